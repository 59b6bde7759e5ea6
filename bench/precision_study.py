"""The precision study's figures (bench/precision_study.md): engine builds repeated, and one table per run.

    # build an ONNX model (e.g. the nvfp4 ViT-B the GPU run exported) with the build stage, N times
    python bench/precision_study.py build MODEL.onnx --repeats 3 --input images --image 224
    # the table of a run: ONNX size, accuracy against fp32, build time, engine size, latency, top kernels
    python bench/precision_study.py summarize OUTPUT_DIR [OUTPUT_DIR ...]

OUTPUT_DIR is a `trtflow run --output-dir` folder of pipelines/precision_study.yaml (several: the GPU run's and
the CPU run's). Latency is the median of the benchmark's repeats (each a trtexec-style run of at least 1 s), with the
lowest and highest repeat median beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any


def build(model: Path, repeats: int, input_name: str, image: int, capability: str) -> list[dict[str, Any]]:
    from trtflow.testing import run_stage
    from trtflow_stages.build import stage

    shape = [3, image, image]
    profile = {"name": "b8", "shapes": {input_name: {"min": [1, *shape], "opt": [8, *shape], "max": [16, *shape]}}}
    results = []
    for repeat in range(repeats):
        with tempfile.TemporaryDirectory(prefix="precision-build-") as work:
            run = run_stage(stage, {"backend": "tensorrt-rtx", "compute_capabilities": [capability],
                                    "profile": profile}, {"model": model}, Path(work))
            summary = run.summary
            results.append({"repeat": repeat + 1, "engine_bytes": summary["engine_bytes"],
                            "build_seconds": summary["build_seconds"], "parse_seconds": summary["parse_seconds"],
                            "heavy_layers": summary["precision_audit"]["heavy_layers"]})
            print(json.dumps(results[-1]), flush=True)
    seconds = [r["build_seconds"] for r in results]
    print(f"{model.name}: {model.stat().st_size / 1e6:.1f} MB ONNX -> {results[0]['engine_bytes'] / 1e6:.1f} MB engine;"
          f" build {statistics.median(seconds):.1f} s median of {len(seconds)} (range {min(seconds):.1f}-"
          f"{max(seconds):.1f} s)")
    return results


def _read(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / name
    return json.loads(path.read_text()) if path.is_file() else None


def summarize(folders: list[Path]) -> None:
    nodes: dict[str, Path] = {}
    for folder in folders:
        for child in sorted(p for p in folder.iterdir() if p.is_dir()):
            nodes.setdefault(child.name, child)
    print("| node | ONNX / engine (MB) | build (s) | cosine vs fp32 | mean abs err | max abs err | p50 latency (ms), "
          "median of repeats [min-max] | throughput (inf/s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, folder in nodes.items():
        engine, validate, bench = (_read(folder, "engine.json"), _read(folder, "validate.json"),
                                   _read(folder, "benchmark.json"))
        onnx = folder / "model.onnx"
        size = f"{engine['engine_bytes'] / 1e6:.1f}" if engine else f"{onnx.stat().st_size / 1e6:.1f}" \
            if onnx.is_file() else ""
        build_s = f"{engine['build_seconds']:.1f}" if engine else ""
        accuracy = ["", "", ""]
        if validate:
            out = next(iter(validate["outputs"].values()))
            accuracy = [f"{out['cosine_similarity']:.5f}", f"{out['mean_abs_error']:.4g}",
                        f"{out['max_abs_error']:.4g}"]
        latency = throughput = ""
        if bench and bench.get("points"):
            report = bench["points"][0]["report"]
            medians = [r["median_ms"] for r in report.get("repeats", [])] or [report["latency_ms"]["median"]]
            latency = (f"{statistics.median(medians):.3f} [{min(medians):.3f}-{max(medians):.3f}] "
                       f"(n={len(medians)}x{report['queries']})")
            throughput = f"{report['throughput_qps']:.0f}"
        if any((size, build_s, *accuracy, latency)):
            print(f"| {name} | {size} | {build_s} | {' | '.join(accuracy)} | {latency} | {throughput} |")
    for name, folder in nodes.items():
        kernels = _read(folder, "kernels.json")
        if not kernels or not kernels.get("kernels"):
            continue
        print(f"\n{name}: {kernels['kernel_time_per_iteration_ms']:.3f} ms of kernels per iteration "
              f"({kernels['iterations']} iterations, {kernels['tool']}; nsys: {kernels['nsys']['reason'][:90]})")
        for row in kernels["kernels"][:5]:
            print(f"  {row['time_percent']:5.1f}%  {row['avg_ns'] / 1000:8.2f} us avg  "
                  f"{row['instances'] / kernels['iterations']:5.1f}/iter  {row['name'][:100]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build")
    b.add_argument("model", type=Path)
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--input", default="images")
    b.add_argument("--image", type=int, default=224)
    b.add_argument("--capability", default="12.0")
    s = commands.add_parser("summarize")
    s.add_argument("folders", type=Path, nargs="+")
    args = parser.parse_args()
    if args.command == "build":
        build(args.model, args.repeats, args.input, args.image, args.capability)
    else:
        summarize(args.folders)


if __name__ == "__main__":
    sys.exit(main())
