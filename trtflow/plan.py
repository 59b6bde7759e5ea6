"""Decide, without running anything, which nodes are fresh and which are stale, and why.

A node is fresh when a complete manifest exists for its key. Otherwise the reason is found by comparing
the key's ingredients with those recorded when the node last ran (its ref): cheapest checks first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.environment import Environment
from trtflow.errors import RecipeError, TrtflowError
from trtflow.fingerprint import StatCache, diff_values, hash_path, node_key
from trtflow.fsutil import allowed_roots_for, resolve_user_path
from trtflow.graph import Graph
from trtflow.recipe.expand import ConcreteNode
from trtflow.storage.store import Store

FRESH = "fresh"
STALE = "stale"


@dataclass
class KeyParts:
    """Everything a node key is made of (also stored in the manifest to explain later changes)."""

    stage: str
    version: str
    params: dict[str, Any]
    inputs: dict[str, str]  # "slot" or "slot[i]" -> digest
    input_sources: dict[str, str]  # same keys -> "node.output"
    files: dict[str, str]  # recipe path -> digest
    facts: dict[str, str]

    @property
    def key(self) -> str:
        return node_key(self.stage, self.version, self.params, self.inputs, self.files, self.facts)

    def as_manifest(self) -> dict[str, Any]:
        return {"stage": self.stage, "version": self.version, "params": self.params, "inputs": self.inputs,
                "input_sources": self.input_sources, "files": self.files, "facts": self.facts}


@dataclass
class Step:
    node: ConcreteNode
    status: str
    reasons: list[str]
    key: str | None = None
    parts: KeyParts | None = None
    manifest: dict[str, Any] | None = None
    waits_for: list[str] = field(default_factory=list)
    gate_failures: list[str] = field(default_factory=list)

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    def as_json(self) -> dict[str, Any]:
        return {"node": self.node.name, "stage": self.node.stage, "status": self.status, "reason": self.reason,
                "key": self.key, "inputs": {s: [f"{n}.{o}" for n, o in refs]
                                            for s, refs in self.node.upstream.items()}}


def key_parts(graph: Graph, node: ConcreteNode, output_digests: dict[tuple[str, str], str],
              env: Environment, recipe_dir: Path, stat_cache: StatCache | None) -> KeyParts | None:
    """The key ingredients of ``node``, or None if an input's digest is not known yet (upstream stale)."""
    stage = graph.stages[node.stage]
    # Files first, even when an upstream node is stale: a missing or misplaced file is found at plan time,
    # not after hours of upstream work.
    files: dict[str, str] = {}
    roots = allowed_roots_for(recipe_dir)
    try:
        refs = stage.files_for(node.params_model)
    except RecipeError as exc:
        raise RecipeError(f"node {node.name!r}: {exc.message}", node.location, hint=exc.hint) from None
    for ref in refs:
        try:
            path = resolve_user_path(ref, recipe_dir, roots)
        except TrtflowError as exc:
            raise RecipeError(f"node {node.name!r}: {exc.message}", node.location, hint=exc.hint) from None
        if not path.exists():
            raise RecipeError(f"node {node.name!r}: file {ref!r} not found (looked at {path})", node.location,
                              hint="check the path; recipe paths are relative to the recipe file")
        if not (path.is_file() or path.is_dir()):
            raise RecipeError(f"node {node.name!r}: {ref!r} is not a regular file or directory ({path})",
                              node.location, hint="point at the model or data file itself")
        try:
            files[ref] = hash_path(path, stat_cache)
        except OSError as exc:
            raise RecipeError(f"node {node.name!r}: cannot read {ref!r}: {exc.strerror or exc}",
                              node.location) from None
    inputs: dict[str, str] = {}
    sources: dict[str, str] = {}
    for slot, refs in node.upstream.items():
        many = stage.inputs[slot].many
        for i, ref in enumerate(refs):
            # a many-slot's entries are keyed by their producer, so renaming a candidate re-runs the chooser
            label = f"{slot}[{ref[0]}.{ref[1]}]" if many else slot if len(refs) == 1 else f"{slot}[{i}]"
            digest = output_digests.get(ref)
            if digest is None:
                return None
            inputs[label] = digest
            sources[label] = f"{ref[0]}.{ref[1]}"
    facts = env.facts(stage.environment_for(node.params_model))
    keyed_params = {k: v for k, v in node.params.items() if k not in stage.gate_params}
    return KeyParts(node.stage, stage.version, keyed_params, inputs, sources, files, facts)


