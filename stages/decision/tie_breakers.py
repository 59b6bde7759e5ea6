"""The tie-breakers: how tied candidates sort on accuracy, size, latency or throughput.

Accuracy is not one number. Candidate A is *more accurate* than B only when at least one of the figures both
validations report (cosine similarity, mean and max absolute error, a generation check's tokens matched) favours A
by more than that figure's numerical resolution plus the two candidates' spread over the rows
(`accuracy.resolution`), and none favours B by as much. The spreads are 95% half-widths; judged on several figures
at once, each is widened to a 1 - 5%/k interval (Bonferroni over the k figures both report), so that two
statistically identical candidates are ordered by some figure at most 5% of the time, not 5% per figure
(``bench/accuracy_order.py``). Figures that differ by less say nothing (a cosine of 0.99999998 against 1 is float
rounding); figures that disagree beyond it say the candidates are not ordered on accuracy. Tied candidates are
sorted into accuracy *fronts* (those no other is more accurate than, then those only the first front beats, ...);
candidates in one front are left to the next tie-breaker.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtflow.digits import distinct, finite

from ..accuracy.resolution import cosine_resolution

#: Accuracy figures in the order reasons list them, with whether higher is better and the name a reason gives.
ACCURACY_FIGURES = {"mean_abs_error": (False, "mean abs error"), "max_abs_error": (False, "max abs error"),
                    "cosine_similarity": (True, "cosine similarity"), "tokens_matched": (True, "tokens matched")}


@dataclass(frozen=True)
class FigureComparison:
    """One accuracy figure of two candidates: ``verdict`` +1 when ours is better beyond ``margin`` (the figure's
    resolution plus both spreads), -1 when worse beyond it, 0 when the difference is within it."""

    figure: str
    ours: float
    theirs: float
    margin: float
    verdict: int
    set_aside: bool = False  # beyond its margin, but the mean errors point the other way (`_max_with_the_mean`)

    def text(self) -> str:
        label = ACCURACY_FIGURES[self.figure][1]
        ours = distinct(self.ours, [self.theirs], least=3)
        theirs = distinct(self.theirs, [self.ours], least=3)
        if self.verdict:
            return f"{label} {ours} vs {theirs}"
        if self.set_aside:
            return f"{label} {ours} vs {theirs} (not judged alone: the mean errors point the other way)"
        return f"{label} {ours} vs {theirs} within its resolution and spread (±{self.margin:.2g})"


def widening(figures: int) -> float:
    """The factor that turns a 95% half-width into one of a 1 - 5%/``figures`` interval (normal quantiles):
    1 for one figure, 1.22 for three, 1.28 for four."""
    from statistics import NormalDist

    quantile = NormalDist().inv_cdf
    return quantile(1 - 0.025 / max(figures, 1)) / quantile(0.975)


def _margin(a: Mapping[str, Any], b: Mapping[str, Any], figure: str, figures: int = 1) -> float:
    ua = (a.get("uncertainty") or {}).get(figure) or {}
    ub = (b.get("uncertainty") or {}).get(figure) or {}
    resolution = max(float(ua.get("resolution") or 0.0), float(ub.get("resolution") or 0.0))
    if figure == "cosine_similarity" and not (ua and ub):  # a record without its uncertainty: float32's rounding
        resolution = max(resolution, cosine_resolution(2))
    spread = math.hypot(float(ua.get("spread") or 0.0), float(ub.get("spread") or 0.0))
    return resolution + spread * widening(figures)


def compare_accuracy(ours: Mapping[str, Any] | None, theirs: Mapping[str, Any] | None) -> list[FigureComparison]:
    """Every accuracy figure both validations report, compared beyond its resolution and spread."""
    if not ours or not theirs:
        return []
    found = []
    both = [figure for figure in ACCURACY_FIGURES if finite(ours.get(figure)) and finite(theirs.get(figure))]
    for figure in both:
        higher = ACCURACY_FIGURES[figure][0]
        a, b = float(ours[figure]), float(theirs[figure])
        margin = _margin(ours, theirs, figure, len(both))
        difference = (a - b) if higher else (b - a)
        verdict = 1 if difference > margin else -1 if -difference > margin else 0
        found.append(FigureComparison(figure, a, b, margin, verdict))
    return [_max_with_the_mean(c, found) for c in found]


def _max_with_the_mean(comparison: FigureComparison, found: Sequence[FigureComparison]) -> FigureComparison:
    """The largest error orders two candidates alone (the mean errors within their spread) only where the mean errors
    point the same way: a maximum rests on one row, and its interval (the exact bootstrap's,
    `accuracy.resolution.max_spread`) is only roughly right for an extreme, so alone it would order identical
    candidates more often than its 5% (``bench/accuracy_order.py``). Mean errors apart beyond their spread keep
    their own verdict: where the two disagree, the candidates are not ordered on accuracy."""
    if comparison.figure != "max_abs_error" or not comparison.verdict:
        return comparison
    mean = next((c for c in found if c.figure == "mean_abs_error"), None)
    if mean is None or mean.verdict or (mean.theirs - mean.ours) * comparison.verdict > 0:
        return comparison
    return FigureComparison(comparison.figure, comparison.ours, comparison.theirs, comparison.margin, 0, True)


def more_accurate(ours: Mapping[str, Any] | None, theirs: Mapping[str, Any] | None) -> bool:
    """Some figure favours ``ours`` beyond its resolution and spread, and none favours ``theirs`` so."""
    verdicts = {c.verdict for c in compare_accuracy(ours, theirs)}
    return 1 in verdicts and -1 not in verdicts


def accuracy_fronts(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Each row's accuracy front among ``rows`` (0: no other is more accurate than it); rows without a validation
    come last. Where what remains is ordered in a circle, it forms one front."""
    remaining = [r for r in rows if r.get("validation")]
    fronts: dict[str, int] = {}
    level = 0
    while remaining:
        front = [r for r in remaining
                 if not any(more_accurate(o["validation"], r["validation"]) for o in remaining if o is not r)]
        front = front or remaining
        for row in front:
            fronts[row["name"]] = level
        remaining = [r for r in remaining if r["name"] not in fronts]
        level += 1
    for row in rows:
        fronts.setdefault(row["name"], level)
    return fronts


def tie_key(row: Mapping[str, Any], criterion: str) -> float:
    """Sort key of a tie-breaker (smaller sorts first); a missing figure sorts last. Accuracy sorts by the row's
    ``accuracy_front`` (`accuracy_fronts` of the tied rows, set by the decision)."""
    if criterion == "accuracy":
        front = row.get("accuracy_front")
        return float(front) if front is not None else math.inf
    if criterion == "size":
        return float(row["size_bytes"])
    point = row.get("operating_point") or {}
    if criterion == "latency":
        value = point.get("latency_ms")
        return value if finite(value) else math.inf
    value = point.get("throughput_qps")
    return -value if finite(value) else math.inf


def accuracy_text(ours: Mapping[str, Any] | None, theirs: Mapping[str, Any] | None) -> str:
    """The figures that decide between two candidates first, then those within their resolution and spread."""
    comparisons = sorted(compare_accuracy(ours, theirs), key=lambda c: c.verdict == 0)
    return ", ".join(c.text() for c in comparisons) or "no accuracy figure"


CRITERION_TEXT = {"accuracy": "accuracy", "size": "size", "latency": "latency", "throughput": "throughput"}
