"""What select says: each candidate's reason (why it won, lost or was excluded) and the selection as a table."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from trtflow.digits import decimals_apart, finite

from .operating_point import lower_is_better
from .params import TIME_GOALS
from .tie_breakers import CRITERION_TEXT, accuracy_text, tie_key
from .ties import ratio_text, row_ratio


def show(criterion: str, row: Mapping[str, Any], stat: str) -> str:
    """A candidate's figure for the size, latency or throughput tie-breaker (accuracy: `tie_breakers.accuracy_text`)."""
    if criterion == "size":
        return f"{row['size_bytes'] / 1e6:.3g} MB"
    point = row.get("operating_point") or {}
    if criterion == "latency":
        return f"{stat} {point['latency_ms']:.4g} ms" if finite(point.get("latency_ms")) else "none"
    return f"{point['throughput_qps']:.4g} qps" if finite(point.get("throughput_qps")) else "none"


def chosen_text(criterion: str, winner: Mapping[str, Any], others: Sequence[Mapping[str, Any]], stat: str) -> str:
    """How the tie-breaker that decided sets the winner apart from the candidates tied with it: "; chosen by
    accuracy: mean abs error 9.3e-09 vs 1.68e-05, cosine similarity 1 vs 0.99999998 within its resolution and spread
    (±2.4e-06) for fp16" (each figure named, none left bare)."""
    if criterion == "accuracy":
        return "; chosen by accuracy: " + "; ".join(
            f"{accuracy_text(winner.get('validation'), other.get('validation'))} for {other['name']}"
            for other in others)
    versus = ", ".join(f"{show(criterion, other, stat)} for {other['name']}" for other in others)
    return f"; chosen by {criterion}: {show(criterion, winner, stat)} vs {versus}"


def untold_text(row: Mapping[str, Any], others: Sequence[Mapping[str, Any]], order: Sequence[str],
                decided_by: str | None) -> str:
    """When accuracy came before the tie-breaker that decided but could not order the candidates: their figures,
    within their resolution and spread (or disagreeing), said so."""
    if "accuracy" not in order or (decided_by is not None and order.index(decided_by) < order.index("accuracy")):
        return ""
    if decided_by == "accuracy":
        return ""
    same = [o for o in others if tie_key(o, "accuracy") == tie_key(row, "accuracy")
            and o.get("validation") and row.get("validation")]
    if not same:
        return ""
    return "; accuracy did not order them: " + "; ".join(
        f"{accuracy_text(row.get('validation'), o.get('validation'))} for {o['name']}" for o in same)


def value_text(value: float, goal: str, interval: Sequence[float] | None = None) -> str:
    if goal == "min_size":
        return f"{value / 1e6:.3g} MB"
    unit = "ms" if goal in TIME_GOALS else "qps"
    if interval is not None and len(interval) == 2 and interval[0] != interval[1]:
        return f"{value:.4g} {unit} [{interval[0]:.4g}, {interval[1]:.4g}]"
    return f"{value:.4g} {unit}"


def _duel_text(row: Mapping[str, Any]) -> str:
    duel = row.get("paired") or {}
    return (f"timed together over {duel.get('rounds')} rounds: ratio {duel.get('ratio', 1):.3g}, bounds "
            f"{duel.get('low', 1):.3g}-{duel.get('high', 1):.3g}")


def _tie_text(row: Mapping[str, Any], winner: Mapping[str, Any], objective_text: str, versus: str,
              ratio: str) -> str:
    """How a tied candidate stands against the winner: within the band, not told apart, or unmeasurable."""
    if row.get("unmeasurable"):
        return f"{row['unmeasurable']}: not ranked against {winner['name']} on {objective_text} ({versus})"
    duel = row.get("paired")
    if duel:
        how = "within the preference band of" if duel["outcome"] == "within" else \
            "not told apart, within the cap on rounds, from"
        return f"{how} {winner['name']} on {objective_text} ({versus}; {_duel_text(row)})"
    if row.get("basis") == "paired A/B" and winner.get("paired"):  # the leader, and the winner close enough to it
        how = "was within the preference band of it" if winner["paired"]["outcome"] == "within" else \
            "could not be told apart from it within the cap on rounds"
        return f"the fastest when the finalists were timed together, but {winner['name']} {how} on " \
               f"{objective_text} and won the tie-break ({versus}; {_duel_text(winner)})"
    return f"tie within noise with {winner['name']} on {objective_text} ({versus}; {ratio})"


