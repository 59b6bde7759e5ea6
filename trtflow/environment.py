"""Environment facts that can invalidate cached results: library versions, TensorRT flavour, GPU.

Every fact is computed lazily and cheaply (package metadata, never importing heavy libraries), so the
no-op path of ``trtflow run`` stays fast. A stage declares which facts its result depends on.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass

ABSENT = "absent"


def dist_version(*names: str) -> str:
    """Version of the first installed distribution among ``names``, or ``absent``."""
    from importlib import metadata  # imported when a fact needs it: the no-op shortcut never does

    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return ABSENT


def module_available(name: str) -> bool:
    from importlib import util

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
    """A GPU (or MIG slice) as CUDA sees it: ``index`` is its CUDA ordinal among the visible devices."""

    index: int
    name: str
    compute_capability: str
    driver: str
    memory_mib: int
    uuid: str = ""
    mig: str | None = None  # MIG device UUID when this is a MIG slice
    host_index: int | None = None  # nvidia-smi's index of the physical GPU

    @property
    def sm(self) -> str:
        return "sm" + self.compute_capability.replace(".", "")

    @property
    def visible_id(self) -> str:
        """What to put in CUDA_VISIBLE_DEVICES to show a process this device alone."""
        return self.mig or self.uuid or str(self.index if self.host_index is None else self.host_index)

    @property
    def label(self) -> str:
        """The device class that keys results built on it: name (and MIG profile) and compute capability."""
        return f"{self.name} ({self.sm})"


_SMI_FIELDS = "index,uuid,name,compute_cap,driver_version,memory.total"
_MIG_LINE = re.compile(r"^\s*MIG\s+(\S+)\s+Device\s+\d+:\s+\(UUID:\s*(MIG-[^)\s]+)\)")
_GPU_LINE = re.compile(r"^GPU\s+(\d+):.*\(UUID:\s*(GPU-[^)\s]+)\)")


def _smi(*args: str) -> str:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return ""
    try:
        return subprocess.run([smi, *args], capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return ""


def parse_smi(query: str, listing: str) -> list[GpuInfo]:
    """Physical GPUs from ``nvidia-smi --query-gpu`` and their MIG slices from ``nvidia-smi -L``."""
    physical: list[GpuInfo] = []
    for line in query.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 6:
            continue
        try:
            physical.append(GpuInfo(int(parts[0]), parts[2], parts[3], parts[4], int(float(parts[5])),
                                    uuid=parts[1], host_index=int(parts[0])))
        except ValueError:
            continue
    by_index = {g.host_index: g for g in physical}
    migs: dict[int, list[GpuInfo]] = {}
    current: GpuInfo | None = None
    for line in listing.splitlines():
        gpu_match = _GPU_LINE.match(line)
        if gpu_match:
            current = by_index.get(int(gpu_match.group(1)))
            continue
        mig_match = _MIG_LINE.match(line)
        if mig_match and current is not None:
            profile, mig_uuid = mig_match.groups()
            migs.setdefault(current.host_index or 0, []).append(GpuInfo(
                current.index, f"{current.name} MIG {profile}", current.compute_capability, current.driver,
                current.memory_mib, uuid=current.uuid, mig=mig_uuid, host_index=current.host_index))
    devices: list[GpuInfo] = []
    for gpu in physical:  # CUDA enumerates a MIG-enabled GPU's slices instead of the GPU itself
        devices.extend(migs.get(gpu.host_index or 0, [gpu]))
    return devices


def visible(devices: list[GpuInfo], cuda_visible_devices: str | None) -> list[GpuInfo]:
    """The devices CUDA shows under ``CUDA_VISIBLE_DEVICES`` (indices, GPU-/MIG- UUIDs or unique prefixes),
    renumbered as CUDA numbers them. As in CUDA, the list stops at the first entry that names no device."""
    if cuda_visible_devices is None:
        chosen = devices
    else:
        chosen = []
        physical = [d for d in devices if d.mig is None] or devices
        for entry in (e.strip() for e in cuda_visible_devices.split(",")):
            match = _match_device(entry, devices, physical)
            if match is None:
                break
            chosen.append(match)
    return [GpuInfo(i, d.name, d.compute_capability, d.driver, d.memory_mib, d.uuid, d.mig, d.host_index)
            for i, d in enumerate(chosen)]


def _match_device(entry: str, devices: list[GpuInfo], physical: list[GpuInfo]) -> GpuInfo | None:
    if not entry:
        return None
    if entry.isdigit():
        index = int(entry)
        hosts = sorted({d.host_index for d in devices if d.host_index is not None})
        return next((d for d in devices if d.host_index == index), None) if index in hosts else None
    if entry.startswith("MIG-"):
        if entry.startswith("MIG-GPU-"):  # legacy form MIG-GPU-<uuid>/<gi>/<ci>: the first slice of that GPU
            gpu_uuid = entry[len("MIG-"):].split("/")[0]
            return next((d for d in devices if d.mig and d.uuid == gpu_uuid), None)
        found = [d for d in devices if d.mig and d.mig.startswith(entry)]
        return found[0] if len(found) == 1 else None
    prefix = entry if entry.startswith("GPU-") else f"GPU-{entry}"
    found = [d for d in devices if d.uuid.startswith(prefix)]
    if len({d.uuid for d in found}) != 1:
        return None
    return found[0]


@functools.lru_cache(maxsize=1)
def gpus() -> tuple[GpuInfo, ...]:
    """GPUs (or MIG slices) this process may use: nvidia-smi's list filtered by CUDA_VISIBLE_DEVICES."""
    query = _smi(f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader,nounits")
    if not query:
        return ()
    devices = parse_smi(query, _smi("-L"))
    return tuple(visible(devices, os.environ.get("CUDA_VISIBLE_DEVICES")))


def gpu_fact(device: GpuInfo | None = None) -> str:
    if device is not None:
        return device.label
    found = gpus()
    if not found:
        return "none"
    return "; ".join(sorted({g.label for g in found}))


def driver_fact(device: GpuInfo | None = None) -> str:
    if device is not None:
        return device.driver
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
    "transformers": lambda: dist_version("transformers"),
    "tensorflow": lambda: dist_version("tensorflow-cpu", "tensorflow"),
    "tf2onnx": lambda: dist_version("tf2onnx"),
    "modelopt": lambda: dist_version("nvidia-modelopt"),
    "polygraphy": lambda: dist_version("polygraphy"),
    "numpy": lambda: dist_version("numpy"),
    "cuda_python": lambda: dist_version("cuda-python", "cuda-bindings"),
    "tensorrt": tensorrt_version,
    "tensorrt_rtx": tensorrt_rtx_version,
    "gpu": gpu_fact,
    "driver": driver_fact,
}


