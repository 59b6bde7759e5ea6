"""Paired A/B judgement: a reference and a candidate timed in alternating windows, judged on the pairs' ratios.

Two measurements taken minutes apart differ by what neither one's intervals see (the host runs faster or slower
from one minute to the next: ~7% here between runs, more under a busy neighbour). Timed in *pairs* of windows, one
of each side back to back in a random order (AB or BA, Chromium Pinpoint's and Google Benchmark's interleaving),
that drift lands on both sides of a pair and cancels in its ratio. Each pair gives one number, the log of the
candidate's figure over the reference's (oriented so that > 0 is worse: latency up, or throughput down), and the
verdict is a statement about the centre of those numbers:

- estimate: the Hodges-Lehmann estimate (the median of the pairs' Walsh averages), robust to a pair hit by a stall;
- interval: the Wilcoxon signed-rank confidence bounds (exact, distribution-free for a symmetric spread, which the
  random AB/BA order gives drift), one-sided at each verdict's error rate;
- sequential looks: the verdict is looked at after `Schedule.looks` pairs (at most four), and the error rates are
  split evenly among the looks (Bonferroni alpha spending: with K looks each spends alpha / K, so looking early
  and stopping when it can decide never raises the error rates above alpha);
- ``fail`` when the lower bound (confidence 1 - alpha_fail / K) lies above the threshold; ``pass`` when the upper
  bound (confidence 1 - alpha_pass / K) lies below it (an equivalence-style pass: no regression beyond the
  threshold, with confidence); ``inconclusive`` only when the last look (the cap) decides neither.

`power` states what a verdict can detect: the smallest change it fails 90% of the time, and the largest it passes
90% of the time, at the noise it measured and with the pairs the cap allows (normal approximation with the signed
rank test's 3/pi efficiency).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import NormalDist
from typing import Any, Literal, cast

Outcome = Literal["pass", "fail", "inconclusive"]

#: A verdict's chance of failing a change exactly at the threshold (a false alarm at worst), before the recipe's
#: correction for several gated nodes (`family_alpha`).
ALPHA_FAIL = 0.01
#: A recipe run's chance of any false alarm among its gated nodes (Bonferroni over the nodes, the first step of
#: Holm's procedure: the run fails exactly when Holm's would).
ALPHA_RUN = 0.05
#: A verdict's chance of passing a change exactly at the threshold.
ALPHA_PASS = 0.05
#: The power a verdict's statement is made at.
POWER = 0.9
MAX_LOOKS = 4
MIN_PAIRS = 8
#: Asymptotic relative efficiency of the signed-rank test against the t test for normal data.
EFFICIENCY = 3.0 / math.pi
#: The rule that sets disturbed pairs aside: a pair whose log-ratio is more than ``ASIDE_SIGMAS`` robust standard
#: deviations (1.4826 x MAD) from the pairs' median is disturbed (a co-tenant's spell hit one side more than the
#: other), at most ``ASIDE_SHARE`` of the pairs (the farthest first), and only from ``MIN_PAIRS`` pairs on. The rule
#: is symmetric about the median, so it moves neither the estimate nor the false-alarm rate of a symmetric noise.
ASIDE_SIGMAS = 4.0
ASIDE_SHARE = 0.2
#: A paired side that waited for a CPU at least this share of its time (README's "unmeasurable" rule, as for
#: limits and stored figures): a fail must hold even if the candidate's waiting had all been added to its latency,
#: a pass even if the reference's had.
UNMEASURABLE_WAIT = 0.5


def family_alpha(nodes: int, alpha_fail: float = ALPHA_FAIL, alpha_run: float = ALPHA_RUN) -> float:
    """The fail error rate of each of ``nodes`` gated nodes: at most ``alpha_fail`` per verdict and ``alpha_run``
    for them all together (Bonferroni; Holm's procedure rejects at least one exactly when Bonferroni does)."""
    return min(alpha_fail, alpha_run / max(nodes, 1))


# -- the signed-rank distribution ------------------------------------------------------------------------------
@lru_cache(maxsize=256)
def _signed_rank_cdf(n: int) -> tuple[float, ...]:
    """P(W+ <= w) for w = 0 .. n(n+1)/2 under the null (exact, by counting subsets of the ranks 1..n)."""
    import numpy as np

    total = n * (n + 1) // 2
    counts = np.zeros(total + 1, dtype=float)
    counts[0] = 1.0
    for rank in range(1, n + 1):
        counts[rank:] = counts[rank:] + counts[: total + 1 - rank].copy()
    return tuple(float(v) for v in np.cumsum(counts) / counts.sum())


def bound_rank(n: int, alpha: float) -> int | None:
    """k (1-based) such that the k-th smallest Walsh average is a lower confidence bound at level 1 - alpha: the
    largest k with P(W+ <= k - 1) <= alpha. None when ``n`` pairs cannot reach that level (2^-n > alpha)."""
    if n < 1:
        return None
    from bisect import bisect_right

    found = bisect_right(_signed_rank_cdf(n), alpha)  # the cdf rises: the count of w with P(W+ <= w) <= alpha
    return found if found else None


def min_pairs(alpha: float) -> int:
    """The fewest pairs whose signed-rank bound exists at ``alpha`` (one-sided): 2^-n <= alpha."""
    return max(1, math.ceil(math.log2(1.0 / alpha)))


def walsh_averages(values: Sequence[float]) -> list[float]:
    """(d_i + d_j) / 2 for every i <= j, sorted."""
    import numpy as np

    data = np.asarray(values, dtype=float)
    i, j = np.triu_indices(data.size)
    return cast(list[float], np.sort((data[i] + data[j]) / 2.0).tolist())


def hodges_lehmann(values: Sequence[float]) -> float:
    averages = walsh_averages(values)
    middle = len(averages) // 2
    return averages[middle] if len(averages) % 2 else (averages[middle - 1] + averages[middle]) / 2.0


def lower_bound(values: Sequence[float], alpha: float) -> float:
    """One-sided lower confidence bound (level 1 - alpha) of the pairs' centre; -inf when too few pairs."""
    k = bound_rank(len(values), alpha)
    return walsh_averages(values)[k - 1] if k is not None else -math.inf


def upper_bound(values: Sequence[float], alpha: float) -> float:
    k = bound_rank(len(values), alpha)
    return walsh_averages(values)[-k] if k is not None else math.inf


def noise(values: Sequence[float]) -> float:
    """A robust standard deviation of the pairs' log-ratios (1.4826 x the median absolute deviation; the plain one
    when that is 0)."""
    import numpy as np

    data = np.asarray(values, dtype=float)
    if data.size < 2:
        return math.inf
    mad = 1.4826 * float(np.median(np.abs(data - np.median(data))))
    return mad if mad > 0 else float(data.std(ddof=1))


def set_aside(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """The pairs kept and the indices of those set aside as disturbed (`ASIDE_SIGMAS`, `ASIDE_SHARE`)."""
    import numpy as np

    if len(values) < MIN_PAIRS:
        return list(values), []
    data = np.asarray(values, dtype=float)
    centre = float(np.median(data))
    sigma = 1.4826 * float(np.median(np.abs(data - centre)))
    if sigma <= 0:
        return list(values), []
    distance = np.abs(data - centre) / sigma
    far = [int(i) for i in np.argsort(-distance, kind="stable") if distance[i] > ASIDE_SIGMAS]
    aside = sorted(far[: int(ASIDE_SHARE * len(values))])
    return [v for i, v in enumerate(values) if i not in set(aside)], aside


# -- looks and verdicts -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    """The error rates of one verdict, over all its looks."""

    alpha_fail: float = ALPHA_FAIL
    alpha_pass: float = ALPHA_PASS

    def first_pairs(self, looks: int) -> int:
        """The fewest pairs at which a look can fail or pass at its share of the budget."""
        return max(MIN_PAIRS, min_pairs(min(self.alpha_fail, self.alpha_pass) / looks))


@dataclass(frozen=True)
class Schedule:
    """When the verdict is looked at: after these numbers of pairs (the last one is the cap), and how the error
    rates are spent among the looks (`share`)."""

    looks: tuple[int, ...]
    #: None: an even share at each look (alpha / K). A number rho: the power family of spending functions (Kim and
    #: DeMets: alpha x t^rho spent by the look at information fraction t; rho 1 is close to Pocock's boundaries, 3
    #: to O'Brien and Fleming's), each look spending its increment over the looks before it, Bonferroni (valid
    #: whatever the looks' correlation, and for the signed-rank bounds, which are not normal).
    spending: float | None = None
    #: Each look's information fraction (1: the last one the plan allows, the end of the budget); None: pairs / cap.
    fractions: tuple[float, ...] | None = None

    @classmethod
    def up_to(cls, cap: int, budget: Budget, count: int = MAX_LOOKS, first: int | None = None) -> Schedule:
        """At most ``count`` evenly spread looks from ``first`` (default: the first pair count that can decide)
        to ``cap``, each spending an even share."""
        first = max(first or 0, budget.first_pairs(count))
        cap = max(cap, first)
        if cap == first:
            return cls((first,))
        steps = min(count, cap - first + 1)
        return cls(tuple(sorted({round(first + (cap - first) * i / (steps - 1)) for i in range(steps)})))

    @property
    def cap(self) -> int:
        return self.looks[-1]

    def is_look(self, pairs: int) -> bool:
        return pairs in self.looks

    def fraction(self, pairs: int) -> float:
        """The information fraction of the planned look at ``pairs`` pairs (or of the last one before it)."""
        taken = [i for i, n in enumerate(self.looks) if n <= pairs]
        if not taken:
            return 0.0
        if self.fractions is not None and len(self.fractions) == len(self.looks):
            return min(self.fractions[taken[-1]], 1.0)
        return min(self.looks[taken[-1]] / self.cap, 1.0)

    def is_final(self, pairs: int) -> bool:
        """Whether the look at ``pairs`` pairs is the last the plan allows."""
        return self.fraction(pairs) >= 1.0 if self.fractions is not None else pairs == self.cap

    def spent(self, pairs: int) -> float:
        """The share of the error rates spent by the planned looks up to ``pairs`` pairs."""
        if self.spending is None:
            return sum(n <= pairs for n in self.looks) / len(self.looks)
        return self.fraction(pairs) ** self.spending

    def share(self, pairs: int, final: bool = False) -> float:
        """The share of the error rates a look after ``pairs`` pairs spends: a planned look its increment; a
        ``final`` look off the plan (the measurement ended there) what the planned looks before it left (even
        spending: one look's share, as before)."""
        if self.spending is None:
            return 1.0 / len(self.looks)
        before = self.spent(pairs - 1)
        if final and not self.is_look(pairs):
            return max(1.0 - before, 0.0)
        return max(self.spent(pairs) - before, 0.0)


@dataclass(frozen=True)
class Look:
    """The state of a paired comparison after ``pairs`` pairs (log-ratios, > 0 is worse)."""

    pairs: int
    estimate: float
    low: float  # lower bound at 1 - alpha_fail / looks
    high: float  # upper bound at 1 - alpha_pass / looks
    limit: float  # log of the threshold ratio
    outcome: Outcome
    final: bool  # the cap was reached (or the measurement ended there)
    sigma: float  # robust standard deviation of one pair's log-ratio
    aside: tuple[int, ...] = ()  # pairs set aside as disturbed (indices among the pairs looked at)
    waited: float | None = None  # the share of the pairs' time spent waiting for a CPU (None: not measured)
    unmeasurable: bool = False  # waited at least UNMEASURABLE_WAIT: judged as if the waiting had been work
    share: float = 1.0  # of the error rates this look spent (`Schedule.share`)

    @property
    def ratio(self) -> float:
        return math.exp(self.estimate)

    @property
    def interval(self) -> tuple[float, float]:
        return math.exp(self.low), math.exp(self.high)


Waits = Sequence[tuple[float, float]]  # per pair: the candidate's and the reference's share of time waiting


def look(values: Sequence[float], limit: float, budget: Budget, looks: int, final: bool,
         waits: Waits | None = None, share: float | None = None) -> Look:
    """One look at ``values`` (pairs' log-ratios) against ``limit`` (the log threshold), spending ``share`` (default
    1 / ``looks``) of the budget, on the pairs `set_aside` keeps. ``waits`` (aligned with ``values``): where the
    pairs waited for a CPU `UNMEASURABLE_WAIT` of their time or more, a fail must hold with each candidate side's
    waiting taken out of its latency, and a pass with each reference side's taken out."""
    kept, aside = set_aside(values)
    kept_waits = [w for i, w in enumerate(waits) if i not in set(aside)] if waits is not None and \
        len(waits) == len(values) else None
    waited = sum(c + r for c, r in kept_waits) / (2 * len(kept_waits)) if kept_waits else None
    busy = waited is not None and waited >= UNMEASURABLE_WAIT
    if busy and kept_waits is not None:
        fail_values = [v + math.log(max(1.0 - c, 1e-9)) for v, (c, _) in zip(kept, kept_waits, strict=True)]
        pass_values = [v - math.log(max(1.0 - r, 1e-9)) for v, (_, r) in zip(kept, kept_waits, strict=True)]
    else:
        fail_values = pass_values = kept
    spent = share if share is not None else 1.0 / looks
    low = lower_bound(fail_values, budget.alpha_fail * spent) if spent > 0 else -math.inf
    high = upper_bound(pass_values, budget.alpha_pass * spent) if spent > 0 else math.inf
    outcome: Outcome = "fail" if low > limit else "pass" if high < limit else "inconclusive"
    return Look(len(values), hodges_lehmann(kept) if kept else 0.0, low, high, limit, outcome, final,
                noise(kept), tuple(aside), waited, busy, spent)


def sequential(values: Sequence[float], schedule: Schedule, limit: float, budget: Budget,
               ended: bool = False, waits: Waits | None = None) -> Look:
    """The verdict of a sequential comparison: the first planned look (at ``schedule.looks`` pairs, among the
    ``values`` measured) that decides; else the last one. ``ended``: the measurement stopped at ``len(values)``
    pairs for good (its time cap), which then counts as a final look even if it was not planned. ``waits``: per
    pair, the sides' shares of time waiting for a CPU (`look`)."""
    count = len(schedule.looks)
    taken: Look | None = None

    def at(pairs: int, final: bool) -> Look:
        return look(values[:pairs], limit, budget, count, final,
                    waits[:pairs] if waits is not None and len(waits) == len(values) else None,
                    schedule.share(pairs, final))

    for pairs in schedule.looks:
        if pairs > len(values):
            break
        taken = at(pairs, schedule.is_final(pairs))
        if taken.outcome != "inconclusive":
            return taken
    if ended and len(values) >= 2 and (taken is None or taken.pairs < len(values)):
        return at(len(values), True)
    if taken is None:
        return at(len(values), ended)
    return taken


# -- what a verdict can detect ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Power:
    """What a paired verdict detects at the noise it measured: it fails a change of ``fails_from`` or more (a
    ratio) ``probability`` of the time, and passes one of ``passes_below`` or less as often, with up to ``pairs``
    pairs."""

    fails_from: float
    passes_below: float
    probability: float
    pairs: int
    sigma: float

    def text(self, figure: str = "p50") -> str:
        """The statement, as a change of ``figure`` (throughput: a drop is worse)."""
        noise = f"noise ±{self.sigma * 100:.2g}% per pair, up to {self.pairs} pairs"
        if figure == "throughput":
            return (f"fails a throughput change of {(1 / self.fails_from - 1) * 100:+.1f}% or worse and passes one "
                    f"of {(1 / self.passes_below - 1) * 100:+.1f}% or better {self.probability:.0%} of the time "
                    f"({noise})") if self.passes_below > 0 else f"no power ({noise})"
        return (f"fails a change of {(self.fails_from - 1) * 100:+.1f}% or more and passes one of "
                f"{(self.passes_below - 1) * 100:+.1f}% or less {self.probability:.0%} of the time ({noise})")

    def as_dict(self) -> dict[str, Any]:
        return {"fails_from": self.fails_from, "passes_below": self.passes_below, "probability": self.probability,
                "pairs": self.pairs, "sigma": self.sigma}


def deciding_pairs(found: Look, budget: Budget, share: float, probability: float = 0.5) -> float:
    """About how many pairs would decide the comparison ``found`` looked at (``probability`` of the time, the
    median by default), were the change at its estimate and the pairs' spread as measured, at a look spending
    ``share`` of the error rates (normal approximation with the signed-rank test's efficiency); inf when the
    estimate is on the threshold or the spread unknown."""
    distance = abs(found.estimate - found.limit)
    if distance <= 0 or not math.isfinite(found.sigma) or share <= 0:
        return math.inf
    normal = NormalDist()
    alpha = budget.alpha_fail if found.estimate > found.limit else budget.alpha_pass
    z = normal.inv_cdf(1 - alpha * share) + normal.inv_cdf(probability)
    return max((z * found.sigma / distance) ** 2 / EFFICIENCY, float(min_pairs(alpha * share)))


def power(sigma: float, pairs: int, limit: float, budget: Budget, looks: float, probability: float = POWER) -> Power:
    """The smallest change (log scale ``limit``) failed and the largest passed ``probability`` of the time at the
    last look, for pairs with spread ``sigma``, the last look spending 1 / ``looks`` of the error rates."""
    normal = NormalDist()
    spread = sigma / math.sqrt(max(pairs, 1) * EFFICIENCY) if math.isfinite(sigma) else math.inf
    z_power = normal.inv_cdf(probability)
    fails = limit + (normal.inv_cdf(1 - budget.alpha_fail / looks) + z_power) * spread
    passes = limit - (normal.inv_cdf(1 - budget.alpha_pass / looks) + z_power) * spread
    return Power(math.exp(fails) if math.isfinite(fails) else math.inf,
                 math.exp(passes) if math.isfinite(passes) else 0.0, probability, pairs, sigma)


#: What each window of a pair records (latency statistics in ms, throughput in samples/s).
WINDOW_FIGURES = ("p50", "p99", "mean", "throughput")


def log_ratio(candidate: float, reference: float, figure: str) -> float:
    """The log of candidate over reference, oriented so that > 0 is worse (latency up, throughput down)."""
    if candidate <= 0 or reference <= 0:
        return math.inf
    ratio = math.log(candidate / reference)
    return -ratio if figure == "throughput" else ratio


@dataclass
class PairedRecord:
    """What a paired measurement keeps in a node's summary: the point it paired, every pair's window figures
    (reference and candidate, and their order), and the looks it planned; enough to judge it again under other
    thresholds and figures."""

    batch_size: int | None
    streams: int = 1
    figure: str = "p50"  # the figure its stopping rule watched
    pairs: list[dict[str, Any]] = field(default_factory=list)  # {"order", "reference": {...}, "candidate": {...}}
    looks: list[int] = field(default_factory=list)
    ended: bool = False  # the measurement ran to its cap or out of time
    alpha_fail: float = ALPHA_FAIL
    alpha_pass: float = ALPHA_PASS
    seed: int | None = None  # of the pairs' AB/BA orders (`ab_seed` replays the run)
    block_s: float | None = None  # each side's block in a pair (None: a window each, before rounds)
    extended: bool = False  # records of earlier versions: went on past the point's cap (now within the budget)
    cost_budget: float | None = None  # both sides timed at most this many times ungated_s (None: earlier records)
    ungated_s: float | None = None  # what the point times ungated at least (its min_duration_s)
    timed_s: float | None = None  # both sides' timed seconds
    spending: float | None = None  # how the looks spend the error rates (`Schedule.spending`)
    fractions: list[float] | None = None  # each look's information fraction (`Schedule.fractions`)

    def schedule(self) -> Schedule:
        """The looks the measurement planned (and, looked at by the cost they reached, took)."""
        return Schedule(tuple(self.looks), self.spending, tuple(self.fractions) if self.fractions else None)

    @property
    def cost(self) -> float | None:
        """Both sides' timed seconds over the ungated point's (None when not recorded)."""
        if self.timed_s is None or not self.ungated_s:
            return None
        return self.timed_s / self.ungated_s

    def add(self, order: str, reference: dict[str, float], candidate: dict[str, float]) -> None:
        self.pairs.append({"order": order, "reference": reference, "candidate": candidate})

    def _finite(self, figure: str) -> list[tuple[float, dict[str, Any]]]:
        found = []
        for pair in self.pairs:
            value = log_ratio(float(pair["candidate"].get(figure, math.nan)),
                              float(pair["reference"].get(figure, math.nan)), figure)
            if math.isfinite(value):
                found.append((value, pair))
        return found

    def log_ratios(self, figure: str) -> list[float]:
        return [value for value, _ in self._finite(figure)]

    def wait_shares(self, figure: str | None = None) -> list[tuple[float, float]] | None:
        """Per pair (those `log_ratios` keeps): the candidate's and the reference's share of time waiting for a
        CPU; None when a side's was not measured."""
        found = []
        for _, pair in self._finite(figure or self.figure):
            new, old = pair["candidate"].get("wait_share"), pair["reference"].get("wait_share")
            if not isinstance(new, (int, float)) or not isinstance(old, (int, float)):
                return None
            found.append((float(new), float(old)))
        return found

    def judge(self, figure: str, limit: float, budget: Budget) -> Look:
        return sequential(self.log_ratios(figure), self.schedule(), limit, budget, self.ended,
                          self.wait_shares(figure))

    def reference_spread(self, figure: str | None = None) -> float:
        """How much the reference's own pair figures varied from pair to pair (a robust standard deviation of
        their logs): the host's variation that the pairs cancelled."""
        values = [math.log(float(p["reference"][figure or self.figure])) for p in self.pairs
                  if float(p["reference"].get(figure or self.figure, 0) or 0) > 0]
        return noise(values)

    def wait_share(self) -> float | None:
        """The share of the paired windows' time their threads waited for a CPU (None: not measured)."""
        waits = [side.get("wait_share") for pair in self.pairs for side in (pair["reference"], pair["candidate"])]
        known = [w for w in waits if isinstance(w, (int, float))]
        return sum(known) / len(known) if known and len(known) == len(waits) else None

    def as_dict(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "streams": self.streams, "figure": self.figure, "pairs": self.pairs,
                "looks": self.looks, "ended": self.ended, "alpha_fail": self.alpha_fail,
                "alpha_pass": self.alpha_pass, "seed": self.seed, "block_s": self.block_s,
                "extended": self.extended, "cost_budget": self.cost_budget, "ungated_s": self.ungated_s,
                "timed_s": self.timed_s, "spending": self.spending, "fractions": self.fractions}

    @classmethod
    def from_dict(cls, data: Any) -> PairedRecord | None:
        if not isinstance(data, dict) or not isinstance(data.get("pairs"), list):
            return None
        pairs = [p for p in data["pairs"] if isinstance(p, dict) and isinstance(p.get("reference"), dict)
                 and isinstance(p.get("candidate"), dict)]
        looks = [int(v) for v in data.get("looks") or [] if isinstance(v, int) and v > 0]
        return cls(data.get("batch_size"), int(data.get("streams") or 1), str(data.get("figure", "p50")), pairs,
                   looks or [max(len(pairs), 1)], bool(data.get("ended")),
                   float(data.get("alpha_fail", ALPHA_FAIL)), float(data.get("alpha_pass", ALPHA_PASS)),
                   data.get("seed") if isinstance(data.get("seed"), int) else None,
                   _number(data.get("block_s")), bool(data.get("extended")), _number(data.get("cost_budget")),
                   _number(data.get("ungated_s")), _number(data.get("timed_s")), _number(data.get("spending")),
                   [float(v) for v in data["fractions"] if isinstance(v, (int, float))]
                   if isinstance(data.get("fractions"), list) else None)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# -- several candidates timed round-robin ------------------------------------------------------------------------
#: select's error rates: the chance of calling a candidate worse beyond the preference band when it is exactly at
#: it, and of calling it within the band when it is exactly at it, over all its comparisons with the leader.
ALPHA_SELECT = 0.05


def select_budget(candidates: int) -> Budget:
    """The error budget of each comparison with the leader among ``candidates`` (Bonferroni over them)."""
    share = ALPHA_SELECT / max(candidates - 1, 1)
    return Budget(share, share)


def round_robin(rounds: Sequence[Mapping[str, Mapping[str, float]]], names: Sequence[str], figure: str,
                limit: float, budget: Budget, schedule: Schedule, ended: bool) -> tuple[str, dict[str, Look]]:
    """The leader of candidates timed in rounds (one window each per round, in a random order) and each other
    candidate's comparison with it: per round the log of its figure over the leader's (> 0 is worse), judged
    against ``limit`` like a pair (`sequential`). The leader has the best Hodges-Lehmann estimate against the
    first candidate."""
    anchor = names[0]

    def ratios(name: str, against: str) -> list[float]:
        found = [log_ratio(float(r[name][figure]), float(r[against][figure]), figure) for r in rounds]
        return [v for v in found if math.isfinite(v)]

    leader = min(names, key=lambda n: (hodges_lehmann(ratios(n, anchor)) if n != anchor and ratios(n, anchor)
                                       else 0.0, n))
    return leader, {name: sequential(ratios(name, leader), schedule, limit, budget, ended)
                    for name in names if name != leader}
