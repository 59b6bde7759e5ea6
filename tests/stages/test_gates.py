"""Gates with the uncertainty of both sides (`measure.compare`, `measure.gates`): pass, fail, inconclusive."""

from __future__ import annotations

import json

import pytest

from trtflow.stage import GateContext
from trtflow_stages import benchmark
from trtflow_stages.measure import compare as _compare
from trtflow_stages.measure.compare import Figure, at_least, at_most, latency_figure
from trtflow_stages.measure.gates import verdicts


def point(p50: float, interval: tuple[float, float] | None = None, batch: int = 4, **extra: object) -> dict:
    """A summary point: one query at a time, so throughput = batch / latency."""
    qps = batch / p50 * 1000.0
    found = {"batch_size": batch, "streams": 1, "latency_ms": {"p50": p50, "p99": p50 * 2, "mean": p50},
             "throughput_qps": qps, **extra}
    if interval is not None:
        found["latency_ci_ms"] = {"p50": list(interval), "p99": [p50 * 1.5, p50 * 3]}
        found["throughput_ci_qps"] = [qps * p50 / interval[1], qps * p50 / interval[0]]
    return found


def summary(*points: dict) -> dict:
    return {"backend": "onnxruntime", "device": "cpu", "hardware": {"cpu": "x86_64 test"}, "points": list(points)}


def test_ratio_intervals_hold_when_both_sides_do():
    new, old = Figure(2.0, 1.9, 2.1), Figure(1.0, 0.95, 1.05)
    ratio = new.ratio(old)
    assert ratio.value == 2.0 and ratio.low == pytest.approx(1.9 / 1.05) and ratio.high == pytest.approx(2.1 / 0.95)
    assert at_most(ratio, 1.1) == "fail" and at_most(Figure(1.0, 0.9, 1.05), 1.1) == "pass"
    assert at_most(Figure(1.05, 0.9, 1.3), 1.1) == "inconclusive"
    assert at_least(Figure(0.5, 0.4, 0.6), 0.9) == "fail" and at_least(Figure(1.0, 0.95, 1.1), 0.9) == "pass"


def test_a_wait_for_the_cpu_widens_a_figure_when_builds_are_compared():
    busy = point(6.0, (5.8, 6.2), cpu_wait_ms_per_query=3.5)
    assert latency_figure(busy, "p50") == Figure(6.0, 5.8, 6.2)  # a latency limit judges what was measured
    # its threads had a CPU 1 - 3.5/6 of the time: the interval reaches down to 5.8 x (2.5/6)^2
    assert latency_figure(busy, "p50", allow_wait=True) == Figure(6.0, pytest.approx(5.8 * (2.5 / 6) ** 2), 6.2)
    assert _compare.throughput_figure(busy, allow_wait=True).high > _compare.throughput_figure(busy).high


def _judge(params: dict, now: dict, previous: dict | None = None, **context: object) -> list[dict]:
    return verdicts(benchmark.Params.model_validate(params), now, GateContext(previous=previous, **context))


def test_regression_against_the_previous_run_passes_fails_or_says_inconclusive():
    params = {"backend": "onnxruntime", "max_regression_percent": 10}
    old = summary(point(1.0, (0.98, 1.02)))
    same = _judge(params, summary(point(1.01, (0.99, 1.03))), old)
    assert [v["verdict"] for v in same] == ["pass", "pass"]
    assert "within max_regression_percent 10" in same[0]["message"]

    slower = _judge(params, summary(point(2.0, (1.96, 2.04))), old)
    assert [v["verdict"] for v in slower] == ["fail", "fail"]
    assert slower[0]["message"].startswith("batch 4: median latency 2 [1.96, 2.04] ms is 100.0% above the previous")
    assert "95% interval 1.922-2.082" in slower[0]["message"]

    noisy = _judge(params, summary(point(1.05, (0.8, 1.6))), old)
    assert noisy[0]["verdict"] == "inconclusive"
    assert "too noisy to tell" in noisy[0]["message"] and "max_duration_s" in noisy[0]["message"]
    # the engine fails the node on fail verdicts only
    validated = benchmark.Params.model_validate(params)
    assert benchmark.stage.judge(validated, summary(point(1.05, (0.8, 1.6))), GateContext(previous=old)) == []
    assert len(benchmark.stage.judge(validated, summary(point(2.0, (1.96, 2.04))),
                                     GateContext(previous=old))) == 2


