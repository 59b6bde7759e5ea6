"""What changed in a recipe's decisions between its last two finished runs (`trtflow history --check`): a node
whose gate newly failed (a candidate select now rejects, which fails no run by itself: `execution.outcome`), and a
chooser whose pick changed. A newly failing gate fails the check; a changed pick is reported and fails nothing (two
candidates within noise of each other may trade places from one night to the next)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trtflow.storage.journal import Journal
from trtflow.storage.records import selection_of, summary_of
from trtflow.verdicts import failures, recorded

PASSED = frozenset({"done", "cached", "fresh"})
FINISHED = frozenset({"ok", "failed"})  # runs that ran to their end: an interrupted one decided nothing


@dataclass(frozen=True)
class DecisionChange:
    message: str
    fails: bool  # True: a gate that passed in the run before fails now


@dataclass(frozen=True)
class _State:
    status: str
    error: str
    summary: Mapping[str, Any]


def decision_changes(journal: Journal, recipe_id: str, nodes: tuple[str, ...] = ()) -> list[DecisionChange]:
    """The changes from the recipe's previous finished run to its latest one (only ``nodes``, when named)."""
    runs = [run for run in journal.runs(50, recipe_id) if run.get("status") in FINISHED][:2]
    if len(runs) < 2:
        return []
    latest, before = (_states(journal, run["id"], recipe_id) for run in runs)
    since = f"(run {runs[1]['id']} -> {runs[0]['id']})"
    candidates = _candidates(latest)
    changes = []
    for node, now in latest.items():
        was = before.get(node)
        if was is None or (nodes and node not in nodes):
            continue
        if now.status == "gate_failed" and was.status in PASSED:
            what = f"candidate {candidates[node]} ({node})" if node in candidates else node
            changes.append(DecisionChange(f"{what}: newly failing its gate {since}: {' '.join(now.error.split())}",
                                          True))
        picked, picked_before = selection_of(now.summary), selection_of(was.summary)
        if picked is not None and picked_before is not None \
                and picked.get("selected") != picked_before.get("selected"):
            changes.append(DecisionChange(
                f"{node}: the pick changed from {picked_before.get('selected') or 'nothing'} to "
                f"{picked.get('selected') or 'nothing'} {since}", False))
    return changes


def _states(journal: Journal, run_id: str, recipe_id: str) -> dict[str, _State]:
    """Each node of a run: its status, error and summary (an up-to-date node's from the run that built it)."""
    states = {}
    for row in journal.node_runs(run_id):
        where = f"of node {row['node']!r} in {journal.path}"
        summary = summary_of(row["summary"], where) or {}
        if not summary and row["status"] == "fresh":
            last = journal.last_executed(row["node"], recipe_id)
            summary = (summary_of(last["summary"], where) or {}) if last else {}
        error = row["error"] or "; ".join(failures(recorded(summary)))  # an up-to-date node's: its verdicts'
        states[row["node"]] = _State(row["status"], error, summary)
    return states


def _candidates(states: Mapping[str, _State]) -> dict[str, str]:
    """The candidate each evaluation node evaluated, as the run's choosers name them."""
    found = {}
    for state in states.values():
        selection = selection_of(state.summary)
        rows: list[Mapping[str, Any]] = list(selection["candidates"]) if selection is not None else []
        for row in rows:
            for part in (row.get("validation"), row.get("benchmark")):
                if isinstance(part, Mapping) and part.get("node"):
                    found[str(part["node"])] = str(row.get("name"))
    return found
