"""MLPerf LoadGen as the load generator of the benchmark's serving scenarios (the ``loadgen`` extra).

LoadGen (``mlcommons-loadgen``, module ``mlperf_loadgen``) issues the queries of an MLPerf scenario and times
them from the moment each was *scheduled*; the system under test (SUT) is trtflow's `measure.serving.traffic.Server`:
its
queue, dynamic batcher and model instances, unchanged. The scenarios are named as MLPerf names them:

- ``Server``: single-sample queries arriving as a Poisson process at ``target_qps``; the run is VALID when the
  ``percentile`` (p99) latency is within the budget *with confidence* (LoadGen's early stopping: with t queries
  over the budget, at least h(t) + t queries are needed; with none over, 459 at p99) and the minimum duration and
  query count were met. Whether a rate meets a budget is LoadGen's verdict;
- ``Offline``: every sample in one query, as fast as the SUT can; the figure is samples per second;
- ``SingleStream``: one single-sample query at a time, the next when the previous completed; the figure is the
  p90 latency and LoadGen's early-stopping estimates of p90 and p99;
- ``MultiStream``: one query of ``samples_per_query`` samples at a time; the figure is the p99 query latency.

LoadGen writes its logs to a folder; `run` reads its verdict and figures from ``mlperf_log_detail.txt`` and every
sample's latency from its trace (``mlperf_log_trace.json``), so the same statistics and intervals as for our own
generator can be computed from LoadGen's own clock.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .traffic import LoadRun, Request, Server

Scenario = Literal["Server", "Offline", "SingleStream", "MultiStream"]
EXTRA_HINT = "pip install 'trtflow[loadgen]' (the mlcommons-loadgen package)"
SAMPLE_LIBRARY_SIZE = 1024  # the feed is the same for every sample: LoadGen's sample indices are not used
RESULT_KEYS = ("result_validity", "result_perf_constraints_met", "result_min_duration_met", "result_min_queries_met",
               "early_stopping_met", "early_stopping_result", "result_invalid_reason", "result_query_count",
               "result_overlatency_query_count", "result_scheduled_samples_per_sec",
               "result_completed_samples_per_sec", "result_samples_per_second", "result_qps_with_loadgen_overhead",
               "result_qps_without_loadgen_overhead", "early_stopping_latency_ss", "early_stopping_latency_ms",
               "result_mean_latency_ns", "effective_target_qps", "effective_min_duration_ms",
               "effective_min_query_count", "effective_target_latency_ns", "effective_target_latency_percentile",
               "effective_samples_per_query", "loadgen_version")
_LINE = re.compile(r"^:::MLLOG (\{.*\})\s*$")
_SAMPLE = re.compile(r'"name":"Sample".*?"args":\{"sample_seq":(\d+),"query_seq":(\d+).*?"complete_ns":(\d+)')


def unavailable() -> str | None:
    """Why LoadGen cannot be used here (None: it can)."""
    try:
        import mlperf_loadgen  # noqa: F401
    except ImportError:
        return f"MLPerf LoadGen is not installed: {EXTRA_HINT}"
    return None


@functools.lru_cache(maxsize=64)
def early_stopping_queries(percentile: float = 0.99, overlatency: int = 0, confidence: float = 0.99) -> int:
    """The fewest queries that let LoadGen's early stopping claim the ``percentile`` latency is within the target
    with ``overlatency`` queries over it (MLPerf: 459 at p99 with none over, at 99% confidence; computed once per
    arguments: every Server level asks)."""
    from scipy import stats

    queries = overlatency + 1
    while stats.binom.cdf(overlatency, queries, 1.0 - percentile) >= 1.0 - confidence:
        queries += max(1, queries // 50)
    low = max(overlatency + 1, queries - max(1, queries // 50))
    while stats.binom.cdf(overlatency, low, 1.0 - percentile) >= 1.0 - confidence:
        low += 1
    return low


@dataclass(frozen=True)
class ScenarioSpec:
    """One LoadGen test: a scenario and its settings (picklable: replicas run it in their own process)."""

    scenario: Scenario
    min_duration_s: float
    target_qps: float = 1.0  # Server: the Poisson arrival rate; Offline: the expected rate (sizes the query)
    latency_budget_ms: float | None = None  # Server: the target latency of `percentile`
    percentile: float = 0.99  # Server and MultiStream: the latency percentile judged
    min_query_count: int = 100
    samples_per_query: int = 8  # MultiStream
    request_samples: int = 1  # Offline: samples per request handed to the server (a batch without a batcher)
    expected_latency_ms: float = 1.0  # SingleStream/MultiStream: sizes the pre-generated queries
    seed: int = 0

    def settings(self) -> Any:
        import mlperf_loadgen as lg

        settings = lg.TestSettings()
        settings.scenario = getattr(lg.TestScenario, self.scenario)
        settings.mode = lg.TestMode.PerformanceOnly
        settings.min_duration_ms = int(self.min_duration_s * 1000)
        settings.min_query_count = self.min_query_count
        settings.schedule_rng_seed = settings.sample_index_rng_seed = self.seed
        expected_ns = max(int(self.expected_latency_ms * 1e6), 1000)
        if self.scenario == "Server":
            settings.server_target_qps = self.target_qps
            # without a budget, nothing is over latency: the run is judged on its duration and query count only
            budget_ms = self.latency_budget_ms if self.latency_budget_ms is not None else 3.6e6
            settings.server_target_latency_ns = int(budget_ms * 1e6)
            settings.server_target_latency_percentile = self.percentile
        elif self.scenario == "Offline":
            settings.offline_expected_qps = self.target_qps
        elif self.scenario == "SingleStream":
            settings.single_stream_expected_latency_ns = expected_ns
        else:
            settings.multi_stream_samples_per_query = self.samples_per_query
            settings.multi_stream_expected_latency_ns = expected_ns
            settings.multi_stream_target_latency_percentile = self.percentile
        return settings


@dataclass
class _Sut:
    """LoadGen's system under test: each query becomes requests on the server; completions go back to LoadGen."""

    server: Server
    spec: ScenarioSpec
    requests: list[Request] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def issue(self, samples: Any) -> None:
        now = time.monotonic_ns()
        ids = [sample.id for sample in samples]
        if self.spec.scenario == "MultiStream":
            chunk = len(ids)  # one query, one batch: its latency is its slowest sample's anyway
        elif self.spec.scenario == "Offline":
            chunk = max(self.spec.request_samples, 1)
        else:
            chunk = 1
        made = []
        for start in range(0, len(ids), chunk):
            part = tuple(ids[start:start + chunk])
            made.append(Request(arrival_ns=now, samples=len(part), sent_ns=now, ids=part, notify=self._complete))
        with self._lock:
            self.requests.extend(made)
        for request in made:
            self.server.submit(request)

    @staticmethod
    def _complete(request: Request) -> None:
        import mlperf_loadgen as lg

        lg.QuerySamplesComplete([lg.QuerySampleResponse(sample_id, 0, 0) for sample_id in request.ids])

    def flush(self) -> None:
        """LoadGen's end of test: every query was already handed to the server."""


