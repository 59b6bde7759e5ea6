"""What a run shipped and which candidates it rejected: the outcome of its choices, told apart from its failures.

A candidate whose evaluation (a validate or benchmark node) fails its quality gate is an outcome of the decision,
not a failure of the run, only when nothing can ship it: the evaluation takes the candidate through its chooser's
``evaluated_slots`` (never as a reference), every node that evaluation feeds is a chooser (``select``) that
succeeded and chose another candidate, and every path from the candidate itself ends there too (each node taking
it is such a chooser, or such an evaluation of it). The run then ends with what shipped and each rejected candidate
with its node and reason, and exits 0. Everything else a failed gate touches still fails the run (exit 1): a gate on
the candidate a chooser picked (the shipped model), a gate whose node feeds anything but a chooser, a candidate that
also reaches a triton, build or any other node or a chooser that picked it, failed or did not run, a chooser that
chose nothing ("nothing to ship"), or any rejection at all when the recipe says ``require_all_candidates: true``.
`rejections` is the one rule:
`RunSummary.ok` (the run's exit code and its status in the journal) and the console's summary both read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtflow.execution.results import GATE_FAILED, SUCCESS, NodeResult
from trtflow.storage.records import selection_of
from trtflow.summaries import evaluated_candidates

if TYPE_CHECKING:  # the graph (and the recipe's pydantic models under it) stays off the no-op shortcut's path
    from trtflow.graph import Graph


@dataclass(frozen=True)
class Rejection:
    """A candidate a chooser did not pick, whose evaluation failed its gate."""

    node: str  # the evaluation whose gate failed (validate-quantize)
    candidate: str  # the candidate it evaluated (quantize)
    chooser: str  # the node that chose another candidate (select)
    error: str  # the gate's failures
    reason: str  # why the chooser did not pick it (its row in selection.json)


@dataclass(frozen=True)
class Shipment:
    """What a chooser picked, and the outputs of it and of the nodes after it (an engine, a Triton repository)."""

    chooser: str
    candidate: str
    outputs: dict[str, tuple[Path, ...]]  # node -> its outputs under build/, the chooser first


def rejections(graph: Graph, results: Mapping[str, NodeResult]) -> dict[str, list[Rejection]]:
    """The nodes whose failed gate rejected a candidate and failed nothing the run shipped: each one evaluates a
    candidate through its chooser's ``evaluated_slots`` and every one of its consumers is a chooser that succeeded,
    picked a candidate and did not pick that one; and the candidate itself reaches nothing else
    (`_goes_nowhere`). Anything else is a failure of the run, as before."""
    found: dict[str, list[Rejection]] = {}
    for result in results.values():
        if result.status == GATE_FAILED and (made := _rejected(graph, results, result)):
            found[result.node] = made
    return found


@dataclass(frozen=True)
class _Chooser:
    """A chooser that succeeded and picked a candidate: its selection and the slots its evaluations take their
    candidate through."""

    node: str
    selected: str
    rows: Mapping[str, Mapping[str, Any]]  # candidate -> its row in selection.json
    evaluated_slots: frozenset[str]


def _chooser(graph: Graph, results: Mapping[str, NodeResult], node: str) -> _Chooser | None:
    result = results.get(node)
    if result is None or result.status not in SUCCESS:
        return None
    selection = selection_of(result.summary)
    slots = graph.nodes[node].params.get("evaluated_slots") if node in graph.nodes else None
    if selection is None or selection.get("selected") is None or not isinstance(slots, list):
        return None
    rows = {str(row.get("name")): row for row in selection["candidates"]}
    return _Chooser(node, str(selection["selected"]), rows, frozenset(str(s) for s in slots))


def _evaluated(graph: Graph, node: str, chooser: _Chooser) -> str | None:
    """The one candidate of ``chooser`` that ``node`` takes through an evaluated slot (what its gate judges)."""
    inputs = {slot: [src for src, _ in refs] for slot, refs in graph.nodes[node].upstream.items()}
    taken = evaluated_candidates(inputs, chooser.rows, chooser.evaluated_slots)
    return taken[0] if len(taken) == 1 else None


def _rejects(graph: Graph, chooser: _Chooser, evaluation: str, candidate: str) -> bool:
    """Whether ``chooser`` did not pick ``candidate`` and took ``evaluation`` as that candidate's evaluation."""
    row = chooser.rows.get(candidate)
    return (chooser.selected != candidate and row is not None and evaluation in _evaluations(row)
            and _evaluated(graph, evaluation, chooser) == candidate)