def judge(graph: Graph, node: ConcreteNode, manifest: dict[str, Any], recipe_dir: Path) -> list[str]:
    """The failures of the node's quality gates on its stored summary (empty: passed, or no gate)."""
    from trtflow.stage import GateContext

    stage = graph.stages[node.stage]
    if stage.gate is None:
        return []
    roots = allowed_roots_for(recipe_dir)
    gate_ctx = GateContext(previous=manifest.get("previous_summary"), facts=manifest.get("facts", {}),
                           resolve=lambda path: resolve_user_path(path, recipe_dir, roots))
    try:
        return stage.judge(node.params_model, manifest.get("summary") or {}, gate_ctx)
    except TrtflowError as exc:
        return [exc.message]


def explain(parts: KeyParts, previous: dict[str, Any] | None) -> list[str]:
    """Why a node with these key parts is stale, compared with the manifest of its last run."""
    if previous is None:
        return ["never built"]
    reasons: list[str] = []
    if previous.get("stage") != parts.stage:
        reasons.append(f"stage changed {previous.get('stage')} -> {parts.stage}")
    if previous.get("version") != parts.version:
        reasons.append(f"stage {parts.stage} version changed {previous.get('version')} -> {parts.version}")
    for name in sorted(set(previous.get("facts", {})) | set(parts.facts)):
        old, new = previous.get("facts", {}).get(name), parts.facts.get(name)
        if old != new:
            reasons.append(f"{name} {old or 'unset'} -> {new or 'unset'}")
    reasons += [f"params.{d}" for d in diff_values(previous.get("params", {}), parts.params)]
    for path in sorted(set(previous.get("files", {})) | set(parts.files)):
        if previous.get("files", {}).get(path) != parts.files.get(path):
            reasons.append(f"file {path} changed")
    old_inputs = previous.get("inputs", {})
    for slot in sorted(set(old_inputs) | set(parts.inputs)):
        if old_inputs.get(slot) != parts.inputs.get(slot):
            source = parts.input_sources.get(slot) or previous.get("input_sources", {}).get(slot, "?")
            reasons.append(f"input {slot} changed (from {source})")
    return reasons or ["no record of a previous build with these settings"]


def make_plan(graph: Graph, store: Store, env: Environment, recipe_dir: Path,
              stat_cache: StatCache | None = None) -> list[Step]:
    """Classify every node of ``graph`` as fresh or stale, with reasons. Pure: runs no stage."""
    steps: list[Step] = []
    digests: dict[tuple[str, str], str] = {}
    status: dict[str, str] = {}
    for name, node in graph.nodes.items():
        parts = key_parts(graph, node, digests, env, recipe_dir, stat_cache)
        if parts is None:
            stale_up = [u for u in graph.upstream(name) if status.get(u) != FRESH]
            steps.append(Step(node, STALE, [f"upstream {', '.join(stale_up)} will run first"],
                              waits_for=stale_up))
            status[name] = STALE
            continue
        key = parts.key
        manifest = store.read_manifest(key)
        if manifest is not None and store.complete(manifest):
            for out_name, out in manifest["outputs"].items():
                digests[(name, out_name)] = out["digest"]
            failures = judge(graph, node, manifest, recipe_dir)
            reasons = ["up to date"] if not failures else [f"gate failed last run: {'; '.join(failures)}"]
            steps.append(Step(node, FRESH, reasons, key, parts, manifest, gate_failures=failures))
            status[name] = FRESH
            continue
        if manifest is not None:
            reasons = ["stored output missing or damaged (will be rebuilt)"]
        else:
            previous_key = store.read_ref(graph.recipe_name, name)
            previous = store.read_manifest(previous_key) if previous_key else None
            reasons = explain(parts, previous)
        steps.append(Step(node, STALE, reasons, key, parts))
        status[name] = STALE
    return steps
