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
a gated point costs at most that many times the ungated one, at every look. The budget is planned from the start
(`round_schedule`): the first look when the candidate's side has been timed ``ungated_s`` (a gated point deciding
there costs 2x), then looks every half of ``ungated_s`` more until the budget (at most `MAX_LOOKS`), the error
rates split among them (`paired.sequential`); the pairing stops when the verdict decides, at the last look, or
before a round would take both sides past the budget (the budget is met, not overrun, up to one round's
difference from the last). Queries too slow for the planned rounds: the looks are planned again from the first
round's measured length (the plan depends on the timer, never on the outcome), so a slow point still decides, or
its verdict says how many pairs fitted and what budget would decide.
"""

from __future__ import annotations

import math
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..statistics.intervals import Window
from ..statistics.paired import MIN_PAIRS, Budget, Look, PairedRecord, Schedule, sequential
from ..statistics.stats import grid_median, percentile

TimeWindow = Callable[[float, int], Window]


def window_figures(window: Window, batch_size: int) -> dict[str, float]:
    """One window's figures for a pair: median (read between the ticks of a coarse timer, `grid_median`, so pairs
    on one tick do not tie), p99 (trtexec's), mean latency, throughput, and the share of its time its threads
    waited for a CPU."""
    ordered = sorted(window.latencies_ms)
    figures = {"p50": grid_median(ordered), "p90": percentile(ordered, 90.0), "p95": percentile(ordered, 95.0),
               "p99": percentile(ordered, 99.0), "mean": sum(ordered) / len(ordered),
               "throughput": window.throughput(batch_size), "queries": float(len(ordered))}
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
    schedule: Schedule  # in pairs (rounds)
    seed: int | None = None  # of the AB/BA orders; None: a new one each run (recorded)
    block_s: float = 0.0375  # each side of a round
    window_s: float = 0.6  # the candidate's blocks returned as one window per step
    ungated_s: float = 3.0  # what the point times ungated at least (min_duration_s): the budget's unit
    cost_budget: float = 8.0  # both sides timed at most this many times ungated_s (`COST_BUDGET`)

    @property
    def budget_s(self) -> float:
        """Both sides' timed seconds at most."""
        return self.cost_budget * self.ungated_s


#: The gated point's timed seconds (both sides) at most this many times the ungated point's (`PairPlan`): the
#: smallest whole budget that keeps the gate's power (twice the threshold failed at least 9 times in 10) in every
#: noise class of ``bench/gate_power.py``; 2 (one look) leaves a co-tenant switching within a pair at ~5 in 10, 6
#: at ~8 in 10, 7 at ~9 in 10 (README's power table). A gated point deciding at its first look costs 2x.
COST_BUDGET = 8.0
#: How the looks spend the error rates (`paired.Schedule.spending`): alpha x t^SPENDING by the look at the
#: information fraction t.
SPENDING: float | None = 2.0
#: The looks are planned in pairs from a round's length (both sides' blocks), first from the planned blocks, then
#: again from the mean round of the first `MIN_PAIRS` (a block times whole queries, so it runs over its planned
#: length by up to one query), or at once when the first round took over twice its planned length (slow queries).
#: The plan depends on the timer, never on the pairs' ratios.
SLOW_ROUND = 2.0
#: Rounds per ungated window, and the shortest block (a block times at least one query).
ROUNDS_PER_WINDOW = 16
MIN_BLOCK_S = 0.002
#: Rounds kept per figure in the record are rounded to this many significant digits (the summary stays small).
DIGITS = 6


def block_length(window_s: float) -> float:
    """Each side's block in a round, for points timed in windows of ``window_s``."""
    return max(window_s / ROUNDS_PER_WINDOW, MIN_BLOCK_S)


def round_schedule(ungated_s: float, cost_budget: float, round_s: float, budget: Budget) -> Schedule:
    """The looks of a paired point timed in rounds of ``round_s`` (both sides' blocks): the first when both sides
    have been timed 2 x ``ungated_s`` (the candidate's side about ``ungated_s``; or the fewest pairs that can
    decide, if more), then one every ``ungated_s`` more of both sides (at most `MAX_LOOKS`, evenly spread) until
    they have been timed ``cost_budget`` x ``ungated_s``."""
    from ..statistics.paired import MAX_LOOKS

    per = max(round_s, 1e-6)
    count = min(MAX_LOOKS, 1 + max(round(cost_budget - 2.0), 0))
    first = max(budget.first_pairs(count), int(2.0 * ungated_s / per))
    return Schedule.up_to(int(cost_budget * ungated_s / per), budget, count=count, first=first, spending=SPENDING)


def _compact(figures: dict[str, float]) -> dict[str, float]:
    return {key: float(f"{value:.{DIGITS}g}") for key, value in figures.items()}


def pooled(windows: list[Window]) -> Window:
    """Blocks of one side as one window (latencies in order, wall and wait times summed)."""
    waits = [w.wait_ms for w in windows]
    return Window([v for w in windows for v in w.latencies_ms], sum(w.wall_ms for w in windows),
                  None if any(v is None for v in waits) else sum(v for v in waits if v is not None))


@dataclass
class Pairing:
    """A paired point being measured: call `step` until `done`."""

    plan: PairPlan
    reference: TimeWindow
    record: PairedRecord = field(init=False)
    done: bool = False
    last: Look | None = None
    replanned: str | None = None  # why the looks were planned again (slow queries)
    _spent_s: float = 0.0
    _reference_s: float = 0.0
    _references: int = 0
    _schedule: Schedule = field(init=False)
    _walls: list[float] = field(default_factory=list)  # the first rounds' seconds (both sides)

    def __post_init__(self) -> None:
        seed = self.plan.seed if self.plan.seed is not None else secrets.randbits(32)
        self._schedule = self.plan.schedule
        self.record = PairedRecord(self.plan.batch_size, self.plan.streams, self.plan.figure,
                                   looks=list(self._schedule.looks), alpha_fail=self.plan.budget.alpha_fail,
                                   alpha_pass=self.plan.budget.alpha_pass, seed=seed, block_s=self.plan.block_s,
                                   cost_budget=self.plan.cost_budget, ungated_s=self.plan.ungated_s,
                                   spending=self._schedule.spending)
        self._random = random.Random(seed)

    def _replan(self, round_s: float, why: str) -> None:
        """The looks planned again from the rounds' measured length (`SLOW_ROUND`)."""
        schedule = round_schedule(self.plan.ungated_s, self.plan.cost_budget, round_s, self.plan.budget)
        if schedule.looks == self._schedule.looks:
            return
        self._schedule = schedule
        self.record.looks = list(schedule.looks)
        self.replanned = (f"{why} took {round_s:.3g} s (planned {2 * self.plan.block_s:.3g} s): looks planned "
                          f"at {', '.join(str(v) for v in schedule.looks)} pairs")

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
            if len(self._walls) < MIN_PAIRS:
                self._walls.append((ours.wall_ms + theirs.wall_ms) / 1000.0)
            self._references += 1
            self._spent_s += ours.wall_ms / 1000.0
            self._reference_s += theirs.wall_ms / 1000.0
            self.record.timed_s = round(self._spent_s + self._reference_s, 4)
            self.record.add(order, _compact(window_figures(theirs, self.plan.batch_size)),
                            _compact(window_figures(ours, self.plan.batch_size)))
            count = len(self.record.pairs)
            if count == 1 and self._walls[0] > SLOW_ROUND * 2.0 * self.plan.block_s:
                self._replan(self._walls[0], "the first round")  # slow queries: before it is too late
            elif count == MIN_PAIRS and self._schedule.looks[0] > count:
                self._replan(sum(self._walls) / len(self._walls), f"a round of the first {MIN_PAIRS} (mean)")
            # stop before a round like the last would take both sides past the budget: the budget is met
            last_round_s = (ours.wall_ms + theirs.wall_ms) / 1000.0
            out_of_budget = self._spent_s + self._reference_s + last_round_s > self.plan.budget_s
            if self._schedule.is_look(count) or out_of_budget:
                ended = out_of_budget or count >= self._schedule.cap
                self.last = sequential(self.record.log_ratios(self.plan.figure), self._schedule, self.plan.limit,
                                       self.plan.budget, ended, waits=self.record.wait_shares())
                if self.last.outcome != "inconclusive" or ended:
                    self.done = True
                    self.record.ended = ended
        return pooled(mine)

    def summary(self) -> dict[str, Any]:
        found = self.record.as_dict()
        if self.last is not None:
            found["stopped"] = {"pairs": self.last.pairs, "outcome": self.last.outcome,
                                "ratio": self.last.ratio if math.isfinite(self.last.estimate) else None}
        found["seconds"] = round(self._spent_s, 3)
        found["reference_seconds"] = round(self._reference_s, 3)
        found["cost"] = round((self._spent_s + self._reference_s) / self.plan.ungated_s, 3) \
            if self.plan.ungated_s > 0 else None
        if self.replanned:
            found["replanned"] = self.replanned
        return found
