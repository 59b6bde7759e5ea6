"""The `trtflow` command line: run, plan, status, show, report, history, schema, gc, verify, doctor."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from trtflow import __version__
from trtflow.errors import (
    EXIT_ENVIRONMENT,
    EXIT_FAILED,
    EXIT_INCONCLUSIVE,
    EXIT_INTERRUPTED,
    EXIT_STORE,
    EXIT_USAGE,
    StoreError,
    TrtflowError,
    UsageError,
)

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

RecipeArg = Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)]
TargetsArg = Annotated[list[str] | None, typer.Argument(help="Only these nodes (and what they need).")]
StoreOpt = Annotated[str | None, typer.Option("--store", help="Store directory (env TRTFLOW_STORE; default .trtflow)")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a recipe value: nodes.NAME.params.KEY=VALUE")]


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def _whole_lines_console() -> Any:
    """A console for stdout that is not a terminal: tables as wide as their content (rich would cut them to
    $COLUMNS, or 80), so that a script, grep or a CI log gets whole ids and names."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True, width=100_000, color_system=None)


def _emit(text: str, output: Path | None) -> None:
    """Write ``text`` to ``output`` (saying so on stderr) or to stdout."""
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
        _console(stderr=True).print(f"wrote {output}")
    else:
        sys.stdout.write(text)


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


# ----------------------------------------------------------------------------- run
@app.command()
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
    remote_namespace: Annotated[str | None, typer.Option(
        "--remote-namespace", help="Write to this namespace of the remote cache (e.g. pr-123) and read it, then "
        "main's; without it a run reads and writes main's only (env TRTFLOW_REMOTE_NAMESPACE).")] = None,
    remote_read_namespace: Annotated[list[str] | None, typer.Option(
        "--remote-read-namespace", help="Also read this namespace (repeatable), e.g. a pull request's whose key the "
        "project trusts: only results a trusted key signed are reused.")] = None,
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
        remote_namespace=remote_namespace or os.environ.get("TRTFLOW_REMOTE_NAMESPACE") or None,
        remote_read_namespaces=tuple(remote_read_namespace or ()),
        push=not no_push,
        ray_transfer=ray_transfer,
        memory_limit=_parse_size(memory) if memory else None,
        rerun=frozenset(rerun or ()),
    )
    if jobs:
        options.jobs = jobs
    hooks = ConsoleHooks(_console, quiet=quiet)
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


# ----------------------------------------------------------------------------- plan
@app.command()
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


