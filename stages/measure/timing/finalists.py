"""Timing select's finalists together: round-robin windows in a random order, until the decision is clear.

What the windows run, per objective and runtime, is planned in `measure.timing.finalist_plans`; this module is the
one machinery that times and judges them, for every objective.

Candidates benchmarked by separate nodes were measured minutes apart, and the host's speed moves by more than a
10% difference between them in that time. The finalists (the candidates not clearly beaten on their stored
figures) are therefore timed again side by side, in *rounds*: one window of each, in an order drawn at random each
round (seeded). Per round, each candidate's figure over the leader's is one paired ratio, drift cancels in it, and
`measure.statistics.paired.round_robin` judges it against the preference band (``tolerance_percent``) with select's
error budget, at planned looks (at most four), until every comparison is decided or the cap: each finalist timed at most
``max_seconds`` (its benchmark's own cap).

`onnxruntime_timers` opens ONNX candidates the way their benchmark ran them (the same ONNX Runtime options and
device, random inputs in the benchmarked shapes); `engine_timers` opens engines through the TensorRT runtime
interface and times them with the cuda-python harness, as the benchmark's engine points are.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..statistics.intervals import Window
from ..statistics.paired import Budget, Look, Schedule, log_ratio, look, select_budget
from ..statistics.stats import median
from .ab import TimeWindow, window_figures

#: A round whose ratio lies further than this many robust standard deviations (1.4826 x the median absolute
#: deviation) from the median of its comparison's rounds was disturbed, and is set aside.
DISTURBED_SD = 4.0
#: Queries a finalist's window holds at least (its median must be a median of something).
WINDOW_QUERIES = 8


def finalist_window(latency_ms: float | None, benchmark_window_s: float) -> float:
    """The window of each finalist per round: as short as holds `WINDOW_QUERIES` queries at the benchmarked latency
    (at least `windows.MIN_WINDOW_S`, at most the benchmark's own window), so that the two sides of a round see the
    same host: a co-tenant switching every few windows of the benchmark's length lands inside a round rarely, and
    many short rounds average what the window noise does."""
    from .windows import MIN_WINDOW_S

    if latency_ms is None or not math.isfinite(latency_ms) or latency_ms <= 0:
        return max(benchmark_window_s, MIN_WINDOW_S)
    return max(MIN_WINDOW_S, min(benchmark_window_s, WINDOW_QUERIES * latency_ms / 1000.0))


#: Each finalist is timed at most this many times its benchmark's max_duration_s: short rounds under a co-tenant
#: need more of them than one benchmark point needs windows (`bench/select_power.py`).
CAP_FACTOR = 2.0


def finalist_cap(benchmark_max_s: float) -> float:
    """Timed seconds per finalist at most, from the benchmarks' cap (`CAP_FACTOR` x)."""
    return CAP_FACTOR * benchmark_max_s


def set_aside(values: Sequence[float]) -> tuple[list[float], int]:
    """The rounds' log-ratios of one comparison without the disturbed ones (beyond `DISTURBED_SD` robust standard
    deviations of their median: a co-tenant switched, a window stalled), and how many were set aside. The rule is
    symmetric around the median, so what it sets aside does not move the estimate; fewer than
    `paired.MIN_PAIRS` rounds are kept whole."""
    from ..statistics.paired import MIN_PAIRS, noise

    values = list(values)
    if len(values) < MIN_PAIRS:
        return values, 0
    center, sd = median(sorted(values)), noise(values)
    if not math.isfinite(sd) or sd <= 0:
        return values, 0
    kept = [v for v in values if abs(v - center) <= DISTURBED_SD * sd]
    return kept, len(values) - len(kept)


def judge_rounds(rounds: Sequence[Mapping[str, Mapping[str, float]]], names: Sequence[str], figure: str,
                 limit: float, budget: Budget, schedule: Schedule,
                 ended: bool) -> tuple[str, dict[str, Look], dict[str, int]]:
    """The leader of finalists timed in rounds (the best median ratio to the first one), each other
    finalist's comparison with it (its rounds' log-ratios, disturbed ones set aside, judged at the planned looks
    against ``limit`` like a pair, `paired.look`), and how many rounds each comparison set aside."""
    anchor = names[0]

    def ratios(name: str, against: str) -> list[float]:
        found = [log_ratio(float(r[name][figure]), float(r[against][figure]), figure) for r in rounds]
        return [v for v in found if math.isfinite(v)]

    def centre(name: str) -> float:
        values = sorted(set_aside(ratios(name, anchor))[0]) if name != anchor else []
        return median(values) if values else 0.0

    leader = min(names, key=lambda n: (centre(n), n))
    looks: dict[str, Look] = {}
    aside: dict[str, int] = {}
    count = len(schedule.looks)
    for name in names:
        if name == leader:
            continue
        values = ratios(name, leader)
        taken: Look | None = None
        for pairs in schedule.looks:
            if pairs > len(values):
                break
            kept, aside[name] = set_aside(values[:pairs])
            taken = look(kept, limit, budget, count, final=pairs == schedule.cap)
            if taken.outcome != "inconclusive":
                break
        if (taken is None or (taken.outcome == "inconclusive" and ended)) and len(values) >= 2 and \
                (taken is None or pairs != len(values)):
            kept, aside[name] = set_aside(values)
            taken = look(kept, limit, budget, count, final=ended)
        looks[name] = taken if taken is not None else look(values, limit, budget, count, final=ended)
        aside.setdefault(name, 0)
    return leader, looks, aside


@dataclass(frozen=True)
class Together:
    """Finalists timed in one window together rather than one window each: ``run(order, seconds)`` interleaves them
    in ``order`` at a finer grain than a window (generation at concurrency 1: one request each, token by token,
    `measure.serving.generation.lockstep`) and returns each one's window."""

    names: Sequence[str]
    run: Callable[[Sequence[str], float], Mapping[str, Window]]


def measure_round_robin(timers: Mapping[str, TimeWindow] | Together, batch_size: int | Mapping[str, int],
                        figure: str, tolerance_percent: float, window_s: float, max_seconds: float,
                        seed: int | None = None) -> dict[str, Any]:
    """Rounds of one window per candidate until the leader's comparisons are decided or the cap; returns the
    record `decision.ties.paired_ties` judges (every round's window figures and order, the seed the orders were
    drawn from, the looks, the time spent). ``batch_size``: the batch of every window, or each finalist's (load
    objectives judge each at its own level's batch, `finalist_plans`). ``seed``: None draws a new one (recorded,
    so the run can be replayed)."""
    names = list(timers.names) if isinstance(timers, Together) else list(timers)
    batches = dict(batch_size) if isinstance(batch_size, Mapping) else dict.fromkeys(names, batch_size)
    budget = select_budget(len(names))
    schedule = Schedule.up_to(int(max_seconds / max(window_s, 1e-6)), budget)
    limit = math.log(1.0 + tolerance_percent / 100.0)
    seed = random.SystemRandom().randrange(2 ** 32) if seed is None else seed
    draw = random.Random(seed)
    rounds: list[dict[str, dict[str, float]]] = []
    orders: list[list[str]] = []
    spent = dict.fromkeys(names, 0.0)
    counts = dict.fromkeys(names, 0)
    ended = False
    while True:
        order = list(names)
        draw.shuffle(order)
        row = {}
        together = timers.run(order, window_s) if isinstance(timers, Together) else {}
        for name in order:
            window = together[name] if isinstance(timers, Together) else timers[name](window_s, counts[name])
            counts[name] += 1
            spent[name] += window.wall_ms / 1000.0
            row[name] = window_figures(window, batches[name])
        rounds.append(row)
        orders.append(order)
        count = len(rounds)
        out_of_time = max(spent.values()) >= max_seconds
        if schedule.is_look(count) or out_of_time:
            ended = out_of_time or count >= schedule.cap
            _, looks, _ = judge_rounds(rounds, names, figure, limit, budget, schedule, ended)
            if ended or all(look.outcome != "inconclusive" for look in looks.values()):
                break
    return {"names": names, "figure": figure, "batch_size": batch_size, "tolerance_percent": tolerance_percent,
            "rounds": rounds, "orders": orders, "seed": seed, "window_s": window_s, "looks": list(schedule.looks),
            "ended": ended, "seconds": {name: round(value, 3) for name, value in spent.items()},
            "alpha": budget.alpha_fail}


def spread(record: Mapping[str, Any], name: str, against: str) -> float:
    """How much one round's ratio of ``name`` to ``against`` varies (robust standard deviation, log scale)."""
    from ..statistics.paired import noise

    figure = record["figure"]
    values = [log_ratio(float(r[name][figure]), float(r[against][figure]), figure) for r in record["rounds"]]
    return noise([v for v in values if math.isfinite(v)])


@dataclass(frozen=True)
class _Feed:
    """What `measure.timing.feeds.make_feed` reads of a benchmark's params: random inputs in the given shapes."""

    shapes: Mapping[str, list[int]]
    profile: Any = None
    data: Any = None


def onnxruntime_timers(models: Mapping[str, Path], shapes: Mapping[str, Mapping[str, list[int]]],
                       options: Mapping[str, Any], device: str, warmup_ms: float, log: Any,
                       data: Mapping[str, Any] | None = None, resolve: Any = Path) -> dict[str, TimeWindow]:
    """A window timer per ONNX model, each on an ONNX Runtime session with the benchmark's ``options`` on
    ``device``, fed in its benchmarked ``shapes`` from the benchmark's ``data`` (a `data.DataSource`, its paths
    ``resolve``d like the recipe's; None: random inputs, seed 0)."""
    from ...accuracy.recovery import runtime_options
    from ...data import DataSource, onnx_input_specs
    from ...runtimes.ort import OrtOptions, create_session
    from .calls import onnxruntime_call, ort_providers
    from .feeds import make_feed
    from .windows import host_window

    source = DataSource.model_validate(dict(data)) if data else None
    timers = {}
    for name, model in models.items():
        specs = onnx_input_specs(model)
        feed = make_feed(specs, shapes[name], _Feed(shapes[name], data=source), resolve, log)
        settings = runtime_options(model, OrtOptions.model_validate(dict(options)), log).options
        session = create_session(model, settings, ort_providers(device))
        call, _ = onnxruntime_call(session, feed, device, include_host_transfers=False)
        timers[name] = host_window(call, warmup_ms)
    return timers


@contextmanager
def engine_timers(models: Mapping[str, Path], shapes: Mapping[str, Mapping[str, list[int]]],
                  batches: Mapping[str, int], plan: Mapping[str, Any], timer_factory: Callable[[], Any],
                  log: Any, resolve: Any = Path) -> Iterator[dict[str, TimeWindow]]:
    """A window timer per engine, open for the ``with`` block: each engine opened through the TensorRT runtime
    interface (`runtimes.trt_runtime.open_engine`: its engine.json's version, GPU and digest checked before it is
    deserialised), one execution context on one stream, fed in its benchmarked ``shapes`` from the benchmark's
    data, and timed on one cuda-python harness (``timer_factory``, `measure.timing.cuda_timing.CudaTimer`) with the
    benchmark's settings (``plan["settings"]``: spin_wait, use_cuda_graph, include_host_transfers); each window holds
    at least `WINDOW_QUERIES` queries."""
    from ...data import DataSource
    from ...runtimes.trt_runtime import open_engine, provenance_for
    from .feeds import make_feed
    from .fixed import EngineWindows, PointSettings
    from .windows import WindowPlan

    source = DataSource.model_validate(dict(plan["data"])) if plan.get("data") else None
    settings = PointSettings(WindowPlan(repeats=1, min_iterations=WINDOW_QUERIES, min_duration_s=plan["window_s"]),
                             float(plan.get("warmup_ms") or 0.0), device="cuda", **plan["settings"])
    with ExitStack() as stack:
        timer = stack.enter_context(timer_factory())
        timers: dict[str, TimeWindow] = {}
        for name, engine in models.items():
            session = stack.enter_context(open_engine(engine, provenance_for(engine), plan["runtime"],
                                                      plan.get("gpu")))
            feed = make_feed(session.input_specs(), shapes[name], _Feed(shapes[name], data=source), resolve, log)
            windows = EngineWindows(session, feed, batches[name], 1, settings, timer)
            stack.callback(windows.close)
            timers[name] = windows.window
        yield timers
