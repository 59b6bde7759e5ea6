"""The benchmark stage's serving-load measurements: closed-loop levels, MLPerf scenarios, streams and GPUs.

`measure_load` prepares the inputs at the largest batch the load needs (checked against the model's and the
profile's batch limits), builds the model instances (`measure.serving.instances`) in this process, or one replica
process per GPU (`measure.serving.replicas`) when ``gpus`` > 1, drives each level (`measure.serving.levels`) through a
`measure.serving.traffic.Server` and turns the request records into benchmark.json's ``load`` (closed loop),
``open_loop`` (MLPerf's Server scenario, driven by LoadGen where installed), ``scenarios`` (Offline, SingleStream,
MultiStream through LoadGen), ``max_rate_meeting_budget`` and ``scaling`` sections.

The serving capacity (``max_rate_meeting_budget``) is searched with short levels (``load_duration_s``: doubling,
then bisecting) and then confirmed in both directions with long levels (`confirm_capacity`): near saturation a short
level can end before its queue shows the p99 a longer run sees, and one long level passes or fails by the queue
excursions it happens to see, so the confirmation runs an up-and-down staircase of long levels on a fixed grid of
rates around the knee and reads the capacity off all of them (`capacity.crossing`, `capacity.CONFIRM_RULE`): where
the median level's p99, made non-decreasing in the rate, crosses the budget, between a grid rate that meets and
the one above it that misses. The entry records both level lengths, the search's answer and bracket, the
capacity's interval, the evidence per rate and every level.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trtflow.stage import RecipeError, StageContext, StageSkipped

from ...data import InputSpec
from ..timing.feeds import FeedParams
from .capacity import CONFIRM_RULE, capacity_interval, crossing, fitted_p99, level_meets, level_p99_ms, settled
from .instances import ExecutorSpec, available_cpus, open_executor
from .levels import Level, run_level
from .loadgen import Scenario, ScenarioSpec, early_stopping_queries, unavailable
from .traffic import (
    DynamicBatching,
    LoadRun,
    Server,
    confirmation_seconds,
    grid_index,
    grid_rate,
    highest_rate_meeting_budget,
    merge_runs,
    next_rate_to_try,
    pooled_meets_budget,
    steady_interpreter,
    summarize_run,
)

if TYPE_CHECKING:
    from trtflow.environment import GpuInfo

    from ...runtimes.ort import OrtOptions
    from .traffic import DynamicBatching


class ServingParams(FeedParams, Protocol):
    """What serving load reads of a benchmark node's params (the benchmark stage's ``Params``: its `LoadFields`, the
    instances it opens, and the feed)."""

    @property
    def concurrency(self) -> list[int]: ...
    @property
    def request_size(self) -> int | None: ...
    @property
    def arrival_rate_qps(self) -> list[float]: ...
    @property
    def scenarios(self) -> Sequence[Scenario]: ...
    @property
    def load_generator(self) -> str: ...
    @property
    def multi_stream_samples(self) -> int: ...
    @property
    def loadgen_min_queries(self) -> int | None: ...
    @property
    def dynamic_batching(self) -> DynamicBatching | None: ...
    @property
    def latency_budget_ms(self) -> float | None: ...
    @property
    def rate_search_probes(self) -> int: ...
    @property
    def confirm_duration_s(self) -> float: ...
    @property
    def confirm_steps(self) -> int: ...
    @property
    def confirm_visits(self) -> int: ...
    @property
    def confirm_step_percent(self) -> float: ...
    @property
    def load_duration_s(self) -> float: ...
    @property
    def load_warmup_s(self) -> float: ...
    @property
    def gpus(self) -> int | str: ...
    @property
    def seed(self) -> int: ...
    @property
    def stream_counts(self) -> list[int]: ...
    @property
    def torch_model(self) -> str | None: ...
    @property
    def serving_cuda_graphs(self) -> bool: ...
    @property
    def onnxruntime(self) -> OrtOptions: ...

ISSUE_LATENCY_KEYS = ("p50", "p90", "p95", "p99")


def serving_gpus(wanted: int | str, visible: Sequence[GpuInfo] | None = None) -> list[str]:
    """What to put in each replica's CUDA_VISIBLE_DEVICES (a GPU's or MIG slice's UUID, else its nvidia-smi
    index): one per GPU to serve from, among the ``visible`` ones (default: those this process may use, every GPU
    the runner gave the node). ``wanted``: a count, or "all"."""
    if visible is None:
        from trtflow.environment import gpus

        visible = gpus()
    found = [gpu.visible_id for gpu in visible]
    count = len(found) if wanted == "all" else int(wanted)
    if count > len(found) or count == 0:
        raise StageSkipped(f"gpus: {wanted} but {len(found)} GPU(s) are visible here",
                           needs=f"a machine with {max(count, 1)} GPUs, and the node given them all")
    return found[:count]


def _torch_reference(spec: str | None, resolve: Callable[[str], Path]) -> str | None:
    """``python:file.py:fn`` with the file resolved to an absolute path, so replica processes find it."""
    if spec is None:
        return None
    target, _, attr = spec.rpartition(":")
    body = target[len("python:"):]
    if body.endswith(".py") or "/" in body:
        return f"python:{resolve(body)}:{attr}"
    return spec


def check_batches(largest: int, limits: tuple[int, int | None], batching: DynamicBatching | None) -> None:
    low, high = limits
    if high is not None and largest > high:
        what = (f"dynamic_batching.max_batch_size {batching.max_batch_size}" if batching is not None
                and batching.max_batch_size == largest else f"a request of {largest} samples")
        raise RecipeError(f"{what} exceeds the largest batch the model accepts ({high}: its optimization profile "
                          "or a fixed batch dimension)", field="dynamic_batching" if batching else "request_size",
                          hint=f"keep batches within [{low}, {high}]")
    if batching is not None and high is not None and low == high and high > 1:
        raise RecipeError(f"dynamic batching needs a model with a dynamic batch dimension; this one runs only "
                          f"batches of {high}", field="dynamic_batching",
                          hint="export the model with a dynamic batch axis (dynamic_axes: {0: batch})")


@contextmanager
def _serving(spec: ExecutorSpec, devices: Sequence[str] | None, instances: int, batching: DynamicBatching | None,
             warm_sizes: Sequence[int], timer_factory: Callable[[], Any]) -> Iterator[tuple[Any, dict[str, Any]]]:
    """Yields (run(levels) -> merged LoadRun per level, executor settings): in this process or on replicas."""
    if devices is None:
        with open_executor(spec, timer_factory) as executor:
            runs = executor.instances(instances)
            with steady_interpreter() as quiet, Server(runs, batching, warm_sizes) as server:
                yield (lambda level: run_level(server, level)), dict(executor.settings, **quiet)
        return
    from .replicas import Replicas

    with Replicas(spec, devices, instances, batching, warm_sizes) as replicas:
        count = len(devices)

        def run(level: Level) -> LoadRun:
            runs = replicas.run([share(level, count, index) for index in range(count)],
                                2 * (level.warmup_s + level.duration_s) + 120.0)
            per_gpu = [round(summarize_run(run)["throughput_qps"], 3) for run in runs]
            merged = merge_runs(runs)
            merged.settings["throughput_qps_per_gpu"] = per_gpu
            return merged

        yield run, dict(replicas.settings[0], devices=list(devices))


def share(level: Level, count: int, index: int) -> Level:
    """Replica ``index``'s part of a level served by ``count`` replicas: an arrival rate is split (Poisson streams
    of rate r/n add up to one of rate r), each with its own seed; closed-loop clients are per replica."""
    seed = level.seed + index
    if level.mode == "open":
        return dataclasses.replace(level, value=level.value / count, seed=seed)
    if level.mode == "loadgen" and level.scenario is not None:
        scenario = level.scenario
        if scenario.scenario in ("Server", "Offline"):
            scenario = dataclasses.replace(scenario, target_qps=scenario.target_qps / count)
        return dataclasses.replace(level, value=level.value / count if scenario.scenario == "Server" else level.value,
                                   seed=seed, scenario=dataclasses.replace(scenario, seed=seed))
    return dataclasses.replace(level, seed=seed)


def _closed_entry(summary: Mapping[str, Any], streams: int, gpus: int) -> dict[str, Any]:
    per_gpu = int(summary["concurrency"])
    entry = {"concurrency": per_gpu * gpus, "throughput_qps": summary["throughput_qps"],
             "latency_ms": {key: summary["latency_ms"][key] for key in ISSUE_LATENCY_KEYS},
             "streams": streams, "gpus": gpus}
    if gpus > 1:
        entry["concurrency_per_gpu"] = per_gpu
    entry.update({key: summary[key] for key in ("requests", "requests_per_s", "request_samples", "queue_ms",
                                                "service_ms", "mean_batch_size", "unfinished")})
    if "throughput_qps_per_gpu" in summary:
        entry["throughput_qps_per_gpu"] = summary["throughput_qps_per_gpu"]
    entry["latency_ms"].update(mean=summary["latency_ms"]["mean"], max=summary["latency_ms"]["max"])
    return entry


def _open_entry(summary: Mapping[str, Any], rate: float, streams: int, gpus: int) -> dict[str, Any]:
    entry = {"arrival_rate_qps": rate, "scenario": "Server", "generator": "trtflow", "streams": streams, "gpus": gpus}
    entry.update({key: value for key, value in summary.items() if key not in ("arrival_rate_qps", "seed")})
    return entry


def _scenario_entry(summary: Mapping[str, Any], streams: int) -> dict[str, Any]:
    """An Offline / SingleStream / MultiStream result: LoadGen's verdict and figures, ours with intervals."""
    verdict = summary.get("loadgen") or {}
    entry = {"scenario": summary.get("scenario"), "generator": "loadgen", "streams": streams,
             "valid": bool(verdict.get("valid")), "throughput_qps": summary["throughput_qps"]}
    if summary.get("scenario") == "Offline" and isinstance(verdict.get("result_samples_per_second"), (int, float)):
        entry["throughput_qps"] = verdict["result_samples_per_second"]  # LoadGen's figure: samples / last completion
    entry.update({key: summary[key] for key in ("queries", "latency_ms", "latency_ci_ms", "mean_batch_size",
                                                "request_samples", "service_ms", "queue_ms") if key in summary})
    entry["loadgen"] = verdict
    return entry


