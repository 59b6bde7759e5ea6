"""A reduced run of `bench/gate_power.py`: the gates' and select's own decision code on seeded models of a busy CPU
host's and a GPU's noise (no timing): false alarms rare, a 20% (CPU) / 15% (GPU) slowdown failed, a 20% slowdown
never passed, select seeing a 20% (CPU) / 10% (GPU) win. The full run (thousands of trials) is the bench script."""

from __future__ import annotations

from bench.gate_power import MODELS, gate_trial, select_trial

TRIALS = 60


def _outcomes(model: str, change: float, seed: int = 11) -> list[str]:
    return [gate_trial(MODELS[model], change, seed * 1_000_003 + i)[0] for i in range(TRIALS)]


def test_gates_do_not_cry_wolf_and_see_twice_the_threshold_on_a_busy_cpu():
    unchanged = _outcomes("cpu", 0.0)
    assert unchanged.count("fail") == 0 and unchanged.count("pass") >= 0.95 * TRIALS
    slower = _outcomes("cpu", 0.20)
    assert slower.count("fail") >= 0.9 * TRIALS and "pass" not in slower  # never exit 0


def test_gates_see_one_and_a_half_times_the_threshold_on_a_gpu():
    slower = _outcomes("gpu", 0.15)
    assert slower.count("fail") >= 0.9 * TRIALS and "pass" not in slower
    at_threshold = _outcomes("gpu", 0.10)
    assert at_threshold.count("fail") <= 1  # a change exactly at the threshold fails at most ~1% of the time


def test_select_sees_a_20_percent_win_on_a_busy_cpu_and_10_percent_on_a_gpu():
    assert sum(select_trial(MODELS["cpu"], 0.20, seed) for seed in range(TRIALS)) >= 0.9 * TRIALS
    assert sum(select_trial(MODELS["gpu"], 0.10, seed) for seed in range(TRIALS)) >= 0.9 * TRIALS
    # within the 5% preference band, the tie-breaker's choice stands
    assert sum(select_trial(MODELS["gpu"], 0.02, seed) for seed in range(TRIALS)) <= 0.1 * TRIALS
