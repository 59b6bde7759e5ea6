"""A node's key: the ingredients that name its result in the store, the pre-key, and the module sets of `python:` code.

The key is made of: the stage's name, its declared version and the digest of its code (`codehash`); its
parameters, with every recipe file they name replaced by that file's content digest and every `python:` callable
by the digest of its file (so moving a recipe, or spelling a path another way, changes nothing); the digests of its
inputs; the environment facts it declares, taken from the device it runs on; and, for a node with `python:` code,
the project modules that code imports, with their digests. Gate thresholds (`Stage.gate_params`) are left out:
changing one re-judges cached measurements.

The modules a `python:` reference imports are *seen, not guessed*: the worker records them while the code runs
(`trtflow.depfile`), and the result is committed under the key made with what was recorded. The planner
(`trtflow.plan`) finds a stored result from the key without those modules (the *pre-key*) as ccache's direct mode
does: for each set of modules recorded under that pre-key (the journal's index, most recent first), then the text
scanner's guess (`codehash`, all a first plan has), it hashes the modules as they are now and looks up the key that
makes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from trtflow.callables import PYTHON_PREFIX, code_references
from trtflow.codehash import callable_files, stage_code
from trtflow.environment import Environment, GpuInfo
from trtflow.errors import RecipeError, TrtflowError
from trtflow.evidence import Evidence
from trtflow.fingerprint import StatCache, hash_file, hash_path, hash_value
from trtflow.fsutil import allowed_roots_for, input_path, project_root, resolve_user_path
from trtflow.graph import Graph
from trtflow.recipe.expand import ConcreteNode

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

    def resolve(self, path: str, check: bool = False) -> Path:
        """``path`` resolved inside the allowed roots; ``check``: an input file, checked by `fsutil.input_path`."""
        resolved = (input_path if check else resolve_user_path)(path, self.recipe_dir, self.allowed_roots)
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
            from trtflow.depfile import ENV_LABEL, label_digest

            path = None if label.startswith(ENV_LABEL) else self.locate(label)
            self.memo[memo] = label_digest(label, path, self.stat_cache)
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
        manifest: dict[str, Any] = {
                    "stage": self.stage, "version": self.version, "code": self.code, "code_files": self.code_files,
                    "params": self.params, "inputs": self.inputs, "input_sources": self.input_sources,
                    "files": self.files, "facts": self.facts, "verdicts": self.verdicts,
                    "reference": self.reference}
        if self.runs_code:
            manifest.update(pre=self.pre_key, deps=self.deps, absent=self.absent)
        return manifest


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
            path = kctx.resolve(ref, check=True)  # fsutil.input_path: the check init makes too
        except TrtflowError as exc:
            raise RecipeError(f"node {node.name!r}: {exc.message}", node.location, hint=exc.hint) from None
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
        for i, producer in enumerate(slot_refs):
            # a many-slot's entries are keyed by their producer, so renaming a candidate re-runs the chooser
            label = f"{slot}[{producer[0]}.{producer[1]}]" if many else slot if len(slot_refs) == 1 else f"{slot}[{i}]"
            produced = output_digests.get(producer)
            if produced is None:
                return None
            inputs[label] = produced
            sources[label] = f"{producer[0]}.{producer[1]}"
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