def _cpu_warnings(settings: Mapping[str, Any], instances: int, device: str) -> list[dict[str, str]]:
    if device != "cpu":
        return []
    cpus = int(settings.get("cpus") or available_cpus())
    threads = settings.get("intra_op_threads")
    per_instance = threads if isinstance(threads, int) and threads > 0 else cpus
    if instances * per_instance <= cpus:
        return []
    return [{"flag": "cpu-oversubscribed", "message": f"{instances} instance(s) x {per_instance} intra-op thread(s) "
             f"> {cpus} CPUs: instances compete for cores, so added streams show contention, not capacity; set "
             "onnxruntime.intra_op_threads so that streams x threads <= CPUs"}]


def load_generator(params: ServingParams) -> tuple[str, list[dict[str, str]]]:
    """The generator of the Server levels ("loadgen" or "trtflow") and a warning when auto fell back."""
    reason = unavailable()
    if params.load_generator == "trtflow":
        return "trtflow", []
    if reason is None:
        return "loadgen", []
    if params.load_generator == "loadgen" or params.scenarios:
        wanted = "load_generator: loadgen" if params.load_generator == "loadgen" else f"scenarios {params.scenarios}"
        raise StageSkipped(f"{wanted} needs MLPerf LoadGen: {reason}", needs="pip install 'trtflow[loadgen]'")
    return "trtflow", [{"flag": "no-loadgen", "message": f"{reason}; the Server levels ran on trtflow's own "
                        "generator, whose p99 is not LoadGen's verdict"}] if params.arrival_rate_qps else []


