"""The `trtflow` command group: the built-in commands and those plugins add (`trtflow.commands` entry points)."""

from __future__ import annotations

from typing import Annotated

import click
import typer

from trtflow import __version__
from trtflow.cli import about, results, run, store

app = typer.Typer(
    name="trtflow",
    help="Turn trained models into fast, validated TensorRT engines from one YAML recipe.\n\n"
    "Exit codes: 0 ok, 1 a stage or a gate failed, 2 bad recipe or usage, 3 this machine cannot run the "
    "requested backend, 4 the store is busy, damaged, read-only or full, 130 interrupted.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version_callback(value: bool) -> None:
    if value:
        print(f"trtflow {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """trtflow: declarative, resumable TensorRT pipelines."""



def _forward(command: click.Command) -> None:
    """List ``command`` (a click command of `cli.run`) in this group and run it from here too, its arguments passed
    on untouched: the console script runs it without typer (`cli.main`), a caller of this app through it."""

    def forward(ctx: typer.Context) -> None:
        code = run.call(command, ctx.args, f"{ctx.find_root().info_name} {command.name}")
        if code:
            raise typer.Exit(code)

    app.command(command.name, help=command.help, add_help_option=False,
                context_settings={"ignore_unknown_options": True, "allow_extra_args": True})(forward)


for command in run.COMMANDS.values():
    _forward(command)
for function in (results.status, results.show, results.report, results.history, about.schema, store.gc,
                 store.verify, about.doctor):
    app.command()(function)

COMMANDS_GROUP = "trtflow.commands"


def add_plugin_commands(argv: list[str]) -> None:
    """Register subcommands from the ``trtflow.commands`` entry-point group (e.g. `init`, `debug`).

    An entry point names a `typer.Typer` (a command group) or a function (one command). Only the command being
    run is imported, so plugins cost nothing on other commands; `--help` imports them all to list them.
    """
    builtin = {c.name or typer.main.get_command_name(c.callback.__name__) for c in app.registered_commands
               if c.callback is not None} | {g.name for g in app.registered_groups}
    wanted = next((a for a in argv if not a.startswith("-")), None)
    if wanted in builtin:
        return  # scanning every installed distribution's entry points costs ~50 ms on each start
    from importlib.metadata import entry_points

    for ep in entry_points(group=COMMANDS_GROUP):
        if ep.name in builtin:
            continue
        if wanted is not None and ep.name != wanted:
            continue
        target = ep.load()
        if isinstance(target, typer.Typer):
            app.add_typer(target, name=ep.name)
        else:
            app.command(ep.name)(target)

