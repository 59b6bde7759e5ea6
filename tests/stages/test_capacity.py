"""The serving capacity: a rate search with short levels, then a confirmation in both directions with long levels.

The logic is checked against a simulated server (exact queue arithmetic, no clock): one instance serving each
request in 1 ms, stalled for 20 ms every 3 s (as an H100 serving CUDA-graph replays is, now and then). A 2 s level
that starts between stalls sees none and passes 950 requests/s; runs of many seconds see the stalls and their
backlog, and meet a 20 ms p99 budget only up to about 800-850/s. The search alone therefore answers
whatever its level length allows; the confirmation walks a fixed grid up and down around the knee and answers the
same rate wherever the search stopped, above the knee or below it. The stage itself is then run on a tiny ONNX
model with short levels, with a budget no host is too busy to meet.
"""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest

from trtflow.testing import run_stage
from trtflow_stages import benchmark
from trtflow_stages.measure.judging.figures import capacity_figure
from trtflow_stages.measure.serving import traffic as _load
from trtflow_stages.measure.serving.levels import Level
from trtflow_stages.measure.serving.measurements import capacity_entry, confirm_capacity, server_level
from trtflow_stages.measure.serving.traffic import (
    LoadRun,
    Request,
    grid_index,
    grid_rate,
    pooled_meets_budget,
    summarize_run,
)

SERVICE_NS = 1_000_000
STALL_NS, STALL_EVERY_NS, FIRST_STALL_NS = 20_000_000, 3_000_000_000, 2_500_000_000
BUDGET_MS = 20.0


def simulated(level: Level, start_ns: int = 0, draw: int = 0) -> LoadRun:
    """Poisson arrivals at ``level.value`` for ``level.duration_s`` on the stalling server, by queue arithmetic
    (``draw``: another sample of arrivals, as a level run again)."""
    rng = random.Random(level.seed * 1000 + int(level.value) + 7919 * draw)
    end = start_ns + int(level.duration_s * 1e9)
    t, free, requests, index = start_ns, start_ns, [], 0
    while True:
        t += int(rng.expovariate(level.value) * 1e9)
        if t >= end:
            break
        begin = max(t, free)
        stall = (begin - FIRST_STALL_NS) // STALL_EVERY_NS if begin >= FIRST_STALL_NS else -1
        stall_start = FIRST_STALL_NS + stall * STALL_EVERY_NS
        if stall >= 0 and begin < stall_start + STALL_NS:
            begin = stall_start + STALL_NS
        free = begin + SERVICE_NS
        requests.append(Request(arrival_ns=t, sent_ns=t, dispatch_ns=begin, done_ns=free, batch_id=index,
                                batch_samples=1))
        index += 1
    return LoadRun(requests, start_ns, end, max(free, end), offered_rate_qps=level.value,
                   settings={"arrival_rate_qps": level.value})


def _params(**changes: Any) -> benchmark.Params:
    return benchmark.Params.model_validate({
        "backend": "onnxruntime", "arrival_rate_qps": [100], "latency_budget_ms": BUDGET_MS, "rate_search_probes": 10,
        "load_duration_s": 2.0, "load_generator": "trtflow", "confirm_duration_s": 10.0, **changes})


def _search(params: benchmark.Params) -> list[dict[str, Any]]:
    """The stage's search (doubling, then bisecting) on the simulated server, each level starting at time 0."""
    group: list[dict[str, Any]] = []
    rate: float | None = params.arrival_rate_qps[0]
    for _ in range(params.rate_search_probes + 1):
        if rate is None:
            break
        summary = summarize_run(simulated(server_level(params, rate, "trtflow")), BUDGET_MS)
        group.append(dict(summary, arrival_rate_qps=rate))
        rate = _load.next_rate_to_try(group)
    return group


def _meets_for_long(rate: float, seconds: float = 60.0) -> bool:
    return bool(summarize_run(simulated(Level("open", rate, 1, 0.0, seconds)), BUDGET_MS)["meets_budget"])


def _capacity(level_s: float) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    params = _params(load_duration_s=level_s)
    group = _search(params)
    found = _load.highest_rate_meeting_budget(group)
    entries, confirmation = confirm_capacity(simulated, params, "trtflow", found, 1, 1)
    return capacity_entry(params, "trtflow", 1, 1, group + entries, confirmation), confirmation, group


