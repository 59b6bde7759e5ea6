"""The pipeline graph: concrete nodes joined by typed artifact edges, checked before any work runs."""

from __future__ import annotations

import bisect
import graphlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trtflow.errors import RecipeError, did_you_mean
from trtflow.recipe.expand import ConcreteNode
from trtflow.stage import Stage


class NoMatchingVariant(RecipeError):
    """A reference to a matrix node none of whose variants agrees with the referring node's matrix."""


@dataclass
class Graph:
    nodes: dict[str, ConcreteNode]  # in topological order
    stages: dict[str, Stage]
    recipe_name: str
    _downstream: dict[str, list[str]] | None = field(default=None, init=False, repr=False, compare=False)
    _by_template: dict[str, list[str]] | None = field(default=None, init=False, repr=False, compare=False)

    def upstream(self, name: str) -> list[str]:
        """The nodes ``name`` takes inputs from, in slot order, each once."""
        return list(dict.fromkeys(src for refs in self.nodes[name].upstream.values() for src, _ in refs))

    def input_sources(self, name: str) -> dict[str, list[dict[str, Any]]]:
        """Per input slot of ``name``, where each input comes from: the producer's name, template, matrix and own
        inputs (what a stage sees as ``ctx.input_sources``)."""
        sources: dict[str, list[dict[str, Any]]] = {}
        for slot, refs in self.nodes[name].upstream.items():
            sources[slot] = []
            for src, _ in refs:
                producer = self.nodes[src]
                sources[slot].append({"node": src, "template": producer.template, "matrix": producer.matrix,
                                      "inputs": {s: [n for n, _ in r] for s, r in producer.upstream.items()}})
        return sources

    def downstream(self, name: str) -> list[str]:
        """The nodes that take an input from ``name``, in graph order."""
        if self._downstream is None:
            index: dict[str, list[str]] = {n: [] for n in self.nodes}
            for n in self.nodes:
                for src in self.upstream(n):
                    if src in index:
                        index[src].append(n)
            self._downstream = index
        return list(self._downstream.get(name, []))

    def closure_upstream(self, targets: list[str]) -> set[str]:
        keep: set[str] = set()
        stack = list(targets)
        while stack:
            name = stack.pop()
            if name not in keep:
                keep.add(name)
                stack.extend(self.upstream(name))
        return keep

    def resolve_targets(self, targets: list[str]) -> list[str]:
        """Node names for ``targets``: each a node name, or a matrix node's name standing for all its variants.

        Raises RecipeError (exit code 2) naming an unknown target, with the closest name as a hint.
        """
        if self._by_template is None:
            by_template: dict[str, list[str]] = {}
            for n, node in self.nodes.items():
                by_template.setdefault(node.template, []).append(n)
            self._by_template = by_template
        names: list[str] = []
        for target in targets:
            matched = [target] if target in self.nodes else self._by_template.get(target, [])
            if not matched:
                raise RecipeError(f"no node named {target!r} in recipe {self.recipe_name!r}",
                                  hint=did_you_mean(target, [*self.nodes, *self._by_template])
                                  or "see `trtflow plan`")
            names.extend(m for m in matched if m not in names)
        return names

    def select(self, targets: list[str]) -> Graph:
        """The sub-graph needed to produce ``targets`` (node names or template names)."""
        keep = self.closure_upstream(self.resolve_targets(targets))
        return Graph({n: node for n, node in self.nodes.items() if n in keep}, self.stages, self.recipe_name)


