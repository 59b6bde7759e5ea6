"""Decide, without running anything, which nodes are fresh and which are stale, and why.

A node is fresh when an intact manifest exists for its key. Otherwise the reason is found by comparing the
key's ingredients with those recorded when the node last ran for this recipe file (its ref): cheapest first.

The key is made of: the stage's name, its declared version and the digest of its code (`codehash`); its
parameters, with every recipe file they name replaced by that file's content digest and every `python:` callable
by the digest of its file (so moving a recipe, or spelling a path another way, changes nothing); the digests of its
inputs; the environment facts it declares, taken from the device it runs on; and, for a node with `python:` code,
the project modules that code imports, with their digests. Gate thresholds (`Stage.gate_params`) are left out:
changing one re-judges cached measurements.

The modules a `python:` reference imports are *seen, not guessed*: the worker records them while the code runs
(`trtflow.depfile`), and the result is committed under the key made with what was recorded. The planner finds a
stored result from the key without those modules (the *pre-key*) as ccache's direct mode does: for each set of
modules recorded under that pre-key (the journal's index, most recent first), then the text scanner's guess
(`codehash`, all a first plan has), it hashes the modules as they are now and looks up the key that makes; a
result is usable when it is intact and no module slot that was empty when it was built holds a module now. The
planner is the one judge of "up to date": the no-op shortcut (`execution.noop`) replays what it observed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from trtflow.callables import PYTHON_PREFIX, code_references
from trtflow.codehash import callable_files, stage_code
from trtflow.depfile import MISSING
from trtflow.environment import Environment, GpuInfo
from trtflow.errors import RecipeError, StageSkipped, TrtflowError
from trtflow.evidence import Evidence
from trtflow.fingerprint import StatCache, diff_values, hash_file, hash_path, hash_value
from trtflow.fsutil import allowed_roots_for, project_root, resolve_user_path
from trtflow.graph import Graph
from trtflow.recipe.expand import ConcreteNode
from trtflow.stage import Resources
from trtflow.status import FRESH, SKIP, STALE
from trtflow.storage.store import Store
from trtflow.verdicts import GateVerdict
from trtflow.verdicts import failures as blocking_failures

KEY_FORMAT = 2

# A set of project modules a node's code imported: (file labels, empty module slot labels), both sorted; labels are
# paths relative to the project root (absolute outside it).
DepSet = tuple[tuple[str, ...], tuple[str, ...]]


@runtime_checkable
class DepIndex(Protocol):
    """Where the planner finds the module sets recorded under a pre-key (the journal; losing it costs rebuilds)."""

    def dep_sets(self, pre: str) -> list[DepSet]: ...


@dataclass(frozen=True)
class KeyContext:
    """What key computation needs besides the graph: where the recipe lives, the environment, a stat cache (and,
    when it is the journal, the index of recorded module sets)."""

    recipe_dir: Path
    project_root: Path
    allowed_roots: tuple[Path, ...]
    env: Environment
    stat_cache: StatCache | None = None
    # what this plan has already worked out, so that a recipe of thousands of nodes costs linear time
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    # what the decisions rested on, when the no-op shortcut asks for it
    evidence: Evidence | None = field(default=None, compare=False, repr=False)

    @classmethod
    def for_recipe(cls, recipe_dir: Path, env: Environment, stat_cache: StatCache | None = None,
                   evidence: Evidence | None = None) -> KeyContext:
        recipe_dir = Path(recipe_dir).resolve()
        return cls(recipe_dir, project_root(recipe_dir) or recipe_dir, tuple(allowed_roots_for(recipe_dir)), env,
                   stat_cache, evidence=evidence)

    def resolve(self, path: str) -> Path:
        resolved = resolve_user_path(path, self.recipe_dir, self.allowed_roots)
        if self.evidence is not None:
            self.evidence.paths[path] = str(resolved)
        return resolved

    def observe(self, path: Path, digest: str) -> None:
        if self.evidence is not None:
            self.evidence.files[str(path)] = digest

    def display(self, path: Path) -> str:
        """A path as it is recorded: relative to the project root when inside it."""
        try:
            return path.relative_to(self.project_root).as_posix()
        except ValueError:
            return path.as_posix()

    def locate(self, label: str) -> Path | None:
        """The path a recorded label names (the inverse of `display`). Labels come from records a cloned repository
        or a shared store may carry: one that climbs out (``..``) or names a place outside the allowed roots
        locates nothing (None)."""
        path = Path(label)
        if ".." in path.parts:
            return None
        if not path.is_absolute():
            return self.project_root / path
        return path if any(r == path or r in path.parents for r in self.allowed_roots) else None

    def module_digest(self, label: str) -> str:
        """The digest of a file the node's code used, as it is now (`MISSING` when it is gone or is not a regular
        file: a named pipe is never opened), once per plan."""
        memo = ("module", label)
        if memo not in self.memo:
            from trtflow.depfile import label_digest  # an env: label is a variable, never a path

            self.memo[memo] = label_digest(label, None if label.startswith("env:") else self.locate(label),
                                           self.stat_cache)
        return self.memo[memo]

    def dep_sets(self, pre: str) -> list[DepSet]:
        index = self.stat_cache
        return index.dep_sets(pre) if isinstance(index, DepIndex) else []


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
    # the pinned artifact the node measures beside its candidate (`Stage.reference`): the digest of its files
    reference: str | None = None
    # a node with python: code: the project modules it imports (label -> digest) and the module slots that were
    # empty when they were recorded (labels), for one of `guesses`, the module sets worth trying (likeliest first)
    runs_code: bool = False
    deps: dict[str, str] = field(default_factory=dict)
    absent: list[str] = field(default_factory=list)
    guesses: list[DepSet] = field(default_factory=list, compare=False, repr=False)

    def _ingredients(self) -> dict[str, Any]:
        ingredients = {"format": KEY_FORMAT, "stage": self.stage, "version": self.version, "code": self.code,
                       "params": self.keyed_params, "inputs": self.inputs,
                       "files": sorted(set(self.files.values())), "facts": self.facts}
        if self.verdicts:
            ingredients["verdicts"] = self.verdicts
        if self.reference:
            ingredients["reference"] = self.reference
        return ingredients

    @property
    def pre_key(self) -> str:
        """The key without the modules the node's code imports: what finds the module sets recorded for it."""
        return hash_value(self._ingredients())

    @property
    def key(self) -> str:
        if not self.runs_code:
            return self.pre_key
        return hash_value({**self._ingredients(), "deps": self.deps})

    @property
    def dep_set(self) -> DepSet:
        return tuple(sorted(self.deps)), tuple(sorted(self.absent))

    def with_deps(self, deps: DepSet, kctx: KeyContext) -> KeyParts:
        """These parts with the module set ``deps``, each module hashed as it is now."""
        files, absent = deps
        return replace(self, deps={label: kctx.module_digest(label) for label in files}, absent=list(absent))

    def as_manifest(self) -> dict[str, Any]:
        manifest = {"stage": self.stage, "version": self.version, "code": self.code, "code_files": self.code_files,
                    "params": self.params, "inputs": self.inputs, "input_sources": self.input_sources,
                    "files": self.files, "facts": self.facts, "verdicts": self.verdicts,
                    "reference": self.reference}
        if self.runs_code:
            manifest.update(pre=self.pre_key, deps=self.deps, absent=self.absent)
        return manifest


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


