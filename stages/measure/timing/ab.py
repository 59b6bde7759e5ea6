"""Timing a reference beside the candidate: rounds of short interleaved blocks in a random order, until the verdict
decides.

One point of a benchmark (its objective point, `Pairing`) is timed in *rounds*: one short block of the reference
artifact and one of the candidate, back to back, in an order drawn at random (AB or BA); each round is a pair of
the paired statistics (`measure.statistics.paired`). Blocks are ``window_s / ROUNDS_PER_WINDOW`` long (at least
``MIN_BLOCK_S``, at least one query), so a pair lasts a fraction of an ungated window. Interleaving this finely is
what makes pairs hold beside a co-tenant that switches on and off: a neighbour's spell lands on both sides of most
rounds and on one side of the few it starts or ends in, which the signed-rank statistics (and their rule for
disturbed pairs) take as outliers (pyperf and Chromium's Pinpoint interleave runs for the same reason; pyperf
also spreads its runs over processes and Pinpoint over bots, which a run of one node cannot). The orders' seed
is new every run unless the plan fixes one (``ab_seed``), and is recorded with the pairs, so a run can be replayed.

The candidate's blocks are also its own measurement of that point (each `step` returns one ungated window's worth
of them as one window). **The cost budget** (``cost_budget``, the recipe's ``gate_cost_budget``): both sides
together are timed at most ``cost_budget`` times ``ungated_s``, the seconds the same point times ungated at least
(its ``min_duration_s``, at least one window: what it costs when it converges, and no ungated point costs less), so
a gated point costs at most that many times the ungated one. The looks are planned *by cost* (`look_marks`): the
first when both sides have been timed 2 x ``ungated_s`` (a point deciding there costs 2x the ungated one), then
evenly to the budget; each look is taken after the last round that keeps both sides within its mark (a round like
the last would pass it), so the budget is met up to one round's difference from the last (a round's queries are
never interrupted). The error rates are spent over the looks' information fractions (their cost over the budget,
`SPENDING`). Looking by cost depends on the timer, never on the pairs' ratios; slow queries simply give fewer
pairs, and a look with too few pairs for its share passes that share to the next, so a slow point still decides
at the budget, or its verdict says what budget would.
"""

from __future__ import annotations

import math
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..statistics.intervals import Window
from ..statistics.paired import Budget, Look, PairedRecord, look, min_pairs
from ..statistics.stats import grid_median, percentile

TimeWindow = Callable[[float, int], Window]


#: The prefixes of a generation window's figures: time to first token and time per output token (``ttft_p50``...).
GENERATION_PREFIXES = ("ttft_", "tpot_")


def _statistics(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": grid_median(ordered), "p90": percentile(ordered, 90.0), "p95": percentile(ordered, 95.0),
            "p99": percentile(ordered, 99.0), "mean": sum(ordered) / len(ordered)}


def window_figures(window: Window, batch_size: int) -> dict[str, float]:
    """One window's figures for a pair: median (read between the ticks of a coarse timer, `grid_median`, so pairs
    on one tick do not tie), p99 (trtexec's), mean latency, throughput, and the share of its time its threads
    waited for a CPU; a generation window's (`Window.first_tokens_ms`) also as ``ttft_<statistic>`` and
    ``tpot_<statistic>`` (its latencies are the times per output token), so one pair judges both."""
    latency = _statistics(window.latencies_ms)
    figures = {**latency, "throughput": window.throughput(batch_size), "queries": float(len(window.latencies_ms))}
    if window.first_tokens_ms:
        figures.update({f"ttft_{key}": value for key, value in _statistics(window.first_tokens_ms).items()})
        figures.update({f"tpot_{key}": value for key, value in latency.items()})
    if window.wait_ms is not None and window.wall_ms > 0:
        figures["wait_share"] = min(window.wait_ms / window.wall_ms, 1.0)
    return figures


