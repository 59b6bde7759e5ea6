"""Environment facts that can invalidate cached results: library versions, TensorRT flavour, GPU.

Every fact is computed lazily and cheaply (package metadata, never importing heavy libraries), so the
no-op path of ``trtflow run`` stays fast. A stage declares which facts its result depends on.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata, util

ABSENT = "absent"


def dist_version(*names: str) -> str:
    """Version of the first installed distribution among ``names``, or ``absent``."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return ABSENT


def module_available(name: str) -> bool:
    try:
        return util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


_TENSORRT_DISTS = ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu11", "tensorrt_cu13_bindings",
                   "tensorrt_cu12_bindings")
_TENSORRT_RTX_DISTS = ("tensorrt-rtx", "tensorrt_rtx_cu13", "tensorrt-rtx-cu13", "tensorrt_rtx_cu12",
                       "tensorrt-rtx-cu12")


def tensorrt_version() -> str:
    if not module_available("tensorrt"):
        return ABSENT
    version = dist_version(*_TENSORRT_DISTS)
    return version if version != ABSENT else "unknown"


def tensorrt_rtx_version() -> str:
    if not module_available("tensorrt_rtx"):
        return ABSENT
    version = dist_version(*_TENSORRT_RTX_DISTS)
    return version if version != ABSENT else "unknown"


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    compute_capability: str
    driver: str
    memory_mib: int

    @property
    def sm(self) -> str:
        return "sm" + self.compute_capability.replace(".", "")


@functools.lru_cache(maxsize=1)
def gpus() -> tuple[GpuInfo, ...]:
    """GPUs visible through nvidia-smi (empty on a machine without an NVIDIA driver)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return ()
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,name,compute_cap,driver_version,memory.total",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return ()
    found = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 5:
            try:
                found.append(GpuInfo(int(parts[0]), parts[1], parts[2], parts[3], int(float(parts[4]))))
            except ValueError:
                continue
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() != "":
        wanted = [v.strip() for v in visible.split(",")]
        found = [g for g in found if str(g.index) in wanted]
    return tuple(found)


def gpu_fact() -> str:
    found = gpus()
    if not found:
        return "none"
    return "; ".join(sorted({f"{g.name} ({g.sm})" for g in found}))


def driver_fact() -> str:
    found = gpus()
    return found[0].driver if found else "none"


def cpu_fact() -> str:
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{platform.machine()} {model} x{os.cpu_count()}".strip()


FACTS: dict[str, Callable[[], str]] = {
    "python": lambda: platform.python_version(),
    "platform": lambda: f"{platform.system()}-{platform.machine()}",
    "cpu": cpu_fact,
    "torch": lambda: dist_version("torch"),
    "onnx": lambda: dist_version("onnx"),
    "onnxruntime": lambda: dist_version("onnxruntime-gpu", "onnxruntime"),
    "onnxsim": lambda: dist_version("onnxsim"),
    "modelopt": lambda: dist_version("nvidia-modelopt"),
    "polygraphy": lambda: dist_version("polygraphy"),
    "numpy": lambda: dist_version("numpy"),
    "cuda_python": lambda: dist_version("cuda-python", "cuda-bindings"),
    "tensorrt": tensorrt_version,
    "tensorrt_rtx": tensorrt_rtx_version,
    "gpu": gpu_fact,
    "driver": driver_fact,
}


class Environment:
    """Lazily computed, memoised environment facts. ``overrides`` pins facts (tests, remote builds)."""

    def __init__(self, overrides: dict[str, str] | None = None) -> None:
        self._values: dict[str, str] = dict(overrides or {})

    def get(self, name: str) -> str:
        if name not in self._values:
            try:
                compute = FACTS[name]
            except KeyError:
                from trtflow.errors import InternalError

                raise InternalError(f"unknown environment fact {name!r}; known: {sorted(FACTS)}") from None
            self._values[name] = compute()
        return self._values[name]

    def facts(self, names: Iterable[str]) -> dict[str, str]:
        return {name: self.get(name) for name in names}

    @classmethod
    def from_env(cls) -> Environment:
        """Honour TRTFLOW_FACT_<NAME>=value overrides (used by tests and by remote build farms)."""
        prefix = "TRTFLOW_FACT_"
        overrides = {k[len(prefix):].lower(): v for k, v in os.environ.items() if k.startswith(prefix)}
        return cls(overrides)
