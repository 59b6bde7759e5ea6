"""What a gated benchmark costs (issue 32): the gate point's both sides are timed at most ``gate_cost_budget`` times
what the point times ungated (its ``min_duration_s``), at every look (the first at 2x), the error rates spent over
the looks' cost fractions, and the verdict says what it cost and, undecided at the budget, what budget would
decide."""

from __future__ import annotations

import math
import random

import pytest
from pydantic import ValidationError

from trtflow.stage import GateContext
from trtflow.verdicts import PAIRED
from trtflow_stages import benchmark
from trtflow_stages.measure.judging.gates import verdicts
from trtflow_stages.measure.judging.reference import pair_plan
from trtflow_stages.measure.statistics.intervals import Precision, Window
from trtflow_stages.measure.statistics.paired import Budget, PairedRecord, Schedule, sequential
from trtflow_stages.measure.timing.ab import COST_BUDGET, Pairing, look_marks
from trtflow_stages.measure.timing.windows import WindowPlan, measure_interleaved

WINDOW_S, MIN_S = 0.06, 0.3  # the point's window and min_duration_s (the budget's unit)


def _timer(factor: float, rng: random.Random, noise: float = 0.05, query_ms: float = 2.0, waited: float | None = None):
    def window(seconds: float, index: int) -> Window:
        latencies: list[float] = []
        while not latencies or sum(latencies) < seconds * 1000:
            latencies.append(query_ms * factor * math.exp(rng.gauss(0, noise)))
        return Window(latencies, sum(latencies), None if waited is None else waited * sum(latencies))
    return window


def _run(change: float, budget: float, seed: int = 1, noise: float = 0.05, query_ms: float = 2.0,
         waited: float | None = None) -> Pairing:
    params = benchmark.Params.model_validate({"backend": "onnxruntime", "max_regression_percent": 10,
                                              "gate_cost_budget": budget})
    plan = pair_plan(params, WINDOW_S, MIN_S, 1, 4, seed=seed, cost_budget=params.gate_cost_budget)
    rng = random.Random(seed)
    pairing = Pairing(plan, _timer(1.0, rng, noise, query_ms, waited))
    candidate = _timer(1.0 + change, rng, noise, query_ms, waited)
    index = 0
    while not pairing.done:
        pairing.step(candidate, WINDOW_S, index)
        index += 1
    return pairing


def _verdict(pairing: Pairing):
    found = {"backend": "onnxruntime", "device": "cpu", "hardware": {"cpu": "x86_64 test"}, "points": [
        {"batch_size": 4, "streams": 1, "latency_ms": {"p50": 2.0, "p99": 4.0, "mean": 2.0}, "throughput_qps": 2e3}],
        "reference": {"name": "x", "basis": PAIRED, "paired": pairing.summary(), "points": []}}
    params = benchmark.Params.model_validate({"backend": "onnxruntime", "max_regression_percent": 10})
    return verdicts(params, found, GateContext())[0]


def test_a_gated_point_costs_2x_at_its_first_look_and_never_more_than_its_budget():
    assert COST_BUDGET == 8.0 and look_marks(COST_BUDGET) == (2.0, 4.0, 6.0, 8.0) and look_marks(2.0) == (2.0,)
    decided = _run(0.3, COST_BUDGET)  # 30% slower at a 10% threshold: the first look decides
    assert decided.last is not None and decided.last.outcome == "fail" and decided.record.fractions == [0.25]
    assert 1.9 <= decided.summary()["cost"] <= 2.02
    for budget in (2.0, 5.0, COST_BUDGET):  # exactly at the threshold: undecided, the whole budget and no more
        undecided = _run(0.1, budget, noise=0.15)
        assert undecided.last is not None and undecided.last.outcome == "inconclusive"
        assert budget - 0.1 <= undecided.summary()["cost"] <= budget * 1.02
        assert undecided.record.fractions[-1] == 1.0 and undecided.record.ended
        verdict = _verdict(undecided)
        assert verdict.outcome == "inconclusive" and "at the cost budget" in verdict.reason
        assert f"x the 0.3 s the point times ungated (gate_cost_budget {budget:g})" in verdict.reason
        assert "would decide" in verdict.reason  # what budget would, or that none up to the largest
    with pytest.raises(ValidationError):  # the reference's side costs as much as the candidate's
        benchmark.Params.model_validate({"backend": "onnxruntime", "gate_cost_budget": 1.5})