def _substitute(value: Any, table: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        return table.get(value, value)
    if isinstance(value, dict):
        return {k: _substitute(v, table) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, table) for v in value]
    return value


@dataclass(frozen=True)
class CodeEntry:
    """The file a `python:` reference names, its digest, and the project files the text scanner finds it importing
    (the first guess at its module set, before a run has recorded it)."""

    path: Path
    digest: str
    scanned: tuple[Path, ...]


def code_entry(spec: str, kctx: KeyContext) -> CodeEntry | None:
    """The file a `python:` reference runs (None: a module with no .py file), once per plan."""
    if ("code", spec) not in kctx.memo:
        kctx.memo[("code", spec)] = _find_entry(spec, kctx)
    return kctx.memo[("code", spec)]


def _find_entry(spec: str, kctx: KeyContext) -> CodeEntry | None:
    from trtflow.callables import module_origin, split_spec

    target, _ = split_spec(spec)
    body = target[len(PYTHON_PREFIX):]
    if body.endswith(".py") or "/" in body or "\\" in body:
        path = kctx.resolve(body)
        if not path.is_file():
            raise TrtflowError(f"file {body!r} of {spec!r} not found (looked at {path})",
                               hint="paths are relative to the recipe file")
    else:
        origin = module_origin(body)
        if kctx.evidence is not None:
            kctx.evidence.modules[body] = origin or ""
        if not origin:
            return None
        path = Path(origin).resolve()
    try:
        digest = hash_file(path, kctx.stat_cache)
    except OSError as exc:
        raise TrtflowError(f"cannot read {spec!r} ({path}): {exc.strerror or exc}") from None
    kctx.observe(path, digest)
    return CodeEntry(path, digest, tuple(callable_files(path, kctx.project_root)))


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
    resolved: dict[str, Path] = {}
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
        kctx.observe(path, digest)
        files[kctx.display(path)] = digest
        keyed[ref] = f"file:{digest}"
        shown[ref] = kctx.display(path)
        resolved[ref] = path
    if stage.check_files is not None and resolved:
        try:
            stage.check_files(node.params_model, resolved)
        except TrtflowError as exc:
            raise RecipeError(f"node {node.name!r}: {exc.message}", node.location, hint=exc.hint) from None
    params = {k: v for k, v in node.params.items() if k not in stage.gate_params}
    entries: list[CodeEntry] = []
    for text in code_references(params):
        if text in keyed:
            continue
        try:
            entry = code_entry(text, kctx)
        except TrtflowError as exc:
            raise RecipeError(f"node {node.name!r}: {exc.message}", node.location, hint=exc.hint) from None
        if entry is None:
            continue
        target, attr = text.rsplit(":", 1)
        keyed[text] = f"python:file:{entry.digest}:{attr}"
        body = target[len(PYTHON_PREFIX):]
        if body.endswith(".py"):
            shown[text] = f"python:{kctx.display(entry.path)}:{attr}"
        files[kctx.display(entry.path)] = entry.digest
        entries.append(entry)
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
    if kctx.evidence is not None and device is None:
        kctx.evidence.facts.update(facts)
    code = stage_code(stage.run.__module__, kctx.stat_cache)
    judged = {src: sorted((verdicts or {}).get(src, []))
              for slot, slot_refs in node.upstream.items() if stage.inputs[slot].accept_gate_failed
              for src, _ in slot_refs}
    parts = KeyParts(node.stage, stage.version, code.digest, code.files, _substitute(params, shown),
                     _substitute(params, keyed), inputs, sources, files, facts, judged,
                     pinned_reference(graph, node, kctx))
    if entries:
        scanned = tuple(sorted({kctx.display(p) for e in entries for p in e.scanned}))
        parts.runs_code = True
        parts.guesses = list(dict.fromkeys([*kctx.dep_sets(parts.pre_key), (scanned, ())]))
        parts = parts.with_deps(parts.guesses[0], kctx)
    return parts