def read_detail(path: Path) -> dict[str, Any]:
    """LoadGen's results from ``mlperf_log_detail.txt``: the `RESULT_KEYS` and every latency percentile."""
    found: dict[str, Any] = {"percentiles_ns": {}}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        try:
            entry = json.loads(match.group(1))
        except ValueError:
            continue
        key, value = entry.get("key"), entry.get("value")
        if key in RESULT_KEYS:
            found[key] = value
        elif isinstance(key, str) and key.startswith("result_") and key.endswith("_percentile_latency_ns"):
            found["percentiles_ns"][key[len("result_"):-len("_percentile_latency_ns")]] = value
        elif isinstance(key, str) and key.endswith("_percentile_per_query_latency_ns"):
            found.setdefault("query_percentiles_ns", {})[
                key[len("result_"):-len("_percentile_per_query_latency_ns")]] = value
    return found


def read_trace(path: Path) -> tuple[list[int], dict[int, int]]:
    """Every sample's latency (ns, LoadGen's clock: scheduled to completed) in sample order, and per query its
    slowest sample's latency (the query latency), from LoadGen's trace."""
    samples: dict[int, int] = {}
    queries: dict[int, int] = {}
    text = path.read_text(encoding="utf-8", errors="replace")
    for match in _SAMPLE.finditer(text):
        sample, query, latency = (int(g) for g in match.groups())
        samples[sample] = latency
        queries[query] = max(queries.get(query, 0), latency)
    return [samples[key] for key in sorted(samples)], queries


