"""Serving-style load on a model: closed-loop clients, open-loop Poisson arrivals and a dynamic batcher.

A `Server` holds a request queue and one worker thread per model instance (a TensorRT execution context on its
own CUDA stream, an ONNX Runtime session, a PyTorch module on its own stream). Each free worker takes the next
batch from the queue: one request as it came or, with dynamic batching, several requests merged into one batch
of at most ``max_batch_size`` samples, following Triton's dynamic batcher: a batch leaves at once when it is full
or reaches the largest preferred size; otherwise it waits until the oldest request has been queued for
``max_queue_delay_ms`` and then leaves with the largest preferred size that can be formed, or with all there is.

Latency is measured from the moment a request was meant to be sent (its *arrival*), so time spent in the queue,
and behind a load generator that fell behind, counts. Closed loop: N clients, each sends its next request when
its previous one completes (N in flight). Open loop: arrivals follow a Poisson process at a fixed rate,
independent of completions, as real traffic does.

Pure Python (threads and `time.monotonic_ns`, a system-wide clock, so request records from several processes on
one host share a time base); the model work runs in the callables given to the server.
"""

from __future__ import annotations

import gc
import math
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, field_validator, model_validator

from trtflow.stage import StageParams

from ..statistics.stats import summarize

#: Runs one batch of the given number of samples and returns when its results are ready.
RunBatch = Callable[[int], None]

#: A generator is "behind" when it sends a request more than this after its intended time.
DELAYED_SEND_NS = 1_000_000
#: Runs of each instance at each warm-up size, on its serving thread, before any request.
WARM_RUNS = 3
#: Python's thread switch interval under load (default 5 ms): clients, batcher and instances share one interpreter,
#: and a thread waiting 5 ms for the interpreter lock would add that to the latencies measured.
SWITCH_INTERVAL_S = 2e-4


@contextmanager
def steady_interpreter(interval_s: float = SWITCH_INTERVAL_S) -> Iterator[dict[str, Any]]:
    """Keep the Python interpreter from adding its own pauses to what is measured: a short thread switch
    interval, and no garbage collection while timing (what exists is collected and frozen first; a full
    collection in a process holding a large model takes tens of milliseconds). Yields what it set."""
    before, was_enabled = sys.getswitchinterval(), gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    sys.setswitchinterval(interval_s)
    try:
        yield {"switch_interval_s": interval_s, "gc": "frozen and off while timing"}
    finally:
        sys.setswitchinterval(before)
        gc.unfreeze()
        if was_enabled:
            gc.enable()


class DynamicBatching(StageParams):
    """Dynamic batching: requests that wait together are run as one batch (Triton's dynamic_batching)."""

    max_batch_size: int = Field(..., ge=1, description="Most samples in one batch; within the optimization "
                                "profile's maximum batch for an engine.")
    max_queue_delay_ms: float = Field(0.0, ge=0, description="How long the oldest queued request may wait for "
                                      "others to join its batch.")
    preferred_batch_sizes: list[int] = Field(
        default_factory=list, description="Batch sizes to send as soon as they can be formed (e.g. the sizes an "
        "engine is fastest at); empty: only max_batch_size.")

    @field_validator("preferred_batch_sizes")
    @classmethod
    def _sorted_positive(cls, sizes: list[int]) -> list[int]:
        if any(size < 1 for size in sizes):
            raise ValueError(f"preferred batch sizes must be >= 1, got {sizes}")
        return sorted(set(sizes))

    @model_validator(mode="after")
    def _within_max(self) -> DynamicBatching:
        too_big = [size for size in self.preferred_batch_sizes if size > self.max_batch_size]
        if too_big:
            raise ValueError(f"preferred_batch_sizes {too_big} exceed max_batch_size {self.max_batch_size}")
        return self


