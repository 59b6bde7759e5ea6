"""`trtflow run` and `trtflow plan`: run the stale nodes of a recipe, or list them and why; a run's exit code.

These two commands are click commands, not typer ones: an unchanged recipe's `trtflow run` is the command users
repeat most, and typer (0.20+) imports pydantic to coerce every argument of every command.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from trtflow.cli.console import rich_console
from trtflow.errors import (
    EXIT_ENVIRONMENT,
    EXIT_FAILED,
    EXIT_INCONCLUSIVE,
    EXIT_INTERRUPTED,
    EXIT_STORE,
    EXIT_USAGE,
    UsageError,
)

#: The arguments `trtflow run` and `trtflow plan` share (click: these commands start without typer, whose
#: coercion imports pydantic on every command; the other commands use typer, `options.py`).
_recipe = click.argument("recipe", type=click.Path(path_type=Path))
_targets = click.argument("targets", nargs=-1)
_store = click.option("--store", help="Store directory (env TRTFLOW_STORE; default .trtflow)")
_set = click.option("--set", "set_", multiple=True, help="Override a recipe value: nodes.NAME.params.KEY=VALUE")


@click.command(help="Run the stale nodes of a recipe, reusing everything that is up to date.\n\nRECIPE (required): "
               "the recipe YAML file; TARGETS: only these nodes (and what they need).")
@_recipe
@_targets
@_store
@_set
@click.option("--jobs", "-j", type=click.IntRange(min=0), default=0,
              help="CPU slots: nodes to run at once (default: min(4, CPUs)).")
@click.option("--keep-going", "-k", is_flag=True, help="After a failure, run everything that does not depend on it.")
@click.option("--require-gpu", is_flag=True,
              help="Fail (exit 3) instead of skipping nodes whose backend cannot run here.")
@click.option("--output-dir", type=click.Path(path_type=Path),
              help="Where outputs are materialised (default: build/<recipe>)")
@click.option("--lock-timeout", type=float, default=21600.0,
              help="Seconds to wait for another run building the same node (default 21600).")
@click.option("--executor", default="local", help="Where nodes run: local (a process per node on this machine), ray "
              "(a Ray cluster), inline (this process; for debugging). Default: local.")
@click.option("--ray-address", help="Join this Ray cluster (e.g. ray://head:10001 or auto) instead of starting a "
              "local one (env RAY_ADDRESS).")
@click.option("--remote", help="A remote cache shared by several stores: a directory or s3://bucket/prefix "
              "(env TRTFLOW_REMOTE).")
@click.option("--remote-digest", help="The hash a remote cache names its objects by: xxh3-128 (fast; integrity only) "
              "or sha256 (cryptographic, for remotes shared beyond one team); a new remote records it, an existing one "
              "must match (env TRTFLOW_REMOTE_DIGEST; default: what the remote uses, xxh3-128 for a new one).")
@click.option("--remote-namespace", help="Write to this namespace of the remote cache (e.g. pr-123) and read it, then "
              "main's; without it a run reads and writes main's only (env TRTFLOW_REMOTE_NAMESPACE).")
@click.option("--remote-read-namespace", "remote_read_namespace", multiple=True, help="Also read this namespace "
              "(repeatable), e.g. a pull request's whose key the project trusts: only results a trusted key signed "
              "are reused.")
@click.option("--memory", help="Host memory the nodes running at once may use together, e.g. 16G (default: what the "
              "machine has free).")
@click.option("--no-push", is_flag=True,
              help="Only pull from the remote cache; never upload (e.g. CI runs of untrusted changes).")
@click.option("--ray-transfer", help="Where Ray workers exchange artifacts: a directory they share or "
              "s3://bucket/prefix (default: the remote cache; under --no-push, needed for a cluster of several "
              "machines).")
@click.option("--quiet", "-q", is_flag=True, help="Print only failures and the summary.")
@click.option("--rerun", multiple=True, help="Run this node again although its result is stored (repeatable; a "
              "matrix node's name runs all of its nodes), e.g. a nightly benchmark, so that its history gets a new "
              "measurement; what uses it runs again if the new result differs.")
def run(recipe: Path, targets: tuple[str, ...], store: str | None, set_: tuple[str, ...], jobs: int,
        keep_going: bool, require_gpu: bool, output_dir: Path | None, lock_timeout: float, executor: str,
        ray_address: str | None, remote: str | None, remote_digest: str | None, remote_namespace: str | None,
        remote_read_namespace: tuple[str, ...], memory: str | None, no_push: bool, ray_transfer: str | None,
        quiet: bool, rerun: tuple[str, ...]) -> None:
    from trtflow import api
    from trtflow.cli.startup import collector_on
    from trtflow.execution.results import RunOptions, resume_command
    from trtflow.report.console import ConsoleHooks

    class _StartedHooks(ConsoleHooks):
        def on_run_start(self, run_id: str, steps: list[Any]) -> None:
            collector_on()  # planned: the nodes run with the cyclic collector on (cli/startup.py)
            super().on_run_start(run_id, steps)

    if executor not in ("local", "ray", "inline"):
        raise UsageError(f"unknown executor {executor!r}", hint="choose local, ray or inline")
    started = time.perf_counter()
    options = RunOptions(
        keep_going=keep_going,
        require_gpu=require_gpu,
        lock_timeout=lock_timeout,
        output_dir=output_dir.absolute() if output_dir else None,
        command=resume_command(),
        executor=executor,
        ray_address=ray_address or os.environ.get("RAY_ADDRESS"),
        remote=remote or os.environ.get("TRTFLOW_REMOTE") or None,
        remote_digest=_remote_digest(remote_digest or os.environ.get("TRTFLOW_REMOTE_DIGEST") or None),
        remote_namespace=remote_namespace or os.environ.get("TRTFLOW_REMOTE_NAMESPACE") or None,
        remote_read_namespaces=tuple(remote_read_namespace or ()),
        push=not no_push,
        ray_transfer=ray_transfer,
        memory_limit=_parse_size(memory) if memory else None,
        rerun=frozenset(rerun or ()),
    )
    if jobs:
        options.jobs = jobs
    hooks = _StartedHooks(rich_console, quiet=quiet)
    try:
        steps: list[Any] = []
        summary = api.run_unchanged(recipe, targets or (), set_ or (), store, options, hooks)
        if summary is None:
            _, steps, summary = api.run(recipe, targets or (), set_ or (), store, options, hooks)
    finally:
        hooks.stop_live()
    hooks.finish(summary, steps, time.perf_counter() - started, options.output_dir, resume_command())
    if summary.interrupted:
        raise click.exceptions.Exit(EXIT_INTERRUPTED)
    if not summary.ok:
        failures = summary.failures()  # a candidate a chooser rejected is an outcome, not a failure (execution.outcome)
        if summary.problems and not failures:
            raise click.exceptions.Exit(EXIT_STORE)
        only_env = all((r.error and "--require-gpu" in r.error) or r.status == "blocked" for r in failures)
        if require_gpu and only_env:
            raise click.exceptions.Exit(EXIT_ENVIRONMENT)
        raise click.exceptions.Exit(EXIT_INCONCLUSIVE if _only_undecided(summary) else failed_exit_code(failures))


def _only_undecided(summary: Any) -> bool:
    """Every node that did not succeed failed only because a gate could not decide (and nothing else broke)."""
    from trtflow.verdicts import only_inconclusive

    failed = summary.failures()
    return not summary.problems and bool(failed) and all(
        (r.status == "gate_failed" and only_inconclusive(r.verdicts)) or r.status == "blocked" for r in failed) \
        and any(r.status == "gate_failed" for r in failed)


def failed_exit_code(results: Any) -> int:
    """The exit code of a run that failed: the one kind of mistake every failed node made (2: what the recipe
    says does not fit the model, as `trtflow init` reports it too; 3: this machine lacks what a node needs), else 1."""
    codes = {r.error_code or EXIT_FAILED for r in results if r.status in ("failed", "gate_failed")}
    return codes.pop() if len(codes) == 1 and codes <= {EXIT_USAGE, EXIT_ENVIRONMENT} else EXIT_FAILED


def _remote_digest(name: str | None) -> str | None:
    from trtflow.storage.remote import HASHES

    if name is not None and name not in HASHES:
        raise UsageError(f"--remote-digest {name!r}: expected one of {', '.join(HASHES)}")
    return name


def _parse_size(text: str) -> int:
    """"16G", "512M", "2.5GiB", "1000000" -> bytes."""
    import re

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not match:
        raise UsageError(f"--memory {text!r}: expected a size such as 16G, 512M or 2.5GiB")
    return int(float(match.group(1)) * 1024 ** "_kmgt".index(match.group(2) or "_"))


@click.command(help="Show which nodes are fresh or stale, and why, without running anything.\n\nRECIPE (required): "
               "the recipe YAML file; TARGETS: only these nodes (and what they need).")
@_recipe
@_targets
@_store
@_set
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of steps.")
def plan(recipe: Path, targets: tuple[str, ...], store: str | None, set_: tuple[str, ...], as_json: bool) -> None:
    from trtflow import api
    from trtflow.redact import hide

    steps = api.plan(recipe, targets or (), set_ or (), store)
    if as_json:
        print(hide(json.dumps([s.as_json() for s in steps], indent=1)))
        return
    _print_plan(steps)


def _print_plan(steps: list[Any]) -> None:
    """An aligned table of nodes; plain text (rich is not imported: `trtflow plan` must start fast)."""
    rows = [(s.node.name, s.node.stage, s.status, s.reason) for s in steps]
    notes = {s.node.name: s.notes for s in steps if s.notes}
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(("node", "stage", "status"))]
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    paint = {"fresh": "\033[32m", "stale": "\033[33m"}
    lines = ["  ".join(h.ljust(w) for h, w in zip(("node", "stage", "status"), widths, strict=True)) + "  reason"]
    for name, stage, status, reason in rows:
        cell = status.ljust(widths[2])
        if color:
            cell = f"{paint.get(status, '')}{cell}\033[0m"
        lines.append(f"{name.ljust(widths[0])}  {stage.ljust(widths[1])}  {cell}  {reason}")
        lines += [f"{' ' * widths[0]}  note: {note}" for note in notes.get(name, [])]
    stale = sum(1 for s in steps if s.status == "stale")
    lines.append(f"{len(steps)} nodes: {len(steps) - stale} fresh, {stale} stale")
    from trtflow.redact import hide

    print(hide("\n".join(lines)))



#: The commands of this module, by name: `trtflow` runs them without importing typer (`cli.main`).
COMMANDS: dict[str, click.Command] = {"run": run, "plan": plan}


def call(command: click.Command, argv: list[str], prog_name: str) -> int:
    """Run ``command`` on ``argv`` as a console script would; its exit code (a TrtflowError propagates)."""
    try:
        code = command.main(argv, prog_name=prog_name, standalone_mode=False)
    except click.exceptions.Abort:
        raise KeyboardInterrupt from None
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    return code if isinstance(code, int) else 0
