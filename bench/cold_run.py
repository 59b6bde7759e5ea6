"""Cold-run cost: `trtflow run` in a fresh store against the same steps done by hand in one Python process.

The hand-written equivalent (``--script``, also runnable alone) calls the same stages, in the recipe's order,
with the same parameters, in a single process: no store, no hashing, no journal, no node processes, no
locks. It is what a user who wrote the pipeline as one script with the same libraries would run: it does the
same measuring work (the benchmark stage with the recipe's ``min_duration_s``, precision and cap, its stopping
rule; select's paired timing), so the two differ only by what trtflow adds around the stages. Both are timed as
whole processes, alternating, and compared by the per-pair ratio (median, 95% bootstrap interval); the ONNX
artifacts of both are compared byte for byte.

Where the time goes: per node, trtflow's wall time from the journal (node started/ended) split by the node's
log into *before* (spawn, the fork server's preloading, the node process's set-up), the *stage* itself and
*after* (result, hashing, signing, commit), against the script's own time for the same stage; the process's
time outside the run (start-up and planning before it, the report after); and per benchmark point why it
stopped timing (converged, cap, busy host) on both sides.

    python bench/cold_run.py                          # pipelines/quickstart.yaml, 5 alternating pairs
    python bench/cold_run.py --recipe pipelines/quickstart.yaml --repeat 9 --json bench/results/cold/run.json
    python bench/cold_run.py --summarize bench/results/cold/after-*.json   # each file's ratio, the pooled breakdown
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TIMINGS = "timings.json"
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


def by_hand(recipe: Path, out: Path) -> None:
    """The pipeline as one hand-written script: each stage called in turn on the previous stages' files.
    Writes how long each stage took to ``timings.json`` beside the outputs (after the last stage)."""
    started = time.perf_counter()
    from trtflow.fsutil import allowed_roots_for
    from trtflow.graph import build_graph
    from trtflow.recipe.expand import expand
    from trtflow.recipe.load import load_recipe
    from trtflow.registry import get_stage
    from trtflow.stage import StageContext

    loaded = load_recipe(recipe)
    graph = build_graph(expand(loaded, get_stage), get_stage, loaded.recipe.name)
    steps: dict[str, float] = {}
    setup = time.perf_counter() - started
    produced: dict[tuple[str, str], Path] = {}
    for name, node in graph.nodes.items():  # topological order
        stage = graph.stages[node.stage]
        folder = out / name
        ctx = StageContext(name, folder, loaded.directory, stage.outputs, out / "caches",
                           allowed_roots=allowed_roots_for(loaded.directory), input_sources=graph.input_sources(name))
        inputs: dict[str, object] = {}
        for slot, refs in node.upstream.items():
            paths = [produced[ref] for ref in refs]
            inputs[slot] = paths if stage.inputs[slot].many else paths[0]
        begun = time.perf_counter()
        stage.run(ctx, inputs, node.params_model)  # type: ignore[arg-type]
        steps[name] = time.perf_counter() - begun
        for out_name in stage.outputs:
            produced[(name, out_name)] = ctx.output(out_name)
    (out / TIMINGS).write_text(json.dumps({"setup_s": setup, "steps_s": steps,
                                           "total_s": time.perf_counter() - started}))


def trtflow_cmd() -> list[str]:
    exe = shutil.which("trtflow")
    return [exe] if exe else [sys.executable, "-m", "trtflow.cli"]


def timed(cmd: list[str], cwd: Path) -> tuple[float, float]:
    """Wall seconds, and CPU seconds (user + system) of the command and every process it and its descendants
    waited for: the work done, which a busy host's other programs do not inflate as much as the wall time."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _log_times(log: Path) -> tuple[float | None, float | None]:
    """The first line's ("stage ... starting") and the last line's time of a node's log, as epoch seconds."""
    stamps = []
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None, None
    for line in lines:
        found = _LOG_TIME.match(line)
        if found:
            stamps.append(time.mktime(time.strptime(found.group(1), "%Y-%m-%d %H:%M:%S")) + int(found.group(2)) / 1e3)
    return (stamps[0], stamps[-1]) if stamps else (None, None)


def journal_times(store: Path) -> dict[str, Any]:
    """Per node: wall time in the journal, split by its log into before the stage, the stage, after it; and the
    run's span (its first node's start to its end, as the journal says)."""
    with sqlite3.connect(f"file:{store / 'trtflow.db'}?mode=ro", uri=True) as conn:
        (run_id, started, ended), = conn.execute("SELECT id, started, ended FROM runs").fetchall()
        rows = conn.execute("SELECT node, started, ended, log_path FROM node_runs WHERE run_id = ?",
                            (run_id,)).fetchall()
    nodes = {}
    for node, begun, done, log in rows:
        first, last = _log_times(Path(log)) if log else (None, None)
        entry = {"wall_s": done - begun}
        if first is not None and last is not None:
            entry.update(before_s=max(first - begun, 0.0), stage_s=max(last - first, 0.0),
                         after_s=max(done - last, 0.0))
        nodes[node] = entry
    return {"run_s": ended - started, "nodes": nodes}


