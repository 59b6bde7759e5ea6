"""Two trtflow installs side by side: cold and no-op runs of the same synthetic pipelines, in alternating rounds.

For a change to the engine: time the install before it (e.g. the main checkout's venv) against the install after
it, on pipelines of N cheap `synth` nodes (see noop_overhead.py). Each round, for each install in turn: a cold run
in a fresh store (`-j 2`), the first no-op run, then, past the stat cache's racy window, two no-op runs of which
the second is timed, and the same with TRTFLOW_NO_SHORTCUT=1 (planning every time). A run that fails is reported
with its last line and retried in a fresh folder (counted). Figures: median (min-max) per install, and the per-round
ratio of B to A.

    python bench/ab_runs.py /work/main/.venv/bin/trtflow .venv/bin/trtflow --sizes 50 500 --rounds 6
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.noop_overhead import child_env, with_example_plugin, write_trtflow_recipe

RACY_WINDOW_S = 2.1  # fingerprint.RACY_WINDOW_NS: younger files are not trusted on their signature yet


class Failed(Exception):
    pass


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise Failed(f"exit {proc.returncode}: {lines[-1] if lines else ''}")
    return took


def one_round(exe: str, folder: Path, n: int, env: dict[str, str]) -> dict[str, float]:
    recipe = write_trtflow_recipe(folder, n)
    run = [exe, "run", "-q", str(recipe)]
    times = {"cold": timed([exe, "run", "-q", "-j", "2", str(recipe)], folder, env)}
    times["first no-op"] = timed(run, folder, env)
    time.sleep(RACY_WINDOW_S)
    timed(run, folder, env)
    times["no-op"] = timed(run, folder, env)
    times["no-op, planning"] = timed(run, folder, dict(env, TRTFLOW_NO_SHORTCUT="1"))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="the trtflow executable of install A (before)")
    parser.add_argument("b", help="the trtflow executable of install B (after)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 500])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    args.a, args.b = (str(Path(shutil.which(x) or x).resolve()) for x in (args.a, args.b))  # runs use other cwds
    root = Path(tempfile.mkdtemp(prefix="trtflow-ab-"))
    env = with_example_plugin(child_env(), root)
    try:
        for n in args.sizes:
            results: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}
            failures = {"A": 0, "B": 0}
            for r in range(args.rounds):
                for name, exe in (("A", args.a), ("B", args.b)):
                    for attempt in range(5):
                        folder = root / f"{n}-{name}{r}-{attempt}"
                        folder.mkdir()
                        try:
                            times = one_round(exe, folder, n, env)
                            break
                        except Failed as exc:
                            failures[name] += 1
                            print(f"  {name} round {r} failed: {exc}", flush=True)
                    else:
                        raise SystemExit(f"{name} failed 5 times in a row")
                    for what, took in times.items():
                        results[name].setdefault(what, []).append(took)
            print(f"{n} nodes, {args.rounds} rounds (failed runs retried: A {failures['A']}, B {failures['B']})")
            for what in results["A"]:
                a, b = results["A"][what], results["B"][what]
                ratios = [y / x for x, y in zip(a, b, strict=True)]
                print(f"  {what:16s} A {statistics.median(a):.3f} s ({min(a):.3f}-{max(a):.3f})  "
                      f"B {statistics.median(b):.3f} s ({min(b):.3f}-{max(b):.3f})  "
                      f"B/A {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