def test_the_budget_holds_through_the_benchmark_loop_and_slow_queries_still_decide_or_say_what_would():
    # the benchmark's own loop (`measure_interleaved`) times the gate point through its pairing
    pairing = _run(0.0, COST_BUDGET)
    rng = random.Random(5)
    params = benchmark.Params.model_validate({"backend": "onnxruntime", "max_regression_percent": 10})
    looped = Pairing(pair_plan(params, WINDOW_S, MIN_S, 1, 4, seed=5), _timer(1.0, rng))
    plan = WindowPlan(5, 10, MIN_S, 3 * MIN_S, Precision())
    measure_interleaved([_timer(1.0, rng)], plan, [lambda windows: []], {0: looped})
    assert looped.done and looped.summary()["cost"] <= 2.02 and pairing.summary()["cost"] <= 2.02
    # queries of 40 ms against 3.75 ms blocks: fewer pairs, looked at by cost all the same
    slow = _run(0.1, COST_BUDGET, noise=0.15, query_ms=40.0)
    assert slow.summary()["cost"] <= COST_BUDGET * 1.1 and len(slow.record.pairs) < 40
    verdict = _verdict(slow)
    assert verdict.outcome == "inconclusive" and "would decide" in verdict.reason
    # pairs that waited for a CPU most of their time: no budget would decide, a quieter host would
    busy = _verdict(_run(0.0, 3.0, waited=0.9))
    assert busy.outcome == "inconclusive" and "no budget would decide: the pairs waited for a CPU 90%" in busy.reason


def test_looks_spend_the_error_rates_over_their_cost_fractions():
    budget = Budget()
    schedule = Schedule((80, 160, 240, 320), 2.0, (0.25, 0.5, 0.75, 1.0))
    shares = [schedule.share(n) for n in schedule.looks]
    assert sum(shares) == pytest.approx(1.0) and shares == sorted(shares)  # little early, most at the budget
    assert schedule.is_final(320) and not schedule.is_final(240)
    carried = Schedule((160, 320), 2.0, (0.5, 1.0))  # a look skipped (too few pairs): its share carries over
    assert carried.share(160) == pytest.approx(0.25) and carried.share(320) == pytest.approx(0.75)
    assert Schedule((10, 20)).share(20) == 0.5  # records of earlier versions: even shares, as they were judged
    rng = random.Random(2)
    values = [rng.gauss(math.log(1.2), 0.05) for _ in range(320)]
    found = sequential(values, schedule, math.log(1.1), budget)
    assert found.outcome == "fail" and found.pairs == 80 and found.share == pytest.approx(shares[0])
    # a record keeps what it needs to be judged again under another threshold, and what it cost
    record = _run(0.0, COST_BUDGET).record
    again = PairedRecord.from_dict(record.as_dict())
    assert again is not None and again.fractions == record.fractions and again.spending == record.spending
    assert again.cost == pytest.approx(record.cost) and again.cost_budget == COST_BUDGET


def test_a_pairing_watching_other_figures_too_stops_when_all_of_them_are_decided():
    import dataclasses

    params = benchmark.Params.model_validate({"backend": "onnxruntime", "max_regression_percent": 10})
    plan = pair_plan(params, WINDOW_S, MIN_S, 1, 4, seed=3)
    rng = random.Random(3)
    both = Pairing(dataclasses.replace(plan, also=("mean",)), _timer(1.0, rng))
    alone = Pairing(plan, _timer(1.0, rng))
    for pairing in (both, alone):
        index = 0
        while not pairing.done:
            pairing.step(_timer(1.3, rng), WINDOW_S, index)
            index += 1
    figures = both.record.judge("mean", math.log(1.1), plan.budget), both.record.judge("p50", math.log(1.1),
                                                                                        plan.budget)
    assert all(found.outcome == "fail" for found in figures) and both.summary()["cost"] <= COST_BUDGET * 1.02