def reason(row: Mapping[str, Any], winner: Mapping[str, Any], best: Mapping[str, Any],
            tied: Sequence[Mapping[str, Any]], order: Sequence[str], objective_text: str, goal: str, stat: str,
            allowance: str, eligible_count: int) -> str:
    value = row["objective_value"]
    shown = value_text(value, goal, row.get("objective_ci"))
    together = " (finalists timed together)" if row.get("basis") == "paired A/B" else ""
    if row["name"] == winner["name"]:
        if len(tied) == 1:
            return f"selected: {objective_text} ({shown}) among {eligible_count} eligible{together}"
        others = [r for r in tied if r["name"] != winner["name"]]
        decided_by = next((c for c in order if any(tie_key(o, c) != tie_key(winner, c) for o in others)), None)
        how = (chosen_text(decided_by, winner, others, stat) if decided_by else "") + \
            untold_text(winner, others, order, decided_by)
        unmeasured = [r for r in tied if r.get("unmeasurable")]
        if unmeasured:
            return (f"selected: {objective_text} ({shown}); "
                    + "; ".join(f"{r['name']} {r['unmeasurable']}" for r in unmeasured)
                    + f": not ranked on it, so the tie-breakers decided among {', '.join(r['name'] for r in tied)}"
                    f"{how}")
        kind = "no difference beyond " + allowance + " with confidence" if not together else \
            "none worse beyond " + allowance + " with confidence, timed together"
        return (f"selected: tie within noise on {objective_text} ({shown}) with "
                f"{', '.join(r['name'] for r in others)} ({kind}){how}")
    versus = (f"{shown} vs {value_text(winner['objective_value'], goal, winner.get('objective_ci'))} for "
              f"{winner['name']}")
    if row["tie"]:
        against = winner if winner["name"] == best["name"] else best
        ratio_shown = ratio_text(row_ratio(row)) + (f" to {against['name']}" if against is not winner else "")
        standing = _tie_text(row, winner, objective_text, versus, ratio_shown)
        criterion = next((c for c in order if tie_key(row, c) != tie_key(winner, c)), None)
        if criterion is None:
            return (f"{standing} and on every tie-breaker; {winner['name']} is better on the objective or first by "
                    "name")
        untold = untold_text(row, [winner], order, criterion)
        if criterion == "accuracy":
            return (f"{standing}; lost the tie-break on accuracy: "
                    f"{accuracy_text(row.get('validation'), winner.get('validation'))} for {winner['name']}")
        return (f"{standing}; lost the tie-break on {CRITERION_TEXT[criterion]}: "
                f"{show(criterion, row, stat)} vs {show(criterion, winner, stat)} for {winner['name']}{untold}")
    ratio = row_ratio(row)
    if lower_is_better(goal):
        factor = f"{ratio.value:.3g}x {'slower' if goal in TIME_GOALS else 'larger'}"
    else:
        factor = f"{ratio.value:.3g}x lower"
    if row.get("paired"):
        beyond = f"; {_duel_text(row)}, beyond {allowance}"
    else:
        beyond = "" if ratio.low == ratio.high else f"; {ratio_text(ratio)}, beyond {allowance}"
    versus_best = (f"{shown} vs {value_text(best['objective_value'], goal, best.get('objective_ci'))} for "
                   f"{best['name']}")
    chosen = "" if best["name"] == winner["name"] else \
        f"; {winner['name']} was chosen among the candidates tied within noise with {best['name']}"
    return f"{objective_text}: {versus_best} ({factor}{beyond}){chosen}"


def table(selection: Mapping[str, Any]) -> str:
    """The selection as an aligned text table (for the failure message and the log)."""
    stat = selection["objective"]["percentile"]
    header = ("candidate", "kind", "precision", "size MB", "cosine", "mean err", "valid", f"{stat} ms", "qps", "at",
              "verdict")
    lines = [header]
    decimals = _cosine_decimals(selection["candidates"])
    for row in selection["candidates"]:
        validation = row.get("validation") or {}
        point = row.get("operating_point") or {}
        cosine = validation.get("cosine_similarity")
        verdict = "SELECTED" if row["name"] == selection["selected"] else row["reason"]
        lines.append((
            row["name"], row["kind"], row.get("precision") or "-", f"{row['size_bytes'] / 1e6:.3g}",
            f"{cosine:.{decimals}f}" if finite(cosine) else "-",
            f"{validation['mean_abs_error']:.3g}" if finite(validation.get("mean_abs_error")) else "-",
            "-" if not validation else ("pass" if validation.get("passed") else "FAIL"),
            f"{point['latency_ms']:.4g}" if finite(point.get("latency_ms")) else "-",
            f"{point['throughput_qps']:.4g}" if finite(point.get("throughput_qps")) else "-",
            point.get("description") or "-", verdict,
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line[:-1], widths, strict=True)) + "  " + line[-1]
                     for line in lines)


def _cosine_decimals(rows: Sequence[Mapping[str, Any]]) -> int:
    """Decimals of the table's cosine column: enough to tell the candidates' cosines apart, but none beyond their
    numerical resolution (`accuracy.resolution`: 0.99999998 and 1 in float32 both print 1.000000)."""
    validations = [row.get("validation") or {} for row in rows]
    decimals = decimals_apart([v.get("cosine_similarity") for v in validations], least=5)
    resolutions = [((v.get("uncertainty") or {}).get("cosine_similarity") or {}).get("resolution") for v in validations]
    coarsest = max((r for r in resolutions if finite(r) and r > 0), default=None)
    if coarsest is not None:
        decimals = min(decimals, max(5, math.floor(-math.log10(coarsest))))
    return decimals
