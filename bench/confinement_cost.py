"""What confining a model file's code costs an export: the same model exported confined and trusted, in rounds.

For each format (a TorchScript archive and a torch.export program of a small MLP; with ``--tensorflow`` also a Keras
SavedModel), each round exports the model twice in a fresh folder, in alternating order: with ``trust_code: true``
(as trtflow read these files before it confined them: in the node's process for PyTorch, an unconfined child for
TensorFlow) and without (in the sandboxed child: bubblewrap's namespaces, the seccomp allow-list, Landlock).
Each export runs in a process forked
from this one, which has imported torch, onnx and onnxruntime and exported nothing: as trtflow's local executor
forks each node from a warm server that preloaded the stage's modules. One warm-up export of each kind (file
caches) is not counted.

For the PyTorch formats a third mode, the same child process unconfined (`confinement.run` with
``confine_child=False``), separates what a fresh process costs from what the kernel's confinement costs.

Figures: per format and mode, the median wall time and its range over the rounds; per round, the extra seconds
of the confined export over the trusted one, and over the unconfined child, each with their mean, a 95%
t-interval and the range.

    python bench/confinement_cost.py --rounds 3 [--tensorflow]
    python bench/confinement_cost.py --startup 30     # the sandbox alone: an empty interpreter, launched each way
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_KERAS = """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import keras
inputs = keras.Input(shape=(8,), name="features")
model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Dense(16, activation="relu")(inputs)))
model.export(sys.argv[1], verbose=False)
"""


def _models(folder: Path, tensorflow: bool) -> dict[str, dict]:
    import torch

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            return self.fc(features).relu()

    torch.jit.save(torch.jit.script(Mlp().eval()), folder / "mlp.pt")
    program = torch.export.export(Mlp().eval(), (torch.randn(2, 8),), dynamic_shapes=({0: torch.export.Dim("b")},))
    torch.export.save(program, folder / "mlp.pt2")
    models = {"torchscript": {"model": "mlp.pt", "inputs": {"features": {"shape": [2, 8],
                                                                         "dynamic_axes": {0: "batch"}}}},
              "exported_program": {"model": "mlp.pt2"}}
    if tensorflow:
        subprocess.run([sys.executable, "-c", _KERAS, str(folder / "saved")], check=True, capture_output=True)
        models["tensorflow"] = {"model": "saved"}
    return models


def _child_unconfined(folder: Path, params: dict) -> dict:
    """The PyTorch export as the confined path runs it, in a child process that does not confine itself."""
    from trtflow_stages import export
    from trtflow_stages.formats import confinement
    from trtflow_stages.formats.detect import detect

    source = (folder / params["model"]).absolute()
    box = Path(tempfile.mkdtemp(dir=folder, prefix="work-")) / "confined"
    request = {"node": "export", "params": export.Params(**params).model_dump(mode="json"),
               "format": detect(params["model"], source).name, "source": str(source)}
    answer = confinement.run("trtflow_stages.export:export_in_child", request, box, [source], confine_child=False)
    return {"model_code": "child", "checked": answer["check"]["checked"]}


def _export(folder: Path, params: dict, mode: str) -> float:
    """Seconds one export takes in a process forked from this one (a node of the local executor)."""
    import os

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 0
        try:
            from trtflow.testing import run_stage
            from trtflow_stages import export

            work = Path(tempfile.mkdtemp(dir=folder, prefix="work-"))
            start = time.perf_counter()
            if mode == "child":
                summary = _child_unconfined(folder, params)
            else:
                summary = run_stage(export.stage, {**params, "trust_code": mode == "trusted"}, workdir=work,
                                    recipe_dir=folder).summary
            took = time.perf_counter() - start
            ok = summary.get("model_code") == mode and summary.get("checked") is True
            os.write(write, json.dumps({"seconds": took} if ok else {"error": summary}).encode())
        except BaseException as error:  # report anything to the parent, which stops
            os.write(write, json.dumps({"error": repr(error)}).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        data = json.loads(answer.read() or b"{}")
    os.waitpid(pid, 0)
    if "seconds" not in data:
        raise SystemExit(f"the export failed: {data.get('error')}")
    return float(data["seconds"])


def _t_interval(values: list[float]) -> tuple[float, float]:
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return mean - half, mean + half


def _startup(count: int) -> dict[str, list[float]]:
    """The sandbox's own price, without torch: ``count`` launches each of an empty interpreter
    (``python -I -S -c ''``), alternating plain and inside the sandbox (bubblewrap, its mounts, the seccomp
    allow-list), as `confinement` launches a model's child."""
    from trtflow_stages.formats import confinement

    command = [sys.executable, "-I", "-S", "-c", ""]
    times: dict[str, list[float]] = {"plain": [], "sandboxed": []}
    box = os.open(tempfile.mkdtemp(prefix="trtflow-bench-"), os.O_RDONLY | os.O_DIRECTORY)
    for index in range(count):
        for mode in (("plain", "sandboxed") if index % 2 == 0 else ("sandboxed", "plain")):
            start = time.perf_counter()
            if mode == "plain":
                proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            else:
                proc = confinement._launch(command, {}, [], subprocess.DEVNULL, subprocess.DEVNULL, box, True)
            if proc.wait() != 0:
                raise SystemExit(f"the {mode} launch failed")
            times[mode].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tensorflow", action="store_true", help="also a Keras SavedModel (needs tf2onnx)")
    parser.add_argument("--json", type=Path, help="write the raw times here")
    parser.add_argument("--startup", type=int, metavar="N",
                        help="only the sandbox's own price: N launches of an empty interpreter each way")
    args = parser.parse_args()
    if args.startup:
        times = _startup(args.startup)
        extra = [s - p for s, p in zip(times["sandboxed"], times["plain"], strict=True)]
        low, high = _t_interval(extra)
        plain, boxed = (statistics.median(times[mode]) * 1e3 for mode in ("plain", "sandboxed"))
        print(f"empty interpreter, {args.startup} launches each, alternating: plain median {plain:.1f} ms, "
              f"sandboxed {boxed:.1f} ms; "
              f"sandbox extra mean {statistics.fmean(extra) * 1e3:+.1f} ms [95% t-interval {low * 1e3:+.1f}, "
              f"{high * 1e3:+.1f}] (median {statistics.median(extra) * 1e3:+.1f}, range {min(extra) * 1e3:+.1f} to "
              f"{max(extra) * 1e3:+.1f})")
        if args.json:
            args.json.write_text(json.dumps({"startup": times}, indent=1) + "\n")
        return
    logging.disable(logging.WARNING)
    import onnx  # noqa: F401  (as a node's warm process has them)
    import onnxruntime  # noqa: F401
    import torch  # noqa: F401

    import trtflow.testing  # noqa: F401  (the stage module, as the warm server imports it)
    from trtflow_stages import export  # noqa: F401
    from trtflow_stages.formats import confinement

    capability = confinement.probe()
    if not capability.available:
        raise SystemExit(f"cannot measure: {capability.describe()}")
    raw: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        models = _models(folder, args.tensorflow)
        for fmt, params in models.items():
            modes = ["trusted", "confined"] + (["child"] if fmt != "tensorflow" else [])
            for mode in modes:
                _export(folder, params, mode)
            times: dict[str, list[float]] = {mode: [] for mode in modes}
            for index in range(args.rounds):
                for mode in modes[index % len(modes):] + modes[:index % len(modes)]:
                    times[mode].append(_export(folder, params, mode))
            raw[fmt] = times
    print(f"confinement: {capability.describe()}; {args.rounds} rounds per format")
    print(f"{'format':<17} {'mode':<32} {'seconds: median (range)':<24} extra over trusted, over unconfined child: "
          "mean [95% t-interval] (range)")
    labels = {"trusted": "trusted (node's process / child)", "confined": "confined child",
              "child": "unconfined child"}
    for fmt, times in raw.items():
        for mode, values in times.items():
            line = f"{fmt:<17} {labels[mode]:<32} {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"
            if mode == "confined":
                for base in ("trusted", "child"):
                    if base in times:
                        extra = [c - t for c, t in zip(values, times[base], strict=True)]
                        low, high = _t_interval(extra)
                        line += (f"{'' if base == 'trusted' else ';':<4}{statistics.fmean(extra):+.2f} "
                                 f"[{low:+.2f}, {high:+.2f}] ({min(extra):+.2f} to {max(extra):+.2f})")
            print(line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"capability": capability.describe(), "rounds": args.rounds,
                                         "seconds": raw}, indent=1) + "\n")


if __name__ == "__main__":
    main()