def run(server: Server, spec: ScenarioSpec, log_dir: Path | None = None) -> LoadRun:
    """One LoadGen test of ``spec`` on ``server``: the request records (for queueing, service and batch figures)
    and, in ``settings["loadgen"]``, LoadGen's verdict and figures; ``settings["latencies_ns"]`` holds every
    sample's latency by LoadGen's clock (query latencies for MultiStream)."""
    import mlperf_loadgen as lg

    sut = _Sut(server, spec)
    with tempfile.TemporaryDirectory(prefix="loadgen-") if log_dir is None else _Keep(log_dir) as folder:
        logs = lg.LogSettings()
        logs.log_output.outdir = str(folder)
        logs.log_output.copy_summary_to_stdout = False
        logs.enable_trace = True
        handle = lg.ConstructSUT(sut.issue, sut.flush)
        library = lg.ConstructQSL(SAMPLE_LIBRARY_SIZE, SAMPLE_LIBRARY_SIZE, _noop, _noop)
        started = time.monotonic_ns()
        try:
            lg.StartTestWithLogSettings(handle, library, spec.settings(), logs)
        finally:
            lg.DestroyQSL(library)
            lg.DestroySUT(handle)
        ended = time.monotonic_ns()
        server.check()
        result = read_detail(Path(folder) / "mlperf_log_detail.txt")
        latencies, per_query = read_trace(Path(folder) / "mlperf_log_trace.json")
    if spec.scenario == "MultiStream":
        latencies = [per_query[key] for key in sorted(per_query)]
    result["valid"] = result.get("result_validity") == "VALID"
    first = min((r.arrival_ns for r in sut.requests), default=started)
    # a Server run is measured over its arrivals; the others until the last query completed
    end = max((r.arrival_ns for r in sut.requests), default=ended) + 1 if spec.scenario == "Server" else ended
    settings: dict[str, Any] = {"generator": "loadgen", "scenario": spec.scenario, "loadgen": result,
                                "latencies_ns": latencies, "request_samples": spec.request_samples}
    if spec.scenario == "Server":
        settings["arrival_rate_qps"] = spec.target_qps
    offered = spec.target_qps if spec.scenario == "Server" else None
    return LoadRun(sut.requests, first, end, ended, offered_rate_qps=offered, settings=settings)


def run_sized(server: Server, spec: ScenarioSpec, log_dir: Path | None = None) -> LoadRun:
    """`run`, once more with the query sized from the first run's pace when LoadGen said the minimum duration was
    not met (its own advice: Offline's expected rate and the streams' expected latency size what it generates)."""
    first = run(server, spec, log_dir)
    verdict = first.settings["loadgen"]
    if spec.scenario == "Server" or verdict.get("result_min_duration_met") is not False:
        return first
    if spec.scenario == "Offline":
        rate = verdict.get("result_samples_per_second")
        if not isinstance(rate, (int, float)) or rate <= 0:
            return first
        sized = dataclasses.replace(spec, target_qps=float(rate) * 1.2)
    else:
        latencies = first.settings["latencies_ns"]
        if not latencies:
            return first
        mean_ms = sum(latencies) / len(latencies) / 1e6
        sized = dataclasses.replace(spec, expected_latency_ms=max(mean_ms / 1.5, 0.001))
    return run(server, sized, log_dir)


def _noop(_samples: Any) -> None:
    """The sample library has nothing to load: every query runs the same prepared inputs."""


class _Keep:
    """A log folder the caller keeps (a context manager like TemporaryDirectory)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def __enter__(self) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        return self.path

    def __exit__(self, *exc: object) -> None:
        pass

