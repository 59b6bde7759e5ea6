"""Gates as typed verdicts (`measure.judging.gates`, `measure.statistics.unpaired`, `measure.statistics.paired`): limits
on intervals, regression on A/B pairs (sequential, with an error budget) or on stored figures (labelled), one primary
verdict per node, power."""

from __future__ import annotations

import json
import math
import random
import re

import pytest

from trtflow.stage import GateContext
from trtflow.verdicts import PAIRED, STORED, GateVerdict, accepted, failures, only_inconclusive
from trtflow_stages import benchmark
from trtflow_stages.measure.judging.gates import verdicts
from trtflow_stages.measure.statistics.paired import (
    Budget,
    PairedRecord,
    Schedule,
    bound_rank,
    family_alpha,
    hodges_lehmann,
    lower_bound,
    power,
    sequential,
)
from trtflow_stages.measure.statistics.unpaired import Figure, at_least, at_most, latency_figure, unmeasurable


def point(p50: float, interval: tuple[float, float] | None = None, batch: int = 4, **extra: object) -> dict:
    """A summary point: one query at a time, so throughput = batch / latency."""
    qps = batch / p50 * 1000.0
    found = {"batch_size": batch, "streams": 1, "latency_ms": {"p50": p50, "p99": p50 * 2, "mean": p50},
             "throughput_qps": qps, **extra}
    if interval is not None:
        found["latency_ci_ms"] = {"p50": list(interval), "p99": [p50 * 1.5, p50 * 3]}
        found["throughput_ci_qps"] = [qps * p50 / interval[1], qps * p50 / interval[0]]
    return found


def summary(*points: dict, reference: dict | None = None) -> dict:
    found = {"backend": "onnxruntime", "device": "cpu", "hardware": {"cpu": "x86_64 test"}, "points": list(points)}
    if reference is not None:
        found["reference"] = reference
    return found


def _judge(params: dict, now: dict, previous: dict | None = None, **context: object) -> list[GateVerdict]:
    return verdicts(benchmark.Params.model_validate(params), now, GateContext(previous=previous, **context))


def pairs(change: float, count: int, noise: float = 0.02, seed: int = 0, batch: int = 4) -> dict:
    """A paired record: ``count`` pairs whose candidate is ``change`` slower (log-normal noise per window)."""
    rng = random.Random(seed)
    record = PairedRecord(batch, 1, "p50", looks=list(Schedule.up_to(count, Budget()).looks))
    for _ in range(count):
        base = math.exp(rng.gauss(0.0, 0.05))  # drift between pairs: cancels within each pair
        ref = base * math.exp(rng.gauss(0.0, noise))
        new = base * (1.0 + change) * math.exp(rng.gauss(0.0, noise))
        record.add("AB", {"p50": ref, "throughput": batch / ref * 1e3}, {"p50": new, "throughput": batch / new * 1e3})
    record.ended = True
    return {"name": "the last accepted result", "basis": PAIRED, "paired": record.as_dict(), "points": []}


# -- figures and intervals --------------------------------------------------------------------------------------
def test_ratio_intervals_are_computed_for_the_ratio():
    new, old = Figure(2.0, 1.9, 2.1), Figure(1.0, 0.95, 1.05)
    ratio = new.ratio(old)
    # lower: new's lower half and old's upper half added in quadrature on the log scale
    assert ratio.value == 2.0
    assert ratio.low == pytest.approx(2.0 * math.exp(-math.hypot(math.log(2.0 / 1.9), math.log(1.05))))
    assert ratio.high == pytest.approx(2.0 * math.exp(math.hypot(math.log(2.1 / 2.0), math.log(1 / 0.95))))
    extremes = (1.9 / 1.05, 2.1 / 0.95)  # the old interval from both sides' extremes: ~1.4x as wide
    assert (extremes[1] - extremes[0]) / (ratio.high - ratio.low) == pytest.approx(math.sqrt(2), rel=0.05)
    assert at_most(ratio, 1.1) == "fail" and at_most(Figure(1.0, 0.9, 1.05), 1.1) == "pass"
    assert at_most(Figure(1.05, 0.9, 1.3), 1.1) == "inconclusive"
    assert at_least(Figure(0.5, 0.4, 0.6), 0.9) == "fail" and at_least(Figure(1.0, 0.95, 1.1), 0.9) == "pass"


