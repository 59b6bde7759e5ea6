"""Orchestration overhead: time no-op re-runs of synthetic pipelines (and DVC's, where installed).

Generates pipelines of N cheap nodes (the example plugin's `synth` stage, which writes a small file; the bench
makes it discoverable itself, installed or not), runs each once (the cold run, timed too), then times
`trtflow run` of the unchanged recipe as a whole process:
  - the first no-op run after the cold run: it plans, finds everything up to date and leaves the no-op record;
  - the following no-op runs, which take the no-op shortcut (`trtflow.execution.noop`);
  - no-op runs with TRTFLOW_NO_SHORTCUT=1, which plan every time (what a changed machine or recipe costs).
Where `dvc` is installed, builds the same DAG as a DVC pipeline (each stage a tiny file-writing command) and
times `dvc repro`. The commands are timed in alternating rounds (trtflow, trtflow planning, dvc, then again), so
that a noisy machine slows all of them alike; each round gives one ratio to DVC. Figures are medians with the
spread (min-max) over --repeat rounds, and the ratio's 95% bootstrap interval (scipy) where scipy is installed.
Also times `trtflow --help` and `trtflow plan`, and checks that the no-op path imports none of torch, onnx,
onnxruntime, polygraphy, modelopt, nor typer, rich or pydantic (the recipe schema) once it takes the shortcut; the
planning path validates the recipe, so pydantic may load there, but no CLI framework beyond click
(tests/test_cli_startup.py holds the same deny-lists).

    python bench/noop_overhead.py --sizes 50 500 --repeat 9
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("torch", "onnx", "onnxruntime", "polygraphy", "modelopt", "tensorrt", "tensorrt_rtx", "typer", "rich")
#: Heavy on the shortcut only: planning validates the recipe with the stages' pydantic models.
SHORTCUT_HEAVY = (*HEAVY, "pydantic")


def trtflow_cmd() -> list[str]:
    exe = shutil.which("trtflow")
    return [exe] if exe else [sys.executable, "-m", "trtflow.cli"]


def dag(n: int) -> list[tuple[str, str | None]]:
    """A layered DAG: node i depends on node i // 2 (a binary tree), so there is real fan-out."""
    return [(f"n{i:04d}", None if i == 0 else f"n{(i - 1) // 2:04d}") for i in range(n)]


def write_trtflow_recipe(folder: Path, n: int) -> Path:
    lines = [f"name: noop{n}", "nodes:"]
    for name, parent in dag(n):
        lines.append(f"  - name: {name}")
        lines.append("    stage: synth")
        lines.append(f"    params: {{text: {name}, size: 64}}")
        if parent:
            lines.append(f"    inputs: {{source: {parent}}}")
    path = folder / "recipe.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_dvc_pipeline(folder: Path, n: int) -> None:
    lines = ["stages:"]
    for name, parent in dag(n):
        deps = f"\n    deps: [out/{parent}.txt]" if parent else ""
        command = f"mkdir -p out && echo {name} > out/{name}.txt"
        lines.append(f"  {name}:\n    cmd: {command}{deps}\n    outs: [out/{name}.txt]")
    (folder / "dvc.yaml").write_text("\n".join(lines) + "\n")


def child_env() -> dict[str, str]:
    """The environment for timed commands: Python's default bytecode caching, as users have it.

    Some sandboxes set PYTHONDONTWRITEBYTECODE=1, which makes every start recompile an editable install's
    sources (DVC, installed from wheels, has its bytecode precompiled): unset it so both compare alike.
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def with_example_plugin(env: dict[str, str], folder: Path) -> dict[str, str]:
    """``env`` in which `trtflow` finds the example `synth` stage, whether or not examples/plugin is installed."""
    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo))
    from tests.reliability.plugins import subprocess_env, write_plugin_distribution

    return subprocess_env(write_plugin_distribution(folder / "plugins"), env)


ENV: dict[str, str] = {}


def timed(cmd: list[str], cwd: Path, repeat: int, env: dict | None = None) -> list[float]:
    env = env or ENV or child_env()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return times


def heavy_imports(cwd: Path, recipe: Path, env: dict[str, str], heavy: tuple[str, ...]) -> list[str]:
    """The heavy modules a no-op `trtflow run` imports (run twice: the first run of this interpreter's command
    line plans and leaves the record that the second one's shortcut checks)."""
    code = (f"import sys, runpy; sys.argv = ['trtflow', 'run', '-q', {str(recipe)!r}]\n"
            "try:\n    runpy.run_module('trtflow.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('MODULES', ' '.join(sorted(sys.modules)))")
    modules: list[str] = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, env=env).stdout
        modules = next((line.split()[1:] for line in out.splitlines() if line.startswith("MODULES")), [])
    return sorted({m.split(".")[0] for m in modules} & set(heavy))