def stop_reasons(out: Path) -> Counter[str]:
    """Why each benchmark point stopped timing (its report's ``stopped``; ``converged``/``not-converged`` in
    reports written before it existed)."""
    found: Counter[str] = Counter()
    for metrics in sorted(out.glob("**/benchmark.json")):
        for point in json.loads(metrics.read_text())["points"]:
            report = point["report"]
            found[report.get("stopped") or ("converged" if report.get("converged") else "not-converged")] += 1
    return found


def same_onnx(script_dir: Path, tool_out: Path) -> tuple[int, list[str]]:
    """Compare the script's <node>/out/*.onnx with trtflow's build/<recipe>/<node>/*.onnx."""
    pairs = [(p, tool_out / p.relative_to(script_dir).parts[0] / p.relative_to(script_dir / p.relative_to(
        script_dir).parts[0] / "out")) for p in sorted(script_dir.glob("*/out/**/*.onnx"))]
    differ = [str(b.relative_to(tool_out)) for a, b in pairs if not b.exists() or not filecmp.cmp(a, b, shallow=False)]
    return len(pairs), differ


def ratio_interval(ratios: list[float]) -> str:
    """Median of the per-pair ratios, its 95% bootstrap interval (scipy), and their spread."""
    text = f"{statistics.median(ratios):.2f}x (min {min(ratios):.2f}, max {max(ratios):.2f}, n={len(ratios)}"
    if len(ratios) >= 3:
        from scipy.stats import bootstrap

        ci = bootstrap((ratios,), statistics.median, confidence_level=0.95, n_resamples=2000, method="percentile",
                       random_state=0).confidence_interval
        text += f"; 95% CI {ci.low:.2f}-{ci.high:.2f}"
    return text + ")"


def _median_of(rounds: list[dict[str, Any]], *keys: str) -> float | None:
    values = []
    for each in rounds:
        value: Any = each
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, (int, float)):
            values.append(float(value))
    return statistics.median(values) if values else None


def breakdown(pairs: list[dict[str, Any]]) -> list[str]:
    """Per node, medians over the pairs: trtflow's wall (before | stage | after) against the script's step."""
    def cell(value: float | None) -> str:
        return f"{value:6.2f}" if value is not None else "     -"

    tool = [p["trtflow"]["journal"] for p in pairs]
    script = [p["script"]["timings"] for p in pairs]
    lines = [f"{'node':20s} {'trtflow':>7s} {'before':>7s} {'stage':>7s} {'after':>7s} {'script':>7s}"]
    for node in tool[0]["nodes"]:
        lines.append(f"{node:20s} " + " ".join(cell(_median_of(tool, "nodes", node, key)) for key in (
            "wall_s", "before_s", "stage_s", "after_s")) + " " + cell(_median_of(script, "steps_s", node)))
    tool_sum = statistics.median(sum(n["wall_s"] for n in t["nodes"].values()) for t in tool)
    lines.append(f"{'(sum of nodes)':20s} {cell(tool_sum)}{'':24s} "
                 f"{cell(statistics.median(sum(s['steps_s'].values()) for s in script))}")
    outside = [p["trtflow"]["wall_s"] - p["trtflow"]["journal"]["run_s"] for p in pairs]
    lines.append(f"trtflow outside its run (start-up, planning, report): {statistics.median(outside):.2f} s; "
                 f"run span {_median_of(tool, 'run_s'):.2f} s; script set-up {_median_of(script, 'setup_s'):.2f} s")
    return lines