def test_a_host_too_busy_to_measure_is_said_not_widened_into_a_tie():
    busy = point(6.0, (5.8, 6.2), cpu_wait_ms_per_query=5.52)
    assert latency_figure(busy, "p50") == Figure(6.0, 5.8, 6.2)  # measured as measured: no s^2 widening
    assert unmeasurable(busy) == "unmeasurable: the benchmark waited for a CPU 92% of the time"
    assert unmeasurable(point(6.0, cpu_wait_ms_per_query=0.3)) is None
    params = {"backend": "onnxruntime", "max_regression_percent": 10}
    old = summary(point(1.5, (1.49, 1.51)))
    found = _judge(params, summary(point(6.0, (5.8, 6.2), cpu_wait_ms_per_query=5.52)), old)
    primary = next(v for v in found if v.primary)
    assert primary.outcome == "inconclusive" and primary.reason.startswith("batch 4: unmeasurable: the benchmark "
                                                                           "waited for a CPU 92% of the time")
    assert primary.blocking  # on_inconclusive: fail by default: never a silent pass
    # beyond the threshold even if every moment of waiting had been work: still a failure (at most 1/(1-share))
    real = _judge(params, summary(point(30.0, (29.0, 31.0), cpu_wait_ms_per_query=15.0)), old)
    assert next(v for v in real if v.primary).outcome == "fail"
    limit = _judge({"backend": "onnxruntime", "max_latency_ms_p50": 2.0},
                   summary(point(6.0, (5.8, 6.2), cpu_wait_ms_per_query=5.52)))
    assert limit[0].outcome == "inconclusive" and "unmeasurable" in limit[0].reason


# -- the signed-rank machinery ----------------------------------------------------------------------------------
def test_signed_rank_bounds_match_the_tables_and_cover():
    # n = 10 and 20 at one-sided 2.5% (two-sided 5%): critical values 8 and 52 (Wilcoxon's tables)
    assert bound_rank(10, 0.025) == 9 and bound_rank(20, 0.025) == 53
    assert bound_rank(8, 0.0025) is None and bound_rank(9, 0.0025) == 1  # 2^-9 < 0.0025 < 2^-8
    assert hodges_lehmann([1.0, 2.0, 3.0]) == 2.0
    rng = random.Random(3)
    covered = sum(lower_bound([rng.gauss(0.0, 0.05) for _ in range(15)], 0.025) <= 0.0 for _ in range(1000))
    assert covered >= 960  # one-sided 97.5%


def test_sequential_looks_stop_when_they_can_decide():
    budget = Budget()
    schedule = Schedule.up_to(30, budget)
    assert schedule.looks[0] == 9 and schedule.cap == 30 and len(schedule.looks) == 4
    limit = math.log(1.10)
    fast = sequential(PairedRecord.from_dict(pairs(0.0, 30)["paired"]).log_ratios("p50"), schedule, limit, budget)
    assert fast.outcome == "pass" and fast.pairs == 9  # unchanged: decided at the first look
    slow = sequential(PairedRecord.from_dict(pairs(0.20, 30)["paired"]).log_ratios("p50"), schedule, limit, budget)
    assert slow.outcome == "fail" and slow.pairs == 9
    edge = sequential(PairedRecord.from_dict(pairs(0.10, 30)["paired"]).log_ratios("p50"), schedule, limit, budget)
    assert edge.outcome == "inconclusive" and edge.pairs == 30 and edge.final  # at the threshold: only at the cap


def test_power_is_what_the_noise_and_the_cap_allow():
    able = power(0.02, 20, math.log(1.1), Budget(), 4)
    assert 1.1 < able.fails_from < 1.15 and 1.05 < able.passes_below < 1.1
    assert "90% of the time" in able.text() and "up to 20 pairs" in able.text()
    noisier = power(0.4, 20, math.log(1.1), Budget(), 4)
    assert noisier.fails_from > 1.5  # a verdict says when it cannot see a 50% change


def test_each_node_gets_its_share_of_the_recipe_error_budget():
    assert family_alpha(1) == 0.01 and family_alpha(5) == 0.01 and family_alpha(10) == 0.005