@dataclass(frozen=True)
class PairPlan:
    """What a paired point is judged against while it is measured."""

    batch_size: int
    streams: int
    figure: str  # p50, p99, mean or throughput: what the stopping rule watches
    limit: float  # log of the threshold ratio (> 0: worse)
    budget: Budget  # the error rates
    marks: tuple[float, ...]  # the looks: both sides' timed seconds, as multiples of ungated_s (`look_marks`)
    seed: int | None = None  # of the AB/BA orders; None: a new one each run (recorded)
    block_s: float = 0.0375  # each side of a round
    window_s: float = 0.6  # the candidate's blocks returned as one window per step
    ungated_s: float = 3.0  # what the point times ungated at least (min_duration_s): the budget's unit
    cost_budget: float = 8.0  # both sides timed at most this many times ungated_s (`COST_BUDGET`)
    also: tuple[str, ...] = ()  # other figures that must be decided too before the pairing stops


#: The gated point's timed seconds (both sides) at most this many times the ungated point's (`PairPlan`): the
#: smallest whole budget that keeps the gate's power (unchanged red at most 1 in 20, twice the threshold failed at
#: least 9 in 10) in every noise class of ``bench/gate_power.py``: within 2 (one look) the gpu model keeps it, the
#: cpu model beside a co-tenant switching within a pair does not (18% of unchanged runs red, 2x failed 37%); 6
#: fails 2x ~85%, 7 ~90%, 8 94% there (README's power table). A point deciding at its first look costs 2x.
COST_BUDGET = 8.0
#: How the looks spend the error rates (`paired.Schedule.spending`): alpha x t^SPENDING by the look at the
#: information fraction t (here the look's cost over the budget: rounds are of equal planned length). 2 spends
#: little at the first look (where a quiet host decides anyway, with power to spare) and keeps most of it for the
#: looks a noisy host needs; even shares (the earlier Bonferroni split) lost ~5 points of power at a co-tenant
#: switching within a pair, 3 (O'Brien-Fleming-like) gained about 1 and costs more on average.
SPENDING = 2.0
#: Rounds per ungated window, and the shortest block (a block times at least one query).
ROUNDS_PER_WINDOW = 16
MIN_BLOCK_S = 0.002
#: Rounds kept per figure in the record are rounded to this many significant digits (the summary stays small).
DIGITS = 6


def block_length(window_s: float) -> float:
    """Each side's block in a round, for points timed in windows of ``window_s``."""
    return max(window_s / ROUNDS_PER_WINDOW, MIN_BLOCK_S)


def look_marks(cost_budget: float) -> tuple[float, ...]:
    """When a paired point is looked at, as both sides' timed seconds over the ungated point's: the first at 2 (the
    candidate's side timed as long as the point ungated), then evenly spread to the budget, about one per unit
    of it (at most `MAX_LOOKS` in all: 2, 4, 6, 8 for a budget of 8)."""
    from ..statistics.paired import MAX_LOOKS

    count = min(MAX_LOOKS, 1 + max(round(cost_budget - 2.0), 0))
    if count == 1 or cost_budget <= 2.0:
        return (cost_budget,)
    return tuple(round(2.0 + (cost_budget - 2.0) * i / (count - 1), 6) for i in range(count))


def _compact(figures: dict[str, float]) -> dict[str, float]:
    return {key: float(f"{value:.{DIGITS}g}") for key, value in figures.items()}


def pooled(windows: list[Window]) -> Window:
    """Blocks of one side as one window (latencies in order, wall and wait times summed)."""
    waits = [w.wait_ms for w in windows]
    firsts = [w.first_tokens_ms for w in windows]
    return Window([v for w in windows for v in w.latencies_ms], sum(w.wall_ms for w in windows),
                  None if any(v is None for v in waits) else sum(v for v in waits if v is not None),
                  None if any(not f for f in firsts) else [v for f in firsts if f for v in f])


