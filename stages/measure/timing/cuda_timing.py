"""A cuda-python timing harness that follows trtexec's inference loop (samples/common/sampleInference.cpp).

It times any ``enqueue(stream) -> bool | None`` callable (a TensorRT ``execute_async_v3``, a CUDA graph
replay, a kernel launch); it does not need TensorRT. Per query and per stream it records CUDA events
around the optional host-to-device copies, the enqueue and the optional device-to-host copies, and the
host clock around the enqueue call. Like trtexec it keeps two queries in flight per stream (it enqueues
query i+1 before waiting for query i), runs until at least ``min_iterations`` timed queries AND
``warmup_ms + min_duration_s`` of GPU time have passed, drops the queries that started during the time-based
warm-up (see `measure.statistics.stats.report_trace`), can capture the enqueue into a CUDA graph (falling back to plain
enqueues when capture fails), and waits with spinning or blocking-sync events.

``cuda.bindings`` (cuda-python) is imported lazily.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...runtimes.cuda import CudaError
from ...runtimes.cuda import check as _check
from ...runtimes.cuda import error_name as _error_name
from ...runtimes.cuda import runtime as _cudart
from ..statistics.stats import QueryTiming

#: What the harness raises when a CUDA call or an enqueue fails.
CudaTimingError = CudaError

Enqueue = Callable[[int], Any]  # receives the raw stream handle; returning False means "enqueue failed"

_H2D_START, _H2D_END, _COMPUTE_START, _COMPUTE_END, _D2H_START, _D2H_END = range(6)
_DEPTH = 2  # queries in flight per stream (trtexec: 1 + overlap)


@dataclass(frozen=True)
class Copy:
    """One asynchronous memcpy of ``nbytes`` from ``src`` to ``dst`` (raw pointers)."""

    dst: int
    src: int
    nbytes: int


@dataclass
class StreamWork:
    """The work of one inference stream: the enqueue and, for timing with host transfers, its copies."""

    stream: int
    enqueue: Enqueue
    h2d: Sequence[Copy] = ()
    d2h: Sequence[Copy] = ()


@dataclass(frozen=True)
class TimingOptions:
    warmup_ms: float = 200.0
    min_iterations: int = 10
    min_duration_s: float = 3.0
    spin_wait: bool = True
    use_cuda_graph: bool = False
    include_host_transfers: bool = False


@dataclass
class TimingRun:
    trace: list[QueryTiming]
    cuda_graph: list[bool]  # per stream: whether the timed enqueue was a CUDA graph launch
    graph_failures: list[str] = field(default_factory=list)


class CudaTimer:
    """Owns the streams, buffers, events and graphs it creates; frees them on ``close()`` / ``with`` exit."""

    def __init__(self, device: int = 0) -> None:
        self._cudart = _cudart()
        _check(self._cudart.cudaSetDevice(device), f"cudaSetDevice({device})")
        self._streams: list[Any] = []
        self._device_buffers: list[int] = []
        self._pinned_buffers: list[int] = []
        self._events: list[Any] = []
        self._graph_execs: list[Any] = []

    def __enter__(self) -> CudaTimer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- resources --------------------------------------------------------------------------------------
    def new_stream(self) -> int:
        stream = _check(
            self._cudart.cudaStreamCreateWithFlags(self._cudart.cudaStreamNonBlocking), "cudaStreamCreate"
        )
        self._streams.append(stream)
        return int(stream)

    def device_buffer(self, nbytes: int) -> int:
        pointer = int(_check(self._cudart.cudaMalloc(max(nbytes, 1)), f"cudaMalloc({nbytes})"))
        self._device_buffers.append(pointer)
        return pointer

    def pinned_buffer(self, nbytes: int) -> int:
        pointer = int(_check(self._cudart.cudaMallocHost(max(nbytes, 1)), f"cudaMallocHost({nbytes})"))
        self._pinned_buffers.append(pointer)
        return pointer

    def pinned_array(self, shape: Sequence[int], dtype: Any) -> Any:
        """A numpy array backed by page-locked host memory (valid until ``close()``)."""
        import numpy as np

        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        pointer = self.pinned_buffer(nbytes)
        raw = (ctypes.c_byte * max(nbytes, 1)).from_address(pointer)
        return np.frombuffer(raw, dtype=np.uint8, count=nbytes).view(dtype).reshape(tuple(shape))

    def copy_sync(self, dst: int, src: int, nbytes: int) -> None:
        _check(self._cudart.cudaMemcpy(dst, src, nbytes, self._cudart.cudaMemcpyKind.cudaMemcpyDefault),
               "cudaMemcpy")

    def synchronize(self, stream: int) -> None:
        _check(self._cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    def _event(self, spin_wait: bool) -> Any:
        flags = self._cudart.cudaEventDefault if spin_wait else self._cudart.cudaEventBlockingSync
        event = _check(self._cudart.cudaEventCreateWithFlags(flags), "cudaEventCreate")
        self._events.append(event)
        return event

    def close(self) -> None:
        cudart = self._cudart
        for graph_exec in self._graph_execs:
            cudart.cudaGraphExecDestroy(graph_exec)
        for event in self._events:
            cudart.cudaEventDestroy(event)
        for stream in self._streams:
            cudart.cudaStreamSynchronize(stream)
            cudart.cudaStreamDestroy(stream)
        for pointer in self._device_buffers:
            cudart.cudaFree(pointer)
        for pointer in self._pinned_buffers:
            cudart.cudaFreeHost(pointer)
        self._graph_execs, self._events, self._streams = [], [], []
        self._device_buffers, self._pinned_buffers = [], []

    # -- CUDA graphs ------------------------------------------------------------------------------------
    def capture_graph(self, enqueue: Enqueue, stream: int) -> tuple[Enqueue | None, str | None]:
        """Capture ``enqueue`` on ``stream`` into a CUDA graph: ``(launch, None)`` or ``(None, reason)``.

        As trtexec does, it runs the enqueue once outside capture first (to flush deferred work such as
        shape updates), and a failed capture leaves the stream usable for plain enqueues.
        """
        cudart = self._cudart
        if enqueue(stream) is False:
            raise CudaTimingError("enqueue failed (before CUDA graph capture)")
        self.synchronize(stream)
        mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        _check(cudart.cudaStreamBeginCapture(stream, mode), "cudaStreamBeginCapture")
        reason = None
        try:
            if enqueue(stream) is False:
                reason = "the enqueue reported failure while capturing"
        except Exception as error:  # an operation not permitted under capture
            reason = f"the enqueue raised {type(error).__name__}: {error}"
        err, graph = cudart.cudaStreamEndCapture(stream)
        if reason is None and err != cudart.cudaError_t.cudaSuccess:
            reason = f"cudaStreamEndCapture returned {_error_name(err)}"
        graph_exec = None
        if reason is None:
            err, graph_exec = cudart.cudaGraphInstantiate(graph, 0)
            if err != cudart.cudaError_t.cudaSuccess:
                reason, graph_exec = f"cudaGraphInstantiate returned {_error_name(err)}", None
        if graph is not None and int(graph) != 0:
            cudart.cudaGraphDestroy(graph)
        cudart.cudaGetLastError()  # clear a sticky capture error so plain enqueues work afterwards
        if graph_exec is None:
            return None, reason
        self._graph_execs.append(graph_exec)

        def launch(launch_stream: int) -> bool:
            _check(cudart.cudaGraphLaunch(graph_exec, launch_stream), "cudaGraphLaunch")
            return True

        return launch, None

    # -- timing -----------------------------------------------------------------------------------------
    def time(self, work: Sequence[StreamWork], options: TimingOptions) -> TimingRun:
        """Run trtexec's inference loop over ``work`` (one entry per stream) and return the raw trace."""
        if not work:
            raise ValueError("nothing to time: give at least one StreamWork")
        cudart = self._cudart
        enqueues: list[Enqueue] = []
        graphs: list[bool] = []
        failures: list[str] = []
        for index, item in enumerate(work):
            if options.use_cuda_graph:
                launch, reason = self.capture_graph(item.enqueue, item.stream)
                if launch is None:
                    failures.append(f"stream {index}: CUDA graph capture failed ({reason}); timed plain "
                                    "enqueues")
                enqueues.append(launch or item.enqueue)
                graphs.append(launch is not None)
            else:
                enqueues.append(item.enqueue)
                graphs.append(False)
        for item in work:
            self.synchronize(item.stream)

        gpu_start = self._event(options.spin_wait)
        first_stream = work[0].stream
        cpu_start = time.perf_counter_ns()
        _check(cudart.cudaEventRecord(gpu_start, first_stream), "cudaEventRecord")
        for item in work[1:]:
            _check(cudart.cudaStreamWaitEvent(item.stream, gpu_start, 0), "cudaStreamWaitEvent")
        slots = [
            _StreamSlot(self, index, item, enqueue, options, gpu_start, cpu_start)
            for index, (item, enqueue) in enumerate(zip(work, enqueues, strict=True))
        ]

        max_duration_ms = options.min_duration_s * 1000.0 + options.warmup_ms
        iteration = skipped = 0
        duration_ms = 0.0
        while iteration < options.min_iterations + skipped or duration_ms < max_duration_ms:
            for slot in slots:
                slot.query()
            for slot in slots:
                duration_ms = max(duration_ms, slot.sync())
            if duration_ms and duration_ms < options.warmup_ms:
                skipped += 1  # warm-up queries do not count towards min_iterations
            iteration += 1
        for slot in slots:
            slot.sync_all()
        trace = sorted((t for slot in slots for t in slot.timings()), key=lambda t: t.compute_start)
        return TimingRun(trace=trace, cuda_graph=graphs, graph_failures=failures)