def spread(times: list[float]) -> str:
    return f"median {statistics.median(times):.3f} s (min {min(times):.3f}, max {max(times):.3f}, n={len(times)})"


def ratio_interval(ours: list[float], theirs: list[float]) -> str:
    """Median of the per-round ratios, with its 95% bootstrap interval when scipy is there."""
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    text = f"{statistics.median(ratios):.2f}x"
    try:
        from scipy.stats import bootstrap
    except ImportError:
        return text + f" (min {min(ratios):.2f}, max {max(ratios):.2f})"
    if len(ratios) < 3:
        return text
    ci = bootstrap((ratios,), statistics.median, confidence_level=0.95, n_resamples=2000, method="percentile",
                   random_state=0).confidence_interval
    return text + f" (95% CI {ci.low:.2f}-{ci.high:.2f}, n={len(ratios)})"


def alternating(commands: dict[str, tuple[list[str], Path, dict[str, str] | None]], rounds: int
                ) -> dict[str, list[float]]:
    """Time each command once per round, in turn, for ``rounds`` rounds."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(rounds):
        for name, (cmd, cwd, env) in commands.items():
            times[name] += timed(cmd, cwd, 1, env)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 500])
    parser.add_argument("--repeat", type=int, default=9, help="Rounds of alternating timings.")
    parser.add_argument("--no-dvc", action="store_true", help="Do not compare with DVC even if installed.")
    args = parser.parse_args()
    tf = trtflow_cmd()
    dvc = None if args.no_dvc else shutil.which("dvc")
    root = Path(tempfile.mkdtemp(prefix="trtflow-bench-"))
    ENV.update(with_example_plugin(child_env(), root))
    planning = dict(ENV, TRTFLOW_NO_SHORTCUT="1")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load:.2f}, "
          f"dvc: {dvc or 'not installed'}")
    try:
        help_t = timed([*tf, "--help"], root, args.repeat)
        print(f"trtflow --help: {spread(help_t)}")
        for n in args.sizes:
            folder = root / f"tf{n}"
            folder.mkdir()
            recipe = write_trtflow_recipe(folder, n)
            start = time.perf_counter()
            timed([*tf, "run", "-q", "-j", str(os.cpu_count() or 2), str(recipe)], folder, 1)
            first = time.perf_counter() - start
            first_noop = timed([*tf, "run", "-q", str(recipe)], folder, 1)[0]
            commands = {"shortcut": ([*tf, "run", "-q", str(recipe)], folder, None),
                        "planning": ([*tf, "run", "-q", str(recipe)], folder, planning)}
            if dvc:
                dfolder = root / f"dvc{n}"
                dfolder.mkdir()
                subprocess.run(["git", "init", "-q"], cwd=dfolder, check=True)
                subprocess.run([dvc, "init", "-q"], cwd=dfolder, check=True)
                write_dvc_pipeline(dfolder, n)
                timed([dvc, "repro", "-q"], dfolder, 2, child_env())  # the build, then its first no-op
                commands["dvc"] = ([dvc, "repro", "-q"], dfolder, child_env())
            times = alternating(commands, args.repeat)
            plan = timed([*tf, "plan", str(recipe)], folder, args.repeat)
            print(f"{n:4d} nodes: cold run {first:.2f} s; first no-op (plans, leaves the record) {first_noop:.3f} s")
            print(f"      no-op run (shortcut)        {spread(times['shortcut'])}")
            print(f"      no-op run (planning)        {spread(times['planning'])}")
            print(f"      trtflow plan                {spread(plan)}")
            if dvc:
                print(f"      dvc repro no-op             {spread(times['dvc'])}")
                print(f"      trtflow/dvc: shortcut {ratio_interval(times['shortcut'], times['dvc'])}; "
                      f"planning {ratio_interval(times['planning'], times['dvc'])}", flush=True)
            for what, env, deny in (("shortcut", ENV, SHORTCUT_HEAVY), ("planning", planning, HEAVY)):
                heavy = heavy_imports(folder, recipe, env, deny)
                print(f"      no-op run ({what}) imports heavy modules: {', '.join(heavy) if heavy else 'none'}",
                      flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
