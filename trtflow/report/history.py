"""The recipe's history as people read it: `trtflow history` (terminal, JSON) and the HTML report's trend section.

`load` reads a recipe file's series from the journal and finds their change points where Apache Otava is
installed; without it the trend is still shown, and ``note`` says why the change points are missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trtflow.history.changes import EXTRA_HINT, unavailable
from trtflow.history.trend import Series, find_changes, series_of
from trtflow.storage.journal import Journal

SPARKS = "▁▂▃▄▅▆▇█"


@dataclass
class History:
    recipe_id: str
    series: list[Series]
    note: str = ""  # why change points are missing, if they are
    recorded: int = 0  # series recorded for the recipe (before filtering)


def load(journal: Journal, recipe_id: str, nodes: Sequence[str] = (), figure: str | None = None,
         last: int | None = None, all_figures: bool = False) -> History:
    """The series of a recipe file (primary figures unless ``all_figures``; names containing ``figure``), with their
    change points where the detector is installed."""
    recorded = series_of(journal.history(recipe_id, nodes), last)
    series = [s for s in recorded
              if (all_figures or s.primary) and (figure is None or figure.lower() in s.figure.lower())]
    reason = unavailable()
    if reason is None:
        find_changes(series)
        return History(recipe_id, series, recorded=len(recorded))
    return History(recipe_id, series, f"{reason}: {EXTRA_HINT}", len(recorded))


def sparkline(values: Sequence[float]) -> str:
    if not values:
        return ""
    low, high = min(values), max(values)
    span = high - low
    return "".join(SPARKS[min(int((v - low) / span * len(SPARKS)), len(SPARKS) - 1)] if span else SPARKS[3]
                   for v in values)


def _interval(low: float | None, high: float | None) -> str:
    if low is None and high is None:
        return ""
    return f" (95% interval {'-' if low is None else f'{low:.4g}'} to {'open' if high is None else f'{high:.4g}'})"


def text_lines(history: History, runs: bool = False) -> list[str]:
    """The terminal view: per series its range, a sparkline, the latest figure and the change points."""
    if not history.series and history.recorded:
        return [f"none of the {history.recorded} figure(s) recorded for {history.recipe_id} matches (only primary "
                "figures are shown without --all)"]
    if not history.series:
        return [f"no figures recorded for {history.recipe_id} yet: a run records each benchmark node's figures "
                "when it measures them"]
    lines = []
    for s in history.series:
        first, latest = s.points[0], s.points[-1]
        lines.append(f"{s.node} ({s.stage}): {s.figure} [{s.unit}, {s.better} is better"
                     f"{', primary' if s.primary else ''}]: {len(s.points)} run(s), {first.when} to {latest.when}")
        lines.append(f"  {sparkline(s.values)}  {min(s.values):.4g} to {max(s.values):.4g} {s.unit}")
        lines.append(f"  latest: {s.describe(latest.value)}{_interval(latest.low, latest.high)}"
                     + (f", n {latest.n}" if latest.n else "") + f", run {latest.run_id}")
        if s.changes is None:
            pass
        elif not s.changes:
            lines.append("  change points: none")
        for c in s.changes or []:
            lines.append(f"  change point at run {c.run_id} ({c.when}): {s.describe(c.mean_before)} -> "
                         f"{s.describe(c.mean_after)} ({c.percent:+.1f}%, p {c.pvalue:.2g}): {c.kind}")
        if runs:
            starts = {c.index for c in s.changes or []}
            for index, p in enumerate(s.points):
                mark = "  <- change" if index in starts else ""
                where = ", ".join(str(p.facts[k]) for k in ("gpu", "cpu") if p.facts.get(k) not in (None, "", "none"))
                lines.append(f"    {p.when}  {p.run_id}  {p.value:.4g}{_interval(p.low, p.high)}"
                             + (f"  n {p.n}" if p.n else "") + f"  key {(p.key or '-')[:12]}"
                             + (f"  {where}" if where else "") + mark)
    if history.note:
        lines.append(f"change points not computed: {history.note}")
    return lines


def as_json(history: History) -> dict[str, Any]:
    return {
        "recipe": history.recipe_id, "note": history.note or None,
        "series": [{
            "node": s.node, "stage": s.stage, "figure": s.figure, "unit": s.unit, "better": s.better,
            "primary": s.primary,
            "points": [{"run_id": p.run_id, "recorded": p.recorded, "value": p.value, "low": p.low, "high": p.high,
                        "n": p.n, "key": p.key, "facts": dict(p.facts), "context": dict(p.context)} for p in s.points],
            "changes": None if s.changes is None else [{
                "index": c.index, "run_id": c.run_id, "recorded": c.recorded, "mean_before": c.mean_before,
                "mean_after": c.mean_after, "percent": c.percent, "pvalue": c.pvalue, "kind": c.kind}
                for c in s.changes],
        } for s in history.series],
    }


def html_sections(history: History) -> list[dict[str, Any]]:
    """Per series with two runs or more: its chart, its change points and its latest figure, for the HTML report."""
    from trtflow.report import charts

    sections = []
    for s in history.series:
        points = [{"when": p.recorded * 1000.0, "value": p.value, "low": p.low, "high": p.high} for p in s.points]
        changes = [{"when": c.recorded * 1000.0, "kind": c.kind, "label": f"{c.percent:+.1f}%"}
                   for c in s.changes or []]
        svg = charts.history_trend(points, changes, f"{s.node}: {s.figure}", s.unit)
        if not svg:
            continue
        latest = s.points[-1]
        sections.append({
            "node": s.node, "figure": s.figure, "unit": s.unit, "better": s.better, "runs": len(s.points),
            "svg": svg, "latest": f"{s.describe(latest.value)}{_interval(latest.low, latest.high)}"
            + (f", n {latest.n}" if latest.n else ""),
            "changes": [{"run": c.run_id, "when": c.when, "before": s.describe(c.mean_before),
                         "after": s.describe(c.mean_after), "percent": f"{c.percent:+.1f}%",
                         "pvalue": f"{c.pvalue:.2g}", "kind": c.kind} for c in s.changes or []],
            "computed": s.changes is not None,
        })
    return sections