# -- regression verdicts --------------------------------------------------------------------------------------
def test_paired_verdicts_fail_a_20_percent_slowdown_and_pass_an_unchanged_build():
    params = {"backend": "onnxruntime", "max_regression_percent": 10}
    same = _judge(params, summary(point(1.0, (0.98, 1.02)), reference=pairs(0.0, 20)))
    primary = [v for v in same if v.primary]
    assert [(v.outcome, v.basis, v.figure) for v in primary] == [("pass", PAIRED, "median latency")]
    assert primary[0].pairs == 9 and "within max_regression_percent 10 with confidence" in primary[0].reason
    assert "fails a change of" in primary[0].power and accepted(same)
    assert [v.figure for v in same if not v.primary] == ["throughput"]  # reported, not judged

    slower = _judge(params, summary(point(1.2, (1.18, 1.22)), reference=pairs(0.20, 20)))
    primary = next(v for v in slower if v.primary)
    assert primary.outcome == "fail" and primary.blocking and primary.estimate == pytest.approx(1.2, rel=0.03)
    assert primary.reason.startswith("batch 4: median latency +") and "beyond max_regression_percent 10" in \
        primary.reason
    assert failures(slower) == [primary.reason]


def test_a_stored_figures_verdict_says_so_and_a_20_percent_slowdown_never_passes():
    params = {"backend": "onnxruntime", "max_regression_percent": 10}
    old = summary(point(1.0, (0.99, 1.01)))
    # 20% slower with tight intervals: beyond 10%, but within 10% x the host's 15% run-to-run drift, which stored
    # figures cannot cancel: undecided, and undecided fails (on_inconclusive: fail, exit code 5)
    drift = _judge(params, summary(point(1.2, (1.19, 1.21))), old)
    primary = next(v for v in drift if v.primary)
    assert primary.basis == STORED and primary.outcome == "inconclusive" and primary.blocking
    assert "stored figures: drift between runs not cancelled" in primary.reason
    assert "not beyond what the host's run-to-run variation (run_to_run_percent 15) can explain" in primary.reason
    assert only_inconclusive(drift)
    strict = _judge({**params, "run_to_run_percent": 0}, summary(point(1.2, (1.19, 1.21))), old)
    assert next(v for v in strict if v.primary).outcome == "fail"
    assert next(v for v in _judge(params, summary(point(1.5, (1.48, 1.52))), old) if v.primary).outcome == "fail"
    same = _judge(params, summary(point(1.01, (1.0, 1.02))), old)
    assert next(v for v in same if v.primary).outcome == "pass"


def test_warn_reports_an_undecided_gate_without_failing_but_never_accepts_it():
    params = {"backend": "onnxruntime", "max_regression_percent": 10, "on_inconclusive": "warn"}
    found = _judge(params, summary(point(1.2, (1.19, 1.21))), summary(point(1.0, (0.99, 1.01))))
    primary = next(v for v in found if v.primary)
    assert primary.outcome == "inconclusive" and not primary.blocking and failures(found) == []
    assert not accepted(found)  # an undecided step never becomes the next night's reference


def test_one_primary_verdict_at_the_gate_point_the_others_reported():
    params = {"backend": "onnxruntime", "max_regression_percent": 10, "run_to_run_percent": 0}
    old = summary(point(1.0, (0.99, 1.01), batch=1), point(4.0, (3.96, 4.04), batch=8))
    now = summary(point(2.0, (1.98, 2.02), batch=1), point(4.0, (3.96, 4.04), batch=8))
    found = _judge(params, now, old)
    primary = [v for v in found if v.primary]
    assert [(v.where, v.outcome) for v in primary] == [("batch 8", "pass")]  # the largest batch by default
    assert any(v.where == "batch 1" and v.outcome == "fail" and not v.blocking for v in found)
    moved = _judge({**params, "gate_batch_size": 1}, now, old)
    assert [(v.where, v.outcome) for v in moved if v.primary] == [("batch 1", "fail")]
    throughput = _judge({**params, "gate_figure": "throughput", "gate_batch_size": 1}, now, old)
    assert [(v.figure, v.outcome) for v in throughput if v.primary] == [("throughput", "fail")]


def test_nothing_to_compare_with_yet_gives_no_regression_verdict():
    assert _judge({"backend": "onnxruntime", "max_regression_percent": 10}, summary(point(1.0, (0.9, 1.1)))) == []


