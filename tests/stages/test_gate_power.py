"""A reduced run of `bench/gate_power.py`: the gates' and select's own decision code on seeded models of a busy CPU
host's and a GPU's noise, with interference the gate was not tuned on (a co-tenant switching on and off, bimodal
windows, heavy tails, 5% window noise; no timing): unchanged candidates rarely end red, twice the threshold fails
and never passes, the gated cost stays within its look's mark (2x at the first, the budget at the last), select
sees a 20% (CPU) / 10% (GPU) win. The full run (hundreds of trials per row, every noise class) is the bench
script."""

from __future__ import annotations

from bench.gate_power import CLASSES, MODELS, gate_trial, select_trial
from trtflow_stages.measure.timing.ab import COST_BUDGET, look_marks

TRIALS = 20
SELECT_TRIALS = 60


def _outcomes(model: str, noise: str, multiple: float, seed: int = 11) -> list[tuple[str, int, float, int, float]]:
    host = MODELS[model]
    return [gate_trial(host, multiple * host.threshold / 100.0, seed * 1_000_003 + i, noise=CLASSES[noise])
            for i in range(TRIALS)]


def test_beside_a_switching_co_tenant_with_every_noise_an_unchanged_candidate_stays_green_and_2x_fails():
    for model in ("cpu", "gpu"):
        same = _outcomes(model, "all", 0.0)
        unchanged = [o[0] for o in same]
        assert unchanged.count("fail") == 0 and unchanged.count("pass") >= TRIALS - 2, (model, unchanged)
        slower = _outcomes(model, "all", 2.0)
        assert [o[0] for o in slower].count("fail") >= 0.85 * TRIALS and all(o[0] != "pass" for o in slower)
        # the gated cost: both sides' timed seconds over the ungated point's (its min_duration_s) within the look's
        # mark (2x at the first, the budget at the last) but for the round that crossed it
        marks = look_marks(COST_BUDGET)
        costs = [(cost, look, before) for _, _, cost, look, before in slower + same]
        assert all(before <= marks[look - 1] * 1.001 and cost <= marks[look - 1] * 1.05 for cost, look, before
                   in costs), costs
        assert marks[0] == 2.0 and marks[-1] == COST_BUDGET


def test_a_co_tenant_switching_within_a_pair_does_not_turn_unchanged_runs_red():
    unchanged = [o[0] for o in _outcomes("cpu", "switch-0.3", 0.0, seed=5)]
    assert unchanged.count("pass") >= TRIALS - 2 and unchanged.count("fail") == 0


def test_select_sees_a_20_percent_win_on_a_busy_cpu_and_10_percent_on_a_gpu():
    assert sum(select_trial(MODELS["cpu"], 0.20, seed) for seed in range(SELECT_TRIALS)) >= 0.9 * SELECT_TRIALS
    assert sum(select_trial(MODELS["gpu"], 0.10, seed) for seed in range(SELECT_TRIALS)) >= 0.9 * SELECT_TRIALS
    # within the 5% preference band, the tie-breaker's choice stands
    assert sum(select_trial(MODELS["gpu"], 0.02, seed) for seed in range(SELECT_TRIALS)) <= 0.1 * SELECT_TRIALS
