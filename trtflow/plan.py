"""Decide, without running anything, which nodes are fresh and which are stale, and why.

A node is fresh when an intact manifest exists for its key (`trtflow.node_keys`): the planner finds a stored result
from the pre-key, for each module set recorded under it, then the scanner's guess; a result is usable when it is
intact and no module slot that was empty when it was built holds a module now. Otherwise the reason is found by
comparing the key's ingredients with those recorded when the node last ran for this recipe file (its ref):
cheapest first. The planner is the one judge of "up to date": the no-op shortcut (`execution.noop`) replays what it
observed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trtflow.depfile import MISSING
from trtflow.environment import Environment, GpuInfo
from trtflow.errors import StageSkipped, TrtflowError
from trtflow.evidence import Evidence
from trtflow.fingerprint import StatCache, diff_values
from trtflow.graph import Graph
from trtflow.node_keys import KeyContext, KeyParts, key_parts
from trtflow.recipe.expand import ConcreteNode
from trtflow.stage import Resources
from trtflow.status import FRESH, SKIP, STALE
from trtflow.storage.signing import trust_problem
from trtflow.storage.store import Store
from trtflow.verdicts import GateVerdict
from trtflow.verdicts import failures as blocking_failures


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
    verdicts: list[GateVerdict] = field(default_factory=list)  # its gate's verdicts as judged by the plan (fresh)
    needs: str | None = None  # for a skipped node: what the machine lacks

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    @property
    def notes(self) -> list[str]:
        """What users should know: about the node's settings (its params' ``notices``), then about its stored
        result (its summary's ``notes``)."""
        notes = ((self.manifest or {}).get("summary") or {}).get("notes")
        return list(self.node.params_model.notices()) + ([str(n) for n in notes] if isinstance(notes, list) else [])

    def as_json(self) -> dict[str, Any]:
        return {"node": self.node.name, "stage": self.node.stage, "status": self.status, "reason": self.reason,
                "key": self.key, "inputs": {s: [f"{n}.{o}" for n, o in refs]
                                            for s, refs in self.node.upstream.items()},
                "gate_failures": self.gate_failures, "needs": self.needs, "notes": self.notes,
                "verdicts": [v.as_dict() for v in self.verdicts]}


def taken_slots(manifest: Mapping[str, Any], kctx: KeyContext) -> list[str]:
    """The module slots that were empty when ``manifest``'s node ran and hold a module now."""
    from trtflow.depfile import slot_taken

    absent = manifest.get("absent") or []
    taken = []
    for label in absent:
        path = kctx.locate(label) if isinstance(label, str) else None
        if path is None or slot_taken(str(path)):  # a label that leaves the project: the record is not ours
            taken.append(str(label))
    return taken


def usable(store: Store, manifest: Mapping[str, Any], kctx: KeyContext) -> bool:
    """The one rule for reusing a stored result: its outputs are intact, its code would import what it did, and a
    key this project trusts signed it (`storage.signing`)."""
    return (store.intact(manifest, kctx.stat_cache) and not taken_slots(manifest, kctx)
            and trust_problem(store, manifest, kctx) is None)


def find_stored(store: Store, parts: KeyParts, kctx: KeyContext) -> tuple[KeyParts, dict[str, Any] | None]:
    """The node's key parts with the module set under which a usable stored result exists, and that result; else
    the parts with the likeliest module set (most recently recorded, else the scanner's guess) and None."""
    options = [parts] if not parts.runs_code else [parts.with_deps(g, kctx) for g in parts.guesses]
    for option in options:
        manifest = store.read_manifest(option.key)
        if manifest is not None and usable(store, manifest, kctx):
            return option, manifest
    return options[0], None


def gate_family(graph: Graph, kctx: KeyContext) -> int:
    """How many nodes of the graph make a comparison (`Stage.compares`): the recipe's false alarm rate is
    divided among them."""
    memo = ("gate family", id(graph))
    if memo not in kctx.memo:
        kctx.memo[memo] = max(sum(1 for n in graph.nodes.values()
                                  if graph.stages[n.stage].compares_for(n.params_model)), 1)
    return int(kctx.memo[memo])


def judge(graph: Graph, node: ConcreteNode, manifest: Mapping[str, Any], kctx: KeyContext) -> list[GateVerdict]:
    """The verdicts of the node's quality gates on its stored summary (empty: no gate)."""
    from trtflow.stage import GateContext

    stage = graph.stages[node.stage]
    if stage.gate is None:
        return []
    gate_ctx = GateContext(previous=manifest.get("previous_summary"), facts=manifest.get("facts", {}),
                           resolve=kctx.resolve, node=node.name, family=gate_family(graph, kctx))
    try:
        return stage.judge(node.params_model, manifest.get("summary") or {}, gate_ctx)
    except TrtflowError as exc:
        return [GateVerdict.failure(exc.message)]


def explain(parts: KeyParts, previous: Mapping[str, Any] | None, damaged_note: Mapping[str, Any] | None = None
            ) -> list[str]:
    """Why a node with these key parts is stale, compared with the manifest of its last run."""
    if damaged_note is not None:
        return [f"its stored result was removed by {damaged_note.get('removed_by', 'verify --fix')} "
                f"({damaged_note.get('reason', 'damaged')}); rebuilt"]
    if previous is None:
        return ["never built"]
    reasons: list[str] = []
    if previous.get("stage") != parts.stage:
        reasons.append(f"stage changed {previous.get('stage')} -> {parts.stage}")
    if previous.get("version") != parts.version:
        reasons.append(f"stage {parts.stage} version changed {previous.get('version')} -> {parts.version}")
    if previous.get("code") is None:
        reasons.append("built by an older trtflow that did not record the stage's code")
    elif previous.get("code") != parts.code:
        old_files = previous.get("code_files") or {}
        changed = sorted(f for f in set(old_files) | set(parts.code_files)
                         if old_files.get(f) != parts.code_files.get(f))
        reasons.append(f"code of stage {parts.stage} changed ({', '.join(changed) or 'its files'})")
    for name in sorted(set(previous.get("facts", {})) | set(parts.facts)):
        old, new = previous.get("facts", {}).get(name), parts.facts.get(name)
        if old != new:
            reasons.append(f"{name} {old or 'unset'} -> {new or 'unset'}")
    reasons += [f"params.{d}" for d in diff_values(previous.get("params", {}), parts.params)]
    old_files = previous.get("files", {})
    for path in sorted(set(old_files) | set(parts.files)):
        if path not in parts.files:
            reasons.append(f"file {path} no longer used")
        elif path not in old_files:
            if parts.files[path] not in set(old_files.values()):
                reasons.append(f"file {path} added")
        elif old_files[path] != parts.files[path]:
            reasons.append(f"file {path} changed")
    if (previous.get("reference") or None) != parts.reference:
        reasons.append("the pinned reference artifact changed" if parts.reference else "no pinned reference any more")
    old_deps = previous.get("deps") or {}
    if isinstance(old_deps, dict) and parts.runs_code:
        for path in sorted(set(old_deps) | set(parts.deps)):
            what = "module" if path.endswith((".py", ".so", ".pyd")) else "file read by its code:"
            if path.startswith("env:"):  # the code's variables: always all recorded; only a change says anything
                if path in parts.deps and path in old_deps and old_deps[path] != parts.deps[path]:
                    reasons.append(f"environment variable {path[4:]} changed")
                continue
            if path not in parts.deps:
                reasons.append(f"{what} {path} no longer used")
            elif path not in old_deps:
                reasons.append(f"{what} {path} now used")
            elif old_deps[path] != parts.deps[path]:
                reasons.append(f"{what} {path} changed")
    old_verdicts = previous.get("verdicts") or {}
    for src in sorted(set(old_verdicts) | set(parts.verdicts)):
        if old_verdicts.get(src) != parts.verdicts.get(src):
            now = "fails its gate" if parts.verdicts.get(src) else "passes its gate"
            reasons.append(f"{src} now {now} (its thresholds changed)")
    old_inputs = previous.get("inputs", {})
    for slot in sorted(set(old_inputs) | set(parts.inputs)):
        if old_inputs.get(slot) != parts.inputs.get(slot):
            source = parts.input_sources.get(slot) or previous.get("input_sources", {}).get(slot, "?")
            reasons.append(f"input {slot} changed (from {source})")
    return reasons or ["no record of a previous build with these settings"]


def stale_reasons(store: Store, parts: KeyParts, kctx: KeyContext, recipe_id: str | None, node: str,
                  refs: dict[str, str] | None = None) -> list[str]:
    """Why no stored result of ``parts`` (as `find_stored` left them) can be used."""
    manifest = store.read_manifest(parts.key)
    if manifest is not None:
        bad = store.damaged_outputs(manifest, kctx.stat_cache)
        if bad:
            return [f"stored output {', '.join(bad)} missing or damaged (will be rebuilt)"]
        return [f"module {label} now exists (it was not there when the node last ran)"
                for label in taken_slots(manifest, kctx)] or [
            f"its stored result is {trust_problem(store, manifest, kctx) or 'not usable'}; rebuilt"]
    return explain(parts, previous_manifest(store, recipe_id, node, refs), damaged_note(store, parts.key))


def previous_manifest(store: Store, recipe_id: str | None, node: str,
                      refs: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The manifest of the result this recipe file's node used last (for explanations and regression gates).

    ``refs``: the recipe's refs read once by the caller (node -> key), so planning stays linear in nodes.
    """
    if recipe_id is None:
        return None
    current = refs if refs is not None else store.refs.current(recipe_id)
    key = current.get(node)
    return store.read_manifest(key) if key else None


def damaged_note(store: Store, key: str) -> dict[str, Any] | None:
    return store.damaged_note(key)


def node_resources(graph: Graph, node: ConcreteNode) -> Resources:
    """What a node needs: its stage's declaration, overridden by the recipe's ``resources:``."""

    declared = graph.stages[node.stage].resources_for(node.params_model)
    return replace(declared, **node.resources) if node.resources else declared


def planned_device(graph: Graph, node: ConcreteNode) -> GpuInfo | None:
    """The GPU a GPU node would run on here: the first visible one its requirements accept."""
    resources = node_resources(graph, node)
    if resources.gpu <= 0:
        return None
    from trtflow.environment import gpus

    return next((g for g in gpus() if resources.accepts(g)), None)


#: Why a node named by ``trtflow run --rerun`` runs although its result is stored.
RERUN_REASON = "run again as asked (--rerun): its stored result is replaced by a new one"


def make_plan(graph: Graph, store: Store, env: Environment, recipe_dir: Path,
              stat_cache: StatCache | None = None, recipe_id: str | None = None,
              rerun: Collection[str] = (), evidence: Evidence | None = None) -> list[Step]:
    """Classify every node of ``graph`` as fresh, stale or skipped, with reasons. Pure: runs no stage. ``rerun``:
    nodes to run again although their result is stored (``trtflow run --rerun``, e.g. a nightly benchmark).
    ``evidence``: filled in with what the decisions rested on (for the no-op shortcut)."""
    kctx = KeyContext.for_recipe(recipe_dir, env, stat_cache, evidence)
    refs = store.refs.current(recipe_id) if recipe_id is not None else {}
    verdicts: dict[str, list[str]] = {}
    steps: list[Step] = []
    digests: dict[tuple[str, str], str] = {}
    status: dict[str, str] = {}
    for name, node in graph.nodes.items():
        parts = key_parts(graph, node, digests, kctx, planned_device(graph, node), verdicts)
        if parts is None:
            stale_up = [u for u in graph.upstream(name) if status.get(u) != FRESH]
            step = Step(node, STALE, [f"upstream {', '.join(stale_up)} will run first"], waits_for=stale_up)
        else:
            parts, manifest = find_stored(store, parts, kctx)
            key = parts.key
            if manifest is not None and name not in rerun:
                _observe_result(parts, kctx)
                for out_name, out in manifest["outputs"].items():
                    digests[(name, out_name)] = out["digest"]
                judged = judge(graph, node, manifest, kctx)
                failures = blocking_failures(judged)
                verdicts[name] = failures
                reasons = ["up to date"] if not failures else [f"gate failed last run: {'; '.join(failures)}"]
                steps.append(Step(node, FRESH, reasons, key, parts, manifest, gate_failures=failures,
                                  verdicts=judged))
                status[name] = FRESH
                continue
            if manifest is not None and name in rerun:
                reasons = [RERUN_REASON]
            else:
                reasons = stale_reasons(store, parts, kctx, recipe_id, name, refs)
            step = Step(node, STALE, reasons, key, parts)
        skipped = _skip_reason(graph, node)
        if skipped is not None:
            step.status, step.needs = SKIP, skipped.needs
            step.reasons = [f"{skipped.reason} (not run here; never cached)"]
        elif any(status.get(u) == SKIP for u in graph.upstream(name)):
            step.status = SKIP
            step.reasons = [f"upstream {', '.join(u for u in graph.upstream(name) if status.get(u) == SKIP)} "
                            "cannot run here"]
        steps.append(step)
        status[name] = step.status
    return steps


def _observe_result(parts: KeyParts, kctx: KeyContext) -> None:
    """The module set by which a fresh result of python: code was found, for the evidence."""
    if kctx.evidence is None or not parts.runs_code:
        return
    kctx.evidence.dep_sets.append((parts.pre_key, parts.dep_set))
    for label, digest in parts.deps.items():
        path = None if label.startswith("env:") else kctx.locate(label)  # env: noop keys the code's variables
        if path is not None:  # a file read and absent must stay absent for the shortcut too
            kctx.evidence.missing.add(str(path)) if digest == MISSING else kctx.observe(path, digest)
    kctx.evidence.absent.update(str(kctx.locate(label)) for label in parts.absent)


def _skip_reason(graph: Graph, node: ConcreteNode) -> StageSkipped | None:
    check = graph.stages[node.stage].check
    if check is None:
        return None
    try:
        check(node.params_model)
    except StageSkipped as exc:
        return exc
    except TrtflowError:
        return None  # reported when the node runs, with its own message
    return None