def test_limits_on_intervals_and_open_tails():
    params = {"backend": "onnxruntime", "max_latency_ms_p50": 2.0, "max_latency_ms_p99": 2.5}
    found = _judge(params, summary(point(1.9, (1.8, 2.1), open_intervals=["p99"], queries=100)))
    by_gate = {v.gate: v for v in found}
    assert by_gate["max_latency_ms_p50"].outcome == "inconclusive"  # 1.9 but the interval reaches 2.1
    assert by_gate["max_latency_ms_p50"].blocking  # undecided at the cap fails by default
    assert by_gate["max_latency_ms_p99"].outcome == "fail"  # the whole interval [2.85, 5.7] is above 2.5
    assert "fails a true value above" in by_gate["max_latency_ms_p99"].power
    loose = _judge({**params, "max_latency_ms_p99": 5.0}, summary(point(1.9, (1.8, 2.1), open_intervals=["p99"],
                                                                         queries=100)))
    p99 = next(v for v in loose if v.gate == "max_latency_ms_p99")
    assert p99.outcome == "inconclusive" and "100 queries are too few to bound p99" in p99.reason
    assert _judge({**params, "max_latency_ms_p50": 3.0, "max_latency_ms_p99": 10.0},
                  summary(point(1.9, (1.8, 2.1))))[0].outcome == "pass"


def test_pinned_baseline_paired_when_its_artifact_was_re_measured_else_stored_figures(tmp_path):
    from trtflow_stages.measure.judging.baseline import make_baseline

    facts = {"cpu": "x86_64 test", "onnxruntime": "1.24"}
    artifact = {"identity": "ab" * 16, "params": {"backend": "onnxruntime"}, "artifact": {
        "format": "trtflow-pin/1", "files": {}, "inputs": {"model": {"file": "model.onnx", "objects": {
            "model.onnx": {"digest": "0" * 32, "size": 10}}}}}}
    document = make_baseline("demo", {"bench": {"stage": "benchmark", "summary": summary(
        point(1.0, (0.97, 1.03), queries=500, converged=True)), "facts": facts}}, {"bench": artifact})
    saved = document["nodes"]["bench"]
    assert saved["points"][0]["latency_ci_ms"]["p50"] == [0.97, 1.03] and saved["artifact"]["inputs"]["model"]
    (tmp_path / "base.json").write_text(json.dumps(document))
    from trtflow_stages.measure.judging.baseline import artifact_identity

    identity = artifact_identity(saved)
    params = {"backend": "onnxruntime", "baseline": "base.json"}
    context = {"facts": facts, "resolve": lambda p: tmp_path / p, "node": "bench"}
    paired = dict(pairs(0.2, 20), identity=identity)
    found = _judge(params, summary(point(1.2, (1.18, 1.22)), reference=paired), **context)
    assert [(v.basis, v.outcome) for v in found if v.primary] == [(PAIRED, "fail")]
    assert found[0].gate == "baseline base.json"
    # pairs measured against another artifact than the file pins now: not used; the stored figures are
    other = dict(paired, identity="cd" * 16)
    stored = [v for v in _judge(params, summary(point(1.02, (0.99, 1.05)), reference=other), **context) if v.primary]
    assert [(v.basis, v.outcome) for v in stored] == [(STORED, "pass")]
    assert "the baseline's 1 [0.97, 1.03] ms" in stored[0].reason
    # stored figures from another CPU are refused, saying why
    refused = _judge(params, summary(point(1.0, (0.99, 1.01))), **{**context, "facts": {**facts, "cpu": "other"}})
    assert [v.outcome for v in refused] == ["fail"] and "not compared with baseline" in refused[0].reason


def test_the_engine_fails_the_node_on_blocking_verdicts_only():
    params = benchmark.Params.model_validate({"backend": "onnxruntime", "max_regression_percent": 10})
    old = summary(point(1.0, (0.98, 1.02)))
    judged = benchmark.stage.judge(params, summary(point(2.0, (1.96, 2.04))), GateContext(previous=old))
    assert failures(judged) and all(isinstance(v, GateVerdict) for v in judged)
    warn = benchmark.Params.model_validate({"backend": "onnxruntime", "max_regression_percent": 10,
                                            "on_inconclusive": "warn"})
    assert failures(benchmark.stage.judge(warn, summary(point(1.05, (0.8, 1.6))), GateContext(previous=old))) == []


