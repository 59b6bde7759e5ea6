"""Model instances for serving-style load: each instance runs a batch of any size up to the prepared one.

`open_executor(spec)` loads the model once for a backend and makes `instances(n)`: n callables, each bound to
its own execution resources, that a `measure.serving.traffic.Server` runs on its worker threads:
- ``tensorrt`` / ``tensorrt-rtx``: one execution context per instance on its own CUDA stream, device buffers
  bound once at the largest batch (`EngineSession.prepare`), the batch set per call (`EngineSession.reshape`);
- ``onnxruntime``: one session per instance (each with its own thread pool, as Triton's instances have);
- ``torch``: the module shared by the instances, each on its own CUDA stream (on the CPU: its own thread); with
  ``cuda_graphs``, each instance captures one CUDA graph per batch size on first use (its warm-up) and replays it.

Inputs stay where the backend keeps them between calls (device buffers for engines and PyTorch on CUDA);
ONNX Runtime takes host arrays, so its CUDA provider's timings include the copies.
`ExecutorSpec` is picklable, so replica processes (one per GPU) build the same executor.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.stage import StageFailed

from ...runtimes.ort import OrtOptions, create_session
from ...runtimes.tensorrt import FLAVOURS as TRT_FLAVOURS
from ..timing.interference import available_cpus
from .traffic import RunBatch


@dataclass(frozen=True)
class ExecutorSpec:
    """What to load and the inputs at the largest batch any instance will run (dimension 0 is the batch)."""

    backend: str  # "tensorrt", "tensorrt-rtx", "onnxruntime" or "torch"
    device: str  # "cpu" or "cuda"
    feed: Mapping[str, Any]  # input name -> numpy array at the largest batch
    model: str | None = None  # an ONNX model or an engine
    provenance: str | None = None  # the engine's engine.json
    torch_model: str | None = None  # python:/absolute/file.py:function or python:package.module:function
    onnxruntime: OrtOptions = field(default_factory=OrtOptions)
    min_batch: int = 1  # smaller batches are padded up to it (an optimization profile's minimum)
    cuda_graphs: bool = False  # torch on CUDA: replay one CUDA graph per batch size instead of eager launches

    @property
    def max_batch(self) -> int:
        return min(int(array.shape[0]) for array in self.feed.values())


class Executor(ABC):
    """A loaded model that makes instances; close it (or use ``with``) to free what it holds."""

    settings: dict[str, Any]

    @abstractmethod
    def instances(self, count: int) -> list[RunBatch]:
        """``count`` model instances, each with its own execution resources."""

    @abstractmethod
    def close(self) -> None:
        """Free the model and its instances."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _batch_views(feed: Mapping[str, Any], batch: int, cache: dict[int, dict[str, Any]]) -> dict[str, Any]:
    views = cache.get(batch)
    if views is None:
        views = cache[batch] = {name: array[:batch] for name, array in feed.items()}
    return views


class OrtExecutor(Executor):
    def __init__(self, spec: ExecutorSpec) -> None:
        if spec.model is None:
            raise StageFailed("backend onnxruntime needs an ONNX model")
        self._spec = spec
        if spec.device == "cuda":
            import onnxruntime as ort

            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise StageFailed("this ONNX Runtime has no CUDA execution provider",
                                  hint="pip install onnxruntime-gpu, or device: cpu")
            self._providers = ["CUDAExecutionProvider"]
        else:
            self._providers = ["CPUExecutionProvider"]
        options = spec.onnxruntime
        self.settings = {
            "runs_on": f"onnxruntime {self._providers[0]}",
            "onnxruntime": options.model_dump(),
            "intra_op_threads": options.intra_op_threads or "default (one per physical core)",
            "cpus": available_cpus(),
            "host_io": True,
        }

    def close(self) -> None:
        """Sessions are freed with their instances' closures."""

    def instances(self, count: int) -> list[RunBatch]:
        runs = []
        for _ in range(count):
            session = create_session(self._spec.model, self._spec.onnxruntime, self._providers)  # type: ignore[arg-type]
            runs.append(self._runner(session))
        return runs

    def _runner(self, session: Any) -> RunBatch:
        cache: dict[int, dict[str, Any]] = {}
        feed, low = self._spec.feed, self._spec.min_batch

        def run(batch: int) -> None:
            session.run(None, _batch_views(feed, max(batch, low), cache))

        return run