def test_a_change_the_host_alone_can_explain_is_inconclusive_not_a_failure():
    params = {"backend": "onnxruntime", "max_regression_percent": 10}
    old = summary(point(1.0, (0.99, 1.01)))
    # 20% slower with tight intervals (ratio 1.19-1.21): beyond 10%, within 10% x the host's 15% run-to-run
    drift = _judge(params, summary(point(1.2, (1.19, 1.21))), old)
    assert [v["verdict"] for v in drift] == ["inconclusive", "inconclusive"]
    assert "not beyond what the host's run-to-run variation (run_to_run_percent 15) can explain" in \
        drift[0]["message"]
    assert [v["verdict"] for v in _judge({**params, "run_to_run_percent": 0}, summary(point(1.2, (1.19, 1.21))),
                                         old)] == ["fail", "fail"]
    assert [v["verdict"] for v in _judge(params, summary(point(1.5, (1.48, 1.52))), old)] == ["fail", "fail"]


def test_a_busy_host_makes_a_false_regression_inconclusive_but_a_real_one_still_fails():
    params = {"backend": "onnxruntime", "max_regression_percent": 10}
    old = summary(point(2.4, (2.38, 2.43), cpu_wait_ms_per_query=0.0))
    # measured while another process held our core: 2.7x slower, and 4 ms of every query spent waiting for a CPU
    disturbed = summary(point(6.5, (6.4, 6.6), cpu_wait_ms_per_query=4.0))
    assert {v["verdict"] for v in _judge(params, disturbed, old)} == {"inconclusive"}
    real = summary(point(8.1, (8.0, 8.2), cpu_wait_ms_per_query=0.1))
    assert {v["verdict"] for v in _judge(params, real, old)} == {"fail"}


def test_latency_limits_on_intervals_and_open_tails():
    params = {"backend": "onnxruntime", "max_latency_ms_p50": 2.0, "max_latency_ms_p99": 2.5}
    found = _judge(params, summary(point(1.9, (1.8, 2.1), open_intervals=["p99"], queries=100)))
    by_gate = {v["gate"]: v for v in found}
    assert by_gate["max_latency_ms_p50"]["verdict"] == "inconclusive"  # 1.9 but the interval reaches 2.1
    assert by_gate["max_latency_ms_p99"]["verdict"] == "fail"  # the whole interval [2.85, 5.7] is above 2.5
    loose = _judge({**params, "max_latency_ms_p99": 5.0}, summary(point(1.9, (1.8, 2.1), open_intervals=["p99"],
                                                                         queries=100)))
    p99 = next(v for v in loose if v["gate"] == "max_latency_ms_p99")
    assert p99["verdict"] == "inconclusive" and "100 queries are too few to bound p99" in p99["message"]
    assert _judge({**params, "max_latency_ms_p50": 3.0, "max_latency_ms_p99": 10.0},
                  summary(point(1.9, (1.8, 2.1))))[0]["verdict"] == "pass"


def test_pinned_baseline_weighs_both_intervals(tmp_path):
    from trtflow_stages.measure.baseline import make_baseline

    facts = {"cpu": "x86_64 test", "onnxruntime": "1.24"}
    document = make_baseline("demo", {"bench": {"stage": "benchmark", "summary": summary(
        point(1.0, (0.97, 1.03), queries=500, converged=True)), "facts": facts}})
    saved = document["nodes"]["bench"]["points"][0]
    assert saved["latency_ci_ms"]["p50"] == [0.97, 1.03] and saved["queries"] == 500 and saved["converged"]
    (tmp_path / "base.json").write_text(json.dumps(document))
    params = {"backend": "onnxruntime", "baseline": "base.json"}
    context = {"facts": facts, "resolve": lambda p: tmp_path / p, "node": "bench"}
    assert {v["verdict"] for v in _judge(params, summary(point(1.02, (0.99, 1.05))), **context)} == {"pass"}
    assert {v["verdict"] for v in _judge(params, summary(point(1.1, (0.9, 1.4))), **context)} == {"inconclusive"}
    failed = _judge(params, summary(point(2.0, (1.95, 2.05))), **context)
    assert {v["verdict"] for v in failed} == {"fail"} and "above the baseline's 1 [0.97, 1.03] ms" in \
        failed[0]["message"]
