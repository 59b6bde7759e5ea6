"""What the change-point detector finds and what the nightly check fails on, on seeded synthetic series.

Each series is one figure per run with log-normal run-to-run noise of 3% (``trtflow.history.power``); the
detector is Apache Otava's (`trtflow.history.changes`), the check `trtflow history --check`'s (`trend.check`).
Rates measured with these seeds (bench/history_power.py has more trials and noise levels):
- a 10% step at run 20 of 30 is found within 2 runs of its place in 99.7% of 300 series;
- an unchanged series of 30 runs shows no change point in 96.3% of 300 (a change point by chance in 3.7%);
- the check (threshold 10%, latest 5 runs, 2 runs after the change, every run since agreeing) fails a 15% step
  by the 2nd run after it in 92% and by the 5th in 99.5% of 200 trials, and never (0 of 200) on an unchanged
  series over 5 nights.
"""

from __future__ import annotations

import pytest

from trtflow.history.power import check_rates, detection_rates
from trtflow.history.trend import Point, Series, check, find_changes

pytest.importorskip("otava.analysis", reason="the history extra (Apache Otava) is not installed")


def test_a_ten_percent_step_in_thirty_noisy_runs_is_found_near_its_place() -> None:
    found = detection_rates(300, runs=30, noise=0.03, step=0.10, at=20, tolerance=2, seed=0)
    assert found.found >= 0.95, found


def test_an_unchanged_series_shows_no_change_point_most_of_the_time() -> None:
    unchanged = detection_rates(300, runs=30, noise=0.03, step=0.0, at=20, seed=1)
    assert unchanged.any_change <= 0.06, unchanged


def test_the_nightly_check_fails_a_regression_beyond_its_threshold_and_not_noise() -> None:
    step = check_rates(200, history=25, noise=0.03, step=0.15, threshold_percent=10.0, seed=0)
    assert step.failed_by_night[0] <= 0.01, "one run after the change is not yet a step (runs_after 2)"
    assert step.failed_by_night[1] >= 0.85 and step.failed_by_night[-1] >= 0.97, step
    unchanged = check_rates(200, history=25, noise=0.03, step=0.0, threshold_percent=10.0, seed=3)
    assert unchanged.failed_by_night[-1] <= 0.02, unchanged


def _series(values: list[float], better: str = "lower") -> Series:
    return Series("bench", "benchmark", "throughput, batch 1" if better == "higher" else "p99 latency, batch 1",
                  "ms", better, True, [Point(f"run{i}", 1.7e9 + i * 86400, v, v * 0.98, v * 1.02, 1000, "k")
                                       for i, v in enumerate(values)])


def test_the_check_judges_the_direction_the_threshold_and_the_window() -> None:
    flat = [10.0, 10.1, 9.9, 10.05, 9.95, 10.0, 10.1, 9.9, 10.0, 10.05, 9.95, 10.0]
    slower = _series(flat + [11.5, 11.6, 11.4])
    faster = _series(flat + [8.5, 8.6, 8.4])
    less = _series([v * 10 for v in flat] + [86.0, 85.0, 85.5], better="higher")
    small = _series(flat + [10.5, 10.6, 10.4])
    find_changes([slower, faster, less, small])
    (finding,) = check([slower], threshold_percent=10.0)
    assert finding.change.index == 12 and finding.change.regression and 14 < finding.change.percent < 16
    assert "bench: p99 latency, batch 1: +15" in finding.message and "run12" in finding.message
    assert faster.changes and not faster.changes[0].regression and check([faster], 10.0) == []
    assert less.changes[0].regression and check([less], 10.0), "throughput down is a regression"
    assert check([small], 10.0) == [], "a 5% step is below the threshold"
    assert check([slower], 10.0, latest=2) == [], "the change started 3 runs ago: outside the latest 2"
    assert check([slower], 20.0) == []