def summarize(files: list[Path]) -> None:
    """Each bench run's ratio (median of its pairs, 95% interval) and the breakdown over all their pairs."""
    pooled: list[dict[str, Any]] = []
    for path in files:
        pairs = json.loads(path.read_text())["pairs"]
        pooled += pairs
        loads = [value for p in pairs for value in p["load_average"]]
        ratios = [p["trtflow"]["wall_s"] / p["script"]["wall_s"] for p in pairs]
        cpu = [p["trtflow"]["cpu_s"] / p["script"]["cpu_s"] for p in pairs if "cpu_s" in p["script"]]
        print(f"{path.name}: trtflow {statistics.median(p['trtflow']['wall_s'] for p in pairs):.1f} s, script "
              f"{statistics.median(p['script']['wall_s'] for p in pairs):.1f} s, ratio {ratio_interval(ratios)}, "
              f"load average {min(loads):.1f}-{max(loads):.1f}" + (f"; CPU ratio {ratio_interval(cpu)}" if cpu else ""))
    stops: dict[str, Counter[str]] = {"trtflow": Counter(), "script": Counter()}
    for pair in pooled:
        for side in stops:
            stops[side].update(pair[side]["benchmark_stops"])
    ratios = [p["trtflow"]["wall_s"] / p["script"]["wall_s"] for p in pooled]
    print(f"all {len(pooled)} pairs: ratio {ratio_interval(ratios)}; benchmark points stopped: trtflow "
          f"{dict(stops['trtflow'])}, script {dict(stops['script'])}")
    print("\n".join(breakdown(pooled)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=REPO / "pipelines" / "quickstart.yaml")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--script", type=Path, help="Run only the hand-written equivalent, writing here.")
    parser.add_argument("--json", type=Path, help="Also write every pair's raw figures here.")
    parser.add_argument("--summarize", type=Path, nargs="+", help="Summarize files --json wrote, and stop.")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize)
        return
    recipe = args.recipe.resolve()
    if args.script:
        by_hand(recipe, args.script.resolve())
        return
    root = Path(tempfile.mkdtemp(prefix="trtflow-cold-"))
    print(f"{recipe.name}: {args.repeat} alternating pairs, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}")
    pairs: list[dict[str, Any]] = []
    try:
        for i in range(args.repeat):
            run_dir, script_dir = root / f"trtflow-{i}", root / f"script-{i}"
            run_dir.mkdir()
            load = os.getloadavg()[0]
            first_tool = i % 2 == 0  # alternate which goes first, so a trend in the host's load hits both alike
            tool_cmd = [*trtflow_cmd(), "run", str(recipe), "-q", "--store", str(run_dir / "store"),
                        "--output-dir", str(run_dir / "out")]
            script_cmd = [sys.executable, __file__, "--recipe", str(recipe), "--script", str(script_dir)]
            if first_tool:
                (tool_s, tool_cpu), (script_s, script_cpu) = timed(tool_cmd, run_dir), timed(script_cmd, root)
            else:
                (script_s, script_cpu), (tool_s, tool_cpu) = timed(script_cmd, root), timed(tool_cmd, run_dir)
            pair = {"load_average": [load, os.getloadavg()[0]], "trtflow_first": first_tool,
                    "trtflow": {"wall_s": tool_s, "cpu_s": tool_cpu, "journal": journal_times(run_dir / "store"),
                                "benchmark_stops": stop_reasons(run_dir / "out")},
                    "script": {"wall_s": script_s, "cpu_s": script_cpu,
                               "timings": json.loads((script_dir / TIMINGS).read_text()),
                               "benchmark_stops": stop_reasons(script_dir)}}
            pairs.append(pair)
            print(f"  pair {i + 1} (load {load:.1f}): trtflow run {tool_s:6.2f} s ({tool_cpu:.1f} s CPU) | "
                  f"one-process script {script_s:6.2f} s ({script_cpu:.1f} s CPU) | {tool_s / script_s:.2f}x | "
                  "benchmark points stopped: trtflow "
                  f"{dict(pair['trtflow']['benchmark_stops'])}, script {dict(pair['script']['benchmark_stops'])}",
                  flush=True)
        count, differ = same_onnx(root / "script-0", root / "trtflow-0" / "out")
        tool = [p["trtflow"]["wall_s"] for p in pairs]
        script = [p["script"]["wall_s"] for p in pairs]
        loads = [value for p in pairs for value in p["load_average"]]
        print(f"median: trtflow run {statistics.median(tool):.2f} s (min {min(tool):.2f}, max {max(tool):.2f}) | "
              f"one-process script {statistics.median(script):.2f} s (min {min(script):.2f}, max {max(script):.2f})"
              f" | ratio {ratio_interval([a / b for a, b in zip(tool, script, strict=True)])}; load average "
              f"{min(loads):.1f}-{max(loads):.1f}")
        print(f"CPU: ratio {ratio_interval([p['trtflow']['cpu_s'] / p['script']['cpu_s'] for p in pairs])}")
        print("\n".join(breakdown(pairs)))
        print(f"ONNX artifacts compared: {count}, differing: {', '.join(differ) if differ else 'none'} (a chooser's "
              "output, e.g. select's, differs when noisy timings picked another candidate)")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"recipe": str(recipe), "cpus": os.cpu_count(), "pairs": pairs},
                                            indent=1) + "\n")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