def build_graph(nodes: list[ConcreteNode], get_stage: Callable[[str], Stage], recipe_name: str) -> Graph:
    """Resolve input references, check kinds, duplicates and cycles, and order nodes topologically."""
    by_name: dict[str, ConcreteNode] = {}
    for node in nodes:
        if node.name in by_name:
            other = by_name[node.name]
            raise RecipeError(
                f"duplicate node name {node.name!r} (also defined at {other.location or 'an earlier node'})",
                node.location, "name", hint="give every node (and matrix variant) a unique name",
            )
        by_name[node.name] = node
    by_template: dict[str, list[ConcreteNode]] = {}
    for node in nodes:
        by_template.setdefault(node.template, []).append(node)
    stages = {node.stage: get_stage(node.stage) for node in nodes}
    producers = _Producers(nodes, stages)

    for node in nodes:
        stage = stages[node.stage]
        unknown = set(node.input_refs) - set(stage.inputs)
        for slot in sorted(unknown):
            raise RecipeError(
                f"node {node.name!r}: stage {node.stage!r} has no input {slot!r}", node.location, f"inputs.{slot}",
                hint=did_you_mean(slot, list(stage.inputs)) or f"its inputs: {', '.join(stage.inputs) or 'none'}",
            )
        for slot, spec in stage.inputs.items():
            refs = node.input_refs.get(slot)
            if refs is None:
                if spec.optional:
                    continue
                if spec.many:
                    raise RecipeError(
                        f"node {node.name!r} needs input {slot!r}: a list of nodes producing "
                        f"{'/'.join(spec.kinds)}", node.location, f"inputs.{slot}",
                        hint=f"add `inputs: {{{slot}: [<node>, <node>, ...]}}`")
                node.upstream[slot] = [_default_input(node, slot, spec.kinds, producers, stages)]
                continue
            if spec.many:
                node.upstream[slot] = _resolve_many(node, slot, spec.kinds, refs, by_name, by_template, stages)
                continue
            resolved: list[tuple[str, str]] = []
            if len(refs) == 1:
                resolved = _resolve_ref(node, slot, spec.kinds, refs[0], by_name, by_template, stages)
            else:  # a list offers alternatives: keep the variants whose matrix values agree with this node
                for ref in refs:
                    try:
                        resolved.extend(_resolve_ref(node, slot, spec.kinds, ref, by_name, by_template, stages))
                    except NoMatchingVariant:
                        continue
                if not resolved:
                    raise RecipeError(
                        f"node {node.name!r}: none of {', '.join(refs)} has a variant matching this node's "
                        f"matrix values {node.matrix}", node.location, f"inputs.{slot}",
                    )
            if len(resolved) > 1:
                raise RecipeError(
                    f"node {node.name!r}: input {slot!r} takes one artifact but the references give "
                    f"{len(resolved)}: {', '.join(f'{n}.{o}' for n, o in resolved)}",
                    node.location, f"inputs.{slot}", hint="refer to a single node or matrix variant",
                )
            node.upstream[slot] = resolved
    order = _topological_order(nodes)
    return Graph({n.name: n for n in order}, stages, recipe_name)


def _outputs_of_kind(stage: Stage, kinds: tuple[str, ...]) -> list[str]:
    return [name for name, out in stage.outputs.items() if out.kind in kinds]


class _Producers:
    """Which recipe nodes produce which artifact kinds, to find a node's default input without a scan."""

    def __init__(self, nodes: list[ConcreteNode], stages: dict[str, Stage]) -> None:
        self.nodes = nodes
        self.stages = stages
        self.variants: dict[int, list[ConcreteNode]] = {}  # recipe position -> its concrete nodes
        for node in nodes:
            self.variants.setdefault(node.index, []).append(node)
        self.positions: dict[tuple[str, ...], list[int]] = {}  # kinds -> sorted positions of producers

    def latest_before(self, index: int, kinds: tuple[str, ...]) -> list[ConcreteNode]:
        """The variants of the last recipe node before position ``index`` that outputs one of ``kinds``."""
        positions = self.positions.get(kinds)
        if positions is None:
            positions = self.positions[kinds] = sorted(
                i for i, variants in self.variants.items() if _outputs_of_kind(self.stages[variants[0].stage], kinds))
        at = bisect.bisect_left(positions, index)
        return self.variants[positions[at - 1]] if at else []


def _default_input(node: ConcreteNode, slot: str, kinds: tuple[str, ...], producers: _Producers,
                   stages: dict[str, Stage]) -> tuple[str, str]:
    earlier = producers.latest_before(node.index, kinds)
    if not earlier:
        raise RecipeError(
            f"node {node.name!r} needs input {slot!r} ({'/'.join(kinds)}) but no earlier node produces one",
            node.location, f"inputs.{slot}", hint=f"add `inputs: {{{slot}: <node>}}` or a node that produces it",
        )
    candidates = _matching_variants(earlier, node)
    if len(candidates) != 1:
        names = ", ".join(c.name for c in candidates)
        raise RecipeError(
            f"node {node.name!r}: input {slot!r} is ambiguous; it could come from any of: {names}",
            node.location, f"inputs.{slot}",
            hint="give the node the same matrix key as its input, or name the input explicitly",
        )
    source = candidates[0]
    return source.name, _outputs_of_kind(stages[source.stage], kinds)[0]


def _matching_variants(candidates: list[ConcreteNode], node: ConcreteNode) -> list[ConcreteNode]:
    """Keep the variants whose matrix values agree with ``node`` on every key they share."""
    def agrees(other: ConcreteNode) -> bool:
        shared = set(other.matrix) & set(node.matrix)
        return all(_same(other.matrix[k], node.matrix[k]) for k in shared)

    return [c for c in candidates if agrees(c)]


def _same(a: Any, b: Any) -> bool:
    return a == b


