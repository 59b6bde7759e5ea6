"""The regression gate on a GPU, through trtflow's own code path: 10% more work must fail, an unchanged model must not.

A recipe benchmarks a 10-layer MLP (`examples/models/mlp_layers.py:mlp10`, 1024 wide) with the benchmark stage on
the PyTorch backend (CUDA events); it is run once and pinned (`trtflow baseline pin`: the factory's file is kept in
the store). Then, alternately, unchanged runs gated on the pinned baseline and runs of the 11-layer MLP (``mlp11``:
10% more work) gated on it, each with its own seed (its own random AB/BA order, so each measures again), in one
store; and a few ungated runs, for the seconds a gated benchmark times. Threshold: ``--threshold`` percent (5: the
10% change is twice it, 1.5x would be 7.5%).

    python bench/gpu_gate.py --runs 10 --out $OUT            # on a GPU machine
    python bench/gpu_gate.py --runs 6 --cotenant 0.3 --out $OUT   # beside a co-tenant: matmuls 0.3 s on, 0.3 s off
    python bench/gpu_gate.py --runs 2 --device cpu           # a smoke test of the script, anywhere

``--cotenant SECONDS`` starts a second process on the same GPU that runs bf16 matrix products (``--cotenant-size``)
for SECONDS and idles for SECONDS, over and over, beside every run (gated and ungated): the switching co-tenant of a
shared GPU.

Prints one line per run (exit code, primary verdict, ratio and bounds, pairs, power) and a summary; writes
gpu-gate.json to --out. Stops starting runs after --budget seconds, keeping what it has.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

RECIPE = """name: gpu-gate
nodes:
  - name: bench
    stage: benchmark
    params:
      backend: torch
      device: %(device)s
      torch_model: python:mlp_layers.py:mlp10
      shapes: {input: [%(batch)d, 1024]}
      min_duration_s: %(duration)s
      warmup_ms: 200
"""


COTENANT = """
import sys, time
import torch
half, size = float(sys.argv[1]), int(sys.argv[2])
a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
while True:
    started = time.perf_counter()
    while time.perf_counter() - started < half:
        a @ b
        torch.cuda.synchronize()
    time.sleep(half)
