"""The decision a report leads with, read from the run's data (`formats.collect`): one per chooser node.

A chooser node (the ``select`` stage, or any stage whose summary has the same shape) summarises every
candidate with its accuracy, benchmark points and the reason it won, lost or was excluded. This module turns
that into table rows and chart series; it does not know how the selection was made. It reads the summaries only
through their declared types (`trtflow.summaries`: `SelectionSummary`, `BenchmarkSummary`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from trtflow.digits import decimals_apart
from trtflow.storage.records import benchmark_of, selection_of
from trtflow.summaries import SelectionSummary


@dataclass
class Decision:
    node: str
    selected: str | None
    objective: str
    percentile: str
    constraints: list[str]
    baseline: str | None
    rows: list[dict[str, Any]]  # one per candidate, for the table
    batch_sizes: list[int]  # the union of benchmarked batch sizes (table columns)
    series: list[dict[str, Any]] = field(default_factory=list)  # per candidate and batch (charts)
    load: list[dict[str, Any]] = field(default_factory=list)  # per candidate and load level (charts)
    charts: list[tuple[str, str]] = field(default_factory=list)  # (title, SVG), filled by the HTML report
    tied: list[str] = field(default_factory=list)  # candidates tied within noise with the best (the tie-breakers chose)
    note: str = ""  # how the winner was chosen when it was a tie within noise
    cosine_format: str = "%.6f"  # enough decimals to tell the candidates' cosine similarities apart
    generation: bool = False  # judged on generation: time to first token and per output token, tokens matched
    flags: dict[str, list[str]] = field(default_factory=dict)  # per benchmark node, its flags (`benchmark_flags`)


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def decisions(data: Mapping[str, Any]) -> list[Decision]:
    return [decision(n["node"], summary) for n in data["nodes"]
            if (summary := selection_of(n.get("summary"))) is not None]


def decision(node: str, summary: SelectionSummary) -> Decision:
    objective = summary.get("objective") or {}
    stat = objective.get("percentile") or "p50"
    candidates = summary["candidates"]
    measured = [perf for c in candidates if (perf := c.get("benchmark"))]
    batches = sorted({batch for perf in measured for p in perf.get("points", [])
                      if isinstance(batch := p.get("batch_size"), int)})
    rows: list[dict[str, Any]] = []
    series: list[dict[str, Any]] = []
    load: list[dict[str, Any]] = []
    for c in candidates:
        validation: Mapping[str, Any] = c.get("validation") or {}
        bench: Mapping[str, Any] = c.get("benchmark") or {}
        point: Mapping[str, Any] = c.get("operating_point") or {}
        by_batch = {p.get("batch_size"): p for p in bench.get("points", [])}
        status = "selected" if c["name"] == summary.get("selected") else "eligible" if c.get("eligible") \
            else "excluded"
        rows.append({
            "name": c["name"], "status": status, "kind": c.get("kind"), "precision": c.get("precision") or "",
            "profiles": ", ".join(c.get("profiles") or []) or "", "size_mb": c.get("size_bytes", 0) / 1e6,
            "cosine": validation.get("cosine_similarity"), "mean_abs_error": validation.get("mean_abs_error"),
            "validation": "" if not validation else ("pass" if validation.get("passed") else "fail"),
            "latency": {b: ((by_batch.get(b) or {}).get("latency_ms") or {}) for b in batches},
            "latency_ci": {b: ((by_batch.get(b) or {}).get("latency_ci_ms") or {}) for b in batches},
            "throughput": point.get("throughput_qps"), "at": point.get("description") or "",
            "operating_latency": point.get("latency_ms"), "operating_latency_ci": point.get("latency_ci_ms"),
            "speedup": c.get("speedup"), "tie": bool(c.get("tie")),
            "pareto": bool(c.get("pareto")), "reason": c.get("reason") or "",
            "backend": " ".join(filter(None, [bench.get("backend"), bench.get("device")])),
            **_generation_row(bench, validation, stat),
        })
        for p in bench.get("points", []):
            latency = p.get("latency_ms") or {}
            series.append({"candidate": c["name"], "status": status, "batch_size": p.get("batch_size"),
                           "p50": latency.get("p50"), stat: latency.get(stat),
                           "throughput_qps": p.get("throughput_qps"), "throughput_ci": p.get("throughput_ci_qps"),
                           "intervals": dict(p.get("latency_ci_ms") or {})})
        for level in bench.get("load", []):
            latency = level.get("latency_ms") or {}
            if _number(level.get("throughput_qps")) and _number(latency.get(stat)):
                load.append({"candidate": c["name"], "concurrency": level.get("concurrency"),
                             "throughput_qps": level["throughput_qps"], "latency_ms": latency[stat]})
    decimals = decimals_apart([r["cosine"] for r in rows], least=6)  # 1.0000000 vs 0.9999999, not 1.000000 twice
    winner: Mapping[str, Any] = next((c for c in candidates if c["name"] == summary.get("selected")), {})
    tied = list(summary.get("tied") or [])
    return Decision(node=node, selected=summary.get("selected"), objective=objective.get("description", ""),
                    percentile=stat, constraints=[c.get("text", str(c)) for c in summary.get("constraints") or []],
                    baseline=summary.get("baseline"), rows=rows, batch_sizes=batches, series=series, load=load,
                    tied=tied, note=(winner.get("reason") or "").removeprefix("selected: ") if len(tied) > 1 else "",
                    cosine_format=f"%.{decimals}f", generation=any(r["ttft"] is not None for r in rows),
                    flags=benchmark_flags(summary))


def _generation_row(bench: Mapping[str, Any], validation: Mapping[str, Any], stat: str) -> dict[str, Any]:
    """A candidate's generation figures at its first level (the lowest concurrency): time to first token and per
    output token at ``stat`` with their 95% intervals, output tokens per second, and the tokens it matched."""
    levels = bench.get("generation") or []
    level = levels[0] if levels else {}

    def figure(which: str) -> tuple[float | None, list[float] | None]:
        figures = level.get(which) or {}
        value = figures.get(stat)
        interval = (figures.get("ci") or {}).get(stat)
        return (float(value) if _number(value) else None,
                list(interval) if isinstance(interval, (list, tuple)) and len(interval) == 2 else None)

    ttft, ttft_ci = figure("ttft_ms")
    tpot, tpot_ci = figure("tpot_ms")
    return {"ttft": ttft, "ttft_ci": ttft_ci, "tpot": tpot, "tpot_ci": tpot_ci,
            "tokens_per_s": level.get("output_tokens_per_s") if _number(level.get("output_tokens_per_s")) else None,
            "concurrency": level.get("concurrency"), "tokens_matched": validation.get("tokens_matched"),
            "tokens_until_difference": validation.get("tokens_until_difference")}


def benchmark_series(nodes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Latency per batch size of every benchmark node (its summary's points), for runs without a chooser."""
    series = []
    for n in nodes:
        summary = benchmark_of(n.get("summary"))
        if summary is None:
            continue
        for p in summary["points"]:
            if isinstance(p, Mapping) and _number(p.get("median_ms")):
                series.append({"candidate": n["node"], "status": "eligible", "batch_size": p.get("batch_size"),
                               "p50": p["median_ms"], "p99": p.get("p99_ms"),
                               "throughput_qps": p.get("throughput_qps"),
                               "throughput_ci": p.get("throughput_ci_qps"),
                               "intervals": dict(p.get("latency_ci_ms") or {})})
    return series


