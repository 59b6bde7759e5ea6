"""Regression gates on a generation benchmark's levels: its time to first token and its time per output token, each
judged like a latency point (``comparison``: a `measure.judging.gates.Comparison`, which calls this module).

A gated generation benchmark times its first level (`measure.serving.generation.gate_level`) in A/B rounds with the
reference (`measure.timing.ab.Pairing`: short interleaved blocks of each side's closed-loop requests in a random
order, a new recorded seed each run; each block gives both figures, ``tpot_<stat>`` and ``ttft_<stat>``, and the
pairing stops only when both are decided or at its cap, extended when disturbed pairs were set aside). Both verdicts
are primary: a regression of either fails the node. The rules are the latency gate's, on the same pairs: disturbed
pairs set aside by the stated symmetric rule, the CPU-wait rule (`measure.statistics.paired.look`), undecided at the
cap is inconclusive (``on_inconclusive``; exit 5 by default). Without pairs (the reference not re-measured), the
stored figures of the reference's levels decide, with the host's run-to-run allowance, as for points; the other
levels' changes are reported, not judged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trtflow.verdicts import GateVerdict

from ..statistics.paired import PairedRecord
from ..statistics.unpaired import Figure

#: The two figures of a generation level: its key in benchmark.json and the pair figures' prefix.
FIGURES = (("tpot_ms", "tpot"), ("ttft_ms", "ttft"))


def statistic(gate_figure: str) -> str:
    """The statistic a generation gate judges: the gate figure's (throughput has none per request: the median)."""
    return gate_figure if gate_figure != "throughput" else "p50"


def level_figure(level: Mapping[str, Any], key: str, stat: str) -> Figure | None:
    """A level's ``key`` (tpot_ms or ttft_ms) at ``stat`` with its 95% interval, or None."""
    raw = level.get(key)
    figures: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    value = figures.get(stat)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        return None
    interval = (figures.get("ci") or {}).get(stat)
    if isinstance(interval, (list, tuple)) and len(interval) == 2 and all(isinstance(v, (int, float))
                                                                          for v in interval):
        return Figure(float(value), min(float(interval[0]), value), max(float(interval[1]), value))
    return Figure.exact(float(value))


def _waited(level: Mapping[str, Any]) -> float:
    share = level.get("cpu_wait_share")
    return float(share) if isinstance(share, (int, float)) else 0.0


def generation_verdicts(comparison: Any, summary: Mapping[str, Any], old_levels: Sequence[Mapping[str, Any]],
                        paired: PairedRecord | None, paired_at: int | None, why_stored: str,
                        missing: str | None = None) -> list[GateVerdict]:
    """The two primary verdicts (time per output token, time to first token) at the gate level (the paired one,
    else the first), on the pairs when ``paired`` measured it (``paired_at``: its concurrency), else on the stored
    figures of the reference's level; the other levels' changes reported."""
    stat = statistic(comparison.params.gate_figure)
    levels = [level for level in summary.get("generation") or [] if isinstance(level, Mapping)]
    if not levels:
        return []
    gate = next((level for level in levels if level.get("concurrency") == paired_at), levels[0])
    recorded = {level.get("concurrency"): level for level in old_levels if isinstance(level, Mapping)}
    found: list[GateVerdict] = []
    for level in levels:
        clients = level.get("concurrency")
        place = f"concurrency {clients}"
        primary = level is gate
        old = recorded.get(clients)
        pairs_here = paired is not None and paired_at == clients
        busy = level.get("unmeasurable") or (old or {}).get("unmeasurable")
        for key, prefix in FIGURES:
            figure = f"{prefix}_{stat}"
            new_figure = level_figure(level, key, stat)
            old_figure = level_figure(old, key, stat) if old is not None else None
            if pairs_here and paired is not None and paired.log_ratios(figure):
                found.append(comparison.paired(paired, figure, place, primary))
                if primary and new_figure is not None and old_figure is not None:
                    # what the pairs cannot see: a change both sides share, reported against the stored figures
                    found.append(comparison.stored(new_figure, old_figure, figure, place, False, busy,
                                                   "a change both sides share, which the pairs cancel",
                                                   (_waited(level), _waited(old or {}))))
                continue
            if old is None:
                if primary and missing is not None:
                    found.append(comparison.refusal(f"{place}: {missing} (it has "
                                                    f"{sorted(str(k) for k in recorded) or 'none'}); pin it again"))
                    break
                continue
            if new_figure is None or old_figure is None:
                continue
            found.append(comparison.stored(new_figure, old_figure, figure, place, primary, busy, why_stored,
                                           (_waited(level), _waited(old))))
    return found
