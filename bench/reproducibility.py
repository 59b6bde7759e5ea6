"""Do decisions and gates reproduce on a noisy machine? The quickstart, run again and again with CPU-bound neighbours.

Two experiments, each with ``--neighbours`` busy-looping processes (``python3 -c 'while True: pass'``) started first
and stopped at the end, every run in a fresh store (so every benchmark measures again):

``select``: the quickstart ``--runs`` times; prints each run's selection, whether it was a tie within noise, and the
    batch-8 p50 of each candidate with its 95% interval. Reproducible: the same candidate every time.
``gate``: one quickstart run whose results are pinned with `trtflow baseline pin`; then ``--runs`` unchanged runs
    gated against it (benchmark ``baseline:``, default 10% threshold, paired A/B at batch 8): none may fail; then
    ``--runs`` runs whose exported model does more work (`examples/models/layered.py:cnn_more_work`, 1.2-1.5x, which
    every candidate derives from): every one must fail. All in the pinned store, each run with its own seed (its own
    random AB/BA order, so each measures again). Prints each run's exit code and primary verdicts per node.
``gated``: the issue's series. A recipe exporting the tiny CNN (`examples/models/layered.py:cnn`) and benchmarking it
    on ONNX Runtime (one thread, batch 8) is run once and pinned (`trtflow baseline pin`); then ``--runs`` unchanged
    gated runs and ``--runs`` runs whose model does more work (``--more-work``: ``layered.py:cnn_more_work``, three
    more convolutions, 1.50x on an idle host; ``cnn_one_more_layer``, 1.15x), each re-measuring the pinned artifact
    beside the candidate in A/B pairs (each run with its own seed: its own random AB/BA order, so each one measures
    again), and ``--runs`` ungated runs of the
    same benchmark, for its timed seconds. Criteria: no unchanged run fails (any non-zero exit), at least 95% of the
    more-work runs fail their gate, and a gated benchmark times at most the cost budget (``gate_cost_budget``, 8 by
    default) times the seconds of an ungated one; the gate point's own cost (both sides over its min_duration_s) is
    printed.

    python bench/reproducibility.py select --runs 5 --neighbours 1
    python bench/reproducibility.py gate --runs 4 --neighbours 1
    python bench/reproducibility.py gated --runs 20 --neighbours 1

Results (every run's selection or verdicts) go to --out as JSON; the exit code is 1 when a criterion is not met.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TARGETS = ("benchmark-simplify", "benchmark-convert", "benchmark-quantize")
QUICKSTART_MORE_WORK = "nodes.export.params.model=python:../examples/models/layered.py:cnn_more_work"


@contextlib.contextmanager
def neighbours(count: int, switch: float | None = None) -> Iterator[list[int]]:
    """``count`` CPU-bound processes running while the block runs; each stopped by its own pid afterwards.
    ``switch``: each busy for that many seconds, then idle as long, over and over (a switching neighbour)."""
    code = "while True: pass" if not switch else (
        f"import time\nwhile True:\n    t = time.perf_counter()\n    while time.perf_counter() - t < {switch}: pass\n"
        f"    time.sleep({switch})")
    processes = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]
    try:
        yield [p.pid for p in processes]
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)


def project(root: Path) -> Path:
    """A copy of the quickstart and the examples it uses, in a folder of its own (a project: it has a
    pyproject.toml); returns the recipe's path."""
    for folder in ("pipelines", "examples"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__", "build", ".trtflow"))
    (root / "pyproject.toml").write_text("[project]\nname = 'reproducibility'\n")
    return root / "pipelines" / "quickstart.yaml"


def trtflow(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "trtflow.cli", *args], cwd=root, capture_output=True, text=True,
                          env=env, timeout=3600)


def node_summaries(root: Path, recipe: Path, store: Path) -> dict[str, Any]:
    report = trtflow(root, "report", str(recipe), "--store", str(store), "--format", "json")
    data = json.loads(report.stdout)
    return {n["node"]: n for n in data["nodes"]}