@dataclass
class Pairing:
    """A paired point being measured: call `step` until `done`."""

    plan: PairPlan
    reference: TimeWindow
    record: PairedRecord = field(init=False)
    done: bool = False
    last: Look | None = None
    _spent_s: float = 0.0
    _reference_s: float = 0.0
    _references: int = 0
    _next: int = 0  # the next look among the plan's marks

    def __post_init__(self) -> None:
        seed = self.plan.seed if self.plan.seed is not None else secrets.randbits(32)
        self.record = PairedRecord(self.plan.batch_size, self.plan.streams, self.plan.figure, looks=[],
                                   alpha_fail=self.plan.budget.alpha_fail, alpha_pass=self.plan.budget.alpha_pass,
                                   seed=seed, block_s=self.plan.block_s, cost_budget=self.plan.cost_budget,
                                   ungated_s=self.plan.ungated_s, spending=SPENDING, fractions=[])
        self._random = random.Random(seed)

    def _look_due(self, round_s: float) -> float | None:
        """The information fraction of a look due now (the next round like the last would take both sides past
        its mark; several marks passed at once: the latest), or None."""
        due = None
        timed = self._spent_s + self._reference_s
        while self._next < len(self.plan.marks) and timed + round_s > self.plan.marks[self._next] * \
                self.plan.ungated_s:
            due = self.plan.marks[self._next] / self.plan.cost_budget
            self._next += 1
        return due

    def step(self, candidate: TimeWindow, seconds: float, index: int) -> Window:
        """Time rounds (a reference block and a candidate block each, in a random order) for about one ungated
        window of the candidate's side, or until the verdict is done (``seconds``, the unpaired points' window, is
        not used); returns the candidate's blocks as one window."""
        mine: list[Window] = []
        while not self.done and (not mine or sum(w.wall_ms for w in mine) / 1000.0 < self.plan.window_s):
            order = "AB" if self._random.random() < 0.5 else "BA"
            ours_index = index if not mine else max(index, 1)
            if order == "AB":
                theirs = self.reference(self.plan.block_s, self._references)
                ours = candidate(self.plan.block_s, ours_index)
            else:
                ours = candidate(self.plan.block_s, ours_index)
                theirs = self.reference(self.plan.block_s, self._references)
            mine.append(ours)
            self._references += 1
            self._spent_s += ours.wall_ms / 1000.0
            self._reference_s += theirs.wall_ms / 1000.0
            self.record.timed_s = round(self._spent_s + self._reference_s, 4)
            self.record.add(order, _compact(window_figures(theirs, self.plan.batch_size)),
                            _compact(window_figures(ours, self.plan.batch_size)))
            fraction = self._look_due((ours.wall_ms + theirs.wall_ms) / 1000.0)
            if fraction is None:
                continue
            count, final = len(self.record.pairs), fraction >= 1.0
            share = fraction ** SPENDING - (self.record.fractions or [0.0])[-1] ** SPENDING
            if not final and count < min_pairs(min(self.plan.budget.alpha_fail, self.plan.budget.alpha_pass) * share):
                continue  # too few pairs to decide at this look's share: it carries over to the next
            self.record.looks.append(count)
            assert self.record.fractions is not None
            self.record.fractions.append(fraction)
            # the looks before were undecided (else it would have stopped): the verdict is this look's
            # (`paired.sequential` over the record, as the gate judges it again, finds the same); with ``also``,
            # it stops when every figure is decided (or at the budget)
            schedule = self.record.schedule()
            looks = [look(self.record.log_ratios(figure), self.plan.limit, self.plan.budget, len(schedule.looks),
                          final, self.record.wait_shares(figure), schedule.share(count, final))
                     for figure in (self.plan.figure, *self.plan.also)]
            self.last = looks[0]
            if all(found.outcome != "inconclusive" for found in looks) or final:
                self.done = True
                self.record.ended = final
        return pooled(mine)

    def summary(self) -> dict[str, Any]:
        found = self.record.as_dict()
        if self.last is not None:
            found["stopped"] = {"pairs": self.last.pairs, "outcome": self.last.outcome,
                                "ratio": self.last.ratio if math.isfinite(self.last.estimate) else None}
        found["seconds"] = round(self._spent_s, 3)
        found["reference_seconds"] = round(self._reference_s, 3)
        found["cost"] = round(self.record.cost, 3) if self.record.cost is not None else None
        return found
