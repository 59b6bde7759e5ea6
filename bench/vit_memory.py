"""Wall time and peak memory of every node of a ViT pipeline, run by `trtflow run` as a user would run it.

Builds a recipe in a work folder for a Vision Transformer defined in code (examples/models/vit.py; ViT-B/16
by default: 86.6M parameters), with synthetic images for calibration and validation:

    export -> simplify -> convert (fp16, AutoCast) -> validate-fp16
                       -> quantize (int8, ModelOpt)  -> validate-int8
                       -> build-fp16 / build-int8 (TensorRT-RTX, built on the CPU; --no-build skips them)

runs it at the given -j, and prints per node what `trtflow show --json` recorded for its latest run: wall time,
peak RSS (the engine's measure: ru_maxrss of the process that ran the node, which runs the stage in-process,
ModelOpt and ONNX Runtime included), the result, and the figures measured on the same model before this work
(issue 13) beside them.

    python bench/vit_memory.py                       # ViT-B/16, the issue's data sizes (32 / 16 images)
    python bench/vit_memory.py --depth 2             # ViT-B width, 2 layers: a quick, smaller run
    python bench/vit_memory.py --calibration-samples 128   # memory must not grow with the data

Run it alone on a shared machine: the full model needs a few GiB per node.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Issue 13's table (ViT-B/16, 32 calibration and 16 validation images, -j 2, before this work).
BEFORE: dict[str, tuple[str, str, str]] = {
    "export": ("21.6 s", "1.4 GiB", "ok"),
    "simplify": ("16.1 s", "2.5 GiB", "ok"),
    "convert-fp16": ("85.2 s", "21.2 GiB", "ok"),
    "quantize-int8": ("77.4 s", "3.7 GiB", "ok"),
    "validate-fp16": ("8 s", "1.0 GiB", "cosine 1.0000"),
    "validate-int8": ("12 s", "1.3 GiB", "cosine 0.291"),
    "build-fp16": ("4.0 s", "0.5 GiB", "181 MB engine"),
    "build-int8": ("7.4 s", "0.9 GiB", "106 MB engine"),
}


@dataclass
class Shape:
    image_size: int
    patch: int
    dim: int
    depth: int
    heads: int
    mlp_dim: int
    classes: int

    def factory_args(self) -> dict[str, int]:
        return {"image_size": self.image_size, "patch": self.patch, "dim": self.dim, "depth": self.depth,
                "heads": self.heads, "mlp_dim": self.mlp_dim, "num_classes": self.classes}

    def parameters(self) -> int:
        tokens = (self.image_size // self.patch) ** 2 + 1
        block = 4 * self.dim * self.dim + 4 * self.dim + 2 * self.dim * self.mlp_dim + self.mlp_dim + self.dim \
            + 4 * self.dim
        embed = 3 * self.patch * self.patch * self.dim + self.dim + (tokens + 1) * self.dim
        return self.depth * block + embed + 2 * self.dim + self.dim * self.classes + self.classes


def images(count: int, size: int, seed: int):
    """Smooth synthetic images normalised like ImageNet inputs (blocky low frequencies plus texture)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    cells = max(size // 16, 1)
    coarse = rng.normal(0.0, 1.0, size=(count, 3, cells, cells)).astype(np.float32)
    repeat = -(-size // cells)
    pictures = coarse.repeat(repeat, axis=2).repeat(repeat, axis=3)[:, :, :size, :size]
    return (pictures + rng.normal(0.0, 0.25, size=pictures.shape)).astype(np.float32)


def write_recipe(workdir: Path, shape: Shape, calibration: int, validation: int, build: bool,
                 calibration_batch: int | None) -> Path:
    import numpy as np

    shutil.copyfile(REPO / "examples" / "models" / "vit.py", workdir / "vit.py")
    np.savez(workdir / "calib.npz", images=images(calibration, shape.image_size, 1))
    np.savez(workdir / "val.npz", images=images(validation, shape.image_size, 2))
    s = shape.image_size
    batch_param = f", batch_size: {calibration_batch}" if calibration_batch else ""
    nodes = f"""\
name: vit
profiles:
  dynamic: {{images: {{min: [1, 3, {s}, {s}], opt: [4, 3, {s}, {s}], max: [8, 3, {s}, {s}]}}}}
nodes:
  - name: export
    stage: export
    params:
      model: python:vit.py:build
      factory_args: {json.dumps(shape.factory_args())}
      inputs: {{images: {{shape: [2, 3, {s}, {s}], dynamic_axes: {{0: batch}}}}}}
      outputs: [logits]
  - name: simplify
    stage: simplify
    params: {{input_shapes: {{images: [1, 3, {s}, {s}]}}}}
  - name: convert
    stage: convert
    matrix: {{dtype: [fp16]}}
    inputs: {{model: simplify}}
    params: {{precision: fp16, calibration_data: {{path: calib.npz{batch_param}}}}}
  - name: quantize
    stage: quantize
    matrix: {{dtype: [int8]}}
    inputs: {{model: simplify}}
    params: {{mode: int8, calibration_data: {{path: calib.npz{batch_param}}}}}
  - name: validate
    stage: validate
    matrix: {{dtype: [fp16, int8]}}
    inputs: {{reference: simplify, candidate: [convert, quantize]}}
    params: {{expect: "${{{{ matrix.dtype }}}}", data: {{path: val.npz}}, batch_size: 1}}
"""
    if build:
        nodes += """\
  - name: build
    stage: build
    matrix: {dtype: [fp16, int8]}
    inputs: {model: [convert, quantize]}
    params: {profile: dynamic}
"""
    recipe = workdir / "vit.yaml"
    recipe.write_text(nodes, encoding="utf-8")
    return recipe


def node_records(trtflow: list[str], recipe: Path, store: Path, names: list[str]) -> dict[str, dict]:
    """Per node: status, summary, duration and peak RSS of its latest run, from `trtflow show --json`."""
    records: dict[str, dict] = {}
    for name in names:
        shown = subprocess.run([*trtflow, "show", str(recipe), name, "--store", str(store), "--json"],
                               cwd=recipe.parent, capture_output=True, text=True)
        if shown.returncode != 0:
            continue
        infos = json.loads(shown.stdout)
        for info in infos if isinstance(infos, list) else [infos]:
            last = info.get("last_run") or {}
            records[info["node"]] = {
                "stage": info["stage"], "status": last.get("status") or info["status"],
                "summary": info.get("summary") or json.loads(last.get("summary") or "null") or {},
                "duration": last.get("duration"), "peak_rss": last.get("peak_rss") or info.get("peak_rss"),
            }
    return records


def gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**30:.2f} GiB"


def result_text(node: dict) -> str:
    summary = node.get("summary") or {}
    status = node.get("status") or "?"
    if node.get("stage") == "validate" and summary:
        cosines = [o.get("cosine_similarity") for o in (summary.get("outputs") or {}).values()]
        cosine = f"cosine {cosines[0]:.4f}" if cosines and cosines[0] is not None else ""
        return f"{status} {cosine}".strip()
    if node.get("stage") == "build" and summary.get("engine_bytes"):
        return f"{status} {summary['engine_bytes'] / 1e6:.0f} MB engine"
    if node.get("stage") == "convert" and summary:
        return f"{status} ({summary.get('fp32_nodes')} nodes kept fp32)"
    if node.get("stage") == "quantize" and summary:
        return f"{status} ({summary.get('quantized_nodes')} nodes quantized)"
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--patch", type=int, default=16)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--mlp-dim", type=int, default=3072)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--calibration-samples", type=int, default=32)
    parser.add_argument("--validation-samples", type=int, default=16)
    parser.add_argument("--calibration-batch", type=int, default=None,
                        help="rows per ModelOpt calibration call (default: the stages' own)")
    parser.add_argument("-j", "--jobs", type=int, default=0, help="trtflow run -j (0: its default)")
    parser.add_argument("--no-build", action="store_true", help="leave out the TensorRT-RTX engine builds")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the run here (default: a temp dir)")
    args = parser.parse_args()

    shape = Shape(args.image_size, args.patch, args.dim, args.depth, args.heads, args.mlp_dim, args.classes)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="vit-memory-"))
    workdir.mkdir(parents=True, exist_ok=True)
    recipe = write_recipe(workdir, shape, args.calibration_samples, args.validation_samples, not args.no_build,
                          args.calibration_batch)
    store = workdir / ".trtflow"
    trtflow = [str(Path(sys.executable).with_name("trtflow"))]
    print(f"ViT image {shape.image_size}, patch {shape.patch}, width {shape.dim}, depth {shape.depth}, "
          f"{shape.parameters() / 1e6:.1f}M parameters (~{shape.parameters() * 4 / 1e6:.0f} MB fp32); "
          f"{args.calibration_samples} calibration / {args.validation_samples} validation images; "
          f"-j {args.jobs or 'default'}; work folder {workdir}", flush=True)
    started = time.perf_counter()
    run = subprocess.run([*trtflow, "run", str(recipe), "--store", str(store), "-j", str(args.jobs), "-k", "-q"],
                         cwd=workdir)
    total = time.perf_counter() - started
    nodes = node_records(trtflow, recipe, store, ["export", "simplify", "convert", "quantize", "validate", "build"])
    is_vit_b = shape == Shape(224, 16, 768, 12, 12, 3072, 1000) and args.calibration_samples == 32
    header = f"{'node':<15} {'wall':>8} {'peak RSS':>10}  {'result':<32}"
    if is_vit_b:
        header += f" | before: {'wall':>7} {'peak RSS':>9}  result"
    print(header)
    print("-" * len(header))
    for name, node in nodes.items():
        duration = node.get("duration")
        line = (f"{name:<15} {'-' if duration is None else f'{duration:.1f} s':>8} "
                f"{gib(node.get('peak_rss')):>10}  {result_text(node):<32}")
        if is_vit_b and name in BEFORE:
            wall, rss, result = BEFORE[name]
            line += f" | {'':8}{wall:>7} {rss:>9}  {result}"
        print(line)
    peaks = [n["peak_rss"] for n in nodes.values() if n.get("peak_rss")]
    print(f"total {total:.1f} s, trtflow run exit code {run.returncode}; the largest node peaked at "
          f"{gib(max(peaks, default=None))} (fp32 model ~{shape.parameters() * 4 / 2**30:.2f} GiB)")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