def _rejected(graph: Graph, results: Mapping[str, NodeResult], result: NodeResult) -> list[Rejection]:
    consumers = [_chooser(graph, results, node) for node in graph.downstream(result.node)]
    if not consumers or any(c is None for c in consumers):
        return []
    choosers = [c for c in consumers if c is not None]
    candidates = {_evaluated(graph, result.node, c) for c in choosers}
    candidate = candidates.pop() if len(candidates) == 1 else None
    if candidate is None or not all(_rejects(graph, c, result.node, candidate) for c in choosers):
        return []
    if not _goes_nowhere(graph, results, candidate):
        return []
    return [Rejection(result.node, candidate, c.node, result.error or "its quality gate failed",
                      str(c.rows[candidate].get("reason") or "not chosen")) for c in choosers]


def _goes_nowhere(graph: Graph, results: Mapping[str, NodeResult], candidate: str) -> bool:
    """Whether every path from ``candidate`` ends at a chooser that succeeded and picked another candidate: each
    node taking it is such a chooser, or an evaluation of it (it takes the candidate through an evaluated slot) whose
    every consumer is such a chooser. A candidate reaching anything else (a triton or build node, another stage,
    a chooser that picked it, failed or did not run, a node taking it as its reference) may ship: its failed gate
    fails the run."""
    for node in graph.downstream(candidate):
        chooser = _chooser(graph, results, node)
        if chooser is not None and candidate in chooser.rows:
            if chooser.selected == candidate:
                return False
            continue
        after = [_chooser(graph, results, consumer) for consumer in graph.downstream(node)]
        if not after or not all(c is not None and _rejects(graph, c, node, candidate) for c in after):
            return False
    return True


def _evaluations(row: Mapping[str, Any]) -> set[str]:
    """The nodes that evaluated a chooser's candidate (its validation's and its benchmark's)."""
    return {str(part["node"]) for part in (row.get("validation"), row.get("benchmark"))
            if isinstance(part, Mapping) and part.get("node")}


def shipments(graph: Graph, results: Mapping[str, NodeResult]) -> list[Shipment]:
    """Each chooser of the run that picked a candidate, with its outputs and those of the nodes after it that
    succeeded."""
    shipped = []
    for result in results.values():
        selection = selection_of(result.summary)
        if result.status not in SUCCESS or selection is None or selection.get("selected") is None:
            continue
        outputs = {result.node: tuple(sorted(result.outputs.values()))}
        for node in _after(graph, result.node):
            after = results.get(node)
            if after is not None and after.status in SUCCESS and after.outputs:
                outputs[node] = tuple(sorted(after.outputs.values()))
        shipped.append(Shipment(result.node, str(selection["selected"]), outputs))
    return shipped


def nothing_to_ship(results: Iterable[NodeResult]) -> list[str]:
    """The choosers whose gate failed because no candidate qualifies."""
    return [r.node for r in results if r.status == GATE_FAILED
            and (selection := selection_of(r.summary)) is not None and selection.get("selected") is None]


def _after(graph: Graph, node: str) -> list[str]:
    """Every node downstream of ``node``, in the graph's order."""
    seen: set[str] = set()
    todo = [node]
    while todo:
        for consumer in graph.downstream(todo.pop()):
            if consumer not in seen:
                seen.add(consumer)
                todo.append(consumer)
    return [name for name in graph.nodes if name in seen]