def recorded_parts(parts: KeyParts, deps: Any, kctx: KeyContext) -> KeyParts:
    """The key parts of a node whose code ran, with the modules the worker recorded it importing (`depfile.Deps`;
    None when nothing was reported: the node then counts as changed, so it is never reused blindly)."""
    from trtflow.depfile import CHANGED

    if not parts.runs_code:
        return parts
    if deps is None:
        return replace(parts, deps={"(not recorded)": CHANGED}, absent=[])
    return replace(parts, deps={kctx.display(Path(p)): d for p, d in sorted(deps.files.items())},
                   absent=sorted(kctx.display(Path(a)) for a in deps.absent))


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
    """The one rule for reusing a stored result: its outputs are intact and its code would import what it did."""
    return store.intact(manifest, kctx.stat_cache) and not taken_slots(manifest, kctx)


def find_stored(store: Store, parts: KeyParts, kctx: KeyContext) -> tuple[KeyParts, dict[str, Any] | None]:
    """The node's key parts with the module set under which a usable stored result exists, and that result; else
    the parts with the likeliest module set (most recently recorded, else the scanner's guess) and None."""
    options = [parts] if not parts.runs_code else [parts.with_deps(g, kctx) for g in parts.guesses]
    for option in options:
        manifest = store.read_manifest(option.key)
        if manifest is not None and usable(store, manifest, kctx):
            return option, manifest
    return options[0], None


def pinned_reference(graph: Graph, node: ConcreteNode, kctx: KeyContext) -> str | None:
    """The digest of the pinned artifact ``node`` measures beside its candidate (None: none, or the node's last
    accepted result, which changes as results are accepted and so stays out of the key)."""
    stage = graph.stages[node.stage]
    if stage.reference is None:
        return None
    try:
        wanted = stage.reference_for(node.params_model, kctx.resolve, node.name)
    except TrtflowError as exc:
        raise RecipeError(f"node {node.name!r}: {exc.message}", node.location, hint=exc.hint) from None
    if not isinstance(wanted, Mapping):
        return None
    from trtflow.storage.pins import Pin

    pin = Pin.from_dict(wanted)
    if pin is None:
        raise RecipeError(f"node {node.name!r}: its reference artifact is not described correctly",
                          node.location, hint="pin it again (`trtflow baseline pin RECIPE`)")
    return pin.identity


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
                for label in taken_slots(manifest, kctx)] or ["its stored result cannot be used"]
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