def select(args: argparse.Namespace, root: Path, recipe: Path) -> dict[str, Any]:
    runs = []
    for index in range(args.runs):
        store, out = root / f"store-select-{index}", root / f"build-select-{index}"
        started = time.perf_counter()
        proc = trtflow(root, "run", str(recipe), "--store", str(store), "--output-dir", str(out))
        selection = json.loads((out / "select" / "selection.json").read_text()) if proc.returncode == 0 else {}
        row = {"run": index + 1, "exit": proc.returncode, "seconds": round(time.perf_counter() - started, 1),
               "selected": selection.get("selected"), "tie_within_noise": selection.get("tie_within_noise"),
               "tied": selection.get("tied"), "candidates": {}}
        for candidate in selection.get("candidates", []):
            point = candidate.get("operating_point") or {}
            row["candidates"][candidate["name"]] = {"p50_ms": point.get("latency_ms"),
                                                    "p50_ci_ms": point.get("latency_ci_ms"),
                                                    "reason": candidate.get("reason")}
        runs.append(row)
        shown = ", ".join(f"{name} {c['p50_ms']:.3f} [{c['p50_ci_ms'][0]:.3f}, {c['p50_ci_ms'][1]:.3f}]"
                          for name, c in row["candidates"].items() if c["p50_ms"] and c["p50_ci_ms"])
        print(f"run {index + 1}: exit {proc.returncode}, selected {row['selected']}"
              f"{' (tie within noise: ' + ', '.join(row['tied']) + ')' if row['tie_within_noise'] else ''}; "
              f"batch-8 p50 ms: {shown}", flush=True)
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-2000:])
    chosen = Counter(r["selected"] for r in runs)
    verdict = len(chosen) == 1 and None not in chosen
    print(f"selections: {dict(chosen)} -> {'the same every time' if verdict else 'NOT reproducible'}")
    return {"runs": runs, "selections": dict(chosen), "reproducible": verdict}


def _gated(root: Path, recipe: Path, store: Path, baseline: Path, index: int, *sets: str) -> dict[str, Any]:
    started = time.perf_counter()
    overrides = [f"nodes.benchmark.params.baseline={baseline.relative_to(recipe.parent)}",
                 f"nodes.benchmark.params.seed={index}", *sets]
    proc = trtflow(root, "run", str(recipe), *TARGETS, "--store", str(store), "--keep-going",
                   *[item for value in overrides for item in ("--set", value)])
    nodes = node_summaries(root, recipe, store)
    verdicts = {name: [v for v in (nodes.get(name, {}).get("summary") or {}).get("verdicts", []) if v.get("primary")]
                for name in TARGETS}
    return {"exit": proc.returncode, "seconds": round(time.perf_counter() - started, 1),
            "statuses": {name: nodes.get(name, {}).get("status") for name in TARGETS},
            "verdicts": {name: [v["outcome"] for v in found] for name, found in verdicts.items()},
            "primary": {name: found[0]["reason"] for name, found in verdicts.items() if found}}


def gate(args: argparse.Namespace, root: Path, recipe: Path) -> dict[str, Any]:
    """The quickstart's three benchmark nodes gated on its pinned baseline (paired A/B at batch 8, the recipe's
    error budget shared by the three): unchanged runs must not fail; runs whose exported model does ~20% more
    work (every candidate derives from it) must fail."""
    store = root / "store-baseline"
    pinned = trtflow(root, "run", str(recipe), *TARGETS, "--store", str(store))
    if pinned.returncode != 0:
        raise SystemExit(f"the baseline run failed:\n{pinned.stdout[-3000:]}\n{pinned.stderr[-3000:]}")
    saved = trtflow(root, "baseline", "pin", str(recipe), "--store", str(store))
    baseline = recipe.parent / "baselines" / "quickstart.json"
    print(saved.stdout.strip(), flush=True)
    result: dict[str, Any] = {"baseline": json.loads(baseline.read_text()), "unchanged": [], "more_work": []}
    for name, sets, key in (("unchanged", (), "unchanged"), ("20% more work", (QUICKSTART_MORE_WORK,),
                                                                 "more_work")):
        for index in range(args.runs):
            # the same store (the pinned artifacts live there); each run with its own A/B order, so it measures again
            row = _gated(root, recipe, store, baseline, index + (100 if key == "more_work" else 0), *sets)
            result[key].append(row)
            print(f"{name}, run {index + 1}: exit {row['exit']}, verdicts {row['verdicts']}", flush=True)
            for node, message in row["primary"].items():
                print(f"    {node}: {message}")
    no_false_alarm = all(r["exit"] == 0 for r in result["unchanged"])
    bites = all(r["exit"] != 0 for r in result["more_work"])  # a run fails when any of its gates fails
    failing = Counter(node for r in result["more_work"] for node, s in r["statuses"].items() if s == "gate_failed")
    print(f"unchanged runs: {'no gate failure' if no_false_alarm else 'FALSE ALARMS'}; more-work runs: "
          f"{'every run fails its gate' if bites else 'NOT every run failed'} (runs in which each node failed: "
          f"{dict(failing)})")
    result.update(no_false_alarm=no_false_alarm, bites=bites)
    return result


