"""Do decisions and gates reproduce on a noisy machine? The quickstart, run again and again with CPU-bound neighbours.

Two experiments, each with ``--neighbours`` busy-looping processes (``python3 -c 'while True: pass'``) started first
and stopped at the end, every run in a fresh store (so every benchmark measures again):

``select``: the quickstart ``--runs`` times; prints each run's selection, whether it was a tie within noise, and the
    batch-8 p50 of each candidate with its 95% interval. Reproducible: the same candidate every time.
``gate``: one quickstart run whose results are pinned with `trtflow baseline save`; then ``--runs`` unchanged runs
    gated against it (benchmark ``baseline:``, default 10% threshold): none may fail (inconclusive is allowed);
    then ``--runs`` runs with ONNX Runtime's graph optimisations disabled in the benchmarks (about 2-3x slower):
    every one must fail its gate. Prints each run's exit code and the verdicts per node.

    python bench/reproducibility.py select --runs 5 --neighbours 1
    python bench/reproducibility.py gate --runs 4 --neighbours 1

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
SLOWER = "nodes.benchmark.params.onnxruntime.graph_optimization_level=disable"


@contextlib.contextmanager
def neighbours(count: int) -> Iterator[list[int]]:
    """``count`` CPU-bound processes running while the block runs; each stopped by its own pid afterwards."""
    processes = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
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


def _gated(root: Path, recipe: Path, store: Path, baseline: Path, *sets: str) -> dict[str, Any]:
    started = time.perf_counter()
    overrides = [f"nodes.benchmark.params.baseline={baseline.relative_to(recipe.parent)}", *sets]
    proc = trtflow(root, "run", str(recipe), *TARGETS, "--store", str(store), "--keep-going",
                   *[item for value in overrides for item in ("--set", value)])
    nodes = node_summaries(root, recipe, store)
    verdicts = {name: Counter(v["verdict"] for v in (nodes.get(name, {}).get("summary") or {}).get("verdicts", []))
                for name in TARGETS}
    ratios, failed = {}, {}
    for name in TARGETS:
        for verdict in (nodes.get(name, {}).get("summary") or {}).get("verdicts", []):
            if verdict.get("where") == "batch 8" and "median latency" in verdict.get("message", ""):
                ratios[name] = verdict["message"]
            if verdict.get("verdict") == "fail":
                failed.setdefault(name, []).append(verdict["message"])
    return {"exit": proc.returncode, "seconds": round(time.perf_counter() - started, 1),
            "statuses": {name: nodes.get(name, {}).get("status") for name in TARGETS},
            "verdicts": {name: dict(count) for name, count in verdicts.items()}, "batch8": ratios,
            "failures": failed}


def gate(args: argparse.Namespace, root: Path, recipe: Path) -> dict[str, Any]:
    pinned = trtflow(root, "run", str(recipe), *TARGETS, "--store", str(root / "store-baseline"))
    if pinned.returncode != 0:
        raise SystemExit(f"the baseline run failed:\n{pinned.stdout[-3000:]}\n{pinned.stderr[-3000:]}")
    saved = trtflow(root, "baseline", "save", str(recipe), "--store", str(root / "store-baseline"))
    baseline = recipe.parent / "baselines" / "quickstart.json"
    print(saved.stdout.strip(), flush=True)
    result: dict[str, Any] = {"baseline": json.loads(baseline.read_text()), "unchanged": [], "slower": []}
    for name, sets, key in (("unchanged", (), "unchanged"), ("graph optimisations disabled", (SLOWER,), "slower")):
        for index in range(args.runs):
            row = _gated(root, recipe, root / f"store-{key}-{index}", baseline, *sets)
            result[key].append(row)
            print(f"{name}, run {index + 1}: exit {row['exit']}, statuses {row['statuses']}, verdicts "
                  f"{row['verdicts']}", flush=True)
            for node, message in row["batch8"].items():
                print(f"    {node}: {message}")
            if key == "unchanged":
                for node, messages in row["failures"].items():
                    print(f"    FALSE ALARM {node}: " + " | ".join(messages))
    no_false_alarm = all(r["exit"] == 0 for r in result["unchanged"])
    bites = all(r["exit"] == 1 for r in result["slower"])  # a run fails when any of its gates fails
    failing = Counter(node for r in result["slower"] for node, s in r["statuses"].items() if s == "gate_failed")
    print(f"unchanged runs: {'no gate failure' if no_false_alarm else 'FALSE ALARMS'}; slower runs: "
          f"{'every run fails its gate' if bites else 'NOT every run failed'} (runs in which each node failed: "
          f"{dict(failing)}; a candidate that is not slower without the optimisations passes)")
    result.update(no_false_alarm=no_false_alarm, bites=bites)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["select", "gate"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--neighbours", type=int, default=1, help="CPU-bound processes running alongside")
    parser.add_argument("--out", type=Path, default=Path("reproducibility-results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load average {load[0]:.2f} before the neighbours; {args.neighbours} neighbour(s)")
    with tempfile.TemporaryDirectory(prefix="reproducibility-") as folder, neighbours(args.neighbours) as pids:
        root = Path(folder)
        recipe = project(root)
        result = (select if args.what == "select" else gate)(args, root, recipe)
        result.update(neighbours=pids, cpus=os.cpu_count(), load_average_before=load,
                      load_average_after=os.getloadavg())
    (args.out / f"{args.what}.json").write_text(json.dumps(result, indent=1, default=str))
    ok = result["reproducible"] if args.what == "select" else result["no_false_alarm"] and result["bites"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
