"""Who beats whom, with the noise of the measurements: each candidate's figure against the best one's.

``tolerance_percent`` is a *preference band*, not a noise allowance: how much of the objective the user gives up
for the tie-breakers (accuracy, size, ...). A candidate *loses* only when it is worse than the best by more than the
band with confidence; every other one is tied with it, and the tie-breakers decide among the tied ones, in a fixed
order.

- Paired (`paired_ties`): the finalists were timed together in round-robin windows (`measure.timing.finalists`); the
  leader has the best paired estimate, and each other finalist's per-round ratio to it is judged with the
  signed-rank bounds of `measure.statistics.paired` (select's 5% error budget split among the comparisons): it loses
  when the lower bound is beyond the band, is within the band when the upper bound is inside it, and is undecided (tied,
  said so) at the cap.
- Stored figures (`loses`): candidates benchmarked at different times are compared on their figures' 95%
  intervals (the ratio's own interval, `measure.statistics.unpaired.Figure.ratio`) beyond the band *and* the host's
  run-to-run variation, which stored figures cannot cancel. A figure without an interval (an old benchmark, an
  artifact's size) counts as exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..measure.statistics.paired import Schedule, select_budget
from ..measure.statistics.unpaired import Figure, worse_beyond
from ..measure.timing.finalists import judge_rounds, spread


def objective_figure(goal: str, value: float | None, interval: Any) -> Figure | None:
    """The objective value of a candidate with its interval ([low, high]) when it has one."""
    if value is None:
        return None
    if goal != "min_size" and isinstance(interval, (list, tuple)) and len(interval) == 2 \
            and all(isinstance(v, (int, float)) for v in interval):
        return Figure(value, min(float(interval[0]), value), max(float(interval[1]), value))
    return Figure.exact(value)


def worse_by(figure: Figure, best: Figure, lower_is_better: bool) -> Figure:
    """How much worse ``figure`` is than ``best`` as a ratio >= 1 for worse (interval included): latency / best
    latency when lower is better, best throughput / throughput when higher is."""
    return figure.ratio(best) if lower_is_better else best.ratio(figure)


def loses(ratio: Figure, tolerance_percent: float, run_to_run_percent: float = 0.0) -> bool:
    """Worse beyond the tolerance with confidence, and beyond what the host's speed changing between the two
    measurements (``run_to_run_percent``, `measure.statistics.unpaired.RUN_TO_RUN_PERCENT`) can explain: the whole
    interval of the ratio is above (1 + tolerance) x (1 + run-to-run)."""
    return worse_beyond(ratio, 1.0 + tolerance_percent / 100.0, run_to_run_percent)


def ratio_text(ratio: Figure) -> str:
    if ratio.low == ratio.high:
        return f"ratio {ratio.value:.3g}"
    return f"ratio {ratio.value:.3g}, 95% interval {ratio.low:.3g}-{ratio.high:.3g}"


def row_ratio(row: Mapping[str, Any]) -> Figure:
    values = row["ratio_to_best"]
    return Figure(values[0], values[1], values[2])


def paired_ties(record: Mapping[str, Any]) -> tuple[str, dict[str, dict[str, Any]]]:
    """The leader of finalists timed together (`measure.timing.finalists.measure_round_robin`'s record) and, per other
    finalist, its ratio to the leader (> 1 is worse), the bounds, the rounds it rests on, the rounds set aside as
    disturbed, and the outcome: ``loses`` (worse beyond the band with confidence), ``within`` (inside the band with
    confidence) or ``undecided``."""
    names = list(record["names"])
    budget = select_budget(len(names))
    limit = math.log(1.0 + float(record["tolerance_percent"]) / 100.0)
    leader, looks, aside = judge_rounds(record["rounds"], names, record["figure"], limit, budget,
                                        Schedule(tuple(record["looks"])), bool(record["ended"]))
    outcome = {"fail": "loses", "pass": "within", "inconclusive": "undecided"}
    found = {name: {"ratio": math.exp(look.estimate), "low": math.exp(look.low), "high": math.exp(look.high),
                    "rounds": look.pairs, "set_aside": aside[name], "outcome": outcome[look.outcome],
                    "noise": spread(record, name, leader)} for name, look in looks.items()}
    return leader, found
