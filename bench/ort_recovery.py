"""What crash recovery costs: the probe every stage pays before an ONNX Runtime session (a model that runs), and
the search on a model that crashes ONNX Runtime 1.24 (the generated crasher of the tests), each timed --repeat
times; prints median, min and max, and the number of child processes the search used.

    python bench/ort_recovery.py --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _mlp(path: Path) -> Path:
    """A 2-layer MLP (float32 [batch, 64] -> [batch, 10]) as an ONNX file, written with onnx.helper."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w1", (64, 128)), ("b1", (128,)), ("w2", (128, 10)), ("b2", (10,)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _time(fn, repeat: int) -> tuple[list[float], object]:
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return times, result


def _show(label: str, times: list[float], extra: str = "") -> None:
    print(f"{label}: median {statistics.median(times):.2f} s (min {min(times):.2f}, max {max(times):.2f}, "
          f"n={len(times)}){extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from tests.stages.ort_crasher import CRASH_OPTIONS, crasher_model
    from trtflow_stages.accuracy import recovery
    from trtflow_stages.runtimes.ort import OrtOptions

    with tempfile.TemporaryDirectory() as folder:
        mlp = _mlp(Path(folder) / "mlp.onnx")
        crasher = crasher_model(Path(folder) / "crasher.onnx")
        times, _ = _time(lambda: recovery.recover(mlp, OrtOptions()), args.repeat)
        _show("probe of a model that runs (one child: session + one run)", times)
        recovery.optimizers_at("all")  # the optimiser lists are read once per process; not part of a search
        times, found = _time(lambda: recovery.recover(crasher, OrtOptions(**CRASH_OPTIONS)), args.repeat)
        _show("search on the crashing model", times, f", {len(found.attempts)} children, found "
              f"{found.options.graph_optimization_level} without {found.options.disabled_optimizers}")


if __name__ == "__main__":
    main()
