"""What the built-in stages can build and run on this machine, for `trtflow doctor` (``trtflow.backends`` group)."""

from __future__ import annotations

from typing import Any

from trtflow.environment import ABSENT, Environment, gpus, module_available

from .tensorrt import INSTALL_HINTS
from .trt_runtime import RTX_COMPUTE_CAPABILITIES

GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider", "NvTensorRTRTXExecutionProvider")


def report() -> list[dict[str, Any]]:
    """One row per backend: {backend, build, run, why}."""
    env = Environment.from_env()
    found = gpus()
    rows = []
    trt = env.get("tensorrt") != ABSENT
    rows.append({
        "backend": "tensorrt", "build": trt and bool(found), "run": trt and bool(found),
        "why": ("ready" if trt and found else
                f"full TensorRT is not installed: {INSTALL_HINTS['tensorrt']}" if not trt else "no NVIDIA GPU visible"),
    })
    rtx = env.get("tensorrt_rtx") != ABSENT
    rtx_run = rtx and any(g.compute_capability in RTX_COMPUTE_CAPABILITIES for g in found)
    why = "builds on the CPU; " if rtx else f"{INSTALL_HINTS['tensorrt-rtx']}; "
    if not found:
        why += "running needs an NVIDIA GPU"
    elif not rtx_run:
        why += ("running needs compute capability " + "/".join(RTX_COMPUTE_CAPABILITIES)
                + f" (found {', '.join(g.compute_capability for g in found)})")
    else:
        why += "runs here"
    rows.append({"backend": "tensorrt-rtx", "build": rtx, "run": rtx_run, "why": why})
    providers: list[str] = []
    if env.get("onnxruntime") != ABSENT:
        try:
            import onnxruntime

            providers = list(onnxruntime.get_available_providers())
        except ImportError:
            providers = []
    usable = [p for p in providers if found or p not in GPU_PROVIDERS]
    unusable = [p for p in providers if p not in usable]
    why = ", ".join(usable) if usable else "onnxruntime not installed"
    if unusable:
        why += f" (installed but no GPU to run them: {', '.join(unusable)})"
    rows.append({"backend": "onnxruntime", "build": False, "run": bool(usable), "why": why})
    torch_ok = env.get("torch") != ABSENT and module_available("torch")
    rows.append({"backend": "torch", "build": False, "run": torch_ok,
                 "why": ("CUDA" if found else "CPU") if torch_ok else "torch not installed"})
    return rows
