"""The serving capacity: a rate search with short levels, then a confirmation run long enough for the queue to settle.

The logic is checked against a simulated server (exact queue arithmetic, no clock): one instance serving each
request in 1 ms, stalled for 20 ms every 3 s (as an H100 serving CUDA-graph replays is, now and then). A 2 s level
that starts between stalls sees none and passes 950 requests/s; runs of many seconds see the stalls and their
backlog, and meet a 20 ms p99 budget only up to about 800-850/s. The search alone therefore answers
whatever its level length allows; the confirmed answer does not depend on it. The stage itself is then run on a
tiny ONNX model with short levels, with a budget no host is too busy to meet.
"""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest

from trtflow.testing import run_stage
from trtflow_stages import benchmark
from trtflow_stages.measure.serving import traffic as _load
from trtflow_stages.measure.serving.levels import Level
from trtflow_stages.measure.serving.measurements import capacity_entry, confirm_capacity, server_level
from trtflow_stages.measure.serving.traffic import LoadRun, Request, summarize_run

SERVICE_NS = 1_000_000
STALL_NS, STALL_EVERY_NS, FIRST_STALL_NS = 20_000_000, 3_000_000_000, 2_500_000_000
BUDGET_MS = 20.0


def simulated(level: Level, start_ns: int = 0) -> LoadRun:
    """Poisson arrivals at ``level.value`` for ``level.duration_s`` on the stalling server, by queue arithmetic."""
    rng = random.Random(level.seed * 1000 + int(level.value))
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


def test_the_confirmed_capacity_does_not_depend_on_the_level_length() -> None:
    short, confirmation, group = _capacity(2.0)
    long, _, long_group = _capacity(10.0)
    searched_short = _load.highest_rate_meeting_budget(group)["arrival_rate_qps"]
    searched_long = _load.highest_rate_meeting_budget(long_group)["arrival_rate_qps"]
    assert searched_short > 1.15 * searched_long, "2 s levels miss the stalls: the search alone depends on them"
    assert short["search_rate_qps"] == searched_short and short["level_s"] == 2.0
    assert short["confirmed"] and long["confirmed"]
    # the 10 s search's own answer moves with the stalls its levels happen to see: within 10% of it
    assert abs(short["arrival_rate_qps"] / long["arrival_rate_qps"] - 1) <= 0.10, (short, long)
    assert _meets_for_long(long["arrival_rate_qps"])
    assert _meets_for_long(short["arrival_rate_qps"]), "the confirmed rate holds for a minute"
    assert not _meets_for_long(searched_short), "the short search's answer does not"
    failed = [a for a in confirmation["attempts"] if not a["meets_budget"]]
    assert failed and confirmation["attempts"][-1]["meets_budget"], "stepped down until a confirmation passed"
    rates = [a["rate_qps"] for a in confirmation["attempts"]]
    assert all(b == pytest.approx(a * 0.95) for a, b in itertools.pairwise(rates))
    assert all(a["duration_s"] >= 10.0 and a["queries"] >= 459 for a in confirmation["attempts"])
    assert short["bracket_qps"][0] == searched_short and short["bracket_qps"][1] > searched_short


def test_a_confirmation_that_never_passes_reports_no_capacity() -> None:
    params = _params(confirm_steps=1, confirm_step_percent=1.0)
    found = {"arrival_rate_qps": 990.0, "service_ms": {"p50": 1.0}, "mean_batch_size": 1.0}
    entries, confirmation = confirm_capacity(simulated, params, "trtflow", found, 1, 1)
    assert confirmation["rate_qps"] is None and len(confirmation["attempts"]) == 2 == len(entries)
    entry = capacity_entry(params, "trtflow", 1, 1, [dict(found, meets_budget=True), *entries], confirmation)
    assert entry["arrival_rate_qps"] is None and not entry["confirmed"] and entry["search_rate_qps"] == 990.0


def test_confirmations_last_longer_near_saturation() -> None:
    point = {"service_ms": {"p50": 1.0}, "mean_batch_size": 1.0}
    assert _load.relaxation_s(500, 0.001) < _load.relaxation_s(900, 0.001) < _load.relaxation_s(990, 0.001)
    assert _load.relaxation_s(2000, 0.001) == _load.relaxation_s(990, 0.001)  # computed up to rho 0.98
    light = _load.confirmation_seconds(100, point, 1, 10.0, 459)
    heavy = _load.confirmation_seconds(950, point, 1, 10.0, 459)
    assert light == 10.0 and 10.0 < heavy <= 20.0, (light, heavy)
    assert _load.confirmation_seconds(20, point, 1, 10.0, 459) == pytest.approx(459 / 20)  # the p99's queries
    assert _load.confirmation_seconds(950, point, 4, 10.0, 459) < heavy  # four instances share the work
    assert _load.step_down(1000, 5) == 950


def test_the_stage_confirms_the_rate_its_search_found(tiny_mlp_onnx, tmp_path) -> None:
    params = {"warmup_ms": 5, "min_iterations": 5, "min_duration_s": 0.0, "shapes": {"input": [1, 16]},
              "onnxruntime": {"intra_op_threads": 1}, "arrival_rate_qps": [50], "load_duration_s": 0.2,
              "load_warmup_s": 0.05, "latency_budget_ms": 1000, "rate_search_probes": 1, "confirm_duration_s": 0.5,
              "load_generator": "trtflow"}
    result = run_stage(benchmark.stage, params, {"model": tiny_mlp_onnx}, workdir=tmp_path)
    metrics = json.loads(result.outputs["metrics"].read_text())
    listed, searched, confirmed = metrics["open_loop"]
    assert (listed["arrival_rate_qps"], searched["arrival_rate_qps"]) == (50, 100)
    assert confirmed["confirmation"] and confirmed["arrival_rate_qps"] == 100 and confirmed["duration_s"] >= 0.5
    assert confirmed["meets_budget"] and confirmed["queries"] >= 459 * 0.8  # 459 arrivals expected over the run
    (best,) = result.summary["max_rate_meeting_budget"]
    assert best["confirmed"] and best["arrival_rate_qps"] == 100 and best["level_s"] == 0.2
    assert best["confirmation"]["rate_qps"] == 100 and best["search_rate_qps"] == 100
    (capacity,) = [f for f in benchmark.figures(benchmark.Params.model_validate(params), result.summary).figures
                   if f.name.startswith("serving capacity")]
    assert capacity.value == 100 and capacity.primary and capacity.context["level_s"] == 0.2
    assert capacity.context["confirmation_s"] >= 0.5 and capacity.n == confirmed["queries"]
