"""The `trtflow` console script: runs a command and maps errors to the documented exit codes."""

from __future__ import annotations

import os
import sys

from trtflow import __version__
from trtflow.cli.startup import collector_off, collector_on
from trtflow.errors import EXIT_INTERRUPTED, TrtflowError


def main() -> None:
    """Console-script entry point: maps errors to documented exit codes."""
    from trtflow.keys import forget_signing_key, take_signing_key

    # First, before any process starts: the CI's key into trtflow.keys' memory, out of the environment and of this
    # process's environment block (/proc/<pid>/environ), where a node's code could read it.
    warning = take_signing_key()
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    # pydantic scans every installed distribution for its plugins on first use; a CLI run needs none.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    collector_off()  # what the command imports loads with the cyclic collector off (cli/startup.py)
    from trtflow.terminal import guard

    try:
        with guard():  # every printer writes without control characters (trtflow/terminal.py)
            _main_guarded()
    finally:
        forget_signing_key()
        collector_on()


def _main_guarded() -> None:
    from trtflow.cli.run import COMMANDS, call

    argv = sys.argv[1:]
    try:
        if argv and argv[0] in COMMANDS:  # run and plan start without typer (and so without pydantic)
            sys.exit(call(COMMANDS[argv[0]], argv[1:], f"trtflow {argv[0]}"))
        from trtflow.cli.app import add_plugin_commands, app

        add_plugin_commands(argv)
        collector_on()  # every module the command needs is loaded: the command's own work with the collector on
        app(standalone_mode=True)
    except TrtflowError as exc:
        from rich.markup import escape

        from trtflow.cli.console import rich_console
        from trtflow.redact import hide

        console = rich_console(stderr=True)
        console.print(f"[bold red]error:[/] {escape(hide(exc.message))}", highlight=False)
        if exc.hint:
            console.print(f"  [bold]hint:[/] {escape(hide(exc.hint))}")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:
        import traceback

        traceback.print_exc()
        print(
            f"\ninternal error in trtflow {__version__}: {type(exc).__name__}: {exc}\n"
            "This is a bug in trtflow; please report it with the traceback above.",
            file=sys.stderr,
        )
        sys.exit(70)