def server_level(params: ServingParams, rate: float, generator: str, duration_s: float | None = None) -> Level:
    """A Server level at ``rate`` (``duration_s``: instead of load_duration_s, e.g. a confirmation's)."""
    duration = params.load_duration_s if duration_s is None else duration_s
    if generator == "trtflow":
        return Level("open", rate, 1, params.load_warmup_s, duration, params.seed)
    queries = params.loadgen_min_queries or early_stopping_queries(0.99)
    scenario = ScenarioSpec("Server", duration, target_qps=rate,
                            latency_budget_ms=params.latency_budget_ms, min_query_count=queries, seed=params.seed)
    return Level("loadgen", rate, 1, params.load_warmup_s, duration, params.seed, scenario)


#: The most grid steps one confirmation level moves while only one side of the budget has been seen (1, 2, then
#: this: 4 x 2.5%, 10%): a 2 s search can stop 20% off the knee, and a level far past it costs a level back.
MAX_STRIDE = 4


def confirm_capacity(serve: Callable[[Level], LoadRun], params: ServingParams, generator: str, found: Mapping[str, Any],
                     streams: int, gpus: int,
                     on_level: Callable[[Level], None] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Confirm, in both directions, the rate a search ``found`` (`capacity.CONFIRM_RULE`): ``confirm_steps`` levels
    of `load.confirmation_seconds` on the grid rates around it, an up-and-down staircase, read by
    `capacity.crossing`. Returns the open-loop entries measured and the confirmation: ``rate_qps`` (None: no rate
    met the budget below one that missed), its ``interval_qps``, the grid rates around it (``meets_qps``,
    ``miss_above_qps``), ``settled``, ``level_s``, the pooled ``queries`` / ``late_requests`` at the rate that
    meets, ``pooled`` per grid rate (its levels, their median and fitted p99, LoadGen's rule on their summed
    queries) and every ``attempts``."""
    step = params.confirm_step_percent
    budget = float(params.latency_budget_ms or 0.0)
    min_queries = params.loadgen_min_queries or early_stopping_queries(0.99)
    with_confidence = generator == "loadgen"
    index = grid_index(float(found["arrival_rate_qps"]), step)
    entries: list[dict[str, Any]] = []
    attempts: list[dict[str, Any]] = []
    durations: list[float] = []
    seen: set[bool] = set()

    def visit(index: int) -> bool:
        rate = grid_rate(index, step)
        duration = confirmation_seconds(rate, found, streams, params.confirm_duration_s, min_queries)
        durations.append(round(duration, 3))
        level = server_level(params, rate, generator, duration)
        if on_level is not None:
            on_level(level)
        summary = summarize_run(serve(level), params.latency_budget_ms)
        entry = dict(_open_entry(summary, rate, streams, gpus), generator=generator, searched=True, confirmation=True,
                     duration_s=round(duration, 3))
        entries.append(entry)
        met = level_meets(entry, budget)
        attempts.append({"rate_qps": rate, "duration_s": round(duration, 3), "queries": entry.get("queries"),
                         "p99_ms": entry["latency_ms"]["p99"], "p99_bound_ms": round(level_p99_ms(entry, budget), 3),
                         "late_requests": entry.get("late_requests"), "meets_budget": met,
                         "loadgen_valid": bool(entry.get("meets_budget"))})
        return met

    stride = 1
    for _ in range(params.confirm_steps):
        met = visit(index)
        seen.add(met)
        index += stride if met else -stride
        stride = 1 if len(seen) == 2 else min(stride * 2, MAX_STRIDE)
    # The fit does not bracket the budget (every rate's median level misses, or every one meets: the host changed
    # during the staircase, or it started far off): on beyond the lowest (highest) rate visited, the stride
    # doubling, up to confirm_steps more levels, until it does. Without it a run could report no capacity at all
    # (seen on the H100: 1 run in 5, bench/results/serving/2026-11-27/h100-d).
    extended = 0
    stride = 1
    while extended < params.confirm_steps:
        _, meets, misses = crossing(entries, budget)
        if meets is not None and misses is not None:
            break
        visited = [grid_index(float(x["arrival_rate_qps"]), step) for x in entries]
        visit(min(visited) - stride if meets is None else max(visited) + stride)
        stride = min(stride * 2, MAX_STRIDE)
        extended += 1
    rate_qps, meets, misses = crossing(entries, budget)
    table = []
    for rate, count, median, fitted in fitted_p99(entries, budget):
        levels = [x for x in entries if x["arrival_rate_qps"] == rate]
        table.append({"rate_qps": rate, "levels": count, "median_p99_ms": round(median, 3),
                      "fitted_p99_ms": round(fitted, 3), "meets_budget": fitted <= budget,
                      "queries": sum(int(x.get("queries") or 0) for x in levels),
                      "late_requests": sum(int(x.get("late_requests") or 0) for x in levels),
                      "pooled_meets_budget": pooled_meets_budget(levels, with_confidence=with_confidence)})
    result: dict[str, Any] = {
        "rule": CONFIRM_RULE, "step_percent": step, "visits": params.confirm_visits,
        "settled": settled(entries, meets, misses, params.confirm_visits), "levels": len(entries),
        "extended_levels": extended,
        "level_s": max(durations) if durations else None, "duration_s": max(durations) if durations else None,
        "meets_qps": meets, "miss_above_qps": misses, "pooled": table, "attempts": attempts}
    if rate_qps is None or meets is None:
        # no miss above a rate that met: a lower bound at best, not a capacity
        result.update(rate_qps=None, lower_bound_qps=meets)
        return entries, result
    interval, missing = capacity_interval(entries, budget, params.seed)
    answer = [x for x in entries if x["arrival_rate_qps"] == meets]
    result.update(rate_qps=round(rate_qps, 1), interval_qps=interval, interval_without_crossing=missing,
                  queries=sum(int(x.get("queries") or 0) for x in answer),
                  late_requests=sum(int(x.get("late_requests") or 0) for x in answer),
                  p99_ms=max(x["latency_ms"]["p99"] for x in answer))
    return entries, result


def capacity_entry(params: ServingParams, generator: str, streams: int, gpus: int, group: Sequence[Mapping[str, Any]],
                   confirmation: Mapping[str, Any] | None) -> dict[str, Any]:
    """``max_rate_meeting_budget``'s entry: the confirmed rate (or, without a confirmation, the search's), the level
    length it was searched with (``level_s``) and confirmed with (``confirm_level_s``), the search's bracket and the
    confirmation."""
    searched = [p for p in group if not p.get("confirmation")]
    top = highest_rate_meeting_budget(searched)
    entry: dict[str, Any] = {"streams": streams, "gpus": gpus, "latency_budget_ms": params.latency_budget_ms,
                             "generator": generator, "level_s": params.load_duration_s,
                             "search_rate_qps": top["arrival_rate_qps"] if top else None}
    misses = [p["arrival_rate_qps"] for p in searched if not p.get("meets_budget")
              and (top is None or p["arrival_rate_qps"] > top["arrival_rate_qps"])]
    entry["bracket_qps"] = [top["arrival_rate_qps"] if top else None, min(misses) if misses else None]
    if confirmation is None:
        entry["confirmed"] = False
        entry.update(arrival_rate_qps=top["arrival_rate_qps"] if top else None,
                     throughput_qps=top["throughput_qps"] if top else None,
                     p99_ms=top["latency_ms"]["p99"] if top else None)
        return entry
    rate = confirmation.get("rate_qps")
    below = confirmation.get("meets_qps")
    # the levels at the grid rate below the capacity, which met: their throughput per offered request, scaled
    points = [p for p in group if p.get("confirmation") and rate is not None and p["arrival_rate_qps"] == below]
    entry["confirmed"] = rate is not None
    entry["settled"] = bool(confirmation.get("settled"))
    entry["confirm_level_s"] = confirmation.get("level_s")
    entry["confirmation"] = dict(confirmation)
    entry.update(arrival_rate_qps=rate, interval_qps=confirmation.get("interval_qps"),
                 throughput_qps=rate * sum(p["throughput_qps"] / p["arrival_rate_qps"] for p in points) / len(points)
                 if points and rate is not None else None,
                 p99_ms=max(p["latency_ms"]["p99"] for p in points) if points else None)
    return entry


def scenario_levels(params: ServingParams, offline_request: int) -> list[Level]:
    levels = []
    for name in params.scenarios:
        # LoadGen's early stopping for the streams discards at least one query: it needs that many more
        queries = params.loadgen_min_queries or early_stopping_queries(0.9 if name == "SingleStream" else 0.99,
                                                                       overlatency=1)
        if name == "Offline":
            queries = 1  # one query carries every sample
        scenario = ScenarioSpec(name, params.load_duration_s, target_qps=1000.0, min_query_count=queries,
                                samples_per_query=params.multi_stream_samples, request_samples=offline_request,
                                seed=params.seed)
        levels.append(Level("loadgen", 0.0, 1, 0.0, params.load_duration_s, params.seed, scenario))
    return levels


def _plans(params: ServingParams, gpu_count: int, closed_request: int, generator: str,
           offline_request: int) -> list[tuple[int, int, list[Level]]]:
    """(streams, gpus, levels): closed-loop levels on one GPU and on all; Server levels on all; the other MLPerf
    scenarios on one."""
    plans = []
    for streams in params.stream_counts:
        for gpus in ([1, gpu_count] if gpu_count > 1 else [1]):
            levels = [Level("closed", c, closed_request, params.load_warmup_s, params.load_duration_s)
                      for c in params.concurrency]
            if gpus == gpu_count:
                levels += [server_level(params, rate, generator) for rate in params.arrival_rate_qps]
            if gpus == 1:
                levels += scenario_levels(params, offline_request)
            plans.append((streams, gpus, levels))
    return plans


def measure_load(ctx: StageContext, params: ServingParams, backend: str, device: str, model: Path | None,
                 provenance: Path | None, specs: Sequence[InputSpec], base_shapes: Mapping[str, list[int]],
                 limits: tuple[int, int | None], timer_factory: Callable[[], Any]) -> dict[str, Any]:
    from ..timing.feeds import batch_of, make_feed, with_batch

    batching = params.dynamic_batching
    closed_request = params.request_size or (1 if batching else batch_of(base_shapes))
    offline_request = batching.max_batch_size if batching else closed_request
    largest = max(closed_request if params.concurrency else 1, batching.max_batch_size if batching else 1,
                  offline_request if "Offline" in params.scenarios else 1,
                  params.multi_stream_samples if "MultiStream" in params.scenarios else 1)
    check_batches(largest, limits, batching)
    low = limits[0]
    feed = make_feed(specs, with_batch(base_shapes, max(largest, low)), params, ctx.resolve, ctx.log)
    spec = ExecutorSpec(backend=backend, device=device, feed=feed, model=str(model) if model else None,
                        provenance=str(provenance) if provenance else None,
                        torch_model=_torch_reference(params.torch_model, ctx.resolve),
                        onnxruntime=params.onnxruntime, min_batch=low, cuda_graphs=params.serving_cuda_graphs)
    devices = serving_gpus(params.gpus) if params.gpus != 1 else []
    gpu_count = max(len(devices), 1)
    generator, warnings = load_generator(params)
    # the batcher forms any size up to its maximum: warm every one, or the first use of a size (a kernel loaded
    # lazily, a shape-specific set-up) stalls a measured request
    warm_sizes = list(range(1, largest + 1)) if batching else sorted({1, closed_request, largest})
    plans = _plans(params, gpu_count, closed_request, generator, offline_request)

    total = sum(len(levels) for _, _, levels in plans)
    done = 0
    load, open_loop, scenarios, best = [], [], [], []
    settings: dict[str, Any] = {}
    for streams, gpus, levels in plans:
        where = None if gpu_count == 1 else devices[:gpus]
        with ctx.native_step(backend, f"serving load on {streams} instance(s), {gpus} GPU(s)"), \
                _serving(spec, where, streams, batching, warm_sizes, timer_factory) as (serve, used):
            settings = settings or dict(used)
            warnings += _cpu_warnings(used, streams, device)
            group: list[dict[str, Any]] = []
            searched = 0
            queue = list(levels)
            while queue:
                level = queue.pop(0)
                total = max(total, done + 1 + len(queue))
                ctx.progress(0.5 + 0.5 * done / total, f"load: {level.describe}, {streams} stream(s), {gpus} GPU(s)")
                summary = summarize_run(serve(level), params.latency_budget_ms)
                done += 1
                if level.mode == "closed":
                    load.append(_closed_entry(summary, streams, gpus))
                    ctx.log.info("closed loop %s: %.1f samples/s, p50 %.4g ms, p99 %.4g ms", load[-1]["concurrency"],
                                 summary["throughput_qps"], summary["latency_ms"]["p50"], summary["latency_ms"]["p99"])
                elif level.scenario is not None and level.scenario.scenario != "Server":
                    scenarios.append(_scenario_entry(summary, streams))
                    ctx.log.info("%s (LoadGen): %s, %.1f samples/s, p90 %.4g ms, p99 %.4g ms",
                                 level.scenario.scenario, "VALID" if scenarios[-1]["valid"] else "INVALID",
                                 scenarios[-1]["throughput_qps"], summary["latency_ms"]["p90"],
                                 summary["latency_ms"]["p99"])
                else:
                    entry = dict(_open_entry(summary, level.value, streams, gpus), generator=generator)
                    entry["searched"] = searched > 0
                    group.append(entry)
                    open_loop.append(entry)
                    ctx.log.info("Server %g/s (%s): %.1f samples/s, p99 %.4g ms, mean batch %.2f%s", level.value,
                                 generator, summary["throughput_qps"], summary["latency_ms"]["p99"],
                                 summary["mean_batch_size"], "" if "meets_budget" not in entry else
                                 ", meets the budget" if entry["meets_budget"] else ", misses the budget")
                if level.mode == "open" and summary["delayed_sends"] > 0.01 * summary["requests"]:
                    warnings.append({"flag": "generator-behind", "message": f"{level.describe}: "
                                     f"{summary['delayed_sends']} requests were sent more than 1 ms late (the host was "
                                     "too busy); their latency still counts from the intended time"})
                if not queue and group and searched < params.rate_search_probes:
                    rate = next_rate_to_try(group)
                    if rate is not None:
                        searched += 1
                        queue.append(server_level(params, rate, generator))
            confirmation = None
            found = highest_rate_meeting_budget(group)
            if searched and found is not None and params.confirm_duration_s > 0:
                def announce(level: Level, streams: int = streams, gpus: int = gpus,
                             share: float = 0.5 + 0.5 * done / max(total, done + 1)) -> None:
                    ctx.progress(share, f"load: confirming {level.describe} for {level.duration_s:.3g} s, "
                                 f"{streams} stream(s), {gpus} GPU(s)")

                confirmed, confirmation = confirm_capacity(serve, params, generator, found, streams, gpus, announce)
                group += confirmed
                open_loop += confirmed
                for entry in confirmed:
                    ctx.log.info("Server %g/s (%s), confirmation of %.3g s: %.1f samples/s, p99 %.4g ms, %s",
                                 entry["arrival_rate_qps"], generator, entry["duration_s"], entry["throughput_qps"],
                                 entry["latency_ms"]["p99"], "meets the budget" if entry.get("meets_budget")
                                 else "misses the budget")
                if confirmation.get("rate_qps") is not None:
                    ctx.log.info("serving capacity %.1f requests/s (90%% interval %s), between %g/s (meets) and %g/s "
                                 "(misses), %d levels of up to %.3g s%s", confirmation["rate_qps"],
                                 confirmation.get("interval_qps"), confirmation["meets_qps"],
                                 confirmation["miss_above_qps"], confirmation["levels"], confirmation["level_s"],
                                 "" if confirmation["settled"] else f", unsettled (fewer than "
                                 f"{params.confirm_visits} levels a side)")
            if params.latency_budget_ms is not None and group:
                best.append(capacity_entry(params, generator, streams, gpus, group, confirmation))

    result: dict[str, Any] = {
        "load_settings": {
            "request_size": closed_request, "duration_s": params.load_duration_s, "warmup_s": params.load_warmup_s,
            "dynamic_batching": batching.model_dump() if batching else None, "batch_limits": list(limits),
            "streams": params.stream_counts, "gpus": gpu_count, "devices": devices or None,
            "generator": generator, "executor": settings, "warnings": warnings,
        },
        "load": load,
    }
    if open_loop:
        result["open_loop"] = open_loop
    if scenarios:
        result["scenarios"] = scenarios
    if best:
        result["max_rate_meeting_budget"] = best
    if gpu_count > 1:
        result["scaling"] = scaling(load, gpu_count)
    return result


def scaling(load: Sequence[Mapping[str, Any]], gpu_count: int) -> list[dict[str, Any]]:
    """Per streams and per-GPU concurrency: aggregate throughput on all GPUs against ``gpu_count`` x one GPU's."""
    single = {(p["streams"], p["concurrency"]): p["throughput_qps"] for p in load if p["gpus"] == 1}
    rows = []
    for point in load:
        if point["gpus"] != gpu_count:
            continue
        one = single.get((point["streams"], point["concurrency_per_gpu"]))
        if not one:
            continue
        rows.append({"streams": point["streams"], "concurrency_per_gpu": point["concurrency_per_gpu"],
                     "gpus": gpu_count, "throughput_qps_1gpu": one, "throughput_qps": point["throughput_qps"],
                     "scaling_efficiency": point["throughput_qps"] / (gpu_count * one)})
    return rows
