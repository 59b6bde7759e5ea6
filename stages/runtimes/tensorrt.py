"""TensorRT flavour logic shared by the stages: which flavour, how to import it, and what an engine needs.

Two flavours build engines through the same Polygraphy code path:

- ``tensorrt``: full TensorRT (NVIDIA's index or an NGC container); builds for the GPU it runs on.
- ``tensorrt-rtx``: TensorRT for RTX (PyPI ``tensorrt-rtx-cu13``); builds ahead of time, even on a CPU-only
  machine, and compiles kernels just in time on the GPU that runs the engine.

Polygraphy picks the flavour from ``POLYGRAPHY_USE_TENSORRT_RTX`` when ``polygraphy.backend.trt`` is first
imported, so a process serves one flavour: `import_trt` sets it up and refuses to switch afterwards.

This module is cheap to import (stdlib and trtflow only); TensorRT itself is imported by `import_trt`.
"""

from __future__ import annotations

import importlib
import os
import platform
import re
import sys
from collections.abc import Mapping, Sequence
from importlib import util as importlib_util
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from trtflow.environment import ABSENT, GpuInfo, dist_version, gpus
from trtflow.errors import did_you_mean
from trtflow.stage import EnvironmentUnavailable, RecipeError, StageFailed, StageSkipped

if TYPE_CHECKING:
    from .records import EngineRecord

Backend = Literal["auto", "tensorrt", "tensorrt-rtx"]
FLAVOURS: tuple[str, ...] = ("tensorrt", "tensorrt-rtx")

POLYGRAPHY_RTX_VARIABLE = "POLYGRAPHY_USE_TENSORRT_RTX"

_MODULES = {"tensorrt": "tensorrt", "tensorrt-rtx": "tensorrt_rtx"}
_FACTS = {"tensorrt": "tensorrt", "tensorrt-rtx": "tensorrt_rtx"}
INSTALL_HINTS = {
    "tensorrt": "full TensorRT from NVIDIA's index: "
    "`pip install --extra-index-url https://pypi.nvidia.com tensorrt` (or run in an NGC TensorRT container)",
    "tensorrt-rtx": "`pip install tensorrt-rtx-cu13` (or `pip install 'trtflow[rtx]'`)",
}


def _module_available(name: str) -> bool:
    try:
        return importlib_util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _known(backend: str) -> str:
    if backend not in FLAVOURS:
        suggestion = did_you_mean(backend, [*FLAVOURS, "auto"])
        raise RecipeError(
            f"unknown TensorRT backend {backend!r}; expected one of auto, {', '.join(FLAVOURS)}",
            field="backend",
            hint=suggestion,
        )
    return backend


def available_backends() -> list[str]:
    """The TensorRT flavours importable here, full TensorRT first (found without importing them)."""
    return [flavour for flavour in FLAVOURS if _module_available(_MODULES[flavour])]


def resolve_backend(requested: str) -> str:
    """Turn ``auto`` into the flavour installed here (full TensorRT preferred); check an explicit one.

    Raises `StageSkipped` (with what to install) when the flavour cannot be imported on this machine.
    """
    available = available_backends()
    if requested == "auto":
        if available:
            return available[0]
        raise StageSkipped(
            "no TensorRT flavour is installed here (neither `tensorrt` nor `tensorrt_rtx` can be imported)",
            needs=f"{INSTALL_HINTS['tensorrt-rtx']}; or {INSTALL_HINTS['tensorrt']}",
        )
    backend = _known(requested)
    if backend not in available:
        raise StageSkipped(
            f"backend {backend!r} is not installed here (`import {_MODULES[backend]}` fails)"
            + (f"; installed: {', '.join(available)}" if available else ""),
            needs=INSTALL_HINTS[backend],
        )
    return backend


def fact_name(backend: str) -> str:
    """The environment fact (see `trtflow.environment.FACTS`) holding this flavour's version."""
    return _FACTS[_known(backend)]


def installed_version(backend: str) -> str:
    """Version of the flavour's installed distribution (package metadata; no import), or ``absent``."""
    from trtflow.environment import FACTS

    return FACTS[fact_name(backend)]()


