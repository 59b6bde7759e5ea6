"""The one interface through which trtflow executes a TensorRT engine (full TensorRT or TensorRT-RTX).

`open_engine` checks the engine's provenance (engine.json from the build stage), deserialises it through
Polygraphy (``EngineFromBytes``) and returns an `EngineSession`: ``infer`` runs Polygraphy's ``TrtRunner``
(accuracy validation); ``prepare`` + ``enqueue`` run ``execute_async_v3`` on device buffers allocated with
cuda-python (benchmark timing). Tests substitute a fake session for this interface, since no TensorRT
engine can execute on the machines that run the test suite.

`runtime_available` says, without importing TensorRT, whether engines can execute here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trtflow.environment import GpuInfo, gpus, module_available
from trtflow.stage import StageFailed, StageSkipped

from ..data import InputSpec
from .tensorrt import INSTALL_HINTS, check_provenance, import_trt, resolve_backend

if TYPE_CHECKING:
    from .records import EngineRecord

# TensorRT-RTX support matrix (Linux x86-64): Turing, Ampere RTX, Ada, Blackwell RTX and GB10. Datacenter
# GPUs such as the A100 (8.0) and H100/H200 (9.0) are not supported.
RTX_COMPUTE_CAPABILITIES: tuple[str, ...] = ("7.5", "8.6", "8.9", "12.0", "12.1")


@dataclass(frozen=True)
class DeviceTensor:
    """An engine I/O tensor bound to a device buffer by `EngineSession.prepare`."""

    name: str
    is_input: bool
    shape: tuple[int, ...]
    dtype: str
    device_ptr: int
    nbytes: int


class EngineSession(Protocol):
    """An execution context of a deserialised engine; use it as a context manager."""

    def __enter__(self) -> EngineSession: ...

    def __exit__(self, *exc: object) -> None: ...

    def input_specs(self) -> list[InputSpec]:
        """The engine's inputs (dynamic dimensions are None)."""
        ...

    def output_names(self) -> list[str]: ...

    def infer(self, feed: Mapping[str, Any]) -> dict[str, Any]:
        """Run one batch from host arrays and return host arrays (synchronous)."""
        ...

    def prepare(self, feed: Mapping[str, Any]) -> list[DeviceTensor]:
        """Set the input shapes from ``feed``, bind device buffers for every I/O tensor and copy ``feed`` in.

        After this, ``enqueue`` runs on those buffers without host transfers."""
        ...

    def reshape(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Set new input shapes on the buffers ``prepare`` bound, no larger than the prepared ones (a smaller
        batch runs on the leading rows: serving several batch sizes without re-allocating)."""
        ...

    def enqueue(self, stream: int) -> bool:
        """Enqueue one inference on the raw CUDA stream handle; False when TensorRT refuses."""
        ...

    def layer_information(self) -> dict[str, Any]:
        """The engine inspector's JSON for this context's shapes (trtexec --exportLayerInfo): per layer its name,
        type, precision and tactic as far as the engine's profiling verbosity recorded them."""
        ...

    def profile_layers(self, stream: int, iterations: int,
                       synchronize: Callable[[int], None]) -> dict[str, list[float]]:
        """Run ``iterations`` inferences with a layer profiler attached (trtexec --exportProfile); per layer name,
        its time in ms in each iteration. Profiling slows inference: run it on a context not used for timing."""
        ...

    def fork(self) -> EngineSession:
        """Another execution context of the same engine (for multi-stream throughput)."""
        ...


def runtime_needs(backend: str) -> str:
    if backend == "tensorrt-rtx":
        return (f"an NVIDIA GPU that TensorRT-RTX supports (compute capability "
                f"{', '.join(RTX_COMPUTE_CAPABILITIES)}) and {INSTALL_HINTS['tensorrt-rtx']}")
    if backend == "tensorrt":
        return f"an NVIDIA GPU with {INSTALL_HINTS['tensorrt']}"
    return f"an NVIDIA GPU with full TensorRT ({INSTALL_HINTS['tensorrt']}) or TensorRT-RTX"


def _gpu(gpu_index: int | None) -> GpuInfo | None:
    found = gpus()
    for gpu in found:
        if gpu_index is None or gpu.index == gpu_index:
            return gpu
    return found[0] if found else None


def runtime_available(backend: str, gpu_index: int | None = None, need_cuda_python: bool = False) -> str | None:
    """None when engines of ``backend`` can execute here, else the reason why not (nothing is imported)."""
    try:
        flavour = resolve_backend(backend)
    except StageSkipped as skipped:
        return skipped.reason
    gpu = _gpu(gpu_index)
    if gpu is None:
        return f"no NVIDIA GPU is visible here (nvidia-smi lists none); {flavour} engines execute only on a GPU"
    if flavour == "tensorrt-rtx" and gpu.compute_capability not in RTX_COMPUTE_CAPABILITIES:
        return (f"TensorRT-RTX does not run on this machine's GPU {gpu.name} (compute capability "
                f"{gpu.compute_capability}); it supports compute capabilities "
                f"{', '.join(RTX_COMPUTE_CAPABILITIES)}")
    if need_cuda_python and not module_available("cuda.bindings"):
        return "cuda-python is not installed (it allocates the device buffers for timing): pip install cuda-python"
    return None


def provenance_for(engine_path: Path, explicit: Path | None = None) -> Path | None:
    """The engine's engine.json: the explicit input, else the build stage's manifest beside the engine."""
    if explicit is not None:
        return explicit
    beside = Path(engine_path).parent / "engine.json"
    return beside if beside.is_file() else None


def read_provenance(provenance_path: Path | None) -> EngineRecord | None:
    """The engine's engine.json, checked against its declared type (`records.engine_record`); None without one."""
    from .records import engine_record

    return engine_record(Path(provenance_path)) if provenance_path is not None else None


def engine_backend(requested: str, manifest: Mapping[str, Any] | None) -> str:
    """The flavour to run an engine with: the one that built it (provenance), else ``requested``."""
    built = manifest.get("backend") if manifest else None
    if requested == "auto":
        return str(built) if built else resolve_backend("auto")
    return requested


def open_engine(engine_path: Path, provenance_path: Path | None, backend: str = "auto",
                gpu_index: int | None = None) -> EngineSession:
    """Check the engine's provenance against this machine, then deserialise it; returns an `EngineSession`."""
    manifest = read_provenance(provenance_path)
    if manifest is None:
        raise StageFailed(f"{engine_path} has no provenance manifest (engine.json) beside it; trtflow loads only "
                          "engines whose provenance and digest it can check",
                          hint="build the engine with the build stage (it writes engine.json next to the engine)")
    flavour = engine_backend(backend, manifest)
    check_provenance(manifest, flavour, gpu_index=gpu_index)
    reason = runtime_available(flavour, gpu_index)
    if reason:
        raise StageSkipped(reason, needs=runtime_needs(flavour))
    data = Path(engine_path).read_bytes()
    verify_engine_digest(data, manifest, engine_path)
    return deserialize_engine(flavour, data, engine_path)


def deserialize_engine(flavour: str, data: bytes, engine_path: Path) -> EngineSession:
    """The TensorRT runtime call: deserialise checked engine bytes into an `EngineSession` (needs a GPU the flavour
    runs on). The tests' TensorRT fakes replace this function only, so every check before it runs for real."""
    trt = import_trt(flavour)
    from polygraphy.backend.trt import engine_from_bytes

    try:
        engine = engine_from_bytes(data)
    except Exception as error:  # Polygraphy raises PolygraphyException with TensorRT's own message
        raise StageFailed(f"{flavour} could not deserialise {engine_path}: {error}",
                          hint="re-build the engine with this TensorRT version on this GPU") from error
    if engine is None:
        raise StageFailed(f"{flavour} could not deserialise {engine_path} (see the log for TensorRT's reason)",
                          hint="re-build the engine with this TensorRT version on this GPU")
    return TrtEngineSession(trt, engine)


def verify_engine_digest(data: bytes, manifest: EngineRecord, engine_path: Path) -> None:
    """Refuse an engine whose bytes are not the ones its build recorded (xxh3-128 digest)."""
    import xxhash

    expected = manifest.get("engine_digest")
    if not expected:
        raise StageFailed(f"the provenance of {engine_path} records no engine digest (built by an older trtflow)",
                          hint="re-build the engine: `trtflow run` after bumping nothing re-uses it, so delete its "
                          "store entry with `trtflow verify --fix` or change a build parameter")
    actual = xxhash.xxh3_128_hexdigest(data)
    if actual != expected:
        raise StageFailed(f"{engine_path} does not match its provenance: digest {actual[:16]}... but the build "
                          f"recorded {expected[:16]}...; the file was changed after it was built",
                          hint="run `trtflow verify --fix` and then `trtflow run` to re-build it")


class TrtEngineSession:
    """`EngineSession` over a TensorRT ``ICudaEngine`` (either flavour, through Polygraphy's binding)."""

    def __init__(self, trt: Any, engine: Any) -> None:
        self._trt = trt
        self._engine = engine
        self._context: Any = None
        self._runner: Any = None
        self._device_buffers: list[int] = []
        self._prepared: dict[str, tuple[int, ...]] = {}

    def __enter__(self) -> TrtEngineSession:
        self._context = self._engine.create_execution_context()
        if self._context is None:
            raise StageFailed("TensorRT could not create an execution context (out of GPU memory?)",
                              hint="free GPU memory or lower the number of streams")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            self._runner.deactivate()
            self._runner = None
        self._free()
        self._context = None

    def _free(self) -> None:
        if self._device_buffers:
            from cuda.bindings import runtime as cudart

            for pointer in self._device_buffers:
                cudart.cudaFree(pointer)
            self._device_buffers = []

    def _io(self, want_input: bool) -> list[str]:
        mode = self._trt.TensorIOMode.INPUT if want_input else self._trt.TensorIOMode.OUTPUT
        names = (self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors))
        return [name for name in names if self._engine.get_tensor_mode(name) == mode]

    def _dtype(self, name: str) -> Any:
        from polygraphy.datatype import DataType

        return DataType.from_dtype(self._engine.get_tensor_dtype(name), source_module="tensorrt")

    def input_specs(self) -> list[InputSpec]:
        import numpy as np
        from polygraphy.datatype import DataType

        specs = []
        for name in self._io(True):
            shape = tuple(None if d < 0 else int(d) for d in self._engine.get_tensor_shape(name))
            dtype = self._dtype(name)
            try:
                dtype_name = np.dtype(DataType.to_dtype(dtype, "numpy")).name
            except Exception:  # a TensorRT type numpy lacks (bf16, fp8): keep Polygraphy's name
                dtype_name = dtype.name
            specs.append(InputSpec(name=name, dtype=dtype_name, shape=shape))
        return specs

    def output_names(self) -> list[str]:
        return self._io(False)

    def infer(self, feed: Mapping[str, Any]) -> dict[str, Any]:
        import numpy as np
        from polygraphy.backend.trt import TrtRunner

        if self._runner is None:
            self._runner = TrtRunner(self._engine)
            self._runner.activate()
        outputs = self._runner.infer(dict(feed))
        return {name: np.array(value) for name, value in outputs.items()}

    def prepare(self, feed: Mapping[str, Any]) -> list[DeviceTensor]:
        import numpy as np
        from cuda.bindings import runtime as cudart

        from .cuda import check as _check

        context = self._context
        self._free()
        for name in self._io(True):
            if name not in feed:
                raise StageFailed(f"no data for engine input {name!r}; engine inputs: {self._io(True)}")
            if not context.set_input_shape(name, tuple(feed[name].shape)):
                raise StageFailed(f"engine input {name!r}: shape {list(feed[name].shape)} is outside the "
                                  "engine's optimization profile",
                                  hint="use shapes within the profile the engine was built with (engine.json)")
        tensors = []
        for name in self._io(True) + self._io(False):
            is_input = name in feed
            shape = tuple(int(d) for d in context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise StageFailed(f"output {name!r} has a data-dependent shape {list(shape)}: benchmarking "
                                  "needs outputs whose shape follows from the input shapes")
            dtype = self._dtype(name)
            nbytes = math.ceil(math.prod(shape) * dtype.itemsize)
            pointer = int(_check(cudart.cudaMalloc(max(nbytes, 1)), f"cudaMalloc for {name!r}"))
            self._device_buffers.append(pointer)
            if not context.set_tensor_address(name, pointer):
                raise StageFailed(f"TensorRT refused the device address for tensor {name!r}")
            if is_input:
                host = np.ascontiguousarray(feed[name])
                _check(cudart.cudaMemcpy(pointer, host.ctypes.data, nbytes,
                                         cudart.cudaMemcpyKind.cudaMemcpyHostToDevice), f"copy of {name!r}")
            tensors.append(DeviceTensor(name, is_input, shape, dtype.name, pointer, nbytes))
        self._prepared = {name: tuple(feed[name].shape) for name in self._io(True)}
        return tensors

    def reshape(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        for name, shape in shapes.items():
            prepared = self._prepared.get(name)
            if prepared is None or len(prepared) != len(shape) or any(
                    d > p for d, p in zip(shape, prepared, strict=True)):
                raise StageFailed(f"engine input {name!r}: shape {list(shape)} does not fit the buffers prepared "
                                  f"for {list(prepared) if prepared else 'nothing'}")
            if not self._context.set_input_shape(name, tuple(shape)):
                raise StageFailed(f"engine input {name!r}: shape {list(shape)} is outside the engine's "
                                  "optimization profile",
                                  hint="use batch sizes within the profile the engine was built with (engine.json)")

    def enqueue(self, stream: int) -> bool:
        return bool(self._context.execute_async_v3(stream))

    def layer_information(self) -> dict[str, Any]:
        inspector = self._engine.create_engine_inspector()
        inspector.execution_context = self._context
        text = inspector.get_engine_information(self._trt.LayerInformationFormat.JSON)
        try:
            return json.loads(text)
        except ValueError as error:
            raise StageFailed(f"the engine inspector returned no JSON ({error})",
                              hint="build the engine with profiling verbosity 'detailed'") from error

    def profile_layers(self, stream: int, iterations: int,
                       synchronize: Callable[[int], None]) -> dict[str, list[float]]:
        times: dict[str, list[float]] = {}
        trt = self._trt

        class LayerTimes(trt.IProfiler):  # type: ignore[name-defined]  # trt: the module, bound at run time
            def __init__(self) -> None:
                trt.IProfiler.__init__(self)

            def report_layer_time(self, layer_name: str, ms: float) -> None:
                times.setdefault(layer_name, []).append(float(ms))

        profiler = LayerTimes()
        self._context.profiler = profiler
        for _ in range(iterations):
            if not self._context.execute_async_v3(stream):
                raise StageFailed("TensorRT refused to enqueue while profiling layers")
            synchronize(stream)
        return times

    def fork(self) -> TrtEngineSession:
        return TrtEngineSession(self._trt, self._engine)
