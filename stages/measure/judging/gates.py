"""The benchmark's gates as typed verdicts (`trtflow.verdicts.GateVerdict`), each with its basis and its power.

- limits (``max_latency_ms_p50`` ... ``min_throughput_qps``), at every measured point: fail when the figure's
  whole 95% interval is beyond the limit, pass when the whole interval is within it, inconclusive in between;
- regression (``max_regression_percent``) against a pinned baseline (``baseline``) or else the node's last
  accepted result: one *primary* verdict at the gate point (``gate_batch_size``, ``gate_figure``), judged on the
  pairs of a paired A/B measurement (`measure.statistics.paired`) when the reference was re-measured beside the
  candidate, else on stored figures (`measure.statistics.unpaired`: the ratio's own interval, plus the host's run-to-run
  allowance, which stored figures cannot cancel); the other points and figures are reported (``primary`` False), not
  judged.

A recipe's comparisons share one error budget: each node's chance of failing a change at its threshold is
`measure.statistics.paired.family_alpha` of the number of nodes that compare (the first step of Holm's procedure, which
fails a run exactly when Holm's would). Every verdict states its power: the smallest change it fails 90% of the time,
at the noise it measured. ``on_inconclusive`` says what an undecided verdict does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any

from trtflow.verdicts import MEASURED, PAIRED, STORED, GateVerdict, Outcome

from ..settings import GateFields
from ..statistics.paired import (
    ALPHA_PASS,
    ASIDE_SIGMAS,
    MIN_PAIRS,
    POWER,
    Budget,
    PairedRecord,
    Schedule,
    deciding_pairs,
    family_alpha,
    power,
)
from ..statistics.unpaired import (
    NOISY_HINT,
    Z95,
    Figure,
    at_least,
    at_most,
    cpu_wait_share,
    latency_figure,
    point_figure,
    point_key,
    throughput_figure,
    unmeasurable,
    where,
)
from .baseline import artifact_identity, baseline_entry, differences, timing_facts, timing_refusal

LATENCY_GATES = {"max_latency_ms_p50": "p50", "max_latency_ms_p90": "p90", "max_latency_ms_p95": "p95",
                 "max_latency_ms_p99": "p99", "max_latency_ms_mean": "mean"}
DEFAULT_BASELINE_REGRESSION_PERCENT = 10.0
FIGURE_TEXT = {"p50": "median latency", "p90": "p90 latency", "p95": "p95 latency", "p99": "p99 latency",
               "mean": "mean latency", "throughput": "throughput"}
#: What decides an undecided paired verdict: more pairs (a larger budget, or a larger unit) or less noise.
PAIRED_HINT = ("raise gate_cost_budget (or min_duration_s, the budget's unit) or measure on a quieter host to "
               "decide")
#: The largest gate_cost_budget a recipe may set (`measure.settings.TimingFields.gate_cost_budget`).
MAX_COST_BUDGET = 100.0
FIGURE_TEXT.update({f"{prefix}_{stat}": f"{stat} {name}" for prefix, name in
                    (("ttft", "time to first token"), ("tpot", "time per output token"))
                    for stat in ("p50", "p90", "p95", "p99", "mean")})  # a generation level's (`generation_gates`)
STORED_NOTE = "stored figures: drift between runs not cancelled"
_NORMAL = NormalDist()


def _interval(figure: Figure) -> str:
    return "" if figure.exact_value else f" (95% interval {figure.low:.4g}-{figure.high:.4g})"


def _open_note(point: Mapping[str, Any], statistic: str) -> str:
    if statistic in (point.get("open_intervals") or []):
        return (f"; {point.get('queries', 'too few')} queries are too few to bound {statistic} from above "
                "(p99 needs 368)")
    return ""


def _limit_power(figure: Figure, limit: float, above_fails: bool) -> str:
    """What a limit verdict detects: the true values it fails and passes 90% of the time at this precision."""
    low, high = figure.log_halves()
    spread = max(low, high) / Z95
    if not math.isfinite(spread):
        return "no power: the figure has no finite interval"
    factor = math.exp((Z95 + _NORMAL.inv_cdf(POWER)) * spread)
    fails, passes = (limit * factor, limit / factor) if above_fails else (limit / factor, limit * factor)
    side = ("above", "below") if above_fails else ("below", "above")
    return (f"fails a true value {side[0]} {fails:.4g} and passes one {side[1]} {passes:.4g} {POWER:.0%} of the "
            f"time (at this precision, ±{spread * Z95 * 100:.2g}%)")


def _waited(point: Mapping[str, Any]) -> float:
    """The share of a point's time its threads waited for a CPU (0 when not measured)."""
    return cpu_wait_share(point) or 0.0