class _StreamSlot:
    """One stream's queries in flight (trtexec's IterationBase with depth 2)."""

    def __init__(self, timer: CudaTimer, index: int, work: StreamWork, enqueue: Enqueue,
                 options: TimingOptions, gpu_start: Any, cpu_start_ns: int) -> None:
        self._cudart = timer._cudart
        self._success = timer._cudart.cudaError_t.cudaSuccess
        self.index = index
        self.work = work
        self.enqueue = enqueue
        self.transfers = options.include_host_transfers and bool(work.h2d or work.d2h)
        self.gpu_start = gpu_start
        self.cpu_start_ns = cpu_start_ns
        self.raw: list[tuple] = []  # converted to QueryTiming after the loop, to keep the loop lean
        self.events = [[timer._event(options.spin_wait) for _ in range(6)] for _ in range(_DEPTH)]
        self.host_times = [(0, 0)] * _DEPTH
        self.active = [False] * _DEPTH
        self.next = 0

    def _record(self, event: Any) -> None:
        err, = self._cudart.cudaEventRecord(event, self.work.stream)
        if err != self._success:
            raise CudaTimingError(f"cudaEventRecord failed: {_error_name(err)}")

    def _copies(self, copies: Sequence[Copy]) -> None:
        kind = self._cudart.cudaMemcpyKind.cudaMemcpyDefault
        for copy in copies:
            _check(self._cudart.cudaMemcpyAsync(copy.dst, copy.src, copy.nbytes, kind, self.work.stream),
                   "cudaMemcpyAsync")

    def query(self) -> None:
        if self.active[self.next]:
            return
        events = self.events[self.next]
        if self.transfers:
            self._record(events[_H2D_START])
            self._copies(self.work.h2d)
            self._record(events[_H2D_END])
        self._record(events[_COMPUTE_START])
        start = time.perf_counter_ns()
        ok = self.enqueue(self.work.stream)
        end = time.perf_counter_ns()
        if ok is False:
            raise CudaTimingError(f"enqueue failed on stream {self.index}")
        self._record(events[_COMPUTE_END])
        if self.transfers:
            self._record(events[_D2H_START])
            self._copies(self.work.d2h)
            self._record(events[_D2H_END])
        self.host_times[self.next] = (start, end)
        self.active[self.next] = True
        self.next = _DEPTH - 1 - self.next

    def sync(self) -> float:
        """Wait for the oldest query in flight and record it; returns its compute start (ms), or 0."""
        if not self.active[self.next]:
            return 0.0
        cudart, success, gpu_start = self._cudart, self._success, self.gpu_start
        events = self.events[self.next]
        err, = cudart.cudaEventSynchronize(events[_D2H_END if self.transfers else _COMPUTE_END])
        if err != success:
            raise CudaTimingError(f"cudaEventSynchronize failed: {_error_name(err)}")
        marks = []
        for index in (_H2D_START, _H2D_END, _COMPUTE_START, _COMPUTE_END, _D2H_START, _D2H_END):
            if self.transfers or index in (_COMPUTE_START, _COMPUTE_END):
                err, elapsed = cudart.cudaEventElapsedTime(gpu_start, events[index])
                if err != success:
                    raise CudaTimingError(f"cudaEventElapsedTime failed: {_error_name(err)}")
                marks.append(elapsed)
        if not self.transfers:  # zero-length transfers at the compute marks, as trtexec records them
            marks = [marks[0], marks[0], marks[0], marks[1], marks[1], marks[1]]
        self.raw.append((self.index, *self.host_times[self.next], *marks))
        self.active[self.next] = False
        return marks[2]

    def timings(self) -> list[QueryTiming]:
        start = self.cpu_start_ns
        return [QueryTiming(index, (s - start) / 1e6, (e - start) / 1e6, *marks)
                for index, s, e, *marks in self.raw]

    def sync_all(self) -> None:
        for _ in range(_DEPTH):
            self.sync()
            self.next = _DEPTH - 1 - self.next
