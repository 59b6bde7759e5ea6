"""Scale-out costs: the Ray executor's per-node overhead against the local one, and a run served from the remote
cache against building.

1. N cheap nodes (the example plugin's `synth` stage, a binary tree of dependencies), cold, in a fresh store:
   `--executor local` against `--executor ray` (a local Ray cluster, started by the run and included in its
   time), and the per-node cost of each.
2. The quickstart built in a fresh store that pushes to a directory remote, then run again in a second fresh
   store that shares the remote: its time against the build's, and the artifacts compared byte for byte.

    python bench/executors.py                      # 200 nodes, the quickstart
    python bench/executors.py --nodes 200 --skip-quickstart
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.noop_overhead import child_env, dag, trtflow_cmd, with_example_plugin  # noqa: E402


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed


def tree_recipe(folder: Path, n: int) -> Path:
    lines = [f"name: tree{n}", "nodes:"]
    for name, parent in dag(n):
        source = f", inputs: {{source: {parent}}}" if parent else ""
        lines.append(f"  - {{name: {name}, stage: synth, params: {{text: {name}, size: 4096}}{source}}}")
    path = folder / "tree.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def executors(root: Path, n: int, env: dict[str, str]) -> None:
    recipe = tree_recipe(root, n)
    times = {}
    for executor in ("local", "ray"):
        folder = root / executor
        folder.mkdir()
        times[executor] = run([*trtflow_cmd(), "run", str(recipe), "-q", "--executor", executor, "--store",
                               str(folder / "store"), "--output-dir", str(folder / "out")], folder, env)
    same = all(filecmp.cmp(root / "local" / "out" / name / "data.bin", root / "ray" / "out" / name / "data.bin",
                           shallow=False) for name, _ in dag(n))
    print(f"{n} cheap nodes, cold: local {times['local']:.1f} s ({times['local'] / n * 1000:.0f} ms/node) | "
          f"ray {times['ray']:.1f} s ({times['ray'] / n * 1000:.0f} ms/node, local Ray cluster start included) | "
          f"ray/local {times['ray'] / times['local']:.2f}x | outputs identical: {same}")


def remote_served(root: Path, env: dict[str, str]) -> None:
    recipe = REPO / "pipelines" / "quickstart.yaml"
    remote = root / "remote"
    remote.mkdir()
    timings = {}
    for name in ("builds", "served"):
        folder = root / name
        folder.mkdir()
        timings[name] = run([*trtflow_cmd(), "run", str(recipe), "-q", "--remote", str(remote), "--store",
                             str(folder / "store"), "--output-dir", str(folder / "out")], folder, env)
    files = sorted(p.relative_to(root / "builds" / "out") for p in (root / "builds" / "out").rglob("*")
                   if p.is_file() and not p.name.startswith("."))
    differ = [str(f) for f in files if not filecmp.cmp(root / "builds" / "out" / f, root / "served" / "out" / f,
                                                        shallow=False)]
    print(f"quickstart: built and pushed {timings['builds']:.1f} s | fresh store served from the directory remote "
          f"{timings['served']:.1f} s | ratio {timings['served'] / timings['builds']:.2f}x | "
          f"{len(files)} artifacts, differing: {', '.join(differ) or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--skip-quickstart", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="trtflow-exec-"))
    env = with_example_plugin(child_env(), root)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    try:
        executors(root, args.nodes, env)
        if not args.skip_quickstart:
            remote_served(root, env)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
