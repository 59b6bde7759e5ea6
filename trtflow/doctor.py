"""`trtflow doctor`: what this machine can build and run."""

from __future__ import annotations

from typing import Any

from trtflow.environment import ABSENT, Environment, gpus, module_available
from trtflow.registry import get_stage, stage_names

# Compute capabilities TensorRT-RTX engines run on (NVIDIA's RTX support matrix: Turing, Ampere GA10x, Ada,
# Blackwell GB20x). The engine may not import the stages; stages/_trt_runtime.py keeps the same list.
RTX_RUNTIME_CC = ("7.5", "8.6", "8.9", "12.0", "12.1")


def diagnose() -> dict[str, Any]:
    env = Environment.from_env()
    names = ["python", "platform", "cpu", "torch", "onnx", "onnxruntime", "onnxsim", "modelopt", "polygraphy",
             "numpy", "cuda_python", "tensorrt", "tensorrt_rtx", "gpu", "driver"]
    facts = env.facts(names)
    found = gpus()
    backends = []
    trt = facts["tensorrt"] != ABSENT
    backends.append({
        "backend": "tensorrt", "build": trt and bool(found), "run": trt and bool(found),
        "why": ("ready" if trt and found else
                "full TensorRT is not installed (NVIDIA's index or an NGC container)" if not trt else
                "no NVIDIA GPU visible"),
    })
    rtx = facts["tensorrt_rtx"] != ABSENT
    rtx_run = rtx and any(g.compute_capability in RTX_RUNTIME_CC for g in found)
    why_rtx = "builds on the CPU; " if rtx else "pip install tensorrt-rtx-cu13; "
    if not found:
        why_rtx += "running needs an NVIDIA GPU"
    elif not rtx_run:
        why_rtx += "running needs compute capability " + "/".join(RTX_RUNTIME_CC) + \
                   f" (found {', '.join(g.compute_capability for g in found)})"
    else:
        why_rtx += "runs here"
    backends.append({"backend": "tensorrt-rtx", "build": rtx, "run": rtx_run, "why": why_rtx})
    providers: list[str] = []
    if facts["onnxruntime"] != ABSENT:
        try:
            import onnxruntime

            providers = list(onnxruntime.get_available_providers())
        except ImportError:
            providers = []
    backends.append({"backend": "onnxruntime", "build": False, "run": bool(providers),
                     "why": ", ".join(providers) if providers else "onnxruntime not installed"})
    torch_ok = facts["torch"] != ABSENT and module_available("torch")
    backends.append({"backend": "torch", "build": False, "run": torch_ok,
                     "why": ("CUDA" if found else "CPU") if torch_ok else "torch not installed"})
    stages = []
    for name in stage_names():
        try:
            stage = get_stage(name)
            stages.append({"name": name, "version": stage.version, "description": stage.description})
        except Exception as exc:  # a broken plugin must not break doctor
            stages.append({"name": name, "version": "?", "description": f"failed to load: {exc}"})
    return {"facts": facts, "backends": backends, "stages": stages,
            "gpus": [g.__dict__ for g in found]}
