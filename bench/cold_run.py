"""Cold-run cost: `trtflow run` in a fresh store against the same steps done by hand in one Python process.

The hand-written equivalent (``--script``, also runnable alone) calls the same stages, in the recipe's order,
with the same parameters, in a single process: no store, no hashing, no journal, no node processes, no
locks. It is what a user who wrote the pipeline as one script with the same libraries would run. Both are
timed as whole processes, alternating, and the medians compared; the ONNX artifacts of both are compared
byte for byte.

    python bench/cold_run.py                          # pipelines/quickstart.yaml, 5 alternating pairs
    python bench/cold_run.py --recipe pipelines/quickstart.yaml --repeat 9
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def by_hand(recipe: Path, out: Path) -> None:
    """The pipeline as one hand-written script: each stage called in turn on the previous stages' files."""
    from trtflow.fsutil import allowed_roots_for
    from trtflow.graph import build_graph
    from trtflow.recipe.expand import expand
    from trtflow.recipe.load import load_recipe
    from trtflow.registry import get_stage
    from trtflow.stage import StageContext

    loaded = load_recipe(recipe)
    graph = build_graph(expand(loaded, get_stage), get_stage, loaded.recipe.name)
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
        stage.run(ctx, inputs, node.params_model)  # type: ignore[arg-type]
        for out_name in stage.outputs:
            produced[(name, out_name)] = ctx.output(out_name)


def trtflow_cmd() -> list[str]:
    exe = shutil.which("trtflow")
    return [exe] if exe else [sys.executable, "-m", "trtflow.cli"]


def timed(cmd: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return elapsed


def same_onnx(script_dir: Path, tool_out: Path) -> tuple[int, list[str]]:
    """Compare the script's <node>/out/*.onnx with trtflow's build/<recipe>/<node>/*.onnx."""
    pairs = [(p, tool_out / p.relative_to(script_dir).parts[0] / p.relative_to(script_dir / p.relative_to(
        script_dir).parts[0] / "out")) for p in sorted(script_dir.glob("*/out/**/*.onnx"))]
    differ = [str(b.relative_to(tool_out)) for a, b in pairs if not b.exists() or not filecmp.cmp(a, b, shallow=False)]
    return len(pairs), differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=REPO / "pipelines" / "quickstart.yaml")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--script", type=Path, help="Run only the hand-written equivalent, writing here.")
    args = parser.parse_args()
    recipe = args.recipe.resolve()
    if args.script:
        by_hand(recipe, args.script.resolve())
        return
    root = Path(tempfile.mkdtemp(prefix="trtflow-cold-"))
    load = os.getloadavg()[0]
    print(f"{recipe.name}: {args.repeat} alternating pairs, {os.cpu_count()} CPUs, load average {load:.2f}")
    tool, script = [], []
    try:
        for i in range(args.repeat):
            run_dir, script_dir = root / f"trtflow-{i}", root / f"script-{i}"
            run_dir.mkdir()
            tool.append(timed([*trtflow_cmd(), "run", str(recipe), "-q", "--store", str(run_dir / "store"),
                               "--output-dir", str(run_dir / "out")], run_dir))
            script.append(timed([sys.executable, __file__, "--recipe", str(recipe), "--script", str(script_dir)],
                                root))
            print(f"  pair {i + 1}: trtflow run {tool[-1]:6.2f} s | one-process script {script[-1]:6.2f} s", flush=True)
        count, differ = same_onnx(root / "script-0", root / "trtflow-0" / "out")
        ratio = statistics.median(tool) / statistics.median(script)
        print(f"median: trtflow run {statistics.median(tool):.2f} s | one-process script "
              f"{statistics.median(script):.2f} s | ratio {ratio:.2f}x")
        print(f"ONNX artifacts compared: {count}, differing: {', '.join(differ) if differ else 'none'} (a chooser's "
              "output, e.g. select's, differs when noisy timings picked another candidate)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