def import_trt(backend: str) -> ModuleType:
    """Import Polygraphy's TensorRT backend for ``backend`` and return the ``tensorrt``/``tensorrt_rtx`` module.

    Safe to call repeatedly for the same flavour. Fails when Polygraphy's TensorRT backend was already
    imported for the other flavour in this process (Polygraphy binds the flavour at import time).
    """
    backend = resolve_backend(backend)
    want_rtx = backend == "tensorrt-rtx"
    polygraphy_config: Any = sys.modules.get("polygraphy.config")  # a module with the flag as an attribute
    if polygraphy_config is not None and bool(polygraphy_config.USE_TENSORRT_RTX) != want_rtx:
        if "polygraphy.backend.trt" in sys.modules:
            bound = "tensorrt-rtx" if polygraphy_config.USE_TENSORRT_RTX else "tensorrt"
            raise EnvironmentUnavailable(
                f"Polygraphy's TensorRT backend is already bound to {bound} in this process; "
                f"it cannot switch to {backend}",
                hint="run stages of different TensorRT flavours in separate processes (the runner does), "
                f"or set {POLYGRAPHY_RTX_VARIABLE}={'1' if want_rtx else '0'} before anything imports "
                "polygraphy.backend.trt",
            )
        polygraphy_config.USE_TENSORRT_RTX = want_rtx
    os.environ[POLYGRAPHY_RTX_VARIABLE] = "1" if want_rtx else "0"
    try:
        importlib.import_module("polygraphy.backend.trt")
        return importlib.import_module(_MODULES[backend])
    except ImportError as exc:
        raise StageSkipped(f"cannot import {backend}: {exc}", needs=INSTALL_HINTS[backend]) from exc


def _major(version: str) -> int | None:
    match = re.match(r"\s*(\d+)", version)
    return int(match.group(1)) if match else None


def is_strongly_typed_only(backend: str, version: str) -> bool:
    """True where precision can only come from the ONNX model: TensorRT-RTX, and TensorRT 11 or newer."""
    if _known(backend) == "tensorrt-rtx":
        return True
    major = _major(version)
    return major is not None and major >= 11


def _version_triplet(version: str) -> str:
    return ".".join(version.split(".")[:3])


def _cuda_of(backend: str) -> str:
    """The CUDA major version the installed flavour was built for, read from its wheel's name."""
    from importlib import metadata

    dists = metadata.packages_distributions().get(_MODULES[backend], [])
    for dist in dists:
        match = re.search(r"cu(\d+)", dist)
        if match:
            return f"{match.group(1)} (from {dist})"
    return "unknown"


