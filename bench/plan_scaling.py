"""How `trtflow plan` scales with the number of nodes: wall time at 500 / 5,000 / 20,000 nodes and the growth.

Generates recipes of N nodes of the example plugin's `synth` stage (node i takes its input from node
(i - 1) // 2: a binary tree, so there is real fan-out and every node has a default input slot resolved),
then times the whole `trtflow plan` command against an empty store (every node stale: "never built"), the
median of --repeat runs. Beside it, what reading the same file costs with PyYAML's C loader alone
(`yaml.load(..., CSafeLoader)` in a fresh interpreter), the floor any YAML-based tool starts from. With
--phases, also the in-process split: load (YAML, schema), expand (matrix, parameters), graph, plan.

Linear planning grows about 10x from 500 to 5,000 nodes (a little less: the start-up is fixed). With --code, every
node is instead a `copy` node of the test plugin (tests/reliability/plugins.py) that names a data file and a
`python:` callable whose file imports a helper module: the path resolution, file hashing, code scanning and module-set
lookups a `python:` node costs the planner.

    python bench/plan_scaling.py                       # 500 5000 20000, 3 repeats
    python bench/plan_scaling.py --sizes 500 5000 --repeat 5 --phases
    python bench/plan_scaling.py --sizes 500 5000 --code
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from noop_overhead import timed  # bench/ is on sys.path when a script here runs

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_PLUGIN = REPO / "examples" / "plugin"

PHASES = """\
import sys, time
from trtflow.environment import Environment
from trtflow.graph import build_graph
from trtflow.pipeline import default_store
from trtflow.plan import make_plan
from trtflow.recipe.expand import expand
from trtflow.recipe.load import load_recipe
from trtflow.registry import get_stage
t0 = time.perf_counter()
loaded = load_recipe(sys.argv[1])
t1 = time.perf_counter()
nodes = expand(loaded, get_stage)
t2 = time.perf_counter()
graph = build_graph(nodes, get_stage, loaded.recipe.name)
t3 = time.perf_counter()
steps = make_plan(graph, default_store(sys.argv[2]), Environment.from_env(), loaded.directory)
t4 = time.perf_counter()
assert len(steps) == len(nodes)
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {t3 - t2:.3f} {t4 - t3:.3f}")
"""


def write_recipe(folder: Path, n: int, code: bool = False) -> Path:
    lines = [f"name: scale{n}", "nodes:"]
    if code:
        (folder / "data").mkdir(exist_ok=True)
        for i in range(10):
            (folder / "data" / f"d{i}.txt").write_text(f"data {i}\n")
        (folder / "helper.py").write_text("VALUE = 'v'\n")
        (folder / "model.py").write_text("import helper\n\n\ndef make():\n    return helper.VALUE\n")
    for i in range(n):
        lines.append(f"  - name: n{i:05d}")
        if code:
            lines.append("    stage: copy")
            lines.append(f"    params: {{path: data/d{i % 10}.txt, make: 'python:model.py:make'}}")
            continue
        lines.append("    stage: synth")
        lines.append(f"    params: {{text: n{i:05d}, size: 64}}")
        if i:
            lines.append(f"    inputs: {{source: n{(i - 1) // 2:05d}}}")
    path = folder / f"scale{n}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def code_env(work: Path) -> dict[str, str]:
    """The environment with the test plugin's stages (`copy`) discoverable, as bench/noop_overhead.py makes it."""
    sys.path.insert(0, str(REPO))
    from tests.reliability.plugins import subprocess_env, write_plugin_distribution

    env = subprocess_env(write_plugin_distribution(work / "test-plugins"), dict(os.environ))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def child_env(work: Path) -> dict[str, str]:
    """The environment for timed commands, with the example plugin's `synth` stage discoverable.

    Where the plugin is not pip-installed, register it as any plugin is found: a ``*.dist-info`` with an
    ``entry_points.txt`` on the Python path. Bytecode caching is left on, as users have it.
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("TRTFLOW_STORE", None)
    probe = "from importlib.metadata import entry_points as e; print('synth' in e(group='trtflow.stages').names)"
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env).stdout.strip()
    if found != "True":
        info = work / "plugins" / "trtflow_bench_synth-0.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trtflow-bench-synth\nVersion: 0.0\n")
        (info / "entry_points.txt").write_text("[trtflow.stages]\nsynth = trtflow_example_plugin:stage\n")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(info.parent), str(EXAMPLE_PLUGIN),
                                                          env.get("PYTHONPATH")]))
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 5000, 20000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--phases", action="store_true", help="Also time load, expand, graph and plan in-process.")
    parser.add_argument("--code", action="store_true", help="Nodes with a data file and python: code (see above).")
    args = parser.parse_args()
    trtflow = [shutil.which("trtflow") or sys.executable, *([] if shutil.which("trtflow") else ["-m", "trtflow.cli"])]
    work = Path(tempfile.mkdtemp(prefix="trtflow-plan-scaling-"))
    (work / "pyproject.toml").write_text("")  # the project the recipes belong to
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load:.2f}; "
          f"median of {args.repeat}, empty store (every node stale){'; python: nodes' if args.code else ''}")
    try:
        env = code_env(work) if args.code else child_env(work)
        rows: list[tuple[int, float]] = []
        header = f"{'nodes':>6} | {'trtflow plan':>12} | {'per node':>9} | {'vs first':>8} | {'yaml.load (C) only':>18}"
        print(header + (" | load / expand / graph / plan (in-process)" if args.phases else ""))
        for n in args.sizes:
            recipe = write_recipe(work, n, args.code)
            store = work / f"store{n}"
            plan = statistics.median(timed([*trtflow, "plan", str(recipe), "--store", str(store)], work,
                                           args.repeat, env))
            yaml_only = statistics.median(timed(
                [sys.executable, "-c", "import sys, yaml; yaml.load(open(sys.argv[1]), Loader=yaml.CSafeLoader)",
                 str(recipe)], work, args.repeat, env))
            rows.append((n, plan))
            line = (f"{n:>6} | {plan:>10.2f} s | {plan / n * 1000:>6.2f} ms | {plan / rows[0][1]:>7.1f}x | "
                    f"{yaml_only:>16.2f} s")
            if args.phases:
                out = subprocess.run([sys.executable, "-c", PHASES, str(recipe), str(store)], cwd=work, env=env,
                                     capture_output=True, text=True, check=True).stdout.split()
                line += " | " + " / ".join(f"{float(t):.2f}" for t in out) + " s"
            print(line, flush=True)
        for (small, t_small), (big, t_big) in itertools.pairwise(rows):
            print(f"growth {small} -> {big} nodes ({big / small:.0f}x the nodes): {t_big / t_small:.1f}x the time")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
