"""The cost of observing a `python:` node's reads (`trtflow.readtrace`): a cold `trtflow run` of one node whose
factory imports numpy, reads weights natively (numpy.fromfile, --megabytes) and a few files, timed as a whole
process in a fresh store, alternating between this checkout and another (--baseline, e.g. a checkout of main):
both pay the same start-up, so the difference is the observed child (a fork, the seccomp supervisor, hashing
what it read). Wall time and CPU time (user + system of the whole process tree: steadier on a busy machine),
medians with min-max over --repeat rounds.

    python bench/python_node_cost.py --baseline /path/to/main --repeat 5
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FACTORY = """\
import numpy
import helper


def make():
    weights = numpy.fromfile("weights.bin", dtype=numpy.float32)
    return f"{float(weights.sum()):.1f} {helper.VALUE} {open('config.txt').read()}"
"""


def project(root: Path, megabytes: int) -> None:
    root.mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'bench'\n")
    (root / "weights.bin").write_bytes(b"\0" * (megabytes << 20))
    (root / "helper.py").write_text("VALUE = 'h'\n")
    (root / "config.txt").write_text("c")
    (root / "model.py").write_text(FACTORY)
    (root / "recipe.yaml").write_text(
        "name: b\nnodes:\n  - {name: factory, stage: coder, params: {model: 'python:model.py:make'}}\n")


def timed_run(checkout: Path, root: Path, plugin: list[str]) -> tuple[float, float]:
    store = root / "store"
    shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(root / "build", ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(checkout), *plugin]))
    env.pop("TRTFLOW_STORE", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "trtflow.cli", "run", "recipe.yaml", "--store", str(store)],
                          cwd=root, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0 or "1 built" not in proc.stdout:
        raise SystemExit(f"{checkout}: the run failed\n{proc.stdout}{proc.stderr}")
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="Another checkout of trtflow (e.g. main).")
    parser.add_argument("--repeat", type=int, default=5, help="Alternating rounds.")
    parser.add_argument("--megabytes", type=int, default=64, help="Size of the weights the factory reads.")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from tests.engine.toystages import register

    work = Path(tempfile.mkdtemp(prefix="trtflow-python-node-"))
    try:
        plugin = register(work / "plugin")
        root = work / "project"
        project(root, args.megabytes)
        times: dict[str, list[tuple[float, float]]] = {"baseline": [], "this": []}
        for _ in range(args.repeat):
            times["baseline"].append(timed_run(args.baseline.resolve(), root, plugin))
            times["this"].append(timed_run(REPO, root, plugin))
        for i, measure in enumerate(("wall", "CPU")):
            for name, pairs in times.items():
                values = [p[i] for p in pairs]
                print(f"{name:8s} cold python: node run, {measure}: median {statistics.median(values):.3f} s "
                      f"(min {min(values):.3f}, max {max(values):.3f}, n={len(values)})")
            deltas = [b[i] - a[i] for a, b in zip(times["baseline"], times["this"], strict=True)]
            print(f"  {measure} difference per round (this - baseline): median {statistics.median(deltas):+.3f} s "
                  f"(min {min(deltas):+.3f}, max {max(deltas):+.3f})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