def limit_count(params: GateFields, points: Sequence[Mapping[str, Any]]) -> int:
    """How many limit verdicts a node makes (its limits set, at each of its points): they share its error budget."""
    limits = sum(getattr(params, field) is not None for field in LATENCY_GATES)
    limits += params.min_throughput_qps is not None
    return max(limits * len(points), 1)


def limit_verdicts(point: Mapping[str, Any], params: GateFields, family: int = 1,
                   count: int = 1) -> list[GateVerdict]:
    """Each limit at ``point``. A limit fails when the figure's lower bound is beyond it at the family's error
    budget: `measure.statistics.paired.family_alpha` of the recipe's ``family`` of comparing nodes, shared among the
    node's ``count`` limit verdicts (Bonferroni), so a recipe's limits raise a false alarm at most as often as its
    regression gates; it passes when its 95% interval is within. A point measured while the host kept the
    benchmark waiting for a CPU most of the time (`measure.statistics.unpaired.unmeasurable`) fails a latency limit
    only when it is beyond it even without any of that wait; otherwise it is unmeasurable (inconclusive), said as
    such."""
    found = []
    confidence = 1.0 - family_alpha(family) / max(count, 1)
    place = where(point)
    waited = _waited(point)
    busy = unmeasurable(point)
    for field, statistic in LATENCY_GATES.items():
        limit = getattr(params, field)
        figure = latency_figure(point, statistic)
        if limit is None or figure is None:
            continue
        outcome = at_most(figure.at_confidence(confidence, 0.975), limit)
        shown = f"{statistic} latency {figure.value:.4g} ms{_interval(figure)}"
        if outcome == "fail" and busy and figure.low * (1.0 - waited) <= limit:
            outcome, message = "inconclusive", f"{place}: {busy}; {shown} against {field} {limit:g} ms"
        elif outcome == "fail":
            message = f"{place}: {shown} > {field} {limit:g} ms ({figure.value / limit:.2f}x)"
        elif outcome == "inconclusive":
            message = (f"{place}: inconclusive: {shown} against {field} {limit:g} ms: the interval straddles the "
                       f"limit{_open_note(point, statistic)}; {NOISY_HINT}")
        else:
            message = f"{place}: {shown} <= {field} {limit:g} ms"
        found.append(GateVerdict(field, outcome, message, place, f"{statistic} latency", figure.value,
                                 (figure.low, figure.high), limit, "ms", MEASURED,
                                 power=_limit_power(figure, limit, True), on_inconclusive=params.on_inconclusive))
    qps = throughput_figure(point)
    if params.min_throughput_qps is not None and qps is not None:
        limit = params.min_throughput_qps
        outcome = at_least(qps.at_confidence(0.975, confidence), limit)
        shown = f"throughput {qps.value:.4g} qps{_interval(qps)}"
        if outcome == "fail" and busy and qps.high / max(1.0 - waited, 1e-9) >= limit:
            outcome, message = "inconclusive", f"{place}: {busy}; {shown} against min_throughput_qps {limit:g}"
        elif outcome == "fail":
            message = f"{place}: {shown} < min_throughput_qps {limit:g} ({qps.value / limit:.2f}x)"
        elif outcome == "inconclusive":
            message = (f"{place}: inconclusive: {shown} against min_throughput_qps {limit:g}: the interval straddles "
                       f"the limit; {NOISY_HINT}")
        else:
            message = f"{place}: {shown} >= min_throughput_qps {limit:g}"
        found.append(GateVerdict("min_throughput_qps", outcome, message, place, "throughput", qps.value,
                                 (qps.low, qps.high), limit, "qps", MEASURED,
                                 power=_limit_power(qps, limit, False), on_inconclusive=params.on_inconclusive))
    return found


