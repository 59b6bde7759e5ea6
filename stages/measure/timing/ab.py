"""Timing a reference beside the candidate: pairs of windows in a random order, until the verdict can decide.

One point of a benchmark (its objective point, `Pairing`) is timed in pairs: each round, one window of the
reference artifact and one of the candidate, back to back, in an order drawn at random (seeded: the same seed
gives the same orders). The candidate's windows are also its own measurement of that point. After each planned
look (`paired.Schedule`) the pairs' log-ratios are judged (`paired.sequential`); the pairing stops when the
verdict is decided, at its pair cap, or when the candidate's side has been timed for ``max_seconds`` (the point's
usual cap: so the paired point takes at most twice as long as the same point timed alone).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..statistics.intervals import Window
from ..statistics.paired import Budget, Look, PairedRecord, Schedule, sequential
from ..statistics.stats import median, percentile

TimeWindow = Callable[[float, int], Window]


def window_figures(window: Window, batch_size: int) -> dict[str, float]:
    """One window's figures for a pair: median, p99 (trtexec's), mean latency, throughput, and the share of its
    time its threads waited for a CPU."""
    ordered = sorted(window.latencies_ms)
    figures = {"p50": median(ordered), "p90": percentile(ordered, 90.0), "p95": percentile(ordered, 95.0),
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
    budget: Budget
    schedule: Schedule
    max_seconds: float  # timed seconds of the candidate's side at most
    seed: int = 0
    window_s: float = 0.2  # each window of a pair


@dataclass
class Pairing:
    """A paired point being measured: call `step` once per round until `done`."""

    plan: PairPlan
    reference: TimeWindow
    record: PairedRecord = field(init=False)
    done: bool = False
    last: Look | None = None
    _spent_s: float = 0.0
    _reference_s: float = 0.0
    _references: int = 0

    def __post_init__(self) -> None:
        self.record = PairedRecord(self.plan.batch_size, self.plan.streams, self.plan.figure,
                                   looks=list(self.plan.schedule.looks), alpha_fail=self.plan.budget.alpha_fail,
                                   alpha_pass=self.plan.budget.alpha_pass)
        self._random = random.Random(self.plan.seed)

    def step(self, candidate: TimeWindow, seconds: float, index: int) -> Window:
        """Time one pair (reference and candidate, in a random order, each a window of the plan's ``window_s``:
        ``seconds``, the unpaired points' window, is not used); returns the candidate's window."""
        seconds = self.plan.window_s
        order = "AB" if self._random.random() < 0.5 else "BA"
        if order == "AB":
            theirs = self.reference(seconds, self._references)
            ours = candidate(seconds, index)
        else:
            ours = candidate(seconds, index)
            theirs = self.reference(seconds, self._references)
        self._references += 1
        self._spent_s += ours.wall_ms / 1000.0
        self._reference_s += theirs.wall_ms / 1000.0
        self.record.add(order, window_figures(theirs, self.plan.batch_size),
                        window_figures(ours, self.plan.batch_size))
        count = len(self.record.pairs)
        out_of_time = self._spent_s >= self.plan.max_seconds
        if self.plan.schedule.is_look(count) or out_of_time:
            ended = out_of_time or count >= self.plan.schedule.cap
            self.last = sequential(self.record.log_ratios(self.plan.figure), self.plan.schedule, self.plan.limit,
                                   self.plan.budget, ended)
            if self.last.outcome != "inconclusive" or ended:
                self.done = True
                self.record.ended = ended
        return ours

    def summary(self) -> dict[str, Any]:
        found = self.record.as_dict()
        if self.last is not None:
            found["stopped"] = {"pairs": self.last.pairs, "outcome": self.last.outcome,
                                "ratio": self.last.ratio if math.isfinite(self.last.estimate) else None}
        found["seconds"] = round(self._spent_s, 3)
        found["reference_seconds"] = round(self._reference_s, 3)
        return found


MIN_WINDOW_S = 0.02


def pair_window(window_s: float, min_seconds: float, budget: Budget) -> float:
    """The window of each side of a pair: the point's usual window, or shorter, so that the first look's pairs fit
    in the point's ``min_seconds`` (a gated point decided at its first look times twice the seconds of the same
    point ungated)."""
    from ..statistics.paired import MAX_LOOKS

    return max(min(window_s, min_seconds / budget.first_pairs(MAX_LOOKS)), MIN_WINDOW_S)


def pair_cap(max_seconds: float, window_s: float, budget: Budget) -> Schedule:
    """The looks of a paired point whose candidate side may be timed ``max_seconds`` in windows of ``window_s``."""
    return Schedule.up_to(int(max_seconds / max(window_s, 1e-6)), budget)