GATED = """name: gated
description: The tiny CNN on ONNX Runtime, gated on a pinned baseline (bench/reproducibility.py gated).
nodes:
  - name: export
    stage: export
    params:
      model: python:../examples/models/layered.py:cnn
      inputs: {input: {shape: [8, 3, 32, 32], dynamic_axes: {0: batch}}}
      outputs: [logits]
      opset: 17
  - name: bench
    stage: benchmark
    inputs: {model: export}
    params:
      backend: onnxruntime
      onnxruntime: {intra_op_threads: 1}
      shapes: {input: [8, 3, 32, 32]}
      min_duration_s: %(duration)s
"""
MORE_WORK = "nodes.export.params.model=python:../examples/models/layered.py:%s"


def _timed_seconds(benchmark: dict[str, Any]) -> float:
    """The seconds a benchmark node timed: its points' windows, and the reference's windows of its pairs."""
    points = sum(float(p["report"].get("wall_time_ms", 0.0)) for p in benchmark.get("points", [])) / 1000.0
    paired = (benchmark.get("reference") or {}).get("paired") or {}
    return points + float(paired.get("reference_seconds") or 0.0)


def _gated_run(root: Path, recipe: Path, store: Path, index: int, *sets: str) -> dict[str, Any]:
    started = time.perf_counter()
    overrides = [f"nodes.bench.params.seed={index}", *sets]
    proc = trtflow(root, "run", str(recipe), "--store", str(store), "--output-dir", str(root / "build-gated"),
                   *[item for value in overrides for item in ("--set", value)])
    node = node_summaries(root, recipe, store).get("bench", {})
    verdicts = [v for v in (node.get("summary") or {}).get("verdicts", []) if v.get("primary")]
    primary = verdicts[0] if verdicts else {}
    benchmark = json.loads((root / "build-gated" / "bench" / "benchmark.json").read_text())
    return {"run": index, "exit": proc.returncode, "seconds": round(time.perf_counter() - started, 1),
            "node_seconds": node.get("duration"), "timed_seconds": round(_timed_seconds(benchmark), 3),
            "outcome": primary.get("outcome"), "basis": primary.get("basis"), "pairs": primary.get("pairs"),
            "ratio": primary.get("estimate"), "interval": primary.get("interval"), "power": primary.get("power"),
            "reason": primary.get("reason"),
            "cost": ((benchmark.get("reference") or {}).get("paired") or {}).get("cost")}