@dataclass(slots=True)
class Request:
    """One inference request and the times it passed each step (``time.monotonic_ns``; 0: not reached)."""

    arrival_ns: int  # when it was meant to be sent: latency counts from here
    samples: int = 1
    sent_ns: int = 0  # when the generator submitted it (later than arrival when the generator fell behind)
    dispatch_ns: int = 0  # when a worker started the batch holding it
    done_ns: int = 0
    batch_id: int = -1
    batch_samples: int = 0
    client: int = -1  # the closed-loop client that sent it
    done: threading.Event | None = None
    ids: tuple[int, ...] = ()  # the load generator's ids of the samples it carries (LoadGen's response ids)
    notify: Callable[[Request], None] | None = None  # called when it completes, or is dropped by a failing server

    def release(self) -> None:
        """Tell whoever waits for this request that it is over (completed, or never to be)."""
        if self.done is not None:
            self.done.set()
        if self.notify is not None:
            self.notify(self)


@dataclass
class _Policy:
    max_batch: int
    delay_ns: int
    preferred: tuple[int, ...]


class Server:
    """A request queue served by one worker thread per model instance; use it as a context manager.

    ``batching`` None: every request runs alone, as it came. A worker that raises stops the server: waiting
    clients are released and `check` re-raises the error in the caller's thread.
    """

    def __init__(self, instances: Sequence[RunBatch], batching: DynamicBatching | None = None,
                 warm_sizes: Iterable[int] = ()) -> None:
        if not instances:
            raise ValueError("a server needs at least one model instance")
        self._instances = list(instances)
        self._warm_sizes = sorted(set(warm_sizes))
        self._ready = threading.Semaphore(0)
        self._policy = None if batching is None else _Policy(
            batching.max_batch_size, int(batching.max_queue_delay_ms * 1e6),
            tuple(batching.preferred_batch_sizes))
        self._queue: deque[Request] = deque()
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._threads: list[threading.Thread] = []
        self._closing = False
        self._submitted = self._completed = 0
        self._batches = 0
        self.error: BaseException | None = None

    @property
    def max_request_samples(self) -> int | None:
        return self._policy.max_batch if self._policy else None

    def __enter__(self) -> Server:
        for index, run in enumerate(self._instances):
            thread = threading.Thread(target=self._serve, args=(run,), name=f"instance-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)
        for _ in self._threads:  # every instance warmed up on its own thread (or failed) before any request
            self._ready.acquire()
        if self.error is not None:
            self.__exit__(None, None, None)
            raise self.error
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._closing = True
            for request in self._queue:  # never run: release anyone waiting on them
                request.release()
            self._queue.clear()
            self._work.notify_all()
        for thread in self._threads:
            thread.join()

    def submit(self, request: Request) -> None:
        if self._policy is not None and request.samples > self._policy.max_batch:
            raise ValueError(f"a request of {request.samples} samples exceeds max_batch_size "
                             f"{self._policy.max_batch}")
        request.sent_ns = request.sent_ns or time.monotonic_ns()
        with self._lock:
            if self._closing or self.error is not None:
                request.release()
                return
            self._queue.append(request)
            self._submitted += 1
            self._work.notify()

    def drain(self, timeout_s: float) -> bool:
        """Wait until every submitted request has completed; False when ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._completed < self._submitted and self.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    # -- workers -------------------------------------------------------------------------------------------
    def _warm(self, run: RunBatch) -> bool:
        """Run the instance at every warm-up size a few times on the thread that will serve it: libraries keep
        per-thread state (PyTorch's cuDNN and cuBLAS handles, the caching allocator's per-stream pools), and
        creating it on the first measured request stalls that request by tens of milliseconds."""
        try:
            for size in self._warm_sizes:
                for _ in range(WARM_RUNS):
                    run(size)
        except BaseException as error:  # handed to the caller by __enter__
            with self._lock:
                self.error = self.error or error
            return False
        finally:
            self._ready.release()
        return True

    def _serve(self, run: RunBatch) -> None:
        if not self._warm(run):
            return
        while True:
            with self._lock:
                batch = self._next_batch()
                if batch is None:
                    return
                self._batches += 1
                batch_id = self._batches
            samples = sum(r.samples for r in batch)
            start = time.monotonic_ns()
            try:
                run(samples)
            except BaseException as error:  # handed to the caller by check()
                with self._lock:
                    self.error = self.error or error
                    self._closing = True
                    for request in (*batch, *self._queue):
                        request.release()
                    self._queue.clear()
                    self._work.notify_all()
                    self._idle.notify_all()
                return
            end = time.monotonic_ns()
            for request in batch:
                request.dispatch_ns, request.done_ns = start, end
                request.batch_id, request.batch_samples = batch_id, samples
                request.release()
            with self._lock:
                self._completed += len(batch)
                if self._completed >= self._submitted:
                    self._idle.notify_all()

    def _next_batch(self) -> list[Request] | None:
        """The next batch to run (called holding the lock; waits as the batching policy says)."""
        while True:
            if self._closing:
                return None
            if self._queue:
                if self._policy is None:
                    return [self._queue.popleft()]
                count, wait_ns = self._batch_count(self._policy, time.monotonic_ns())
                if count:
                    return [self._queue.popleft() for _ in range(count)]
                self._work.wait(wait_ns / 1e9)
            else:
                self._work.wait()

    def _batch_count(self, policy: _Policy, now: int) -> tuple[int, int]:
        """(requests to take now, 0) or (0, nanoseconds to wait for more)."""
        sizes = []  # cumulative samples of the first k+1 requests that fit in one batch
        total = 0
        for request in self._queue:
            if total + request.samples > policy.max_batch:
                break
            total += request.samples
            sizes.append(total)
        more_waiting = len(sizes) < len(self._queue)
        if more_waiting or total == policy.max_batch:
            return len(sizes), 0
        if policy.preferred and total >= policy.preferred[-1]:
            return _largest_prefix(sizes, policy.preferred[-1]), 0
        waited = now - self._queue[0].sent_ns
        if waited < policy.delay_ns:
            return 0, policy.delay_ns - waited
        formed = [k for k, size in enumerate(sizes, 1) if size in policy.preferred]
        return (formed[-1] if formed else len(sizes)), 0


def _largest_prefix(sizes: Sequence[int], limit: int) -> int:
    return sum(1 for size in sizes if size <= limit)


# -- load generators ---------------------------------------------------------------------------------------
@dataclass
class LoadRun:
    """The request records of one load level and its measurement window (requests arriving in it count)."""

    requests: list[Request]
    window_start_ns: int
    window_end_ns: int
    cutoff_ns: int  # when the run stopped waiting: unfinished requests count as finishing here
    offered_rate_qps: float | None = None
    settings: dict[str, Any] = field(default_factory=dict)


def closed_loop(server: Server, concurrency: int, request_samples: int, warmup_s: float,
                duration_s: float) -> LoadRun:
    """``concurrency`` clients, each sending its next request when its previous one completes."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    start = time.monotonic_ns()
    window_start = start + int(warmup_s * 1e9)
    window_end = window_start + int(duration_s * 1e9)
    records: list[Request] = []

    def client(index: int) -> None:
        done = threading.Event()
        while server.error is None:
            now = time.monotonic_ns()
            if now >= window_end:
                return
            request = Request(arrival_ns=now, samples=request_samples, sent_ns=now, client=index, done=done)
            server.submit(request)
            done.wait()
            done.clear()
            records.append(request)  # list.append is atomic

    clients = [threading.Thread(target=client, args=(i,), name=f"client-{i}", daemon=True)
               for i in range(concurrency)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    server.check()
    return LoadRun(records, window_start, window_end, time.monotonic_ns(),
                   settings={"concurrency": concurrency, "request_samples": request_samples})


def poisson_arrivals(rate_qps: float, start_ns: int, end_ns: int, seed: int) -> list[int]:
    """Arrival times of a Poisson process of ``rate_qps`` between ``start_ns`` and ``end_ns``."""
    if rate_qps <= 0:
        raise ValueError(f"arrival rate must be > 0, got {rate_qps}")
    rng = random.Random(seed)
    arrivals: list[int] = []
    t = float(start_ns)
    while True:
        t += rng.expovariate(rate_qps) * 1e9
        if t >= end_ns:
            return arrivals
        arrivals.append(int(t))


def open_loop(server: Server, rate_qps: float, request_samples: int, warmup_s: float, duration_s: float,
              seed: int = 0, drain_timeout_s: float | None = None) -> LoadRun:
    """Requests arriving as a Poisson process of ``rate_qps``, whatever the server's pace.

    The generator sleeps until each arrival and submits it; latency counts from the arrival even when the
    generator was late. After the window it waits up to ``drain_timeout_s`` (default: the window's length,
    at least 1 s) for the requests in flight; unfinished ones count as finishing at that cutoff.
    """
    start = time.monotonic_ns() + 1_000_000
    window_start = start + int(warmup_s * 1e9)
    window_end = window_start + int(duration_s * 1e9)
    records = [Request(arrival_ns=t, samples=request_samples)
               for t in poisson_arrivals(rate_qps, start, window_end, seed)]
    for request in records:
        wait = request.arrival_ns - time.monotonic_ns()
        if wait > 0:
            time.sleep(wait / 1e9)
        if server.error is not None:
            break
        request.sent_ns = time.monotonic_ns()
        server.submit(request)
    server.drain(drain_timeout_s if drain_timeout_s is not None else max(duration_s, 1.0))
    server.check()
    return LoadRun(records, window_start, window_end, time.monotonic_ns(), offered_rate_qps=rate_qps,
                   settings={"arrival_rate_qps": rate_qps, "request_samples": request_samples, "seed": seed})


# -- summaries ---------------------------------------------------------------------------------------------
LATENCY_KEYS = ("p50", "p90", "p95", "p99", "mean", "max")


def _ms(values_ns: Iterable[int], keys: Sequence[str] = LATENCY_KEYS) -> dict[str, float]:
    summary = summarize([v / 1e6 for v in values_ns])
    return {key: summary[key] for key in keys}


def summarize_run(run: LoadRun, latency_budget_ms: float | None = None) -> dict[str, Any]:
    """Throughput, latency (arrival to completion, queueing included) with 95% intervals, queue time, batch sizes,
    lateness.

    Throughput counts the samples that *completed* inside the window, over the window's length; latencies are
    those of the requests that *arrived* inside it. A LoadGen run brings its own latencies (by LoadGen's clock,
    from each query's scheduled time) and its own verdict on the budget (``meets_budget``: LoadGen's VALID, which
    needs the p99 within the budget with confidence).
    """
    from ..statistics.intervals import QUANTILES, quantile_interval

    start, end = run.window_start_ns, run.window_end_ns
    measured = [r for r in run.requests if start <= r.arrival_ns < end and r.sent_ns]
    if not measured:
        raise ValueError("no request arrived in the measurement window: run longer or at a higher rate")
    seconds = (end - start) / 1e9
    completed = sum(r.samples for r in run.requests if start <= r.done_ns < end)
    completed_requests = sum(1 for r in run.requests if start <= r.done_ns < end)
    unfinished = [r for r in measured if not r.done_ns]
    settings = dict(run.settings)
    loadgen = settings.pop("loadgen", None)
    latencies = settings.pop("latencies_ns", None) or [(r.done_ns or run.cutoff_ns) - r.arrival_ns for r in measured]
    queueing = [(r.dispatch_ns or run.cutoff_ns) - r.arrival_ns for r in measured]
    service = [r.done_ns - r.dispatch_ns for r in measured if r.done_ns]  # a long one is a stall, not queueing
    batches = {r.batch_id: r.batch_samples for r in measured if r.done_ns}
    result: dict[str, Any] = settings
    latency = _ms(latencies)
    ordered = sorted(v / 1e6 for v in latencies)
    intervals = {}
    for key, quantile in QUANTILES.items():
        low, high, _ = quantile_interval(ordered, quantile)
        intervals[key] = [min(low, latency[key]), max(high, latency[key])]
    result.update({
        "requests": len(measured),
        "queries": len(latencies),
        "throughput_qps": completed / seconds,
        "requests_per_s": completed_requests / seconds,
        "latency_ms": latency,
        "latency_ci_ms": intervals,
        "queue_ms": _ms(queueing, ("p50", "p99", "mean")),
        "service_ms": _ms(service, ("p50", "p99", "max")) if service else None,
        "mean_batch_size": sum(batches.values()) / len(batches) if batches else 0.0,
        "delayed_sends": sum(1 for r in measured if r.sent_ns - r.arrival_ns > DELAYED_SEND_NS),
        "unfinished": len(unfinished),
    })
    if loadgen is not None:
        result["loadgen"] = loadgen
    if latency_budget_ms is not None:
        budget_ns = latency_budget_ms * 1e6
        result["late_requests"] = sum(1 for value in latencies if value > budget_ns)
        if loadgen is not None:
            result["meets_budget"] = bool(loadgen.get("valid")) and not unfinished
        else:
            result["meets_budget"] = result["latency_ms"]["p99"] <= latency_budget_ms and not unfinished
    if run.offered_rate_qps is not None:  # open loop: did completions keep up with what actually arrived?
        arrived = sum(r.samples for r in measured) / seconds
        result["saturated"] = bool(unfinished) or result["throughput_qps"] < 0.9 * arrived
    return result


def highest_rate_meeting_budget(points: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The open-loop point of the highest arrival rate whose p99 latency met the budget (None: none did)."""
    meeting = [p for p in points if p.get("meets_budget")]
    return max(meeting, key=lambda p: p["arrival_rate_qps"]) if meeting else None


def next_rate_to_try(points: Sequence[Mapping[str, Any]], tolerance: float = 0.05) -> float | None:
    """The arrival rate to probe next when searching for the highest rate that meets the budget, from the points
    measured so far: double the best passing rate until one misses, halve the lowest rate while none passes, then
    bisect between the best pass and the lowest miss above it; None once those are within ``tolerance``."""
    if not points:
        raise ValueError("a rate search starts from at least one measured rate")
    passing = [p["arrival_rate_qps"] for p in points if p.get("meets_budget")]
    failing = [p["arrival_rate_qps"] for p in points if not p.get("meets_budget")]
    if not passing:
        return min(failing) / 2
    best = max(passing)
    above = [rate for rate in failing if rate > best]
    if not above:
        return best * 2
    low_miss = min(above)
    return None if low_miss <= best * (1 + tolerance) else (best + low_miss) / 2


#: A confirmation run lasts at least this many relaxation times of the queue at its rate (`relaxation_s`).
SETTLE_RELAXATIONS = 30.0
#: ... and at most this many times the shortest confirmation asked for.
CONFIRM_CAP_FACTOR = 2.0
#: The highest utilisation the relaxation time is computed for (at 1 it is infinite).
MAX_UTILISATION = 0.98


def relaxation_s(rate_qps: float, sample_service_s: float) -> float:
    """How long a single-server queue at ``rate_qps`` arrivals per second, ``sample_service_s`` seconds of work each,
    takes to forget a disturbance (Morse's relaxation time, s / (1 - sqrt(rho))^2, rho = rate x s): a burst or a
    stall near saturation leaves a backlog that drains for this long, so a run shorter than many of them may end
    before its queue has shown what its p99 is. Grows without bound as rho nears 1 (computed up to
    `MAX_UTILISATION`)."""
    if rate_qps <= 0 or sample_service_s <= 0:
        return 0.0
    rho = min(rate_qps * sample_service_s, MAX_UTILISATION)
    return sample_service_s / (1.0 - rho ** 0.5) ** 2


def sample_service_s(point: Mapping[str, Any], instances: int) -> float:
    """The work of one sample, in seconds of one server, from a measured open-loop point: the median service time
    of its batches over their mean size, shared by ``instances`` model instances (0 when not measured)."""
    service = (point.get("service_ms") or {}).get("p50")
    batch = point.get("mean_batch_size") or 1.0
    if not isinstance(service, (int, float)) or service <= 0:
        return 0.0
    return service / 1000.0 / max(float(batch), 1.0) / max(instances, 1)


def confirmation_seconds(rate_qps: float, point: Mapping[str, Any], instances: int, shortest_s: float,
                         min_queries: int) -> float:
    """How long to confirm ``rate_qps``: at least ``shortest_s``, at least ``min_queries`` arrivals (what the judged
    percentile needs), and `SETTLE_RELAXATIONS` relaxation times of the queue at that rate (longer near saturation),
    at most `CONFIRM_CAP_FACTOR` x ``shortest_s`` (unless the queries need more)."""
    for_queries = min_queries / rate_qps if rate_qps > 0 else 0.0
    settle = SETTLE_RELAXATIONS * relaxation_s(rate_qps, sample_service_s(point, instances))
    return max(min(max(shortest_s, settle), CONFIRM_CAP_FACTOR * shortest_s), for_queries)


def grid_index(rate_qps: float, step_percent: float) -> int:
    """The index of the highest rate of the confirmation grid at or below ``rate_qps``: the grid is geometric,
    (1 + step_percent/100) ** k requests/s, anchored at 1/s, so every run of a search confirms the same rates."""
    if rate_qps <= 0:
        raise ValueError(f"a confirmation needs a positive rate, not {rate_qps}")
    index = math.floor(math.log(rate_qps) / math.log1p(step_percent / 100.0) + 1e-3)
    # a grid rate rounded to 0.01/s (`grid_rate`) is still its own index: rounding down can put it below the
    # exact power by more than the tolerance above
    while grid_rate(index + 1, step_percent) <= rate_qps:
        index += 1
    while index > 0 and grid_rate(index, step_percent) > rate_qps:
        index -= 1
    return index


def grid_rate(index: int, step_percent: float) -> float:
    """Rate ``index`` of the confirmation grid (`grid_index`), rounded to 0.01 requests/s."""
    return round((1.0 + step_percent / 100.0) ** index, 2)


def pooled_meets_budget(levels: Sequence[Mapping[str, Any]], percentile: float = 0.99, confidence: float = 0.99,
                        with_confidence: bool = True) -> bool:
    """Whether the levels run at one rate, pooled (their queries and late queries summed), meet the budget: with
    ``with_confidence`` (LoadGen's rule, its early stopping) the ``percentile`` latency is within the budget with
    ``confidence``: P(Binomial(queries, 1 - percentile) <= late) < 1 - confidence (459 queries with none late at
    p99); else the late share is at most 1 - percentile (a p99 within the budget). A level with unfinished requests
    fails the rate. For one level this is LoadGen's verdict on the latency."""
    if not levels or any(level.get("unfinished") for level in levels):
        return False
    queries = sum(int(level.get("queries") or 0) for level in levels)
    late = sum(int(level.get("late_requests") or 0) for level in levels)
    if queries == 0:
        return False
    if not with_confidence:
        return late <= (1.0 - percentile) * queries
    from scipy import stats

    return bool(stats.binom.cdf(late, queries, 1.0 - percentile) < 1.0 - confidence)


def merge_runs(runs: Sequence[LoadRun]) -> LoadRun:
    """One record of several replicas (one per GPU) run at the same time: their requests together, over the
    window they all covered."""
    start = max(run.window_start_ns for run in runs)
    end = min(run.window_end_ns for run in runs)
    if end <= start:
        raise ValueError("the replicas' measurement windows do not overlap")
    requests = []
    for index, run in enumerate(runs):
        for request in run.requests:
            request.batch_id += index << 40  # batch numbers restart in every replica
            requests.append(request)
    settings = dict(runs[0].settings)
    if all("latencies_ns" in run.settings for run in runs):  # LoadGen in each replica: its clock, every sample
        settings["latencies_ns"] = [v for run in runs for v in run.settings["latencies_ns"]]
    verdicts = [run.settings["loadgen"] for run in runs if "loadgen" in run.settings]
    if verdicts:
        valid = len(verdicts) == len(runs) and all(v.get("valid") for v in verdicts)
        settings["loadgen"] = {"valid": valid, "result_validity": "VALID" if valid else "INVALID",
                               "replicas": verdicts}
    return LoadRun(requests, start, end, max(run.cutoff_ns for run in runs),
                   offered_rate_qps=sum(run.offered_rate_qps or 0 for run in runs) or None, settings=settings)