# -- regression ---------------------------------------------------------------------------------------------------
def allowed_ratio(percent: float, figure: str) -> float:
    """The most a candidate / reference ratio may be worse: latency up by ``percent``, or throughput down by it
    (as a "worse" ratio > 1: reference / candidate for throughput)."""
    return 1.0 / (1.0 - min(percent, 99.0) / 100.0) if figure == "throughput" else 1.0 + percent / 100.0


def gate_point(params: GateFields, points: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The point whose regression verdict decides the node: ``gate_batch_size`` (else the largest measured batch
    size) at the fewest streams."""
    candidates = [p for p in points if isinstance(p.get("batch_size"), int)]
    if not candidates:
        return None
    batch = params.gate_batch_size if params.gate_batch_size is not None else \
        max(p["batch_size"] for p in candidates)
    at_batch = [p for p in candidates if p["batch_size"] == batch]
    return min(at_batch, key=lambda p: p.get("streams", 1)) if at_batch else None


def _change(ratio: float, figure: str) -> str:
    """A candidate / reference ratio as a change in percent."""
    return f"{(ratio - 1.0) * 100.0:+.1f}%"


class Comparison:
    """One regression gate's settings: against what, how strict, with what share of the recipe's error budget."""

    def __init__(self, gate: str, against: str, percent: float, params: GateFields, family: int) -> None:
        self.gate = gate
        self.against = against
        self.percent = percent
        self.params = params
        self.budget = Budget(family_alpha(family), ALPHA_PASS)
        self.pinned: list[str] = []  # the reference's pinned settings that differ from the candidate's

    def verdict(self, outcome: Outcome, reason: str, place: str, figure: str, estimate: float | None,
                interval: tuple[float, float] | None, basis: str, primary: bool, pairs: int | None = None,
                power_text: str | None = None) -> GateVerdict:
        # estimate, interval and threshold as candidate / reference ratios (throughput: < 1 is worse)
        threshold = 1.0 - min(self.percent, 99.0) / 100.0 if figure == "throughput" else 1.0 + self.percent / 100.0
        return GateVerdict(self.gate, outcome, reason, place, FIGURE_TEXT.get(figure, figure), estimate, interval,
                           threshold, "ratio", basis, pairs, primary, power_text, self.params.on_inconclusive)

    # ----- paired A/B
    @staticmethod
    def interference(record: PairedRecord, look: Any) -> str:
        """What the pairs saw of the host: pairs set aside as disturbed, the reference's own spread from block to
        block (the variation the pairs cancelled), waiting for a CPU, an extension past the cap."""
        seen = []
        if look.aside:
            seen.append(f"{len(look.aside)} of {look.pairs} pairs set aside as disturbed (beyond "
                        f"{ASIDE_SIGMAS:g} robust SDs of the pairs' median: a neighbour's spell on one side)")
        spread = record.reference_spread()
        if math.isfinite(spread):
            seen.append(f"the reference's own blocks varied ±{spread * 100:.2g}%")
        if look.waited is not None and look.waited >= 0.05:
            seen.append(f"waited for a CPU {look.waited:.0%} of the time")
        if record.extended:  # a record of an earlier version, which extended past its cap
            seen.append("timed past max_duration_s (up to its extension) as the host was disturbed")
        return "; ".join(seen)

    @staticmethod
    def cost(record: PairedRecord) -> str:
        """What the paired point cost: both sides' timed seconds over what the point times ungated at least."""
        if record.cost is None or record.ungated_s is None or record.timed_s is None:
            return ""
        budget = f" (gate_cost_budget {record.cost_budget:g})" if record.cost_budget is not None else ""
        return (f"cost: both sides timed {record.timed_s:.3g} s, {record.cost:.2f}x the {record.ungated_s:.3g} s "
                f"the point times ungated{budget}")

    @staticmethod
    def to_decide(record: PairedRecord, look: Any, budget: Budget) -> str:
        """Undecided at the cost budget: about what budget would decide at the noise measured (9 times in 10, were
        the change at its estimate), or why none would."""
        if record.cost_budget is None or record.timed_s is None or not record.ungated_s or look.pairs <= 0:
            return ""
        if look.unmeasurable:
            return (f"; no budget would decide: the pairs waited for a CPU {look.waited:.0%} of the time "
                    "(unmeasurable), a quieter host would")
        needed = deciding_pairs(look, budget, look.share, POWER)
        wanted = math.ceil(max(needed / look.pairs, 1.0) * record.timed_s / record.ungated_s) if \
            math.isfinite(needed) else math.inf
        estimate = f"{(math.exp(look.estimate) - 1) * 100:+.1f}%"
        noise = f"the noise ±{look.sigma * 100:.2g}% per pair"
        if wanted > MAX_COST_BUDGET:
            return (f"; no budget up to gate_cost_budget {MAX_COST_BUDGET:g} would decide: the change ({estimate}) "
                    f"is too close to the threshold for {noise}")
        if wanted <= record.cost_budget:
            return (f"; this budget decides a change of {estimate} at {noise} 9 times in 10: re-run it (or raise "
                    f"gate_cost_budget)")
        return (f"; were the change {estimate} and {noise}, gate_cost_budget {wanted:g} would decide 9 times in "
                "10")

    def able(self, record: PairedRecord, look: Any, limit: float) -> Any:
        """What the verdict could detect at the end of its plan (the budget), at the noise it measured."""
        if record.cost_budget is not None and record.timed_s and record.ungated_s and record.fractions:
            pairs = round(len(record.pairs) * record.cost_budget * record.ungated_s / record.timed_s)
            before = [f for f in record.fractions if f < 1.0]
            share = 1.0 - (before[-1] ** record.spending if before and record.spending else 0.0)
            return power(look.sigma, max(pairs, 1), limit, self.budget, 1.0 / max(share, 1e-9))
        schedule = Schedule(tuple(record.looks or [look.pairs]))
        return power(look.sigma, schedule.cap, limit, self.budget, len(schedule.looks))

    def paired(self, record: PairedRecord, figure: str, place: str, primary: bool) -> GateVerdict:
        limit = math.log(allowed_ratio(self.percent, figure))
        look = record.judge(figure, limit, self.budget)
        sign = -1.0 if figure == "throughput" else 1.0
        ratio = math.exp(sign * look.estimate)
        bounds = sorted((math.exp(sign * look.low), math.exp(sign * look.high)))
        interval = (bounds[0], bounds[1])
        able = self.able(record, look, limit)
        what = FIGURE_TEXT.get(figure, figure)
        rounds = f" of {record.block_s * 1000:.3g} ms blocks" if record.block_s else ""
        detail = (f"paired A/B, {look.pairs} pairs{rounds}: ratio {ratio:.3f}, bounds {interval[0]:.3f}-"
                  f"{interval[1]:.3f} (lower at {1 - self.budget.alpha_fail * look.share:.2%}, upper "
                  f"at {1 - self.budget.alpha_pass * look.share:.2%} confidence; AB/BA seed "
                  f"{record.seed})")
        seen = self.interference(record, look)
        if seen:
            detail += f"; {seen}"
        spent = self.cost(record)
        if spent:
            detail += f"; {spent}"
        if self.pinned:
            detail += f"; the reference ran with its pinned settings ({', '.join(self.pinned)})"
        if look.unmeasurable:
            detail += ("; unmeasurable beyond what the waiting could explain: judged as if each side's waiting "
                       "had been its work")
        if look.outcome == "fail":
            reason = (f"{place}: {what} {_change(ratio, figure)} against {self.against}, beyond "
                      f"max_regression_percent {self.percent:g} with confidence ({detail})")
        elif look.outcome == "pass":
            reason = (f"{place}: {what} {_change(ratio, figure)} against {self.against}, within "
                      f"max_regression_percent {self.percent:g} with confidence ({detail})")
        else:
            first = record.looks[0] if record.looks else MIN_PAIRS
            if look.pairs < first and record.cost_budget is None:  # a record of an earlier version
                blocks = [float(p["candidate"].get("mean", 0)) * float(p["candidate"].get("queries", 1)) / 1000.0
                          for p in record.pairs]
                block = sum(blocks) / len(blocks) if blocks else 0.0
                cause = (f"only {look.pairs} pair(s) fitted in max_duration_s: a block (at least one query) took "
                         f"{block:.3g} s and the first look needs {first} pairs; raise max_duration_s to "
                         f"{first * block * 1.2:.3g} s or more to decide")
            elif look.final and record.cost_budget is not None:
                cause = "the cost budget" + self.to_decide(record, look, self.budget)
            elif look.final:
                cause = "the cap"
            else:
                cause = "the pairs measured before the node stopped (re-run it to measure more)"
            hint = PAIRED_HINT if record.cost_budget is not None else NOISY_HINT
            reason = (f"{place}: inconclusive: {what} {_change(ratio, figure)} against {self.against}, neither "
                      f"beyond nor within max_regression_percent {self.percent:g} with confidence at {cause} "
                      f"({detail}); {hint}")
        return self.verdict(look.outcome, reason, place, figure, ratio, interval, PAIRED, primary, look.pairs,
                            able.text(figure))

    # ----- stored figures
    @staticmethod
    def _despite_wait(outcome: str, worse: Figure, fail_at: float, pass_at: float,
                      waits: tuple[float, float]) -> bool:
        """Would ``outcome`` hold even if the waiting for a CPU (shares ``waits``: candidate, reference) had
        inflated the candidate's or the reference's latency by all of it?"""
        new_wait, old_wait = waits
        if outcome == "fail":
            return worse.low * (1.0 - new_wait) > fail_at
        if outcome == "pass":
            return worse.high / max(1.0 - old_wait, 1e-9) <= pass_at
        return False

    def stored(self, new: Figure, old: Figure, figure: str, place: str, primary: bool, busy: str | None,
               why: str, waits: tuple[float, float] = (0.0, 0.0)) -> GateVerdict:
        ratio = new.ratio(old)  # candidate / reference
        worse = old.ratio(new) if figure == "throughput" else ratio
        limit = allowed_ratio(self.percent, figure)
        allowance = 1.0 + self.params.run_to_run_percent / 100.0
        scaled = worse.at_confidence(1 - self.budget.alpha_fail, 1 - self.budget.alpha_pass)
        outcome: Outcome
        if scaled.low > limit * allowance:
            outcome = "fail"
        elif scaled.high <= limit:
            outcome = "pass"
        else:
            outcome = "inconclusive"
        what = FIGURE_TEXT.get(figure, figure)
        unit = "qps" if figure == "throughput" else "ms"
        interval_text = "" if ratio.exact_value else f", 95% interval {ratio.low:.3f}-{ratio.high:.3f}"
        figures = (f"{what} {new} {unit} vs {self.against} {old} {unit} ({_change(ratio.value, figure)}; ratio "
                   f"{ratio.value:.3f}{interval_text})")
        if busy is not None and not self._despite_wait(outcome, worse, limit * allowance, limit, waits):
            outcome, reason = "inconclusive", f"{place}: {busy}; {figures}; {STORED_NOTE}"
        elif outcome == "fail":
            reason = (f"{place}: {figures}: beyond max_regression_percent {self.percent:g} and the host's run-to-run "
                      f"{self.params.run_to_run_percent:g}% with confidence ({STORED_NOTE}; {why})")
        elif outcome == "pass":
            reason = f"{place}: {figures}, within max_regression_percent {self.percent:g} ({STORED_NOTE}; {why})"
        else:
            beyond = scaled.low > limit
            cause = (f"beyond max_regression_percent {self.percent:g}, but not beyond what the host's run-to-run "
                     f"variation (run_to_run_percent {self.params.run_to_run_percent:g}) can explain" if beyond
                     else f"straddles max_regression_percent {self.percent:g}")
            reason = f"{place}: inconclusive: {figures}, which {cause} ({STORED_NOTE}; {why}); {NOISY_HINT}"
        down, up = worse.log_halves()
        spread = max(down, up) / Z95
        if math.isfinite(spread):
            z = _NORMAL.inv_cdf(POWER)
            fails = limit * allowance * math.exp((_NORMAL.inv_cdf(1 - self.budget.alpha_fail) + z) * spread)
            passes = limit * math.exp(-(_NORMAL.inv_cdf(1 - self.budget.alpha_pass) + z) * spread)
            if figure == "throughput":
                able = (f"fails a throughput change of {(1 / fails - 1) * 100:+.1f}% or worse and passes one of "
                        f"{(1 / passes - 1) * 100:+.1f}% or better {POWER:.0%} of the time (stored figures, "
                        f"±{spread * 100:.2g}% combined)")
            else:
                able = (f"fails a change of {(fails - 1) * 100:+.1f}% or more and passes one of "
                        f"{(passes - 1) * 100:+.1f}% or less {POWER:.0%} of the time (stored figures, "
                        f"±{spread * 100:.2g}% combined)")
        else:
            able = "no power: a figure has no finite interval"
        return self.verdict(outcome, reason, place, figure, ratio.value, (ratio.low, ratio.high), STORED, primary,
                            power_text=able)

    def refusal(self, message: str) -> GateVerdict:
        """A comparison refused (another machine, a missing file): it fails, as the gate cannot be judged."""
        return GateVerdict(self.gate, "fail", message, basis=STORED, on_inconclusive=self.params.on_inconclusive)


def regression_verdicts(comparison: Comparison, summary: Mapping[str, Any], old_points: Sequence[Mapping[str, Any]],
                        paired: PairedRecord | None, why_stored: str,
                        missing: str | None = None) -> list[GateVerdict]:
    """The primary verdict at the gate point (paired when ``paired`` measured it, else stored figures) and the
    other points' and figures' changes, reported."""
    params = comparison.params
    points = [p for p in summary.get("points", []) if isinstance(p, Mapping)]
    primary_point = gate_point(params, points)
    recorded = {point_key(p): p for p in old_points}
    found: list[GateVerdict] = []
    for point in points:
        place = where(point)
        is_primary = point is primary_point
        old = recorded.get(point_key(point))
        pairs_here = paired is not None and (paired.batch_size, paired.streams) == point_key(point)
        figures = [params.gate_figure] + [f for f in ("p50", "throughput") if f != params.gate_figure]
        for figure in figures:
            primary = is_primary and figure == params.gate_figure
            if pairs_here and paired is not None and paired.log_ratios(figure):
                found.append(comparison.paired(paired, figure, place, primary))
                if primary and old is not None:
                    # what the pairs cannot see: a change both sides share (a runtime, driver or host upgrade),
                    # reported against the stored figures (the history's check tracks it over runs)
                    new_figure, old_figure = point_figure(point, figure), point_figure(old, figure)
                    if new_figure is not None and old_figure is not None and old_figure.value > 0:
                        shared = comparison.stored(new_figure, old_figure, figure, place, False,
                                                   unmeasurable(point) or unmeasurable(old),
                                                   "a change both sides share, which the pairs cancel",
                                                   (_waited(point), _waited(old)))
                        found.append(shared)
                continue
            if pairs_here is False and paired is not None and primary:
                paired_at = where({"batch_size": paired.batch_size, "streams": paired.streams})
                why_stored = f"the reference was paired at {paired_at}, not here"
            if old is None:
                if primary and missing is not None:
                    found.append(comparison.refusal(f"{place}: {missing} (it has "
                                                    f"{sorted(str(k) for k in recorded) or 'none'}); pin it again"))
                continue
            new_figure, old_figure = point_figure(point, figure), point_figure(old, figure)
            if new_figure is None or old_figure is None or old_figure.value <= 0:
                continue
            busy = unmeasurable(point) or unmeasurable(old)
            found.append(comparison.stored(new_figure, old_figure, figure, place, primary, busy, why_stored,
                                           (_waited(point), _waited(old))))
    return found


def _paired_level(reference: Mapping[str, Any]) -> int | None:
    """The concurrency a generation benchmark's pairs timed (None: not paired)."""
    level = (reference.get("paired") or {}).get("concurrency") if isinstance(reference.get("paired"), Mapping) \
        else None
    return level if isinstance(level, int) else None


def reference_of(summary: Mapping[str, Any]) -> Mapping[str, Any]:
    """What the node measured its candidate against (written by the benchmark stage, `reference_summary`)."""
    found = summary.get("reference")
    return found if isinstance(found, Mapping) else {}


def baseline_verdicts(params: GateFields, summary: Mapping[str, Any], gate_ctx: Any,
                      family: int) -> list[GateVerdict]:
    """Against a pinned baseline file: paired when its artifact was re-measured beside the candidate (and is the
    one the file pins now), else its stored figures, refused when they come from other hardware or runtime."""
    if params.baseline is None:  # `verdicts` asks only with a baseline
        return []
    percent = params.max_regression_percent or DEFAULT_BASELINE_REGRESSION_PERCENT
    entry, path = baseline_entry(params.baseline, params.baseline_node, "benchmark", gate_ctx.resolve, gate_ctx.node)
    comparison = Comparison(f"baseline {params.baseline}", "the baseline's", percent, params, family)
    reference = reference_of(summary)
    comparison.pinned = [str(v) for v in reference.get("settings") or []]
    identity = artifact_identity(entry)
    paired = PairedRecord.from_dict(reference.get("paired")) if identity is not None and \
        reference.get("identity") == identity else None
    if paired is None:
        refused = timing_refusal(entry, summary, gate_ctx.facts, path)
        if refused is not None:
            return [comparison.refusal(refused)]
    why = str(reference.get("why") or ("the baseline pins no artifact (saved by an older trtflow): pin it again"
                                       if identity is None else "its artifact was not re-measured"))
    if summary.get("generation"):
        from .generation_gates import generation_verdicts

        return generation_verdicts(comparison, summary, entry.get("generation") or [], paired,
                                   _paired_level(reference), why, missing=f"baseline {path} has no such level")
    return regression_verdicts(comparison, summary, entry.get("points", []), paired, why,
                               missing=f"baseline {path} has no such point")


def previous_run_verdicts(summary: Mapping[str, Any], params: GateFields,
                          previous: Mapping[str, Any] | None, family: int) -> list[GateVerdict]:
    """Against the node's last accepted result: paired when it was re-measured beside the candidate, else its
    stored figures (or, for results from before accepted references were kept, the previous run's, when that ran
    on the same hardware)."""
    if params.max_regression_percent is None:
        return []
    reference = reference_of(summary)
    comparison = Comparison("regression (last accepted)", "the last accepted result's",
                            params.max_regression_percent, params, family)
    comparison.pinned = [str(v) for v in reference.get("settings") or []]
    paired = PairedRecord.from_dict(reference.get("paired"))
    old_points = [p for p in reference.get("points") or [] if isinstance(p, Mapping)]
    why = str(reference.get("why") or "the reference was not re-measured")
    if summary.get("generation"):
        from .generation_gates import generation_verdicts

        old_levels = [level for level in reference.get("generation") or [] if isinstance(level, Mapping)]
        if not old_levels and paired is None:
            return []  # nothing accepted to compare with yet: this result becomes the reference once it passes
        return generation_verdicts(comparison, summary, old_levels, paired, _paired_level(reference), why)
    if not old_points and paired is None:
        if not previous or not previous.get("points"):
            return []  # nothing accepted yet: this result becomes the reference once its gates pass
        keys = timing_facts(summary.get("backend"), summary.get("device"))
        hardware = tuple(k for k in keys if k in ("gpu", "cpu"))
        if differences(previous.get("hardware") or {}, summary.get("hardware") or {}, hardware):
            return []
        old_points = [p for p in previous["points"] if isinstance(p, Mapping)]
        why = "no accepted reference is kept yet: compared with the previous run"
    return regression_verdicts(comparison, summary, old_points, paired, why)


def verdicts(params: GateFields, summary: Mapping[str, Any], gate_ctx: Any) -> list[GateVerdict]:
    """Every gate's verdicts: limits at each point, then regression against a pinned baseline or the last
    accepted result."""
    family = max(int(getattr(gate_ctx, "family", 1) or 1), 1)
    points = [point for point in summary.get("points", []) if isinstance(point, Mapping)]
    count = limit_count(params, points)
    found = [item for point in points for item in limit_verdicts(point, params, family, count)]
    if params.baseline is not None:
        found += baseline_verdicts(params, summary, gate_ctx, family)
    else:
        found += previous_run_verdicts(summary, params, gate_ctx.previous, family)
    return found
