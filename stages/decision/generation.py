"""select's figures for generation: time per output token under a first-token budget, or time to first token, from a
benchmark's
``generation`` levels (`measure.serving.generation`: one per concurrency, each with ``ttft_ms`` and ``tpot_ms``
statistics, their sample count ``n`` and 95% intervals ``ci``).

Pure functions on JSON-ready data; `decision.operating_point` turns the chosen level into an operating point.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

GOAL = "min_time_per_token"
#: The lowest time to first token at a concurrency.
TTFT_GOAL = "min_time_to_first_token"
GOALS = (GOAL, TTFT_GOAL)


def levels_of(benchmark_json: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What selection keeps of each generation level of a benchmark.json."""
    kept = []
    for level in benchmark_json.get("generation") or []:
        kept.append({key: level.get(key) for key in ("concurrency", "requests", "ttft_ms", "tpot_ms",
                                                     "output_tokens_per_s", "converged", "flags", "cpu_wait_share",
                                                     "unmeasurable")})
    return kept


def figure(level: Mapping[str, Any], which: str, stat: str) -> tuple[float | None, list[float] | None]:
    """(value, 95% interval) of ``which`` (ttft_ms or tpot_ms) at statistic ``stat`` (p50, p90, ..., mean)."""
    figures = level.get(which) or {}
    value = figures.get(stat)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return None, None
    interval = (figures.get("ci") or {}).get(stat)
    return float(value), list(interval) if isinstance(interval, (list, tuple)) and len(interval) == 2 else None


def pick_level(levels: Sequence[Mapping[str, Any]], stat: str, concurrency: int | None,
               max_ttft_ms: float | None, judged: str = "tpot_ms") -> tuple[Mapping[str, Any] | None, str]:
    """The level a candidate is judged at: the one at ``concurrency`` (default: the lowest measured) with a
    ``judged`` figure (tpot_ms or ttft_ms), if its time to first token (at ``stat``) is within ``max_ttft_ms``; else
    None and why."""
    if not levels:
        return None, "the benchmark has no generation figures (benchmark params: generation)"
    by_level = {level.get("concurrency"): level for level in levels}
    chosen = min(c for c in by_level if isinstance(c, int)) if concurrency is None else concurrency
    if chosen not in by_level:
        measured = ", ".join(str(c) for c in sorted(c for c in by_level if isinstance(c, int)))
        return None, f"not benchmarked at concurrency {chosen} (measured: {measured})"
    level = by_level[chosen]
    value, _ = figure(level, judged, stat)
    if value is None:
        what = "time per output token" if judged == "tpot_ms" else "time to first token"
        return None, f"no {stat} {what} at concurrency {chosen}"
    if max_ttft_ms is not None:
        ttft, interval = figure(level, "ttft_ms", stat)
        if ttft is None:
            return None, f"no {stat} time to first token at concurrency {chosen}"
        if ttft > max_ttft_ms:
            shown = f" [{interval[0]:.4g}, {interval[1]:.4g}]" if interval else ""
            return None, (f"{stat} time to first token {ttft:.4g} ms{shown} at concurrency {chosen} > max_ttft_ms "
                          f"{max_ttft_ms:g}")
    return level, ""


def point_source(level: Mapping[str, Any], stat: str, judged: str = "tpot_ms") -> dict[str, Any]:
    """The level as a latency point (the ``judged`` figure, time per output token or to first token, is the latency
    judged), for `measure.statistics.unpaired`."""
    value, value_ci = figure(level, judged, stat)
    ttft, ttft_ci = figure(level, "ttft_ms", stat)
    return {"concurrency": level.get("concurrency"), "latency_ms": {stat: value},
            "latency_ci_ms": {stat: value_ci} if value_ci else {}, "ttft_ms": ttft, "ttft_ci_ms": ttft_ci,
            "requests": level.get("requests"), "throughput_qps": level.get("output_tokens_per_s"),
            "unmeasurable": level.get("unmeasurable")}


def first_token_text(source: Mapping[str, Any], stat: str, max_ttft_ms: float | None) -> str:
    """The time to first token of the chosen level, for the reason."""
    value, interval = source.get("ttft_ms"), source.get("ttft_ci_ms")
    if not isinstance(value, (int, float)):
        return ""
    shown = f"{stat} time to first token {value:.4g} ms" + (f" [{interval[0]:.4g}, {interval[1]:.4g}]"
                                                             if interval else "")
    return shown + (f" (budget {max_ttft_ms:g} ms)" if max_ttft_ms is not None else "")
