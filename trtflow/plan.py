"""Decide, without running anything, which nodes are fresh and which are stale, and why.

A node is fresh when an intact manifest exists for its key. Otherwise the reason is found by comparing the
key's ingredients with those recorded when the node last ran for this recipe file (its ref): cheapest first.

The key is made of: the stage's name, its declared version and the digest of its code (`codehash`); its
parameters, with every recipe file they name replaced by that file's content digest and every `python:` callable
by the digest of its file and the project modules it imports (so moving a recipe, or spelling a path another
way, changes nothing); the digests of its inputs; and the environment facts it declares, taken from the device
it runs on. Gate thresholds (`Stage.gate_params`) are left out: changing one re-judges cached measurements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.callables import PYTHON_PREFIX, code_references
from trtflow.codehash import CodeDigest, callable_code, stage_code
from trtflow.environment import Environment, GpuInfo
from trtflow.errors import RecipeError, StageSkipped, TrtflowError
from trtflow.fingerprint import StatCache, diff_values, hash_path, hash_value
from trtflow.fsutil import allowed_roots_for, project_root, resolve_user_path
from trtflow.graph import Graph
from trtflow.recipe.expand import ConcreteNode
from trtflow.stage import Resources
from trtflow.status import FRESH, SKIP, STALE
from trtflow.storage.store import Store

KEY_FORMAT = 2


@dataclass(frozen=True)
class KeyContext:
    """What key computation needs besides the graph: where the recipe lives, the environment, a stat cache."""

    recipe_dir: Path
    project_root: Path
    allowed_roots: tuple[Path, ...]
    env: Environment
    stat_cache: StatCache | None = None
    # what this plan has already worked out, so that a recipe of thousands of nodes costs linear time
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def for_recipe(cls, recipe_dir: Path, env: Environment, stat_cache: StatCache | None = None) -> KeyContext:
        recipe_dir = Path(recipe_dir).resolve()
        return cls(recipe_dir, project_root(recipe_dir) or recipe_dir, tuple(allowed_roots_for(recipe_dir)), env,
                   stat_cache)

    def resolve(self, path: str) -> Path:
        return resolve_user_path(path, self.recipe_dir, self.allowed_roots)

    def display(self, path: Path) -> str:
        """A path as it is recorded: relative to the project root when inside it."""
        try:
            return path.relative_to(self.project_root).as_posix()
        except ValueError:
            return path.as_posix()


@dataclass
class KeyParts:
    """Everything a node key is made of (also stored in the manifest to explain later changes)."""

    stage: str
    version: str
    code: str
    code_files: dict[str, str]
    params: dict[str, Any]  # as the user wrote them (file paths relative to the project): shown, not keyed
    keyed_params: dict[str, Any]  # files and code replaced by content digests; gate thresholds left out
    inputs: dict[str, str]  # "slot" or "slot[i]" -> digest
    input_sources: dict[str, str]  # same keys -> "node.output"
    files: dict[str, str]  # project-relative path -> digest (recipe files and the code callables import)
    facts: dict[str, str]
    # for slots that take results whose gate failed (a chooser): each producer's current gate failures, so a
    # threshold change upstream (which re-judges without re-running) still re-runs the chooser
    verdicts: dict[str, list[str]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        ingredients = {"format": KEY_FORMAT, "stage": self.stage, "version": self.version, "code": self.code,
                       "params": self.keyed_params, "inputs": self.inputs,
                       "files": sorted(set(self.files.values())), "facts": self.facts}
        if self.verdicts:
            ingredients["verdicts"] = self.verdicts
        return hash_value(ingredients)

    def as_manifest(self) -> dict[str, Any]:
        return {"stage": self.stage, "version": self.version, "code": self.code, "code_files": self.code_files,
                "params": self.params, "inputs": self.inputs, "input_sources": self.input_sources,
                "files": self.files, "facts": self.facts, "verdicts": self.verdicts}


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
    needs: str | None = None  # for a skipped node: what the machine lacks

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    @property
    def notes(self) -> list[str]:
        """What the stage said users should know about its stored result (its summary's ``notes``)."""
        notes = ((self.manifest or {}).get("summary") or {}).get("notes")
        return [str(n) for n in notes] if isinstance(notes, list) else []

    def as_json(self) -> dict[str, Any]:
        return {"node": self.node.name, "stage": self.node.stage, "status": self.status, "reason": self.reason,
                "key": self.key, "inputs": {s: [f"{n}.{o}" for n, o in refs]
                                            for s, refs in self.node.upstream.items()},
                "gate_failures": self.gate_failures, "needs": self.needs, "notes": self.notes}


def _substitute(value: Any, table: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        return table.get(value, value)
    if isinstance(value, dict):
        return {k: _substitute(v, table) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, table) for v in value]
    return value


def _code_of_callable(spec: str, kctx: KeyContext) -> CodeDigest | None:
    """Digest of the code a `python:` reference runs (its file or module, and the project files it imports)."""
    if ("code", spec) not in kctx.memo:
        kctx.memo[("code", spec)] = _hash_callable(spec, kctx)
    return kctx.memo[("code", spec)]


def _hash_callable(spec: str, kctx: KeyContext) -> CodeDigest | None:
    from trtflow.callables import module_origin, split_spec

    target, _ = split_spec(spec)
    body = target[len(PYTHON_PREFIX):]
    if body.endswith(".py") or "/" in body or "\\" in body:
        path = kctx.resolve(body)
        if not path.is_file():
            raise TrtflowError(f"file {body!r} of {spec!r} not found (looked at {path})",
                               hint="paths are relative to the recipe file")
        return callable_code(path, kctx.project_root, kctx.stat_cache)
    origin = module_origin(body)
    return callable_code(Path(origin), kctx.project_root, kctx.stat_cache) if origin else None


def key_parts(graph: Graph, node: ConcreteNode, output_digests: Mapping[tuple[str, str], str], kctx: KeyContext,
              device: GpuInfo | None = None, verdicts: Mapping[str, list[str]] | None = None) -> KeyParts | None:
    """The key ingredients of ``node``, or None if an input's digest is not known yet (upstream stale)."""
    stage = graph.stages[node.stage]
    # Files first, even when an upstream node is stale: a missing or misplaced file is found at plan time,
    # not after hours of upstream work.
    files: dict[str, str] = {}
    keyed: dict[str, Any] = {}
    shown: dict[str, Any] = {}
    try:
        refs = stage.files_for(node.params_model)
    except RecipeError as exc:
        raise RecipeError(f"node {node.name!r}: {exc.message}", node.location, hint=exc.hint) from None
    for ref in refs:
        try:
            path = kctx.resolve(ref)
        except TrtflowError as exc:
            raise RecipeError(f"node {node.name!r}: {exc.message}", node.location, hint=exc.hint) from None
        if not path.exists():
            raise RecipeError(f"node {node.name!r}: file {ref!r} not found (looked at {path})", node.location,
                              hint="check the path; recipe paths are relative to the recipe file")
        if not (path.is_file() or path.is_dir()):
            raise RecipeError(f"node {node.name!r}: {ref!r} is not a regular file or directory ({path})",
                              node.location, hint="point at the model or data file itself")
        try:
            digest = hash_path(path, kctx.stat_cache)
        except OSError as exc:
            raise RecipeError(f"node {node.name!r}: cannot read {ref!r}: {exc.strerror or exc}",
                              node.location) from None
        files[kctx.display(path)] = digest
        keyed[ref] = f"file:{digest}"
        shown[ref] = kctx.display(path)
    params = {k: v for k, v in node.params.items() if k not in stage.gate_params}
    for text in code_references(params):
        if text in keyed:
            continue
        try:
            code = _code_of_callable(text, kctx)
        except TrtflowError as exc:
            raise RecipeError(f"node {node.name!r}: {exc.message}", node.location, hint=exc.hint) from None
        if code is None:
            continue
        target, attr = text.rsplit(":", 1)
        keyed[text] = f"python:code:{code.digest}:{attr}"
        body = target[len(PYTHON_PREFIX):]
        if body.endswith(".py"):
            shown[text] = f"python:{kctx.display(kctx.resolve(body))}:{attr}"
        files.update(code.files)
    inputs: dict[str, str] = {}
    sources: dict[str, str] = {}
    for slot, slot_refs in node.upstream.items():
        many = stage.inputs[slot].many
        for i, ref in enumerate(slot_refs):
            # a many-slot's entries are keyed by their producer, so renaming a candidate re-runs the chooser
            label = f"{slot}[{ref[0]}.{ref[1]}]" if many else slot if len(slot_refs) == 1 else f"{slot}[{i}]"
            digest = output_digests.get(ref)
            if digest is None:
                return None
            inputs[label] = digest
            sources[label] = f"{ref[0]}.{ref[1]}"
    facts = kctx.env.facts(stage.environment_for(node.params_model), device)
    code = stage_code(stage.run.__module__, kctx.stat_cache)
    judged = {src: sorted((verdicts or {}).get(src, []))
              for slot, slot_refs in node.upstream.items() if stage.inputs[slot].accept_gate_failed
              for src, _ in slot_refs}
    return KeyParts(node.stage, stage.version, code.digest, code.files, _substitute(params, shown),
                    _substitute(params, keyed), inputs, sources, files, facts, judged)


def judge(graph: Graph, node: ConcreteNode, manifest: Mapping[str, Any], kctx: KeyContext) -> list[str]:
    """The failures of the node's quality gates on its stored summary (empty: passed, or no gate)."""
    from trtflow.stage import GateContext

    stage = graph.stages[node.stage]
    if stage.gate is None:
        return []
    gate_ctx = GateContext(previous=manifest.get("previous_summary"), facts=manifest.get("facts", {}),
                           resolve=kctx.resolve, node=node.name)
    try:
        return stage.judge(node.params_model, manifest.get("summary") or {}, gate_ctx)
    except TrtflowError as exc:
        return [exc.message]


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
    from dataclasses import replace

    declared = graph.stages[node.stage].resources_for(node.params_model)
    return replace(declared, **node.resources) if node.resources else declared


def planned_device(graph: Graph, node: ConcreteNode) -> GpuInfo | None:
    """The GPU a GPU node would run on here: the first visible one its requirements accept."""
    resources = node_resources(graph, node)
    if resources.gpu <= 0:
        return None
    from trtflow.environment import gpus

    return next((g for g in gpus() if resources.accepts(g)), None)


def make_plan(graph: Graph, store: Store, env: Environment, recipe_dir: Path,
              stat_cache: StatCache | None = None, recipe_id: str | None = None) -> list[Step]:
    """Classify every node of ``graph`` as fresh, stale or skipped, with reasons. Pure: runs no stage."""
    kctx = KeyContext.for_recipe(recipe_dir, env, stat_cache)
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
            key = parts.key
            manifest = store.read_manifest(key)
            if manifest is not None and store.intact(manifest, stat_cache):
                for out_name, out in manifest["outputs"].items():
                    digests[(name, out_name)] = out["digest"]
                failures = judge(graph, node, manifest, kctx)
                verdicts[name] = failures
                reasons = ["up to date"] if not failures else [f"gate failed last run: {'; '.join(failures)}"]
                steps.append(Step(node, FRESH, reasons, key, parts, manifest, gate_failures=failures))
                status[name] = FRESH
                continue
            if manifest is not None:
                bad = store.damaged_outputs(manifest, stat_cache)
                reasons = [f"stored output {', '.join(bad)} missing or damaged (will be rebuilt)"]
            else:
                reasons = explain(parts, previous_manifest(store, recipe_id, name, refs), damaged_note(store, key))
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