class Repeated:
    """The simulated server, each level run with fresh arrivals (as a real level run again would be)."""

    def __init__(self) -> None:
        self.levels: list[Level] = []

    def __call__(self, level: Level) -> LoadRun:
        self.levels.append(level)
        return simulated(level, draw=len(self.levels))


def _confirm(params: benchmark.Params, found_rate: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    found = {"arrival_rate_qps": found_rate, "service_ms": {"p50": 1.0}, "mean_batch_size": 1.0}
    return confirm_capacity(Repeated(), params, "trtflow", found, 1, 1)


def test_the_confirmation_answers_the_same_rate_from_above_and_from_below() -> None:
    params = _params(confirm_steps=16)  # from 600/s the climb alone takes 7 levels
    answers = {}
    for start in (600.0, 820.0, 1000.0):
        entries, confirmation = _confirm(params, start)
        rates = [a["rate_qps"] for a in confirmation["attempts"]]
        assert confirmation["settled"], confirmation
        answer = confirmation["rate_qps"]
        above = grid_rate(grid_index(answer, 2.5) + 1, 2.5)
        assert confirmation["miss_above_qps"] == above
        pooled = {row["rate_qps"]: row for row in confirmation["pooled"]}
        assert pooled[answer]["meets_budget"] and not pooled[above]["meets_budget"]
        assert pooled[answer]["levels"] >= 2 and pooled[above]["levels"] >= 2, "each side confirmed twice"
        assert all(r == grid_rate(grid_index(r, 2.5), 2.5) for r in rates), "every level on the shared grid"
        assert all(e["duration_s"] >= 10.0 and e["confirmation"] for e in entries)
        assert confirmation["level_s"] >= 10.0 and "pooled" in confirmation["rule"]
        if start < answer:
            assert any(b > a for a, b in itertools.pairwise(rates)), "steps up from below"
        else:
            assert any(b < a for a, b in itertools.pairwise(rates)), "steps down from above"
        answers[start] = answer
    low, high = min(answers.values()), max(answers.values())
    # this server's late counts from 786 to 846/s are set by where its stalls fall, not by the rate (pooled pairs
    # of 10 s levels: 124 late at 786/s, 336 at 806/s, 146 at 846/s): no rule resolves the knee finer than that
    assert grid_index(high, 2.5) - grid_index(low, 2.5) <= 3, answers
    assert _meets_for_long(low), "the confirmed rate holds for a minute"


def test_the_confirmed_capacity_does_not_depend_on_the_level_length() -> None:
    short, confirmation, group = _capacity(2.0)
    long, _, long_group = _capacity(10.0)
    searched_short = _load.highest_rate_meeting_budget(group)["arrival_rate_qps"]
    searched_long = _load.highest_rate_meeting_budget(long_group)["arrival_rate_qps"]
    assert searched_short > 1.15 * searched_long, "2 s levels miss the stalls: the search alone depends on them"
    assert short["search_rate_qps"] == searched_short and short["level_s"] == 2.0
    assert short["confirmed"] and long["confirmed"] and short["settled"]
    assert short["confirm_level_s"] >= 10.0
    assert abs(grid_index(short["arrival_rate_qps"], 2.5) - grid_index(long["arrival_rate_qps"], 2.5)) <= 3
    assert not _meets_for_long(searched_short), "the short search's answer does not hold for a minute"
    assert short["bracket_qps"][0] == searched_short and short["bracket_qps"][1] > searched_short
    figure = capacity_figure(short)
    assert figure is not None and figure.value == short["arrival_rate_qps"]
    assert figure.n == confirmation["queries"] >= 2 * 459
    assert figure.context["level_s"] == 2.0 and figure.context["confirmation_s"] >= 10.0
    assert figure.context["settled"] and figure.context["levels"] == confirmation["levels"]


def test_no_capacity_without_a_rate_that_meets_below_one_that_misses() -> None:
    entries, confirmation = _confirm(_params(confirm_steps=2), 1500.0)
    assert confirmation["rate_qps"] is None and len(entries) == 2 and not confirmation["settled"]
    entry = capacity_entry(_params(), "trtflow", 1, 1, [{"arrival_rate_qps": 1500.0, "meets_budget": True,
                                                         "throughput_qps": 1.0, "latency_ms": {"p99": 1.0}},
                                                        *entries], confirmation)
    assert entry["arrival_rate_qps"] is None and not entry["confirmed"] and entry["search_rate_qps"] == 1500.0
    assert capacity_figure(entry) is None
    _, rising = _confirm(_params(confirm_steps=3), 300.0)  # every level meets: a lower bound, not a capacity
    assert rising["rate_qps"] is None and rising["lower_bound_qps"] == rising["attempts"][-1]["rate_qps"]
    assert [a["rate_qps"] for a in rising["attempts"]] == [grid_rate(grid_index(300, 2.5) + k, 2.5) for k in (0, 1, 3)]


def test_the_pooled_verdict_is_loadgens_early_stopping_rule() -> None:
    assert pooled_meets_budget([{"queries": 459, "late_requests": 0}])
    assert not pooled_meets_budget([{"queries": 458, "late_requests": 0}]), "459 queries for p99 at 99%"
    assert not pooled_meets_budget([{"queries": 459, "late_requests": 1}])
    one = {"queries": 8000, "late_requests": 70}
    assert not pooled_meets_budget([one]) and pooled_meets_budget([one, {"queries": 8000, "late_requests": 20}])
    assert pooled_meets_budget([{"queries": 459, "late_requests": 4}], with_confidence=False)
    assert not pooled_meets_budget([{"queries": 459, "late_requests": 0, "unfinished": 1}])
    assert grid_rate(grid_index(850.0, 2.5), 2.5) <= 850.0 < grid_rate(grid_index(850.0, 2.5) + 1, 2.5)
    assert grid_index(grid_rate(271, 2.5), 2.5) == 271


def test_confirmations_last_longer_near_saturation() -> None:
    point = {"service_ms": {"p50": 1.0}, "mean_batch_size": 1.0}
    assert _load.relaxation_s(500, 0.001) < _load.relaxation_s(900, 0.001) < _load.relaxation_s(990, 0.001)
    assert _load.relaxation_s(2000, 0.001) == _load.relaxation_s(990, 0.001)  # computed up to rho 0.98
    light = _load.confirmation_seconds(100, point, 1, 10.0, 459)
    heavy = _load.confirmation_seconds(950, point, 1, 10.0, 459)
    assert light == 10.0 and 10.0 < heavy <= 20.0, (light, heavy)
    assert _load.confirmation_seconds(20, point, 1, 10.0, 459) == pytest.approx(459 / 20)  # the p99's queries
    assert _load.confirmation_seconds(950, point, 4, 10.0, 459) < heavy  # four instances share the work


def test_the_stage_confirms_around_the_rate_its_search_found(tiny_mlp_onnx, tmp_path) -> None:
    params = {"warmup_ms": 5, "min_iterations": 5, "min_duration_s": 0.0, "shapes": {"input": [1, 16]},
              "onnxruntime": {"intra_op_threads": 1}, "arrival_rate_qps": [50], "load_duration_s": 0.2,
              "load_warmup_s": 0.05, "latency_budget_ms": 1000, "rate_search_probes": 1, "confirm_duration_s": 0.5,
              "confirm_steps": 1, "load_generator": "trtflow"}
    result = run_stage(benchmark.stage, params, {"model": tiny_mlp_onnx}, workdir=tmp_path)
    metrics = json.loads(result.outputs["metrics"].read_text())
    listed, searched, confirmed = metrics["open_loop"]
    assert (listed["arrival_rate_qps"], searched["arrival_rate_qps"]) == (50, 100)
    grid = grid_rate(grid_index(100, 2.5), 2.5)
    assert confirmed["confirmation"] and confirmed["arrival_rate_qps"] == grid and confirmed["duration_s"] >= 0.5
    assert confirmed["meets_budget"] and confirmed["queries"] >= 459 * 0.8  # 459 arrivals expected over the run
    (best,) = result.summary["max_rate_meeting_budget"]
    # one level that met, none that missed above it: a lower bound, not a capacity, and said so
    assert not best["confirmed"] and best["arrival_rate_qps"] is None and best["search_rate_qps"] == 100
    assert best["confirmation"]["lower_bound_qps"] == grid and best["level_s"] == 0.2
    assert best["confirm_level_s"] >= 0.5 and "grid" in best["confirmation"]["rule"]
    assert not [f for f in benchmark.figures(benchmark.Params.model_validate(params), result.summary).figures
                if f.name.startswith("serving capacity")]
