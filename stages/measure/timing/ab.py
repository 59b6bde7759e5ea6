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
of them as one window). The verdict is looked at after planned numbers of pairs (`paired.Schedule`): the first
when the candidate's side has been timed the point's ``min_duration_s``, the last at its ``max_duration_s``; the
pairing stops when the verdict is decided, at the last look, or before a round would take the candidate's side
past ``max_duration_s``. So a gated point costs at most twice the seconds of the same point ungated at its cap,
the gated benchmark's stated budget (and about twice an ungated point that converges at ``min_duration_s``, when
the verdict decides at its first look). Queries too slow for the planned rounds: the looks are planned again from
the first round's measured length (the plan depends on the timer, never on the outcome), so a slow point still
decides, or its verdict says how many pairs fitted.
"""

from __future__ import annotations

import math
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..statistics.intervals import Window
from ..statistics.paired import Budget, Look, PairedRecord, Schedule, sequential
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
    budget: Budget
    schedule: Schedule  # in pairs (rounds)
    max_seconds: float  # timed seconds of the candidate's side at most
    seed: int | None = None  # of the AB/BA orders; None: a new one each run (recorded)
    block_s: float = 0.0375  # each side of a round
    window_s: float = 0.6  # the candidate's blocks returned as one window per step
    min_seconds: float = 3.0  # the candidate's side timed before the first look
    extend: float = 1.0  # beside interference, the candidate's side may be timed up to extend x max_seconds
    also: tuple[str, ...] = ()  # other figures that must be decided too before the pairing stops (generation: TTFT)


#: Beside interference (the rule for disturbed pairs set some aside), an undecided verdict at ``max_seconds``
#: goes on to this many times it: the looks are planned to the extended cap from the start, and stopping at the
#: nominal cap on a quiet host (undecided) can only lower the error rates.
EXTEND = 2.0
#: Rounds per ungated window, and the shortest block (a block times at least one query).
ROUNDS_PER_WINDOW = 16
MIN_BLOCK_S = 0.002
#: Rounds kept per figure in the record are rounded to this many significant digits (the summary stays small).
DIGITS = 6


def block_length(window_s: float) -> float:
    """Each side's block in a round, for points timed in windows of ``window_s``."""
    return max(window_s / ROUNDS_PER_WINDOW, MIN_BLOCK_S)


def round_schedule(min_seconds: float, max_seconds: float, block_s: float, budget: Budget,
                   extend: float = EXTEND) -> Schedule:
    """The looks of a paired point timed in blocks of ``block_s``: the first when the candidate's side has been
    timed ``min_seconds`` (or the fewest pairs that can decide, if more), then evenly to ``max_seconds`` (the
    last of them at or after it) and on to ``extend`` x ``max_seconds``."""
    from ..statistics.paired import MAX_LOOKS

    first = max(budget.first_pairs(MAX_LOOKS), math.ceil(min_seconds / max(block_s, 1e-6)))
    nominal = Schedule.up_to(int(max_seconds / max(block_s, 1e-6)), budget, first=first)
    if extend <= 1.0 or len(nominal.looks) < 2:
        return nominal
    step = nominal.looks[-1] - nominal.looks[-2]
    beyond = int(extend * max_seconds / max(block_s, 1e-6))
    more = tuple(range(nominal.cap + step, beyond + 1, step))[: MAX_LOOKS - 1]
    return Schedule(nominal.looks + more)


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
    replanned: str | None = None  # why the looks were planned again (slow queries)
    extended: bool = False  # went on past max_seconds (interference seen, `EXTEND`)
    _spent_s: float = 0.0
    _reference_s: float = 0.0
    _references: int = 0
    _schedule: Schedule = field(init=False)

    def __post_init__(self) -> None:
        seed = self.plan.seed if self.plan.seed is not None else secrets.randbits(32)
        self._schedule = self.plan.schedule
        self.record = PairedRecord(self.plan.batch_size, self.plan.streams, self.plan.figure,
                                   looks=list(self._schedule.looks), alpha_fail=self.plan.budget.alpha_fail,
                                   alpha_pass=self.plan.budget.alpha_pass, seed=seed, block_s=self.plan.block_s)
        self._random = random.Random(seed)

    def _replan(self, block_wall_s: float) -> None:
        """The looks planned again when the first round's block took far longer than planned (slow queries)."""
        if block_wall_s <= 2.0 * self.plan.block_s:
            return
        self._schedule = round_schedule(self.plan.min_seconds, self.plan.max_seconds, block_wall_s,
                                        self.plan.budget, self.plan.extend)
        self.record.looks = list(self._schedule.looks)
        self.replanned = (f"a block took {block_wall_s:.3g} s (planned {self.plan.block_s:.3g} s): looks planned "
                          f"again at {', '.join(str(v) for v in self._schedule.looks)} pairs")

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
            self.record.add(order, _compact(window_figures(theirs, self.plan.batch_size)),
                            _compact(window_figures(ours, self.plan.batch_size)))
            count = len(self.record.pairs)
            if count == 1:
                self._replan(ours.wall_ms / 1000.0)
            # stop before a round would take the candidate's side past its cap: the budget is met, not overrun
            cap_s = self.plan.max_seconds * (self.plan.extend if self.extended else 1.0)
            out_of_time = self._spent_s + ours.wall_ms / 1000.0 > cap_s
            if self._schedule.is_look(count) or out_of_time:
                ended = out_of_time or count >= self._schedule.cap
                looks = [sequential(self.record.log_ratios(figure), self._schedule, self.plan.limit,
                                    self.plan.budget, ended, waits=self.record.wait_shares(figure))
                         for figure in (self.plan.figure, *self.plan.also)]
                self.last = looks[0]
                undecided = any(found.outcome == "inconclusive" for found in looks)
                if ended and undecided and not self.extended and self.plan.extend > 1.0 and \
                        any(found.aside for found in looks) and count < self._schedule.cap:
                    self.extended = True  # interference seen: on to the extended cap, as planned
                    self.record.extended = True
                elif not undecided or ended:
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
        if self.replanned:
            found["replanned"] = self.replanned
        return found