def gate_notes(nodes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every gate verdict of every node as the engine judged it (`trtflow.verdicts.recorded`), the ones that
    decide first: outcome, figure with its interval, basis (paired A/B or stored figures), pairs and power."""
    from trtflow.verdicts import recorded

    notes = []
    for n in nodes:
        for verdict in recorded(n.get("summary")):
            interval = verdict.interval
            notes.append({"node": n["node"], "verdict": verdict.outcome, "gate": verdict.gate,
                          "message": verdict.reason, "primary": verdict.primary, "basis": verdict.basis,
                          "blocking": verdict.blocking, "pairs": verdict.pairs, "power": verdict.power or "",
                          "figure": verdict.figure, "where": verdict.where,
                          "estimate": verdict.estimate, "interval": list(interval) if interval else None,
                          "on_inconclusive": verdict.on_inconclusive})
    return sorted(notes, key=lambda note: (not note["primary"], note["verdict"] == "pass"))


def benchmark_flags(summary: SelectionSummary) -> dict[str, list[str]]:
    """Per benchmark node a selection rested on, the flags its measurements carry (``busy-host``,
    ``not-converged``, ...: `measure.statistics.stats`, `measure.timing.windows`, `measure.timing.interference`), each
    with where it was raised (batch size or concurrency), and the candidates select found unmeasurable (the benchmark
    waited for a CPU most of the time)."""
    flags: dict[str, list[str]] = {}
    for c in summary.get("candidates") or []:
        bench: Mapping[str, Any] = c.get("benchmark") or {}
        node = bench.get("node") or c.get("name")
        raised: dict[str, list[str]] = {}
        for p in bench.get("points") or []:
            for flag in p.get("flags") or []:
                raised.setdefault(str(flag), []).append(f"batch {p.get('batch_size')}")
        for level in bench.get("generation") or []:
            for flag in level.get("flags") or []:
                raised.setdefault(str(flag), []).append(f"concurrency {level.get('concurrency')}")
        found = [f"{flag} ({', '.join(dict.fromkeys(where))})" for flag, where in sorted(raised.items())]
        if c.get("unmeasurable") or (summary.get("unmeasurable") or {}).get(c.get("name")):
            found.append("unmeasurable")
        if found:
            flags[str(node)] = found
    return flags


def headline(node: str, summary: SelectionSummary) -> str:
    """One line: what a chooser node chose and why (its winner's reason: the objective, the figure with its 95%
    interval, the margin or the tie-break), and the flags of the benchmarks it rested on. Plain text."""
    objective = (summary.get("objective") or {}).get("description") or "its objective"
    selected = summary.get("selected")
    if selected is None:
        line = f"{node}: no candidate qualifies for {objective}"
    else:
        winner: Mapping[str, Any] = next((c for c in summary["candidates"] if c.get("name") == selected), {})
        reason = (winner.get("reason") or objective).removeprefix("selected: ")
        line = f"{node}: chose {selected}: {reason}"
    flags = benchmark_flags(summary)
    if flags:
        line += "; benchmarks flagged: " + "; ".join(f"{bench} {', '.join(found)}" for bench, found in flags.items())
    return line