class TorchExecutor(Executor):
    def __init__(self, spec: ExecutorSpec) -> None:
        import torch

        from trtflow.callables import load_callable

        if spec.torch_model is None:
            raise StageFailed("backend torch needs torch_model")
        factory = load_callable(spec.torch_model, Path, "torch_model")
        self._torch = torch
        self._min_batch = spec.min_batch
        self._device = torch.device("cuda", 0) if spec.device == "cuda" else torch.device("cpu")
        self._module = factory().to(self._device).eval()
        self._graphs = spec.cuda_graphs and spec.device == "cuda"
        self._inputs = [torch.from_numpy(array).to(self._device) for array in spec.feed.values()]
        if spec.device == "cuda":
            torch.cuda.synchronize(self._device)
        self.settings = {
            "runs_on": f"torch {spec.device}",
            "device_name": torch.cuda.get_device_name(self._device) if spec.device == "cuda" else "cpu",
            "torch_threads": torch.get_num_threads(),
            "cpus": available_cpus(),
            "host_io": spec.device != "cuda",
            "cuda_graphs": self._graphs,
        }

    def close(self) -> None:
        del self._module, self._inputs
        if self._device.type == "cuda":
            self._torch.cuda.empty_cache()

    def instances(self, count: int) -> list[RunBatch]:
        return [self._runner() for _ in range(count)]

    def _runner(self) -> RunBatch:
        torch, module, inputs, low = self._torch, self._module, self._inputs, self._min_batch
        if self._device.type != "cuda":
            def run_cpu(batch: int) -> None:
                with torch.inference_mode():
                    module(*[tensor[:max(batch, low)] for tensor in inputs])

            return run_cpu
        stream = torch.cuda.Stream(self._device)
        if self._graphs:
            return _graph_runner(torch, module, inputs, low, stream)

        def run_cuda(batch: int) -> None:
            with torch.inference_mode(), torch.cuda.stream(stream):
                module(*[tensor[:max(batch, low)] for tensor in inputs])
            stream.synchronize()

        return run_cuda


def _graph_runner(torch: Any, module: Any, inputs: list[Any], low: int, stream: Any) -> RunBatch:
    """An instance that replays its forward as a CUDA graph, one per batch size, captured on the first call of a
    size (the server's warm-up runs every size on the serving thread). The graphs of one instance share a memory
    pool: they run one at a time on its stream. Captures are thread-local, so instances may capture at once."""
    graphs: dict[int, Any] = {}
    pool = torch.cuda.graph_pool_handle()

    def run(batch: int) -> None:
        size = max(batch, low)
        graph = graphs.get(size)
        with torch.inference_mode(), torch.cuda.stream(stream):
            if graph is None:
                views = [tensor[:size] for tensor in inputs]
                for _ in range(2):  # lazy initialisation (cuDNN algorithm choice, workspaces) before capture
                    module(*views)
                stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                    module(*views)
                graphs[size] = graph
            graph.replay()
        stream.synchronize()

    return run


def default_timer() -> Any:
    from ..timing.cuda_timing import CudaTimer

    return CudaTimer(device=0)  # replicas and the runner narrow CUDA_VISIBLE_DEVICES to the GPU they use


class EngineExecutor(Executor):
    """Instances of an engine: an execution context each, on its own stream, buffers bound at the largest batch."""

    def __init__(self, spec: ExecutorSpec, timer_factory: Callable[[], Any]) -> None:
        from ...runtimes import trt_runtime as _trt_runtime

        if spec.model is None:
            raise StageFailed(f"backend {spec.backend} needs an engine")
        self._spec = spec
        self._session = _trt_runtime.open_engine(Path(spec.model), Path(spec.provenance) if spec.provenance
                                                 else None, spec.backend, None)
        self._timer = timer_factory().__enter__()
        self._open: list[Any] = []
        self.settings = {"runs_on": f"{spec.backend} engine", "cpus": available_cpus(), "host_io": False}

    def instances(self, count: int) -> list[RunBatch]:
        runs = []
        for index in range(count):
            session = (self._session if index == 0 and not self._open else self._session.fork()).__enter__()
            self._open.append(session)
            session.prepare(self._spec.feed)
            runs.append(self._runner(session, self._timer.new_stream()))
        return runs

    def _runner(self, session: Any, stream: int) -> RunBatch:
        shapes = {name: tuple(array.shape[1:]) for name, array in self._spec.feed.items()}
        timer, low = self._timer, self._spec.min_batch

        def run(batch: int) -> None:
            batch = max(batch, low)
            session.reshape({name: (batch, *rest) for name, rest in shapes.items()})
            if session.enqueue(stream) is False:
                raise StageFailed(f"TensorRT refused to enqueue a batch of {batch}")
            timer.synchronize(stream)

        return run

    def close(self) -> None:
        for session in reversed(self._open):
            session.__exit__(None, None, None)
        self._open = []
        self._timer.__exit__(None, None, None)


def open_executor(spec: ExecutorSpec, timer_factory: Callable[[], Any] | None = None) -> Executor:
    """Load ``spec``'s model for its backend (on this process's first visible GPU for CUDA work)."""
    if spec.backend in TRT_FLAVOURS:
        return EngineExecutor(spec, timer_factory or default_timer)
    if spec.backend == "onnxruntime":
        return OrtExecutor(spec)
    if spec.backend == "torch":
        return TorchExecutor(spec)
    raise ValueError(f"no executor for backend {spec.backend!r}")