def _resolve_ref(node: ConcreteNode, slot: str, kinds: tuple[str, ...], ref: str,
                 by_name: dict[str, ConcreteNode], by_template: dict[str, list[ConcreteNode]],
                 stages: dict[str, Stage], every_variant: bool = False) -> list[tuple[str, str]]:
    target, _, output = ref.partition(".") if ref not in by_name and ref not in by_template else (ref, "", "")
    if target not in by_name and target not in by_template:
        # node names may contain dots: try the longest prefix that names a node
        parts = ref.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            head = ".".join(parts[:cut])
            if head in by_name or head in by_template:
                target, output = head, ".".join(parts[cut:])
                break
    if target in by_name:
        sources = [by_name[target]]
    elif target in by_template:
        sources = _matching_variants(by_template[target], node)
        if len(sources) > 1 and not every_variant:
            raise RecipeError(
                f"node {node.name!r}: input {slot!r} refers to {target!r}, which has {len(sources)} variants "
                f"({', '.join(s.name for s in sources)})",
                node.location, f"inputs.{slot}",
                hint="give this node the same matrix keys, or refer to one variant by its full name",
            )
    else:
        candidates = list(by_name) + [t for t in by_template if t not in by_name]
        raise RecipeError(
            f"node {node.name!r}: input {slot!r} refers to unknown node {target!r}", node.location,
            f"inputs.{slot}", hint=did_you_mean(target, candidates) or f"nodes: {', '.join(candidates)}",
        )
    if not sources:
        raise NoMatchingVariant(
            f"node {node.name!r}: no variant of {target!r} matches this node's matrix values "
            f"{node.matrix}", node.location, f"inputs.{slot}",
        )
    resolved = []
    for source in sources:
        if source.name == node.name:
            raise RecipeError(f"node {node.name!r} uses its own output as input {slot!r}", node.location,
                              f"inputs.{slot}")
        stage = stages[source.stage]
        if output:
            if output not in stage.outputs:
                raise RecipeError(
                    f"node {node.name!r}: {source.name!r} has no output {output!r}", node.location,
                    f"inputs.{slot}",
                    hint=did_you_mean(output, list(stage.outputs)) or f"its outputs: {', '.join(stage.outputs)}",
                )
            if stage.outputs[output].kind not in kinds:
                raise RecipeError(
                    f"node {node.name!r}: input {slot!r} takes {'/'.join(kinds)} but {source.name}.{output} is "
                    f"{stage.outputs[output].kind}", node.location, f"inputs.{slot}",
                )
            resolved.append((source.name, output))
        else:
            matching = _outputs_of_kind(stage, kinds)
            if not matching:
                raise RecipeError(
                    f"node {node.name!r}: input {slot!r} takes {'/'.join(kinds)} but {source.name!r} "
                    f"({source.stage}) produces none; its outputs: "
                    f"{', '.join(f'{n} ({o.kind})' for n, o in stage.outputs.items()) or 'none'}",
                    node.location, f"inputs.{slot}",
                )
            resolved.append((source.name, matching[0]))
    return resolved


def _resolve_many(node: ConcreteNode, slot: str, kinds: tuple[str, ...], refs: list[str],
                  by_name: dict[str, ConcreteNode], by_template: dict[str, list[ConcreteNode]],
                  stages: dict[str, Stage]) -> list[tuple[str, str]]:
    """Every artifact the references of a many-slot name: all agreeing variants of a matrix node, in order."""
    resolved: list[tuple[str, str]] = []
    for ref in refs:
        for source in _resolve_ref(node, slot, kinds, ref, by_name, by_template, stages, every_variant=True):
            if source not in resolved:
                resolved.append(source)
    return resolved


def _topological_order(nodes: list[ConcreteNode]) -> list[ConcreteNode]:
    """Nodes in dependency order: each round, every node whose inputs are all placed, in recipe order."""
    by_name = {n.name: n for n in nodes}
    position = {n.name: i for i, n in enumerate(nodes)}
    sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for n in nodes:
        sorter.add(n.name, *(src for refs in n.upstream.values() for src, _ in refs))
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        cycle = _readable_cycle(exc.args[1], position)
        raise RecipeError(f"the nodes form a cycle: {' -> '.join(cycle)}", by_name[cycle[0]].location, "inputs",
                          hint="a node cannot depend, directly or not, on its own output") from None
    order: list[ConcreteNode] = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready(), key=position.__getitem__)
        order.extend(by_name[name] for name in ready)
        sorter.done(*ready)
    return order


def _readable_cycle(cycle: list[str], position: dict[str, int]) -> list[str]:
    """graphlib's cycle (each node an input of the next) as "X -> Y: X takes input from Y", starting at the
    node written first in the recipe, ending where it started."""
    ring = list(reversed(cycle[:-1]))
    first = min(range(len(ring)), key=lambda i: position[ring[i]])
    ring = ring[first:] + ring[:first]
    return [*ring, ring[0]]