# ----------------------------------------------------------------------------- status
@app.command()
def status(
    recipe: Annotated[Path | None, typer.Argument(help="Limit to this recipe file.")] = None,
    store: StoreOpt = None,
    runs: Annotated[int, typer.Option(help="How many recent runs to list.")] = 5,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Recent runs and the state of each node in the latest one."""
    from trtflow.pipeline import default_store, identity_of
    from trtflow.recipe.load import load_recipe

    st = default_store(store)
    st.check_format()
    if not st.has_journal():
        raise TrtflowError(f"no trtflow runs recorded in {st.root}", hint="run `trtflow run RECIPE` first")
    journal = st.journal(readonly=True)
    recipe_id = identity_of(load_recipe(recipe).path, "").id if recipe else None
    recent = journal.runs(runs, recipe_id)
    latest_nodes = journal.node_runs(recent[0]["id"]) if recent else []
    for n in latest_nodes:
        n["built_in_run"], n["build_duration"] = None, None
        if n["status"] in ("fresh", "cached", "gate_failed") and n["key"]:
            manifest = st.read_manifest(n["key"]) or {}
            n["built_in_run"], n["build_duration"] = manifest.get("run_id"), manifest.get("duration")
    if as_json:
        print(json.dumps({"runs": recent, "nodes": latest_nodes}, indent=1, default=str))
        return
    from rich.table import Table

    console = _console()
    if not console.is_terminal:  # a pipe or a file: whole run ids and recipe names, never cut to 80 columns
        console = _whole_lines_console()
    table = Table(title="recent runs", box=None, header_style="bold")
    for col in ("run", "recipe", "started", "duration", "status"):
        table.add_column(col)
    for r in recent:
        duration = f"{r['ended'] - r['started']:.1f}s" if r["ended"] else "-"
        table.add_row(r["id"], r["recipe_id"] or r["recipe"],
                      time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started"])), duration, r["status"])
    console.print(table)
    if latest_nodes:
        nodes = Table(title=f"nodes of run {recent[0]['id']}", box=None, header_style="bold")
        for col in ("node", "stage", "status", "time", "detail"):
            nodes.add_column(col, overflow="fold")
        for n in latest_nodes:
            duration, detail = n["duration"], n["error"] or n["reason"] or ""
            if n["status"] == "fresh" and n["built_in_run"]:
                duration = n["build_duration"]
                detail = f"up to date (built in run {n['built_in_run']})"
            nodes.add_row(n["node"], n["stage"], n["status"], f"{duration:.1f}s" if duration else "-", detail)
        console.print(nodes)


# ----------------------------------------------------------------------------- show
@app.command()
def show(
    recipe: RecipeArg,
    node: Annotated[str, typer.Argument(help="Node name (as listed by `trtflow plan`), or a matrix node's name.")],
    store: StoreOpt = None,
    set_: SetOpt = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="yaml or json.")] = "yaml",
    as_json: Annotated[bool, typer.Option("--json", help="The same as --format json.")] = False,
) -> None:
    """Everything about one node: params, key, inputs, outputs, log, timings, summary (YAML, or JSON)."""
    if fmt not in ("yaml", "json"):
        raise UsageError(f"--format {fmt!r}: expected yaml or json")
    from trtflow.environment import Environment
    from trtflow.pipeline import default_store, load_pipeline
    from trtflow.plan import make_plan

    pipeline = load_pipeline(recipe, set_ or ())
    selected = pipeline.graph.select([node])  # a node name or a matrix node's base name; unknown: exit 2
    names = [n for n, c in pipeline.graph.nodes.items() if n == node or c.template == node]
    st = default_store(store)
    st.check_format()
    journal = st.journal(readonly=True) if st.has_journal() else None
    steps = {s.node.name: s for s in make_plan(selected, st, Environment.from_env(), pipeline.loaded.directory,
                                                journal, pipeline.identity.id)}
    current = st.refs.current(pipeline.identity.id)
    infos = []
    for name in names:
        step = steps[name]
        manifest = step.manifest
        if manifest is None and current.get(name):
            manifest = st.read_manifest(current[name])
        try:
            last = journal.last_node_run(name, pipeline.identity.id) if journal else None
        except StoreError as exc:  # the journal is history: show what the store knows, and say what is missing
            _console(stderr=True).print(f"warning: no run history: {exc.message}", markup=False)
            journal, last = None, None
        infos.append({
            "node": name, "stage": step.node.stage, "status": step.status, "reason": step.reason, "key": step.key,
            "params": step.node.params, "matrix": step.node.matrix,
            "inputs": {s: [f"{n}.{o}" for n, o in refs] for s, refs in step.node.upstream.items()},
            "facts": step.parts.facts if step.parts else None,
            "outputs": {k: {**v, "path": str(st.object_path(v["digest"]))}
                        for k, v in (manifest or {}).get("outputs", {}).items()},
            "summary": (manifest or {}).get("summary"), "built_key": (manifest or {}).get("key"),
            "built_in_run": (manifest or {}).get("run_id"), "duration": (manifest or {}).get("duration"),
            "peak_rss": (manifest or {}).get("peak_rss"), "last_run": last,
            "verdicts": [v.as_dict() for v in step.verdicts],  # its gates as they judge the stored result now
        })
    from trtflow.redact import hide

    data = infos[0] if len(infos) == 1 else infos
    text = json.dumps(data, indent=1, default=str)
    if not as_json and fmt == "yaml":
        import yaml

        text = yaml.safe_dump(json.loads(text), sort_keys=False, allow_unicode=True, width=1_000_000).rstrip("\n")
    print(hide(text))


# ----------------------------------------------------------------------------- report
@app.command()
def report(
    recipe: RecipeArg,
    store: StoreOpt = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="json, markdown, html or junit")] = "markdown",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
) -> None:
    """Report of the latest run of a recipe file (JSON, Markdown, HTML, or JUnit XML for CI)."""
    from trtflow.pipeline import default_store, identity_of
    from trtflow.recipe.load import load_recipe
    from trtflow.report.documents import render

    recipe_id = identity_of(load_recipe(recipe).path, "").id
    st = default_store(store)
    st.check_format()
    if not st.has_journal():
        raise TrtflowError(f"no runs recorded in {st.root}", hint="run `trtflow run` first")
    journal = st.journal(readonly=True)
    text = render(journal, recipe_id, fmt)
    _emit(text, output)


# ----------------------------------------------------------------------------- history
@app.command()
def history(
    recipe: RecipeArg,
    nodes: Annotated[list[str] | None, typer.Argument(
        help="Only these nodes (a matrix node's name: all of its nodes).", show_default=False)] = None,
    store: StoreOpt = None,
    figure: Annotated[str | None, typer.Option(help="Only figures whose name contains this, e.g. p99.")] = None,
    last: Annotated[int | None, typer.Option(min=2, help="Only each figure's latest N runs.")] = None,
    all_figures: Annotated[bool, typer.Option(
        "--all", help="Every figure, not only the primary ones (those the nodes' gates judge).")] = False,
    runs: Annotated[bool, typer.Option("--runs", help="List every run of each figure.")] = False,
    check: Annotated[bool, typer.Option(
        "--check", help="Fail (exit 1) when a regression beyond --threshold starts among the --latest runs of a "
        "primary figure (every figure with --all): the nightly CI gate. Needs the history extra.")] = False,
    threshold: Annotated[float, typer.Option(
        min=0, help="--check: the smallest change of a figure's mean, in percent, that fails.")] = 10.0,
    latest: Annotated[int, typer.Option(
        min=1, help="--check: judge changes that start among this many latest runs.")] = 5,
    runs_after: Annotated[int, typer.Option(
        min=1, help="--check: ... and that this many runs show (1: one slow night fails).")] = 2,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The trend of each benchmark figure over the runs that measured it, with 95% intervals and change points."""
    from trtflow.history.changes import require
    from trtflow.history.trend import check as check_history
    from trtflow.pipeline import default_store, identity_of
    from trtflow.recipe.load import load_recipe
    from trtflow.report import history as view
    from trtflow.storage.journal import Journal

    recipe_id = identity_of(load_recipe(recipe).path, "").id
    st = default_store(store)
    st.check_format()
    if not st.db_path.exists():
        raise TrtflowError(f"no runs recorded in {st.root}", hint="run `trtflow run` first")
    if nodes:  # a matrix node's name stands for all of its nodes; a name no longer in the recipe is looked up as is
        from trtflow.pipeline import load_pipeline

        graph = load_pipeline(recipe).graph
        nodes = sorted({n for n, c in graph.nodes.items() if n in nodes or c.template in nodes}
                       | (set(nodes) - set(graph.nodes) - {c.template for c in graph.nodes.values()}))
    if check:
        if runs_after > latest:
            raise UsageError(f"--runs-after {runs_after} exceeds --latest {latest}: no change could ever fail",
                             hint="keep --runs-after at most --latest")
        require()  # the gate cannot judge without the detector: exit 3, not a silent pass
    found = view.load(Journal(st.db_path, readonly=True), recipe_id, nodes or (), figure, last, all_figures)
    findings = check_history(found.series, threshold, latest, all_figures, runs_after) if check else []
    if as_json:
        data = view.as_json(found)
        if check:
            data["check"] = {"threshold_percent": threshold, "latest": latest, "runs_after": runs_after,
                             "passed": not findings,
                             "regressions": [f.message for f in findings]}
        print(json.dumps(data, indent=1, default=str))
    else:
        console = _console()
        for line in view.text_lines(found, runs):
            console.print(line, markup=False, highlight=False)
        if check:
            judged = sum(1 for s in found.series if s.primary or all_figures)
            if findings:
                console.print(f"history check FAILED: {len(findings)} regression(s) beyond {threshold:g}% among the "
                              f"latest {latest} run(s):", markup=False, style="bold red")
                for finding in findings:
                    console.print(f"  {finding.message}", markup=False, highlight=False)
            else:
                console.print(f"history check passed: no regression beyond {threshold:g}% starts among the latest "
                              f"{latest} run(s) of {judged} figure(s)", markup=False)
    if findings:
        raise typer.Exit(EXIT_FAILED)


# ----------------------------------------------------------------------------- schema
@app.command()
def schema(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the schema to this file.")] = None,
    builtin: Annotated[bool, typer.Option("--builtin", help="Only the stages that ship with trtflow.")] = False,
) -> None:
    """Print the recipe JSON Schema (with every installed stage's parameters)."""
    from trtflow.schema_export import recipe_json_schema

    text = json.dumps(recipe_json_schema(builtin_only=builtin), indent=2) + "\n"
    _emit(text, output)


# ----------------------------------------------------------------------------- gc / verify
WaitOpt = Annotated[float, typer.Option("--wait", help="Seconds to wait for runs holding the store, then give up "
                                                      "(exit 4, store busy).")]


@app.command()
def gc(
    store: StoreOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be removed, and why; remove nothing.")
                       ] = False,
    keep_days: Annotated[float, typer.Option(
        "--keep-days", help="Also keep what runs of the last N days used (env TRTFLOW_GC_KEEP_DAYS; default 0: "
        "only what each recipe file's latest run uses).", show_default=False)] = -1.0,
    forget_missing_after: Annotated[float, typer.Option(
        "--forget-missing-after", help="Forget a recipe file that no longer exists (and drop its results) only after "
        "gc has seen it missing for N days (env TRTFLOW_GC_FORGET_MISSING_DAYS; default 7; 0: now).",
        show_default=False)] = -1.0,
    wait: WaitOpt = 60.0,
) -> None:
    """Remove stored results no recipe file's latest run uses (and old logs, scratch space, refs of recipe files
    missing for a week). gc never runs beside a `trtflow run`: it waits for them, and new runs wait for it."""
    from trtflow.pipeline import default_store
    from trtflow.storage.gc import FORGET_MISSING_DAYS, collect_garbage

    if keep_days < 0:
        keep_days = float(os.environ.get("TRTFLOW_GC_KEEP_DAYS", "0") or 0)
    if forget_missing_after < 0:
        forget_missing_after = float(os.environ.get("TRTFLOW_GC_FORGET_MISSING_DAYS", "") or FORGET_MISSING_DAYS)
    console = _console()
    report_ = collect_garbage(default_store(store), keep_days=keep_days, dry_run=dry_run, wait_s=wait,
                              on_wait=lambda msg: _console(stderr=True).print(msg),
                              forget_missing_days=forget_missing_after)
    verb = "would remove" if dry_run else "removed"
    if report_.removals and (dry_run or len(report_.removals) <= 50):
        rows = [(r.what, r.recipe, r.node, _size(r.size), _age(r.age_s), r.why) for r in report_.removals]
        header = ("what", "recipe", "node", "size", "age", "why")
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header[:-1])]
        for row in [header, *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1])
    results, result_bytes = report_.total("result")
    objects, object_bytes = report_.total("object")
    logs, _ = report_.total("log")
    scratch, _ = report_.total("scratch")
    console.print(f"{verb} {results} results ({_size(result_bytes)}), {objects} other objects "
                  f"({_size(object_bytes)}), {logs} log folders, {scratch} scratch folders; kept "
                  f"{report_.kept_results} results ({report_.kept_objects} objects)")
    if report_.missing:
        first = min(m.since for m in report_.missing)
        paths = ", ".join(m.path or m.recipe for m in report_.missing[:3]) + (", ..." if len(report_.missing) > 3
                                                                               else "")
        console.print(f"kept the results of {len(report_.missing)} recipe file{'s' * (len(report_.missing) > 1)} "
                      f"missing since {time.strftime('%Y-%m-%d %H:%M', time.localtime(first))} ({paths}) "
                      f"(forgotten after {forget_missing_after:g} days missing; --forget-missing-after 0 forgets "
                      "them now)", markup=False, highlight=False)


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


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n} B"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} d"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