#: Facts that describe one device: computed from the GPU a node runs on, not from the host's set of GPUs.
DEVICE_FACTS: dict[str, Callable[[GpuInfo], str]] = {"gpu": gpu_fact, "driver": driver_fact}


class Environment:
    """Lazily computed, memoised environment facts. ``overrides`` pins facts (tests, remote builds)."""

    def __init__(self, overrides: dict[str, str] | None = None) -> None:
        self._values: dict[str, str] = dict(overrides or {})
        self._overrides = dict(overrides or {})

    def for_device(self, name: str, device: GpuInfo | None) -> str:
        """A fact as seen by a node running on ``device`` (the host's view when None or not device-bound)."""
        if device is None or name not in DEVICE_FACTS or name in self._overrides:
            return self.get(name)
        return DEVICE_FACTS[name](device)

    def get(self, name: str) -> str:
        if name not in self._values:
            try:
                compute = FACTS[name]
            except KeyError:
                from trtflow.errors import InternalError

                raise InternalError(f"unknown environment fact {name!r}; known: {sorted(FACTS)}") from None
            self._values[name] = compute()
        return self._values[name]

    def facts(self, names: Iterable[str], device: GpuInfo | None = None) -> dict[str, str]:
        return {name: self.for_device(name, device) for name in names}

    @classmethod
    def from_env(cls) -> Environment:
        """Honour TRTFLOW_FACT_<NAME>=value overrides (used by tests and by remote build farms)."""
        prefix = "TRTFLOW_FACT_"
        overrides = {k[len(prefix):].lower(): v for k, v in os.environ.items() if k.startswith(prefix)}
        return cls(overrides)
