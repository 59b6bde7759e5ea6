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
                 "why": _torch_devices(env.get("torch"), torch_cuda_build(), bool(found)) if torch_ok
                 else "torch not installed"})
    rows.append(_confinement_row())
    return rows


def _confinement_row() -> dict[str, Any]:
    """Whether model files that run their own code (TorchScript, .pt2, SavedModel, Keras) can be exported here."""
    from ..formats.confinement import probe

    capability = probe()
    why = (f"{capability.describe()}: TorchScript, .pt2, SavedModel and Keras files are exported in a confined child"
           if capability.available else f"{capability.describe()}: TorchScript, .pt2, SavedModel and Keras files "
           "are refused unless the export node says trust_code: true")
    return {"backend": "model confinement", "build": capability.available, "run": capability.available, "why": why}


def torch_cuda_build() -> str | None:
    """The CUDA version the installed torch was built for (``torch.version.cuda``), None for a CPU build; read from
    torch's version file without importing torch (seconds)."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        tree = ast.parse((Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text())
    except (OSError, SyntaxError, StopIteration):
        return None
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "cuda" and isinstance(node, (ast.Assign, ast.AnnAssign)) \
                and isinstance(node.value, ast.Constant):
            return node.value.value if isinstance(node.value.value, str) else None
    return None


def _torch_devices(version: str, cuda: str | None, gpu_visible: bool) -> str:
    """Where this torch can run models: the GPU only with a CUDA build and a visible GPU."""
    if cuda and gpu_visible:
        return f"CUDA {cuda} and CPU"
    if cuda:
        return f"CPU (a CUDA {cuda} build, but no NVIDIA GPU is visible)"
    if gpu_visible:
        return (f"CPU only: torch {version} is a CPU build, so the GPU here is not used; install a CUDA build of "
                "torch to benchmark PyTorch models on it")
    return "CPU"