@app.command()
def verify(
    store: StoreOpt = None,
    fix: Annotated[
        bool,
        typer.Option(
            "--fix", help="Remove damaged objects and the manifests that use them (the next run rebuilds them), "
            "unreadable refs, and reset a damaged journal."
        ),
    ] = False,
    wait: WaitOpt = 60.0,
    provenance: Annotated[Path | None, typer.Option(
        "--provenance", help="Check this signed provenance (`trtflow provenance`) instead of the store: signed by a "
        "trusted key, and (--artifact) that each file is one of its subjects.")] = None,
    artifact: Annotated[list[Path] | None, typer.Option("--artifact", help="A file that must be a subject of "
                                                                          "--provenance (repeatable).")] = None,
) -> None:
    """Re-hash every stored object, check manifests, refs and the journal; exit 1 if anything is damaged."""
    from trtflow.keys import policy_here  # results by signer (trtflow/keys.py, storage/signing.py)
    from trtflow.pipeline import default_store
    from trtflow.storage.verify import verify_store

    policy = policy_here()
    if provenance is not None:
        from trtflow.provenance import check

        stmt, signer = check(provenance, policy, list(artifact or []))
        print(f"{provenance}: signed by {signer} ({policy.describe(signer)}), trusted; "
              f"{len(stmt['subject'])} subjects" + (f", {len(artifact or [])} artifacts among them" if artifact
                                                     else ""))
        return
    st = default_store(store)
    report_ = verify_store(st, fix=fix, wait_s=wait, on_wait=lambda msg: _console(stderr=True).print(msg),
                           policy=policy)
    console = _console()
    for signer, count in sorted(report_.signers.items()):
        print(f"signed by {signer}: {count} results")
    for problem in report_.problems:
        console.print(f"[red]damaged[/]: {problem}")
    for fixed in report_.fixed:
        console.print(f"[green]fixed[/]: {fixed}")
    console.print(
        f"checked {report_.objects} objects and {report_.manifests} manifests, refs and the journal: "
        + (
            "clean"
            if not report_.problems
            else f"{len(report_.problems)} problems"
            + (" (fixed: the next run rebuilds what was damaged)" if fix else " (run `trtflow verify --fix`)")
        )
    )
    if report_.problems and not fix:
        raise typer.Exit(EXIT_FAILED)


