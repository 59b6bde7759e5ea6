"""What select's accuracy ordering can tell apart (issue 43 item 7): the largest error's uncertainty is the exact
bootstrap of the rows' maximum (checked against resampling), the margins are widened for the figures judged at once,
and the largest error alone orders candidates only where the mean errors point the same way. The rates under five
error models are measured by ``bench/accuracy_order.py``, not asserted here."""

from __future__ import annotations

import numpy as np
import pytest

from trtflow_stages.accuracy.resolution import figure_uncertainty, max_spread
from trtflow_stages.decision.tie_breakers import compare_accuracy, more_accurate, widening


@pytest.mark.parametrize("rows", [2, 3, 5, 16, 64, 257])
def test_the_exact_bootstrap_of_the_maximum_agrees_with_resampling(rows):
    """The fast path (the quantile from (j/n)^n) against the slow one it replaces: 20,000 bootstrap resamples of the
    rows, the 2.5% quantile of their maxima (the resampled quantile falls within one order statistic of the exact
    one: the resampling's own noise)."""
    rng = np.random.default_rng(rows)
    maxima = rng.gamma(2.0, 1.0, rows)
    resampled = maxima[rng.integers(0, rows, (20_000, rows))].max(axis=1)
    quantile = float(np.quantile(resampled, 0.025, method="inverted_cdf"))
    ordered = np.sort(maxima)
    exact = ordered[-1] - max_spread(maxima)
    position = int(np.searchsorted(ordered, exact))
    assert abs(int(np.searchsorted(ordered, quantile)) - position) <= 1, (quantile, exact)
    assert max_spread(maxima[:1]) == 0.0


def test_the_spread_of_the_maximum_is_not_the_gap_between_the_two_largest_rows():
    rows = np.arange(1.0, 17.0)  # per-row maxima 1..16: the gap rule said 1; one row fewer moves the maximum by 1,
    error = np.zeros((16, 4))   # three fewer (a resample without them, 2.5% likely) by 3
    error[:, 0] = rows
    uncertainty = figure_uncertainty(np.zeros((16, 4)), error)
    assert uncertainty["spread"]["max_abs_error"] == pytest.approx(3.0)


def _record(mean: float, largest: float, mean_spread: float = 1e-5, max_spread_: float = 1e-3) -> dict:
    return {"cosine_similarity": 0.999, "mean_abs_error": mean, "max_abs_error": largest,
            "uncertainty": {"mean_abs_error": {"resolution": 1e-7, "spread": mean_spread},
                            "max_abs_error": {"resolution": 1e-6, "spread": max_spread_}}}


def test_margins_are_widened_for_the_figures_judged_at_once():
    assert widening(1) == pytest.approx(1.0)
    assert widening(3) == pytest.approx(2.394 / 1.960, rel=1e-3)
    # mean errors 1.6e-5 apart order at 95% for one figure (margin 1.4e-5), not when three are judged (1.7e-5)
    ours, theirs = _record(1e-3, 0.5), _record(1e-3 + 1.6e-5, 0.5)
    mean = next(c for c in compare_accuracy(ours, theirs) if c.figure == "mean_abs_error")
    assert mean.margin == pytest.approx(1e-7 + np.hypot(1e-5, 1e-5) * widening(3))
    assert mean.verdict == 0 and not more_accurate(ours, theirs)


def test_the_largest_error_alone_orders_only_where_the_mean_errors_agree():
    # identical mean errors pointing the other way: a chance maximum does not order them, and the reason says why
    ours, theirs = _record(1.00001e-3, 0.40), _record(1e-3, 0.50)
    comparison = next(c for c in compare_accuracy(ours, theirs) if c.figure == "max_abs_error")
    assert comparison.verdict == 0 and comparison.set_aside
    assert "not judged alone: the mean errors point the other way" in comparison.text()
    assert not more_accurate(ours, theirs) and not more_accurate(theirs, ours)
    # the mean errors pointing the same way (within their spread): the maximum orders
    ours = _record(0.99999e-3, 0.40)
    assert more_accurate(ours, theirs) and not more_accurate(theirs, ours)
    # the mean errors apart beyond their spread the other way: the two figures disagree, not ordered
    ours = _record(1.2e-3, 0.40)
    assert not more_accurate(ours, theirs) and not more_accurate(theirs, ours)
