"""What a run shipped and which candidates it rejected: the outcome of its choices, told apart from its failures.

A candidate whose evaluation (a validate or benchmark node) fails its quality gate is an outcome of the decision,
not a failure of the run, when every node that evaluation feeds is a chooser (``select``) that succeeded and chose
another candidate: the run ends with what shipped and each rejected candidate with its node and reason, and exits 0.
Everything else a failed gate touches still fails the run (exit 1): a gate on the candidate a chooser picked (the
shipped model), a gate whose node feeds anything but a chooser, a chooser that chose nothing ("nothing to ship"), or
any rejection at all when the recipe says ``require_all_candidates: true``. `rejections` is the one rule:
`RunSummary.ok` (the run's exit code and its status in the journal) and the console's summary both read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.execution.results import GATE_FAILED, SUCCESS, NodeResult
from trtflow.graph import Graph
from trtflow.storage.records import selection_of


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
    """The nodes whose failed gate rejected a candidate and failed nothing the run shipped: each one's every
    consumer is a chooser that succeeded, picked a candidate, and did not pick the one this node evaluated."""
    found: dict[str, list[Rejection]] = {}
    for result in results.values():
        if result.status != GATE_FAILED:
            continue
        consumers = graph.downstream(result.node)
        made = [_rejected_by(result, results.get(consumer)) for consumer in consumers]
        if made and all(r is not None for r in made):
            found[result.node] = [r for r in made if r is not None]
    return found


def _rejected_by(result: NodeResult, chooser: NodeResult | None) -> Rejection | None:
    if chooser is None or chooser.status not in SUCCESS:
        return None
    selection = selection_of(chooser.summary)
    if selection is None or selection.get("selected") is None:
        return None
    row = next((row for row in selection["candidates"] if result.node in _evaluations(row)), None)
    if row is None or row.get("name") == selection["selected"]:
        return None
    return Rejection(result.node, str(row["name"]), chooser.node, result.error or "its quality gate failed",
                     str(row.get("reason") or "not chosen"))


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