# ----------------------------------------------------------------------------- doctor
@app.command()
def doctor(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """What this machine has: Python, libraries, TensorRT flavours, GPUs, and which backends build/run here."""
    from trtflow.doctor import diagnose

    info = diagnose()
    if as_json:
        print(json.dumps(info, indent=1))
        return
    from rich.table import Table

    console = _console()
    facts = Table(title="environment", box=None, header_style="bold", show_header=False)
    facts.add_column("what")
    facts.add_column("value", overflow="fold")
    for k, v in info["facts"].items():
        facts.add_row(k, str(v))
    console.print(facts)
    backends = Table(title="backends", box=None, header_style="bold")
    for col in ("backend", "build", "run", "why"):
        backends.add_column(col, overflow="fold")
    for b in info["backends"]:
        backends.add_row(b["backend"], "yes" if b["build"] else "no", "yes" if b["run"] else "no", b["why"])
    console.print(backends)
    console.print("stages: " + ", ".join(f"{s['name']} ({s['version']})" for s in info["stages"]))


COMMANDS_GROUP = "trtflow.commands"


def _add_plugin_commands(argv: list[str]) -> None:
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


def main() -> None:
    """Console-script entry point: maps errors to documented exit codes."""
    # pydantic scans every installed distribution for its plugins on first use; a CLI run needs none.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    try:
        _add_plugin_commands(sys.argv[1:])
        app(standalone_mode=True)
    except TrtflowError as exc:
        from rich.markup import escape

        from trtflow.redact import hide

        console = _console(stderr=True)
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


if __name__ == "__main__":
    main()