def gated(args: argparse.Namespace, root: Path, recipe: Path) -> dict[str, Any]:
    recipe = recipe.parent / "gated.yaml"
    recipe.write_text(GATED % {"duration": args.min_duration})
    store = root / "store-gated"
    first = trtflow(root, "run", str(recipe), "--store", str(store))
    if first.returncode != 0:
        raise SystemExit(f"the baseline run failed:\n{first.stdout[-3000:]}\n{first.stderr[-3000:]}")
    print(trtflow(root, "baseline", "pin", str(recipe), "--store", str(store)).stdout.strip(), flush=True)
    ungated = []
    for index in range(args.runs):
        row = _gated_run(root, recipe, store, 1000 + index)
        ungated.append(row)
        print(f"ungated, run {index + 1}: exit {row['exit']}, timed {row['timed_seconds']} s, node "
              f"{row['node_seconds']:.1f} s", flush=True)
    gate_on = "nodes.bench.params.baseline=baselines/gated.json"
    result: dict[str, Any] = {"ungated": ungated, "unchanged": [], "more_work": []}
    for name, key, sets in (("unchanged", "unchanged", (gate_on,)), (f"more work ({args.more_work})", "more_work",
                                                                     (gate_on, MORE_WORK % args.more_work))):
        for index in range(args.runs):
            row = _gated_run(root, recipe, store, index + (2000 if key == "more_work" else 0), *sets)
            result[key].append(row)
            interval = row["interval"] or [float("nan")] * 2
            print(f"{name}, run {index + 1}: exit {row['exit']}, {row['outcome']} ({row['basis']}, {row['pairs']} "
                  f"pairs): ratio {row['ratio'] or float('nan'):.3f} [{interval[0]:.3f}, {interval[1]:.3f}], timed "
                  f"{row['timed_seconds']} s, node {row['node_seconds'] or 0:.1f} s; power: {row['power']}",
                  flush=True)
    timed = sorted(r["timed_seconds"] for r in ungated)
    gated_timed = sorted(r["timed_seconds"] for r in result["unchanged"] + result["more_work"])
    ratio = max(gated_timed) / (sorted(timed)[len(timed) // 2] or 1.0)
    false_alarms = sum(r["exit"] != 0 for r in result["unchanged"])
    caught = sum(r["outcome"] == "fail" for r in result["more_work"])
    caught_exit = sum(r["exit"] != 0 for r in result["more_work"])
    print(f"unchanged: {false_alarms} of {args.runs} runs failed; more work: {caught} of {args.runs} failed "
          f"their gate ({caught_exit} non-zero exits); timed seconds: ungated median {timed[len(timed) // 2]:.2f} "
          f"(range {timed[0]:.2f}-{timed[-1]:.2f}), gated {gated_timed[0]:.2f}-{gated_timed[-1]:.2f}: at most "
          f"{ratio:.2f}x the ungated median")
    from trtflow_stages.measure.timing.ab import COST_BUDGET

    costs = [r["cost"] for r in result["unchanged"] + result["more_work"] if r["cost"] is not None]
    if costs:
        print(f"gate point cost (both sides over its min_duration_s): {min(costs):.2f}-{max(costs):.2f}x, budget "
              f"{COST_BUDGET:g}x")
    result.update(false_alarms=false_alarms, caught=caught, timed_ratio=ratio,
                  ok=false_alarms == 0 and caught >= 0.95 * args.runs and ratio <= COST_BUDGET)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["select", "gate", "gated"])
    parser.add_argument("--min-duration", type=float, default=1.0, help="gated: the benchmark's min_duration_s")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--more-work", default="cnn_more_work",
                        help="gated: the model of the more-work runs, a function of examples/models/layered.py "
                        "(cnn_one_more_layer: 1.15x on an idle host, cnn_two_more_layers: 1.31x, cnn_more_work: 1.50x)")
    parser.add_argument("--neighbours", type=int, default=1, help="CPU-bound processes running alongside")
    parser.add_argument("--switch", type=float, default=None,
                        help="the neighbours switch: busy this many seconds, idle as long, over and over")
    parser.add_argument("--out", type=Path, default=Path("reproducibility-results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load average {load[0]:.2f} before the neighbours; {args.neighbours} neighbour(s)")
    with tempfile.TemporaryDirectory(prefix="reproducibility-") as folder, \
            neighbours(args.neighbours, args.switch) as pids:
        root = Path(folder)
        recipe = project(root)
        result = {"select": select, "gate": gate, "gated": gated}[args.what](args, root, recipe)
        result.update(neighbours=pids, cpus=os.cpu_count(), load_average_before=load,
                      load_average_after=os.getloadavg())
    (args.out / f"{args.what}.json").write_text(json.dumps(result, indent=1, default=str))
    ok = {"select": lambda: result["reproducible"], "gate": lambda: result["no_false_alarm"] and result["bites"],
          "gated": lambda: result["ok"]}[args.what]()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
