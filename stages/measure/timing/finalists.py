"""Timing select's finalists together: round-robin windows in a random order, until the decision is clear.

Candidates benchmarked by separate nodes were measured minutes apart, and the host's speed moves by more than a
10% difference between them in that time. The finalists (the candidates not clearly beaten on their stored
figures) are therefore timed again side by side, in *rounds*: one window of each, in an order drawn at random each
round (seeded). Per round, each candidate's figure over the leader's is one paired ratio, drift cancels in it, and
`measure.statistics.paired.round_robin` judges it against the preference band (``tolerance_percent``) with select's
error budget, at planned looks (at most four), until every comparison is decided or the cap: each finalist timed at most
``max_seconds`` (its benchmark's own cap).

`onnxruntime_timers` opens ONNX candidates the way their benchmark ran them (the same ONNX Runtime options and
device, random inputs in the benchmarked shapes).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def measure_round_robin(timers: Mapping[str, TimeWindow], batch_size: int, figure: str, tolerance_percent: float,
                        window_s: float, max_seconds: float, seed: int | None = None) -> dict[str, Any]:
    """Rounds of one window per candidate until the leader's comparisons are decided or the cap; returns the
    record `decision.ties.paired_ties` judges (every round's window figures and order, the seed the orders were
    drawn from, the looks, the time spent). ``seed``: None draws a new one (recorded, so the run can be replayed)."""
    names = list(timers)
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
        for name in order:
            window = timers[name](window_s, counts[name])
            counts[name] += 1
            spent[name] += window.wall_ms / 1000.0
            row[name] = window_figures(window, batch_size)
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


def timing_plan(rows: Sequence[Mapping[str, Any]], objective: Mapping[str, Any], models: Mapping[str, Path],
                gpu: int | None, max_seconds: float | None) -> dict[str, Any] | str:
    """How select can time its finalists (``rows``: their selection rows, each with its benchmark and operating
    point) together here: the figure, batch, shapes, ONNX Runtime options and device, window and cap; or why it
    cannot (said in the selection, which then rests on the stored figures)."""
    goal = objective.get("goal")
    if goal == "min_time_per_token":
        return generation_plan(rows, objective, models, gpu, max_seconds)
    if goal not in ("min_latency", "max_throughput"):
        return f"objective {goal} is judged on load levels or sizes, which are not re-timed"
    figure = objective.get("percentile", "p50") if goal == "min_latency" else "throughput"
    points = {row["name"]: row.get("operating_point") or {} for row in rows}
    if any(point.get("concurrency") is not None for point in points.values()):
        return "the operating points are load levels, which are not re-timed"
    benches = {row["name"]: row.get("benchmark") or {} for row in rows}
    if any(row.get("kind") != "onnx" or benches[row["name"]].get("backend") != "onnxruntime" for row in rows):
        return "only ONNX models benchmarked on ONNX Runtime are timed together so far (engines: stored figures)"
    methods = [benches[name].get("method") or {} for name in benches]
    devices = {benches[name].get("device") for name in benches}
    options = [m.get("onnxruntime") for m in methods]
    data = [m.get("data") for m in methods]
    if len(devices) != 1 or any(o != options[0] for o in options) or any(d != data[0] for d in data):
        return "the finalists were benchmarked with different devices, ONNX Runtime options or data"
    device = devices.pop() or "cpu"
    if device == "cuda" and gpu is None:
        return "they ran on CUDA, and this node has no GPU (give select `resources: {gpu: 1}`)"
    shapes = {}
    for name, point in points.items():
        batch = point.get("batch_size")
        measured = {p.get("batch_size"): p for p in benches[name].get("points") or []}
        if batch not in measured or not measured[batch].get("shapes"):
            return f"{name}'s benchmark does not record the shapes of batch {batch}"
        shapes[name] = measured[batch]["shapes"]
    batch = next(iter(points.values())).get("batch_size")
    benchmark_window = min(max(float(m.get("min_duration_s") or 1.0) / max(int(m.get("repeats") or 1), 1), 0.02)
                           for m in methods) if methods else 0.2
    latencies = [float(p["latency_ms"]) for p in points.values() if isinstance(p.get("latency_ms"), (int, float))]
    window = finalist_window(max(latencies) if latencies else None, benchmark_window)
    cap = max_seconds or finalist_cap(min(float(m.get("max_duration_s") or 3.0) for m in methods))
    return {"figure": figure, "batch_size": batch, "shapes": shapes, "options": options[0] or {}, "device": device,
            "data": data[0],
            "warmup_ms": float(methods[0].get("warmup_ms") or 200.0), "window_s": window, "max_seconds": cap,
            "models": {name: models[name] for name in points}}


def generation_plan(rows: Sequence[Mapping[str, Any]], objective: Mapping[str, Any], models: Mapping[str, Path],
                    gpu: int | None, max_seconds: float | None) -> dict[str, Any] | str:
    """How select times finalists judged on time per output token together (`measure.serving.generation
    .generation_timers`): the benchmarks' requests (prompt length, new tokens, seed) at the judged concurrency,
    each window long enough for two requests of the slowest finalist; or why it cannot."""
    benches = {row["name"]: row.get("benchmark") or {} for row in rows}
    if any(row.get("kind") != "onnx" or benches[row["name"]].get("backend") != "onnxruntime" for row in rows):
        return "only ONNX models benchmarked on ONNX Runtime are timed together so far"
    methods = [benches[name].get("method") or {} for name in benches]
    requests: list[dict[str, Any]] = [
        {k: (m.get("generation") or {}).get(k) for k in ("context_length", "new_tokens", "seed")} for m in methods]
    devices = {benches[name].get("device") for name in benches}
    options = [m.get("onnxruntime") for m in methods]
    if len(devices) != 1 or any(o != options[0] for o in options) or any(r != requests[0] for r in requests) \
            or not requests[0].get("new_tokens"):
        return "the finalists were benchmarked with different devices, ONNX Runtime options or requests"
    device = devices.pop() or "cpu"
    if device == "cuda" and gpu is None:
        return "they ran on CUDA, and this node has no GPU (give select `resources: {gpu: 1}`)"
    concurrency = {(row.get("operating_point") or {}).get("concurrency") for row in rows}
    if len(concurrency) != 1 or not isinstance(next(iter(concurrency)), int):
        return "the finalists are judged at different concurrencies"
    clients = concurrency.pop()
    stat = objective.get("percentile", "p50")
    new_tokens = int(requests[0]["new_tokens"])
    longest = 0.0
    for name, bench in benches.items():
        level: Mapping[str, Any] = next(
            (g for g in bench.get("generation") or [] if g.get("concurrency") == clients), {})
        ttft, tpot = (level.get("ttft_ms") or {}).get(stat), (level.get("tpot_ms") or {}).get(stat)
        if not isinstance(ttft, (int, float)) or not isinstance(tpot, (int, float)):
            return f"{name}'s benchmark has no {stat} time to first token and per output token at concurrency {clients}"
        longest = max(longest, ttft + tpot * (new_tokens - 1))
    from .windows import MIN_WINDOW_S

    window = max(MIN_WINDOW_S, 2.0 * longest / 1000.0)
    cap = max_seconds or finalist_cap(min(float(m.get("max_duration_s") or 3.0) for m in methods))
    return {"generation": {**requests[0], "concurrency": clients}, "figure": stat, "batch_size": 1,
            "options": options[0] or {}, "device": device, "window_s": window, "max_seconds": cap,
            "models": {name: models[name] for name in benches}}