def _cuda_driver_version() -> str:
    """CUDA version supported by the installed driver, via cuda-python when present."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        return "unknown (cuda-python not installed)"
    try:
        err, version = runtime.cudaDriverGetVersion()
    except Exception:  # cuda-python raises various errors on odd setups; the fact is only informative
        return "unknown"
    if int(err) != 0 or version == 0:
        return "none"
    return f"{version // 1000}.{(version % 1000) // 10}"


def _gpu_record(gpu: GpuInfo) -> dict[str, Any]:
    return {"name": gpu.name, "compute_capability": gpu.compute_capability, "driver": gpu.driver,
            "memory_mib": gpu.memory_mib}


def _select_gpu(machine_gpus: Sequence[GpuInfo], gpu_index: int | None) -> GpuInfo | None:
    if not machine_gpus:
        return None
    if gpu_index is not None:
        for gpu in machine_gpus:
            if gpu.index == gpu_index:
                return gpu
    return machine_gpus[0]


def provenance(backend: str, trt_module: ModuleType, extra: Mapping[str, Any] | None = None,
               gpu_index: int | None = None) -> dict[str, Any]:
    """Where and with what an engine was built: flavour, version, GPU, driver, CUDA, Python, plus ``extra``."""
    backend = _known(backend)
    gpu = _select_gpu(gpus(), gpu_index)
    record: dict[str, Any] = {
        "backend": backend,
        "version": str(trt_module.__version__),
        "strongly_typed_only": is_strongly_typed_only(backend, str(trt_module.__version__)),
        "gpu": _gpu_record(gpu) if gpu else "none: built on CPU",
        "driver": gpu.driver if gpu else "none",
        "cuda": _cuda_of(backend),
        "cuda_driver": _cuda_driver_version(),
        "polygraphy": dist_version("polygraphy"),
        "python": platform.python_version(),
        "platform": f"{platform.system()}-{platform.machine()}",
    }
    record.update(extra or {})
    return record


def _rebuild_hint(fact: str) -> str:
    return (
        f"re-build the engine on this machine: `trtflow run` re-builds it after the change because the build "
        f"node's key includes the {fact!r} fact; or run it where the environment matches the engine's "
        f"provenance (engine.json)"
    )


def check_provenance(manifest: EngineRecord, backend: str, *, version: str | None = None,
                     machine_gpus: Sequence[GpuInfo] | None = None, gpu_index: int | None = None) -> None:
    """Refuse an engine this machine cannot load, naming the field that differs and how to rebuild.

    ``manifest`` is the provenance written by the build stage (engine.json). ``version`` and
    ``machine_gpus`` default to what is installed and visible here.
    """
    backend = _known(backend)
    built_backend = manifest.get("backend")
    if built_backend != backend:
        raise StageFailed(
            f"engine built with {built_backend} but this run uses {backend}",
            hint=f"set backend: {built_backend} where the engine is used, or " + _rebuild_hint(fact_name(backend)),
        )
    here = version if version is not None else installed_version(backend)
    if here == ABSENT:
        raise StageFailed(f"engine built with {backend} but {backend} is not installed here",
                          hint=f"install it: {INSTALL_HINTS[backend]}")
    built = str(manifest.get("version", "unknown"))
    if not _versions_compatible(backend, built, here, bool(manifest.get("builder", {}).get("version_compatible"))):
        raise StageFailed(
            f"engine built for {backend} {_version_triplet(built)} but this machine has {_version_triplet(here)} "
            f"(built with {built}, installed {here}); TensorRT engines only load with the exact version that "
            "built them",
            hint=_rebuild_hint(fact_name(backend)),
        )
    gpu = _select_gpu(gpus() if machine_gpus is None else machine_gpus, gpu_index)
    if gpu is None:
        return  # nothing to compare: the runtime says itself that it needs a GPU
    _check_gpu(manifest, backend, gpu)


def _versions_compatible(backend: str, built: str, here: str, version_compatible: bool) -> bool:
    if built == here:
        return True
    if backend == "tensorrt" and version_compatible:
        # Version-compatible engines load on the same major version, at the building version or newer.
        def parts(v: str) -> tuple[int, ...]:
            return tuple(int(p) for p in re.findall(r"\d+", v)[:4])

        return _major(built) == _major(here) and parts(here) >= parts(built)
    return False


def _cc_tuple(value: str) -> tuple[int, int]:
    major, _, minor = value.partition(".")
    return int(major), int(minor or 0)


def _check_gpu(manifest: EngineRecord, backend: str, gpu: GpuInfo) -> None:
    builder = manifest.get("builder", {}) or {}
    here_cc = gpu.compute_capability
    recorded = manifest.get("gpu")
    built_gpu: Mapping[str, Any] = recorded if isinstance(recorded, Mapping) else {}  # a str: built on CPU
    built_cc = built_gpu.get("compute_capability")
    if backend == "tensorrt-rtx":
        targets = builder.get("compute_capabilities")
        if not targets:
            return  # the default targets are chosen by TensorRT-RTX itself; its runtime reports a mismatch
        if targets == ["current"]:
            targets = [built_cc] if built_cc else []
        if targets and here_cc not in targets:
            raise StageFailed(
                f"engine built for compute capabilities {', '.join(targets)} but this machine's GPU "
                f"{gpu.name} has compute capability {here_cc}",
                hint=f"add {here_cc!r} to compute_capabilities of the build stage, then `trtflow run` "
                "re-builds the engine",
            )
        return
    if built_cc is None:
        return
    level = builder.get("hardware_compatibility")
    if level == "ampere+":
        if _cc_tuple(here_cc) < (8, 0):
            raise StageFailed(
                f"engine built with hardware_compatibility ampere+ needs compute capability 8.0 or newer, "
                f"but this machine's GPU {gpu.name} has {here_cc}",
                hint="run it on an Ampere or newer GPU, or re-build it on this GPU",
            )
        return
    if here_cc != built_cc:
        raise StageFailed(
            f"engine built for GPU {built_gpu.get('name')} (compute capability {built_cc}) but this machine's "
            f"GPU {gpu.name} has compute capability {here_cc}",
            hint="re-build it on this GPU (`trtflow run` re-builds it: the build node's key includes the 'gpu' "
            "fact), or build with hardware_compatibility: ampere+ for an engine that moves between GPUs",
        )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")


def timing_cache_name(backend: str, version: str, gpu_index: int | None = None) -> str:
    """Name of the shared timing cache for a flavour+version on this machine's GPU ("cpu" when none)."""
    gpu = _select_gpu(gpus(), gpu_index)
    where = f"{_slug(gpu.name)}_{gpu.sm}" if gpu else "cpu"
    return f"timing/{_known(backend)}-{_slug(version)}-{where}.cache"
