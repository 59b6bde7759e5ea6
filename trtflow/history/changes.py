"""Change points of a series of figures, found by Apache Otava (the ``history`` extra: ``apache-otava``).

Otava is the change-point detector of MongoDB's and DataStax's performance CI (Hunter, Fleming et al. 2023):
E-Divisive (Matteson and James) over sliding windows proposes candidate points, and a two-sided t-test between the
neighbouring segments keeps those significant at ``max_pvalue``. It judges point values (one per run); it works on
short series (a t-test needs a few points a side) and needs no model of the noise.

Power and false alarms of the settings used here (`MAX_PVALUE`, otava's default window of 50 runs), measured by
``tests/history/test_changes.py`` and ``bench/history_power.py`` on seeded synthetic series of 30 runs with
log-normal run-to-run noise: see README's "Nightly history".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trtflow.errors import EnvironmentUnavailable

MAX_PVALUE = 0.001  # otava's default: a change point found by chance in ~2% of unchanged 30-run series
WINDOW = 50  # otava's default: runs analysed at once
MIN_POINTS = 4  # fewer runs than this have no change point to find
EXTRA_HINT = "pip install 'trtflow[history]' (Apache Otava, the change-point detector)"


@dataclass(frozen=True)
class ChangePoint:
    """A change between the segment before ``index`` and the one from it on (``index``: the first run after it)."""

    index: int
    mean_before: float
    mean_after: float
    pvalue: float

    @property
    def percent(self) -> float:
        """The change of the mean, in percent of the mean before it."""
        return (self.mean_after / self.mean_before - 1.0) * 100.0 if self.mean_before else 0.0


def unavailable() -> str | None:
    """Why change points cannot be computed here (None: they can)."""
    try:
        import otava.analysis  # noqa: F401
    except ImportError as exc:
        return f"change points need Apache Otava, which is not installed ({exc.name or exc})"
    return None


def require() -> None:
    """Raise `EnvironmentUnavailable` (exit 3) when Otava is not installed, saying how to install it."""
    reason = unavailable()
    if reason is not None:
        raise EnvironmentUnavailable(reason, hint=EXTRA_HINT)


def change_points(values: Sequence[float], max_pvalue: float = MAX_PVALUE, window: int = WINDOW) -> list[ChangePoint]:
    """The change points of ``values`` (oldest first), each with the means of the segments around it and its
    p-value; raises `EnvironmentUnavailable` without Otava."""
    require()
    from otava.analysis import compute_change_points

    series = [float(v) for v in values]
    if len(series) < MIN_POINTS:
        return []
    found, _weak = compute_change_points(series, window_len=window, max_pvalue=max_pvalue)
    return [ChangePoint(int(cp.index), float(cp.stats.mean_before()), float(cp.stats.mean_after()),
                        float(cp.stats.pvalue)) for cp in sorted(found, key=lambda cp: cp.index)]