"""


def trtflow(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200", TRTFLOW_STORE=str(root / "store"))
    return subprocess.run([sys.executable, "-m", "trtflow.cli", *args], cwd=root, capture_output=True, text=True,
                          env=env, timeout=900)


def one_run(root: Path, recipe: Path, seed: int, *sets: str) -> dict[str, Any]:
    started = time.perf_counter()
    overrides = [f"nodes.bench.params.seed={seed}", *sets]
    proc = trtflow(root, "run", str(recipe), *[item for value in overrides for item in ("--set", value)])
    report = json.loads(trtflow(root, "report", str(recipe), "-f", "json").stdout or "{}")
    node = next((n for n in report.get("nodes", []) if n["node"] == "bench"), {})
    summary = node.get("summary") or {}
    primary = next((v for v in summary.get("verdicts", []) if v.get("primary")), {})
    paired = (summary.get("reference") or {}).get("paired") or {}
    point = (summary.get("points") or [{}])[0]
    return {"seed": seed, "exit": proc.returncode, "seconds": round(time.perf_counter() - started, 1),
            "node_seconds": node.get("duration"), "outcome": primary.get("outcome"), "basis": primary.get("basis"),
            "pairs": primary.get("pairs"), "ratio": primary.get("estimate"), "interval": primary.get("interval"),
            "power": primary.get("power"), "reason": primary.get("reason"),
            "p50_ms": (point.get("latency_ms") or {}).get("p50"),
            "p50_ci_ms": (point.get("latency_ci_ms") or {}).get("p50"),
            "timed_seconds": round(float(paired.get("seconds") or 0) + float(paired.get("reference_seconds") or 0), 3),
            "extended": paired.get("extended"), "seed_ab": paired.get("seed"), "block_s": paired.get("block_s"),
            "tail": proc.stdout[-1500:] if proc.returncode not in (0, 1, 5) else ""}


def show(kind: str, row: dict[str, Any]) -> str:
    interval = row["interval"] or [float("nan")] * 2
    ratio = row["ratio"] if row["ratio"] is not None else float("nan")
    return (f"{kind:9s} seed {row['seed']}: exit {row['exit']}, {row['outcome']} ({row['basis']}, {row['pairs']} "
            f"pairs): ratio {ratio:.4f} [{interval[0]:.4f}, {interval[1]:.4f}], p50 {row['p50_ms']} ms, "
            f"{row['seconds']} s; power: {row['power']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--ungated", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--duration", type=float, default=0.5, help="the benchmark's min_duration_s")
    parser.add_argument("--threshold", type=float, default=5.0, help="max_regression_percent")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds after which no run is started")
    parser.add_argument("--cotenant", type=float, default=None, help="seconds on and off of a co-tenant's matmuls")
    parser.add_argument("--cotenant-size", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=Path("gpu-gate-results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="gpu-gate-"))
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    neighbour = None
    try:
        shutil.copy(REPO / "examples" / "models" / "mlp_layers.py", root / "mlp_layers.py")
        (root / "pyproject.toml").write_text("[project]\nname = 'gpu-gate'\n")
        recipe = root / "gpu-gate.yaml"
        recipe.write_text(RECIPE % {"device": args.device, "batch": args.batch, "duration": args.duration})
        first = trtflow(root, "run", str(recipe))
        if first.returncode != 0:
            print(first.stdout[-3000:], first.stderr[-3000:])
            return 2
        pinned = trtflow(root, "baseline", "pin", str(recipe))
        print(pinned.stdout.strip(), flush=True)
        if args.cotenant:
            neighbour = subprocess.Popen([sys.executable, "-c", COTENANT, str(args.cotenant), str(args.cotenant_size)])
            print(f"co-tenant: {args.cotenant_size}^2 bf16 matmuls {args.cotenant:g} s on, {args.cotenant:g} s off",
                  flush=True)
        result["ungated"] = []
        for index in range(args.ungated):
            row = one_run(root, recipe, 1000 + index)
            result["ungated"].append(row)
            print(f"ungated   seed {row['seed']}: exit {row['exit']}, p50 {row['p50_ms']} ms {row['p50_ci_ms']}, "
                  f"{row['seconds']} s", flush=True)
        gate = ["nodes.bench.params.baseline=baselines/gpu-gate.json",
                f"nodes.bench.params.max_regression_percent={args.threshold}"]
        more = "nodes.bench.params.torch_model=python:mlp_layers.py:mlp11"
        result["unchanged"], result["more_work"] = [], []
        for index in range(args.runs):
            for kind, key, sets in (("unchanged", "unchanged", gate), ("10% more", "more_work", [*gate, more])):
                if time.perf_counter() - started > args.budget:
                    break
                row = one_run(root, recipe, index + (500 if key == "more_work" else 0), *sets)
                result[key].append(row)
                print(show(kind, row), flush=True)
                if row["tail"]:
                    print(row["tail"])
    finally:
        if neighbour is not None:
            neighbour.terminate()
            neighbour.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)
    unchanged, more_work = result.get("unchanged", []), result.get("more_work", [])
    alarms = sum(r["exit"] != 0 for r in unchanged)
    undecided = sum(r["outcome"] == "inconclusive" for r in unchanged + more_work)
    caught = sum(r["outcome"] == "fail" for r in more_work)
    print(f"unchanged: {alarms} of {len(unchanged)} runs failed; 10% more work: {caught} of {len(more_work)} failed "
          f"their gate (max_regression_percent {args.threshold:g}); {undecided} undecided in all; "
          f"{time.perf_counter() - started:.0f} s in all")
    result.update(false_alarms=alarms, caught=caught, undecided=undecided,
                  seconds=round(time.perf_counter() - started, 1))
    (args.out / "gpu-gate.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
