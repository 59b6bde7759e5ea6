"""`trtflow status`, `show`, `report` and `history`: what the store and the journal know of past runs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from trtflow.cli.console import emit, rich_console, whole_lines_console
from trtflow.cli.options import RecipeArg, SetOpt, StoreOpt
from trtflow.errors import (
    EXIT_FAILED,
    EXIT_INCONCLUSIVE,
    StoreError,
    TrtflowError,
    UsageError,
)


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

    console = rich_console()
    if not console.is_terminal:  # a pipe or a file: whole run ids and recipe names, never cut to 80 columns
        console = whole_lines_console()
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
            rich_console(stderr=True).print(f"warning: no run history: {exc.message}", markup=False)
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
            "peak_rss": (manifest or {}).get("peak_rss"),
            # the journal's row of the node's last run, without its copy of the summary (shown once, above)
            "last_run": {k: v for k, v in last.items() if k != "summary"} if last else last,
            "verdicts": [v.as_dict() for v in step.verdicts],  # its gates as they judge the stored result now
        })
    from trtflow.redact import hide

    data = infos[0] if len(infos) == 1 else infos
    text = json.dumps(data, indent=1, default=str)
    if not as_json and fmt == "yaml":
        import yaml

        text = yaml.safe_dump(json.loads(text), sort_keys=False, allow_unicode=True, width=1_000_000).rstrip("\n")
    print(hide(text))


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
    emit(text, output)


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
        "primary figure (every figure with --all), or when a gate that passed in the run before fails in the "
        "latest (a newly rejected candidate); a changed pick is reported: the nightly CI gate. Needs the history "
        "extra.")] = False,
    threshold: Annotated[float, typer.Option(
        min=0, help="--check: the smallest change of a figure's mean, in percent, that fails.")] = 10.0,
    latest: Annotated[int, typer.Option(
        min=1, help="--check: judge changes that start among this many latest runs.")] = 5,
    runs_after: Annotated[int, typer.Option(
        min=1, help="--check: ... and that this many runs show (1: one slow night fails).")] = 2,
    min_runs: Annotated[int, typer.Option(
        min=1, help="--check: the runs a figure needs before the check can pass (fewer: undecided, exit 5).")] = 8,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The trend of each benchmark figure over the runs that measured it, with 95% intervals and change points."""
    from trtflow.history.changes import require
    from trtflow.history.decisions import decision_changes
    from trtflow.history.trend import check as check_history
    from trtflow.history.trend import too_short
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
    journal = Journal(st.db_path, readonly=True)
    found = view.load(journal, recipe_id, nodes or (), figure, last, all_figures)
    findings = check_history(found.series, threshold, latest, all_figures, runs_after) if check else []
    short = too_short(found.series, min_runs, all_figures) if check else []
    decisions = decision_changes(journal, recipe_id, tuple(nodes or ())) if check else []
    newly_failing = [d for d in decisions if d.fails]
    if as_json:
        data = view.as_json(found)
        if check:
            data["check"] = {"threshold_percent": threshold, "latest": latest, "runs_after": runs_after,
                             "min_runs": min_runs, "passed": not findings and not short and not newly_failing,
                             "regressions": [f.message for f in findings],
                             "newly_failing": [d.message for d in newly_failing],
                             "pick_changes": [d.message for d in decisions if not d.fails],
                             "too_few_runs": [f"{s.node}: {s.figure} ({len(s.points)} run(s))" for s in short]}
        print(json.dumps(data, indent=1, default=str))
    else:
        console = rich_console()
        for line in view.text_lines(found, runs):
            console.print(line, markup=False, highlight=False)
        if check:
            judged = sum(1 for s in found.series if s.primary or all_figures)
            for decision in decisions:  # since the run before: a gate that newly fails, a pick that changed
                console.print(("history check FAILED: " if decision.fails else "history check note: ")
                              + decision.message, markup=False, highlight=False)
            if findings:
                console.print(f"history check FAILED: {len(findings)} regression(s) beyond {threshold:g}% among the "
                              f"latest {latest} run(s):", markup=False, style="bold red")
                for finding in findings:
                    console.print(f"  {finding.message}", markup=False, highlight=False)
            elif short:
                console.print(f"history check undecided: {len(short)} of {judged} figure(s) have fewer than "
                              f"--min-runs {min_runs} runs, too few to tell a step from the runs before it: "
                              + ", ".join(f"{s.node}: {s.figure} ({len(s.points)})" for s in short),
                              markup=False, style="bold yellow")
            elif not newly_failing:
                console.print(f"history check passed: no regression beyond {threshold:g}% starts among the latest "
                              f"{latest} run(s) of {judged} figure(s), each with at least {min_runs} runs",
                              markup=False)
    if findings or newly_failing:
        raise typer.Exit(EXIT_FAILED)
    if short:
        raise typer.Exit(EXIT_INCONCLUSIVE)

