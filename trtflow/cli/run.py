"""`trtflow run` and `trtflow plan`: run the stale nodes of a recipe, or list them and why; a run's exit code."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from trtflow.cli.console import rich_console
from trtflow.cli.options import RecipeArg, SetOpt, StoreOpt, TargetsArg
from trtflow.errors import (
    EXIT_ENVIRONMENT,
    EXIT_FAILED,
    EXIT_INCONCLUSIVE,
    EXIT_INTERRUPTED,
    EXIT_STORE,
    EXIT_USAGE,
    UsageError,
)


def run(
    recipe: RecipeArg,
    targets: TargetsArg = None,
    store: StoreOpt = None,
    set_: SetOpt = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=0, show_default=False,
                                      help="CPU slots: nodes to run at once (default: min(4, CPUs)).")] = 0,
    keep_going: Annotated[
        bool, typer.Option("--keep-going", "-k", help="After a failure, run everything that does not depend on it.")
    ] = False,
    require_gpu: Annotated[
        bool,
        typer.Option("--require-gpu", help="Fail (exit 3) instead of skipping nodes whose backend cannot run here."),
    ] = False,
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", help="Where outputs are materialised (default: build/<recipe>)")
    ] = None,
    lock_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for another run building the same node.")
    ] = 21600.0,
    executor: Annotated[str, typer.Option(
        "--executor", help="Where nodes run: local (a process per node on this machine), ray (a Ray cluster), "
        "inline (this process; for debugging).")] = "local",
    ray_address: Annotated[str | None, typer.Option(
        "--ray-address", help="Join this Ray cluster (e.g. ray://head:10001 or auto) instead of starting a local "
        "one (env RAY_ADDRESS).")] = None,
    remote: Annotated[str | None, typer.Option(
        "--remote", help="A remote cache shared by several stores: a directory or s3://bucket/prefix "
        "(env TRTFLOW_REMOTE).")] = None,
    remote_digest: Annotated[str | None, typer.Option(
        "--remote-digest", help="The hash a remote cache names its objects by: xxh3-128 (fast; integrity only) or "
        "sha256 (cryptographic, for remotes shared beyond one team); a new remote records it, an existing one must "
        "match (env TRTFLOW_REMOTE_DIGEST; default: what the remote uses, xxh3-128 for a new one).")] = None,
    memory: Annotated[str | None, typer.Option(
        "--memory", help="Host memory the nodes running at once may use together, e.g. 16G (default: what the "
        "machine has free).")] = None,
    no_push: Annotated[bool, typer.Option(
        "--no-push", help="Only pull from the remote cache; never upload (e.g. CI runs of untrusted changes).")
    ] = False,
    ray_transfer: Annotated[str | None, typer.Option(
        "--ray-transfer", help="Where Ray workers exchange artifacts: a directory they share or s3://bucket/prefix "
        "(default: the remote cache; under --no-push, needed for a cluster of several machines).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only failures and the summary.")] = False,
    rerun: Annotated[list[str] | None, typer.Option(
        "--rerun", help="Run this node again although its result is stored (repeatable; a matrix node's name runs "
        "all of its nodes), e.g. a nightly benchmark, so that its history gets a new measurement; what uses it "
        "runs again if the new result differs.")] = None,
) -> None:
    """Run the stale nodes of a recipe, reusing everything that is up to date."""
    from trtflow import api
    from trtflow.execution.results import RunOptions, resume_command
    from trtflow.report.console import ConsoleHooks

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
        push=not no_push,
        ray_transfer=ray_transfer,
        memory_limit=_parse_size(memory) if memory else None,
        rerun=frozenset(rerun or ()),
    )
    if jobs:
        options.jobs = jobs
    hooks = ConsoleHooks(rich_console, quiet=quiet)
    try:
        steps: list[Any] = []
        summary = api.run_unchanged(recipe, targets or (), set_ or (), store, options, hooks)
        if summary is None:
            _, steps, summary = api.run(recipe, targets or (), set_ or (), store, options, hooks)
    finally:
        hooks.stop_live()
    hooks.finish(summary, steps, time.perf_counter() - started, options.output_dir, resume_command())
    if summary.interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)
    if not summary.ok:
        results = summary.results.values()
        if summary.problems and all(r.status in ("fresh", "done", "cached", "skipped") for r in results):
            raise typer.Exit(EXIT_STORE)
        only_env = all(
            r.status in ("fresh", "done", "cached") or (r.error and "--require-gpu" in r.error) or r.status == "blocked"
            for r in results
        )
        if require_gpu and only_env:
            raise typer.Exit(EXIT_ENVIRONMENT)
        raise typer.Exit(EXIT_INCONCLUSIVE if _only_undecided(summary) else failed_exit_code(results))


def _only_undecided(summary: Any) -> bool:
    """Every node that did not succeed failed only because a gate could not decide (and nothing else broke)."""
    from trtflow.verdicts import only_inconclusive

    failed = [r for r in summary.results.values() if r.status not in ("fresh", "done", "cached", "skipped")]
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


def plan(
    recipe: RecipeArg,
    targets: TargetsArg = None,
    store: StoreOpt = None,
    set_: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list of steps.")] = False,
) -> None:
    """Show which nodes are fresh or stale, and why, without running anything."""
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