# -- measuring through interference (issue 32) ------------------------------------------------------------------
def _paired_run(change: float, seed: int | None, host_seed: int = 3) -> object:
    """A gated point timed by `measure.timing.ab.Pairing` on a host whose co-tenant switches on (1.6x slower) and
    off every 15 ms, in 2 ms queries: the rounds' blocks are the pairs."""
    from trtflow_stages.measure.judging.reference import pair_plan
    from trtflow_stages.measure.statistics.intervals import Window
    from trtflow_stages.measure.timing.ab import Pairing

    rng = random.Random(host_seed)
    clock = [0.0]

    def timer(factor: float):
        def window(seconds: float, index: int) -> Window:
            latencies = []
            while not latencies or sum(latencies) < seconds * 1000:
                on = (clock[0] // 15.0) % 2 == 1
                value = 2.0 * factor * (1.6 if on else 1.0) * math.exp(rng.gauss(0, 0.05))
                latencies.append(value)
                clock[0] += value
            return Window(latencies, sum(latencies))
        return window

    params = benchmark.Params.model_validate({"backend": "onnxruntime", "max_regression_percent": 10,
                                              "ab_seed": seed})
    plan = pair_plan(params, 0.06, 0.3, 1, 4, seed=params.ab_seed, cost_budget=params.gate_cost_budget)
    pairing = Pairing(plan, timer(1.0))
    index = 0
    while not pairing.done:
        pairing.step(timer(1.0 + change), 0.06, index)
        index += 1
    return pairing


def test_the_ab_order_is_new_each_run_recorded_and_replayed_by_ab_seed():
    first, second = _paired_run(0.0, None), _paired_run(0.0, None)
    assert first.record.seed != second.record.seed  # a new random order every run
    replay = _paired_run(0.0, first.record.seed)
    orders = [p["order"] for p in first.record.pairs]
    assert [p["order"] for p in replay.record.pairs][:len(orders)] == orders
    assert {"AB", "BA"} == set(orders) and replay.summary()["seed"] == first.record.seed


def test_a_switching_co_tenant_is_measured_through_in_short_interleaved_blocks():
    unchanged, slower = _paired_run(0.0, 1), _paired_run(0.2, 2)
    record = PairedRecord.from_dict(unchanged.summary())
    assert record is not None and record.block_s == pytest.approx(0.06 / 16)  # a fraction of the co-tenant's period
    assert unchanged.last.outcome == "pass" and slower.last.outcome == "fail"
    verdict = _judge({"max_regression_percent": 10}, summary(point(2.0), reference={
        "name": "x", "basis": PAIRED, "paired": slower.summary(), "points": []}))[0]
    assert verdict.outcome == "fail" and "AB/BA seed" in verdict.reason and "blocks varied" in verdict.reason
    # the candidate's side is timed at most max_duration_s (0.9 s here), the reference's beside it: 2x its cap
    assert slower.summary()["seconds"] <= 0.9 + 0.01


def test_disturbed_pairs_are_set_aside_by_the_stated_rule_symmetrically():
    from trtflow_stages.measure.statistics.paired import ASIDE_SHARE, set_aside

    rng = random.Random(4)
    values = [rng.gauss(0.1, 0.01) for _ in range(50)] + [0.9, -0.7, 1.2]  # three pairs a spell hit on one side
    kept, aside = set_aside(values)
    assert sorted(aside) == [50, 51, 52] and len(kept) == 50
    assert hodges_lehmann(kept) == pytest.approx(0.1, abs=0.01)
    wild = [rng.gauss(0, 0.01) for _ in range(20)] + [5.0] * 10  # never more than ASIDE_SHARE of them
    assert len(set_aside(wild)[1]) == int(ASIDE_SHARE * 30)


def test_cpu_waiting_enters_paired_verdicts_a_diluted_regression_never_passes():
    # 90% of the time spent waiting for a CPU: a 20% regression diluted to +2% cannot pass, nor can it fail
    rng = random.Random(6)
    values = [math.log(1.02) + rng.gauss(0, 0.005) for _ in range(40)]
    waits = [(0.9, 0.9)] * 40
    schedule = Schedule.up_to(40, Budget())
    limit = math.log(1.1)
    assert sequential(values, schedule, limit, Budget(), True).outcome == "pass"  # blind to the waiting
    looked = sequential(values, schedule, limit, Budget(), True, waits=waits)
    assert looked.outcome == "inconclusive" and looked.unmeasurable
    # a regression beyond the threshold even if the candidate's waiting had all been its work still fails
    big = [math.log(3.0) + rng.gauss(0, 0.005) for _ in range(40)]
    assert sequential(big, schedule, limit, Budget(), True, waits=[(0.5, 0.5)] * 40).outcome == "fail"


def test_a_coarse_timer_does_not_tie_the_pairs():
    from trtflow_stages.measure.statistics.stats import grid_median

    tick = 1.0
    fast = sorted([2.0] * 30 + [3.0] * 10)  # 0.25 of the queries on the next tick
    slow = sorted([2.0] * 18 + [3.0] * 22)  # 0.55 of them
    assert grid_median(fast) < grid_median(slow)  # the plain medians tie at 2.0 / 3.0 ticks
    assert 1.5 <= grid_median(fast) <= 2.5 and grid_median([1.0 + i * 0.001 for i in range(40)]) == \
        pytest.approx(1.0195)
    assert tick > 0


def test_a_point_whose_queries_are_slow_says_what_would_decide():
    record = PairedRecord(4, 1, "p50", looks=[60, 120], block_s=0.01)
    for _ in range(3):
        record.add("AB", {"p50": 400.0, "mean": 400.0, "queries": 1.0}, {"p50": 401.0, "mean": 401.0, "queries": 1.0})
    record.ended = True
    verdict = _judge({"max_regression_percent": 10}, summary(point(400.0), reference={
        "name": "x", "basis": PAIRED, "paired": record.as_dict(), "points": []}))[0]
    assert verdict.outcome == "inconclusive"
    assert "only 3 pair(s) fitted" in verdict.reason and "raise max_duration_s to" in verdict.reason


def test_the_reference_runs_with_its_pinned_settings():
    from trtflow_stages.measure.judging.reference import pinned_params

    candidate = benchmark.Params.model_validate({"backend": "onnxruntime",
                                                 "onnxruntime": {"graph_optimization_level": "disable"}})
    pinned = benchmark.Params.model_validate({"backend": "onnxruntime"}).model_dump(mode="json")
    reference, said = pinned_params(candidate, pinned)
    assert reference.onnxruntime.graph_optimization_level == pinned["onnxruntime"]["graph_optimization_level"]
    assert said and said[0].startswith("onnxruntime:")
    assert pinned_params(candidate, {})[1] == []  # nothing recorded: the candidate's settings
    verdict = _judge({"max_regression_percent": 10}, summary(point(2.4, (2.35, 2.45)), reference={
        **pairs(0.2, 30), "settings": said, "points": [point(2.0, (1.95, 2.05))]}))
    primary = [v for v in verdict if v.primary]
    assert len(primary) == 1 and primary[0].basis == PAIRED and "pinned settings" in primary[0].reason
    # beside it, the stored figures: what a change both sides share would show
    assert any(v.basis == STORED and not v.primary and "both sides share" in v.reason for v in verdict)


def test_limit_verdicts_share_the_family_error_budget():
    from trtflow_stages.measure.judging.gates import limit_count, limit_verdicts

    params = benchmark.Params.model_validate({"max_latency_ms_p50": 2.0, "min_throughput_qps": 100.0})
    points = [point(2.1, (2.02, 2.2)), point(2.1, (2.02, 2.2), batch=8)]
    assert limit_count(params, points) == 4
    alone = limit_verdicts(points[0], params)[0]
    shared = limit_verdicts(points[0], params, family=3, count=4)[0]
    assert alone.outcome == "fail" and shared.outcome == "inconclusive"  # 95% alone; 1 - 1.7%/4 shared


def test_the_history_tracks_the_gate_point_not_batch_1():
    figures = benchmark.figures(benchmark.Params.model_validate({}), summary(point(1.0, batch=1), point(4.0, batch=8)))
    primary = [f.name for f in figures.figures if f.primary]
    assert primary == ["p50 latency, batch 8", "throughput, batch 8"]


def _generation_pairs(ttft: float, tpot: float, count: int = 30, disturbed: int = 0, waits: float = 0.05,
                      seed: int = 0) -> dict:
    """A gated generation level's record: per pair both figures (``ttft`` and ``tpot`` slower by these), the first
    ``disturbed`` pairs with a co-tenant's spell on the candidate's side only, each side waiting ``waits``."""
    rng = random.Random(seed)
    record = PairedRecord(1, 1, "tpot_p50", looks=list(Schedule.up_to(count, Budget()).looks))
    for index in range(count):
        base = math.exp(rng.gauss(0.0, 0.05))
        spell = 2.0 if index < disturbed else 1.0

        def side(change_first: float, change_token: float, factor: float = 1.0, base: float = base) -> dict:
            first = 20.0 * base * change_first * factor * math.exp(rng.gauss(0.0, 0.02))
            token = 5.0 * base * change_token * factor * math.exp(rng.gauss(0.0, 0.02))
            return {"ttft_p50": first, "tpot_p50": token, "p50": token, "wait_share": waits}

        record.add("AB" if index % 2 else "BA", side(1.0, 1.0), side(1.0 + ttft, 1.0 + tpot, spell))
    record.ended = True
    return {"name": "the last accepted result", "basis": PAIRED, "points": [],
            "paired": dict(record.as_dict(), concurrency=1)}


def _level(concurrency: int, ttft: float, tpot: float) -> dict:
    def figure(value: float) -> dict:
        return {"p50": value, "ci": {"p50": [value * 0.98, value * 1.02]}}
    return {"concurrency": concurrency, "requests": 40, "ttft_ms": figure(ttft), "tpot_ms": figure(tpot)}


def test_generation_gates_judge_ttft_and_tpot_on_given_pairs():
    """A gated generation benchmark's first level: its time to first token and its time per output token are both
    primary verdicts on the pairs, by the latency gate's rules: a regression of either fails; disturbed pairs are
    set aside (the verdict says how many); a host that kept both sides waiting for a CPU most of the time leaves a
    small change undecided; the other levels are reported, not judged; without pairs the stored levels decide."""
    params = {"generation": {"concurrency": [1, 4]}, "max_regression_percent": 10}
    levels = [_level(1, 20.0, 5.0), _level(4, 30.0, 6.0)]

    def judged(reference: dict, now: list | None = None) -> dict:
        found = _judge(params, dict(summary(reference=reference), points=[], generation=now or levels))
        assert not any(v.primary for v in found if v.where == "concurrency 4")  # reported at most
        return {v.figure: v for v in found if v.primary}

    same = judged(_generation_pairs(0.0, 0.0))
    assert set(same) == {"p50 time to first token", "p50 time per output token"}
    assert {(v.outcome, v.basis, v.where) for v in same.values()} == {("pass", PAIRED, "concurrency 1")}
    slower_tokens = judged(_generation_pairs(0.0, 0.20))
    assert slower_tokens["p50 time per output token"].outcome == "fail"
    assert slower_tokens["p50 time to first token"].outcome == "pass"
    slower_first = judged(_generation_pairs(0.20, 0.0))
    assert slower_first["p50 time to first token"].outcome == "fail"
    assert "p50 time to first token +" in slower_first["p50 time to first token"].reason
    # a co-tenant's spells on the candidate's side in 4 of 30 pairs: set aside, said, and an unchanged model passes
    spells = judged(_generation_pairs(0.0, 0.0, disturbed=4))
    assert {v.outcome for v in spells.values()} == {"pass"}
    assert re.search(r"[1-4] of \d+ pairs set aside as disturbed", spells["p50 time per output token"].reason)
    # waiting for a CPU 70% of the time: a 3% change cannot be told from the waiting (undecided, said so)
    busy = judged(_generation_pairs(0.0, 0.03, waits=0.7))
    assert busy["p50 time per output token"].outcome == "inconclusive"
    assert "unmeasurable" in busy["p50 time per output token"].reason
    # not re-measured: the reference's stored levels decide (with the host's run-to-run allowance)
    stored = judged({"name": "the last accepted result", "basis": STORED, "paired": None, "points": [],
                     "why": "the reference does not run here",
                     "generation": [_level(1, 10.0, 5.0), _level(4, 30.0, 6.0)]})
    assert {v.basis for v in stored.values()} == {STORED}
    reported = _judge(params, dict(summary(reference={"name": "r", "paired": None, "points": [],
                                                      "generation": [_level(4, 30.0, 6.0)]}), points=[],
                                   generation=levels))
    assert [(v.where, v.primary) for v in reported] == [("concurrency 4", False)] * 2
    assert stored["p50 time to first token"].outcome == "fail" and stored["p50 time per output token"].outcome == \
        "pass"
