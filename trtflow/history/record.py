"""What a run adds to the history: the figures of each node result it used, once per measurement.

`rows_of` is the one place where a finished node's result becomes history rows: its stage's ``figures`` declaration
(`trtflow.stage.Figures`) reads them from the summary the node returned. A measurement is identified by the digest
of that summary, so a run that reuses a cached result adds nothing, and a result measured again under the same key
(after its manifest was removed) adds a new point.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from trtflow.fingerprint import hash_value
from trtflow.stage import Figures, Stage
from trtflow.storage import records

#: Statuses of a node that used a result (built now, reused, or judged by its gate).
USED = frozenset({"done", "cached", "fresh", "gate_failed"})


class FinishedNode(Protocol):
    """The fields of a finished node's result that the history reads (`trtflow.execution.results.NodeResult`)."""

    node: str
    stage: str
    status: str
    key: str | None
    summary: dict[str, Any]


@dataclass(frozen=True)
class RunInfo:
    """The run recording the rows."""

    run_id: str
    recipe_id: str
    recorded: float = 0.0  # when (time.time()); 0: now


def rows_of(run: RunInfo, result: FinishedNode, stage: Stage, params: Any) -> list[dict[str, Any]]:
    """The history rows (the journal's ``history`` columns) of one finished node: one per figure its stage reads
    from the result's summary; none when the node used no result or its stage declares no figures."""
    if stage.figures is None or result.status not in USED or not result.summary:
        return []
    found = stage.figures(params, result.summary)
    if not isinstance(found, Figures):
        raise TypeError(f"stage {stage.name}: figures() must return trtflow.stage.Figures, got {type(found).__name__}")
    measurement = hash_value(result.summary)
    recorded = run.recorded or time.time()
    facts = json.dumps(dict(found.facts), sort_keys=True, default=str)
    rows = []
    for figure in found.figures:
        if not _finite(figure.value):
            continue
        rows.append({
            "recipe_id": run.recipe_id, "node": result.node, "figure": figure.name, "measurement": measurement,
            "run_id": run.run_id, "recorded": recorded, "stage": result.stage, "key": result.key,
            "value": float(figure.value), "low": _number(figure.low), "high": _number(figure.high),
            "n": figure.n, "unit": figure.unit, "better": figure.better, "is_primary": int(figure.primary),
            "facts": facts, "context": json.dumps(dict(figure.context), sort_keys=True, default=str),
        })
    return rows


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(value: Any) -> float | None:
    return float(value) if _finite(value) else None


def parse(row: Mapping[str, Any], column: str) -> dict[str, Any]:
    """A JSON column of a history row (``facts``, ``context``) as a dict; {} when absent or unreadable."""
    text = row.get(column)
    if not text:
        return {}
    try:
        return records.parse(records.FIGURE_FACTS, text if isinstance(text, str) else "", f"{column} of a history row")
    except records.Damaged:
        return {}
