"""The stage contract: what a stage declares and what it receives when it runs.

A stage is a `Stage` object exposed through the ``trtflow.stages`` entry-point group. Its module must be
cheap to import (no torch, onnx, TensorRT at module level): the planner imports it to read the
declarations, and the no-op path of ``trtflow run`` must stay fast. Heavy imports go inside ``run``.

Each input arrives as a path in a private folder; the other outputs of the node that produced it lie in
the same folder (``inputs["model"].parent``), so an ONNX model's external weights or an engine's
provenance manifest travel with it. A slot declared ``Input(..., many=True)`` arrives as a list of such
paths, each in its own folder named after the node that produced it.

The stage writes each declared output to ``ctx.output(name)`` and may return a JSON-serialisable summary
(metrics, counts) that is stored in the node's manifest and shown in reports. It writes nothing outside
``ctx.scratch`` / ``ctx.output(...)``; the runner commits the outputs atomically.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict

from trtflow.errors import (
    EnvironmentUnavailable,
    GateFailed,
    RecipeError,
    RecipeMismatch,
    StageFailed,
    StageSkipped,
    TrtflowError,
)
from trtflow.recipe.schema import ProfileSpec, ShapeRange
from trtflow.storage.confined.tree import Tree
from trtflow.storage.confined.tree import locate as confined_locate
from trtflow.storage.pins import Pin
from trtflow.verdicts import GateVerdict, as_verdicts

__all__ = [
    "CodeReference",
    "EnvironmentUnavailable",
    "Figure",
    "Figures",
    "GateContext",
    "GateFailed",
    "GateVerdict",
    "Input",
    "Output",
    "Pin",
    "ProfileSpec",
    "RecipeError",
    "RecipeMismatch",
    "Reference",
    "Resources",
    "ShapeRange",
    "SharedCache",
    "Stage",
    "StageContext",
    "StageFailed",
    "StageParams",
    "StageSkipped",
    "TrtflowError",
]

#: The file (in a node's scratch folder) naming the native call in progress, read after a crash.
NATIVE_STEP_FILE = "native_step.json"

# Artifact kinds that flow along graph edges. Stages may use their own kinds too (any string).
ONNX = "onnx"
ENGINE = "engine"
METRICS = "metrics"
CALIBRATION = "calibration"
FILE = "file"


def _check_code_reference(value: str) -> str:
    from trtflow.callables import validate_spec

    return validate_spec(value)


#: A parameter naming user code: ``python:path/to/file.py:function`` or ``python:package.module:function``.
CodeReference = Annotated[str, AfterValidator(_check_code_reference)]


class StageParams(BaseModel):
    """Base class for a stage's parameters: unknown keys are errors; every field needs a description.

    A field declared with ``json_schema_extra={"written_in_recipe": True}`` (a grant of trust, e.g. export's
    ``trust_code``) may be turned on only in a recipe file, not with ``--set``: the recipe loader refuses it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    def notices(self) -> list[str]:
        """What a user should know about these settings before the node runs (`trtflow plan` shows each)."""
        return []


@dataclass(frozen=True)
class Input:
    """An input slot of a stage, filled by another node's output of one of the accepted kinds.

    ``many``: the slot takes every artifact its references resolve to (a reference to a matrix node means
    all its variants that agree with this node's matrix); the stage receives a list of paths, each in a
    folder named after the node that produced it, and `StageContext.input_sources` says where each came
    from. ``accept_gate_failed``: the slot also takes the committed outputs of a node whose quality gate
    failed (a chooser excludes such a candidate and says why, instead of being blocked by it).
    """

    kind: str | tuple[str, ...]
    description: str = ""
    optional: bool = False
    many: bool = False
    accept_gate_failed: bool = False

    @property
    def kinds(self) -> tuple[str, ...]:
        return (self.kind,) if isinstance(self.kind, str) else tuple(self.kind)


@dataclass(frozen=True)
class Output:
    """An output of a stage: one file, stored by content digest. ``filename`` may hold sub-folders
    (``1/model.onnx``): outputs are committed and materialised at that relative path."""

    kind: str
    filename: str
    description: str = ""
    optional: bool = False


ParamsFn = Callable[[Any], Any]


@dataclass(frozen=True)
class Resources:
    """What a node needs while it runs; the scheduler starts a node only when all of it is free.

    ``exclusive``: nothing else runs beside it (on its GPU, and no CPU-heavy node on its host): for
    benchmarks, whose timings other work would disturb. ``memory_mb``: peak host memory; None lets the engine
    use the stage's ``memory`` estimate. ``compute_capability`` ("9.0", ">=8.0") and ``gpu_name`` (a substring
    of the GPU's name) restrict which GPU class may run a GPU node.
    """

    cpu: float = 1.0
    gpu: int = 0
    exclusive: bool = False
    memory_mb: int | None = None
    compute_capability: str | None = None
    gpu_name: str | None = None

    def accepts(self, gpu: Any) -> bool:
        """Whether a GPU (`trtflow.environment.GpuInfo`) meets ``compute_capability`` and ``gpu_name``."""
        if self.gpu_name and self.gpu_name.lower() not in gpu.name.lower():
            return False
        wanted = (self.compute_capability or "").strip()
        if not wanted:
            return True
        have = _cc(gpu.compute_capability)
        if wanted.startswith(">="):
            return have >= _cc(wanted[2:])
        return have == _cc(wanted.removeprefix("sm"))

    @classmethod
    def of(cls, value: Resources | frozenset[str] | set[str] | Sequence[str]) -> Resources:
        """Accept the older declaration form: a set of "cpu" / "gpu"."""
        if isinstance(value, Resources):
            return value
        names = set(value)
        unknown = names - {"cpu", "gpu"}
        if unknown:
            raise ValueError(f"unknown resource names {sorted(unknown)}; use Resources(cpu=..., gpu=...)")
        return cls(cpu=1.0, gpu=1 if "gpu" in names else 0)


def _cc(text: str) -> tuple[int, ...]:
    """"9.0" / "90" / "sm90" -> (9, 0)."""
    text = text.strip().lower().removeprefix("sm")
    if "." not in text and text.isdigit() and len(text) >= 2:
        text = f"{text[:-1]}.{text[-1]}"
    try:
        return tuple(int(p) for p in text.split("."))
    except ValueError:
        return (-1,)


@dataclass(frozen=True)
class GateContext:
    """What a quality gate sees besides the params and the node's summary."""

    #: The summary of the node's previous successful run under another key (for regression gates), or None.
    previous: Mapping[str, Any] | None = None
    #: The environment facts the node was keyed with (GPU, TensorRT version, ...).
    facts: Mapping[str, str] = field(default_factory=dict)
    #: Resolves a recipe path (relative to the recipe file, inside the project), e.g. a baseline file.
    resolve: Callable[[str], Path] | None = None
    #: The node being judged (its name in the recipe).
    node: str = ""
    #: How many nodes of the recipe make a comparison (`Stage.compares`): each one's error rate is divided among
    #: them, so that a recipe run raises a false alarm no more often than one comparison would.
    family: int = 1


@dataclass(frozen=True)
class Figure:
    """One figure of a node's result that the recipe's history keeps (`trtflow history`): a statistic with its
    sample count and 95% interval, e.g. the p99 latency at batch 8.

    ``name`` identifies the series across runs (keep it stable: "p99 latency, batch 8"); ``better`` says which way
    is an improvement; ``primary`` marks what the node's gates judge (its objective point), the figures
    `trtflow history --check` judges by default; ``context`` holds what a reader needs to interpret the value (a
    level length, a search bracket), JSON-serialisable. ``low``/``high``: the 95% interval, None where the figure
    has none (a search bracket is not an interval: put it in ``context``).
    """

    name: str
    value: float
    unit: str
    better: str  # "lower" or "higher"
    low: float | None = None
    high: float | None = None
    n: int | None = None
    primary: bool = False
    context: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.better not in ("lower", "higher"):
            raise ValueError(f"Figure.better must be 'lower' or 'higher', got {self.better!r}")


@dataclass(frozen=True)
class Figures:
    """What a node's result adds to the history: its figures, and facts about where they were measured (GPU, CPU,
    host load), JSON-serialisable."""

    figures: tuple[Figure, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)


#: ``figures(params, summary) -> Figures``: the figures of a node's summary for the recipe's history.
FiguresFn = Callable[[Any, Mapping[str, Any]], Figures]


#: ``gate(params, summary, gate_ctx) -> verdicts`` (a plain string is a failure message; none: the gate passes).
GateFn = Callable[[Any, Mapping[str, Any], GateContext], Sequence[GateVerdict | str]]
#: ``reference(params, resolve, node) -> "accepted" | a pinned artifact (`Pin.describe`'s form) | None``: what
#: the node measures beside its candidate. "accepted": the artifact of this node's last accepted result (every
#: primary gate verdict passed), kept by the engine; a mapping: a pinned artifact (its files' digests), which
#: enters the node key.
ReferenceFn = Callable[[Any, Callable[[str], Path], str], "str | Mapping[str, Any] | None"]


@dataclass(frozen=True)
class Reference:
    """A reference artifact laid out for a stage, as its inputs are: ``inputs`` (slot -> the file the slot
    names, its producer's other outputs beside it), ``files`` (project-relative path -> the pinned copy of a
    recipe file or code file the node used), and what was recorded with it (``record``: the node's params and
    summary when it was pinned, the pin's name and time). ``missing``: why it could not be laid out (then the
    paths are empty and a stage falls back to the recorded figures)."""

    name: str
    inputs: Mapping[str, Path] = field(default_factory=dict)
    files: Mapping[str, Path] = field(default_factory=dict)
    record: Mapping[str, Any] = field(default_factory=dict)
    missing: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "inputs": {k: str(v) for k, v in self.inputs.items()},
                "files": {k: str(v) for k, v in self.files.items()}, "record": dict(self.record),
                "missing": self.missing}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Reference | None:
        if not data:
            return None
        return cls(str(data.get("name", "")), {k: Path(v) for k, v in (data.get("inputs") or {}).items()},
                   {k: Path(v) for k, v in (data.get("files") or {}).items()}, dict(data.get("record") or {}),
                   data.get("missing"))
#: ``memory(params, input_sizes) -> bytes``: peak host memory of a node, from its inputs' sizes by slot.
MemoryFn = Callable[[Any, Mapping[str, int]], int]


@dataclass(frozen=True)
class Stage:
    """Everything the engine needs to know about a stage.

    - ``resources``: `Resources`, or a subset of {"cpu", "gpu"}; a callable receives the validated params.
    - ``environment``: names of environment facts (see `trtflow.environment.FACTS`) the result depends
      on; they are part of the node key. A callable receives the validated params.
    - ``files``: a callable returning the paths (relative to the recipe) whose content the result depends
      on beyond its graph inputs (a model file, calibration data); they are hashed into the node key.
    - ``check``: called before any work with the params; raises `StageSkipped` (backend cannot run here)
      or `EnvironmentUnavailable`/`RecipeError` with a clear message.
    - ``check_files``: called at plan time with the params and ``files`` resolved (recipe path -> Path, each one
      present); raises a `TrtflowError` when a file is not what the params need (a model folder that holds no
      model), which the planner reports as a recipe error at the node's line. Cheap: it runs on every plan.
    - ``gate`` / ``gate_params``: quality gates applied by the engine to the summary ``run`` returned, on a
      fresh run and again on every cached reuse; ``gate_params`` (top-level param names) only configure gates,
      so they are left out of the node key: changing a threshold re-judges the cached measurements. A gate
      returns `GateVerdict` objects (`trtflow.verdicts`).
    - ``compares``: whether a node with these params makes a comparison (a regression gate): the recipe's false
      alarm rate is divided among such nodes (`GateContext.family`, `StageContext.gate_family`).
    - ``reference``: what the node measures beside its candidate (see `ReferenceFn`); the engine lays it out for
      the stage (`StageContext.reference`) and, for "accepted", keeps the artifact of each accepted result.
    - ``figures``: the figures of a result that the recipe's history keeps (`Figures`, from the params and the
      summary ``run`` returned); the engine records them in the journal once per measurement, and
      `trtflow history` shows their trend and change points.
    - ``memory``: peak host memory estimate (bytes) from the input sizes, for memory-aware scheduling.
    - ``preload``: heavy modules ``run`` imports (torch, onnx, ...): a warm process imports them once and forks
      the nodes from it. Only modules whose import starts no thread and does not initialise CUDA belong here.
    - ``version``: bump it for a behaviour change the code digest cannot see (e.g. a dependency's default).
      The node key also holds a digest of the stage's module and the modules of its package it imports.
    """

    name: str
    version: str
    description: str
    params: type[StageParams]
    run: Callable[[StageContext, dict[str, Any], Any], Mapping[str, Any] | None]  # slot -> Path (list: many)
    inputs: Mapping[str, Input] = field(default_factory=dict)
    outputs: Mapping[str, Output] = field(default_factory=dict)
    resources: Resources | frozenset[str] | Callable[[Any], Resources | frozenset[str]] = frozenset({"cpu"})
    environment: Sequence[str] | Callable[[Any], Sequence[str]] = ()
    files: Callable[[Any], Sequence[str]] | None = None
    check: Callable[[Any], None] | None = None
    check_files: Callable[[Any, Mapping[str, Path]], None] | None = None
    gate: GateFn | None = None
    gate_params: tuple[str, ...] = ()
    compares: Callable[[Any], bool] | None = None
    reference: ReferenceFn | None = None
    figures: FiguresFn | None = None
    memory: MemoryFn | None = None
    preload: tuple[str, ...] = ()

    def resources_for(self, params: Any) -> Resources:
        return Resources.of(self.resources(params) if callable(self.resources) else self.resources)

    def environment_for(self, params: Any) -> tuple[str, ...]:
        return tuple(self.environment(params) if callable(self.environment) else self.environment)

    def files_for(self, params: Any) -> tuple[str, ...]:
        return tuple(self.files(params)) if self.files else ()

    def judge(self, params: Any, summary: Mapping[str, Any], gate_ctx: GateContext) -> list[GateVerdict]:
        """The verdicts of the stage's gates for this summary (empty when it has no gate)."""
        return as_verdicts(self.gate(params, summary, gate_ctx)) if self.gate is not None else []

    def compares_for(self, params: Any) -> bool:
        return bool(self.compares(params)) if self.compares is not None else False

    def reference_for(self, params: Any, resolve: Callable[[str], Path], node: str) -> str | Mapping[str, Any] | None:
        return self.reference(params, resolve, node) if self.reference is not None else None


class SharedCache:
    """A mutable file shared by many nodes (e.g. a TensorRT timing cache), guarded by a file lock.

    It is never part of a node key. Read it under ``lock()``, work on a private copy, and write it back
    with ``replace_atomically`` under ``lock()`` again (merging with what others wrote meanwhile).
    """

    def __init__(self, path: Path, lock_timeout: float = 600.0, root: Path | None = None) -> None:
        from trtflow.storage.confined.tree import locate

        self.path = path
        self.lock_timeout = lock_timeout
        # below ``root`` (the store's caches folder), every folder is walked without following links
        self._tree, self._rel = locate(path, root)
        self._tree.mkdir(self._rel[:-1]) if len(self._rel) > 1 else self._tree.ensure()

    @contextmanager
    def lock(self) -> Iterator[Path]:
        """Hold the cache's lock (raises TimeoutError after ``lock_timeout`` seconds)."""
        with self._tree.lock((*self._rel[:-1], self._rel[-1] + ".lock"), timeout=self.lock_timeout):
            yield self.path

    def read_bytes(self) -> bytes | None:
        from trtflow.storage.confined import kinds

        try:
            return self._tree.read_bytes(self._rel, kinds.CACHE)
        except FileNotFoundError:
            return None

    def replace_atomically(self, data: bytes) -> None:
        """Write new contents (call while holding ``lock()``)."""
        self._tree.write_bytes(self._rel, data)


class StageContext:
    """What a running stage gets: scratch space, output paths, a logger, progress, caches, cancellation."""

    def __init__(
        self,
        node: str,
        scratch: Path,
        recipe_dir: Path,
        outputs: Mapping[str, Output],
        cache_dir: Path,
        facts: Mapping[str, str] | None = None,
        gpu: int | None = None,
        allowed_roots: Sequence[Path] = (),
        logger: logging.Logger | None = None,
        progress_file: Path | None = None,
        previous_summary: Mapping[str, Any] | None = None,
        input_sources: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
        ran_alone: bool | None = None,
        reference: Reference | None = None,
        gate_family: int = 1,
        scratch_tree: Tree | None = None,
    ) -> None:
        self.node = node
        #: What the node measures beside its candidate (`Stage.reference`), laid out like its inputs; None: none.
        self.reference = reference
        #: How many nodes of the recipe make a comparison (`GateContext.family`).
        self.gate_family = max(int(gate_family), 1)
        #: Per input slot, one entry per artifact (in the order of ``inputs[slot]``): the producing node's
        #: ``node`` name, ``template``, ``matrix`` values and ``inputs`` (its own slots -> producer node names).
        #: True when the engine ran nothing beside this node (an exclusive node, e.g. a benchmark); None: unknown.
        self.ran_alone = ran_alone
        self.input_sources = {slot: [dict(entry) for entry in entries]
                              for slot, entries in (input_sources or {}).items()}
        #: The summary this node returned the last time it succeeded (any settings), or None: lets a stage
        #: gate on regressions, e.g. a benchmark that got slower after a TensorRT upgrade.
        self.previous_summary = dict(previous_summary) if previous_summary else None
        self.scratch = scratch
        self.recipe_dir = recipe_dir
        self.facts = dict(facts or {})
        self.gpu = gpu
        self.log = logger or logging.getLogger(f"trtflow.node.{node}")
        self._outputs = outputs
        self._cache_dir = cache_dir
        self._allowed_roots = [Path(p).resolve() for p in (allowed_roots or [recipe_dir])]
        self._progress_file = progress_file
        self._cancelled = threading.Event()
        self._native_steps: list[dict[str, Any]] = []
        self.out_dir = scratch / "out"
        if scratch_tree is not None:  # the descriptor the runner made the folder with (``scratch`` names it)
            self._scratch = scratch_tree
        else:  # a context made by hand (e.g. trtflow.testing) may name a folder to create
            self._scratch = Tree(scratch)
            self._scratch.ensure()
        self._scratch.mkdir("out")

    @property
    def scratch_folder(self) -> Tree:
        """The scratch folder as the descriptor the runner made it with (``scratch`` is a path through it,
        ``/proc/<pid>/fd/<n>``). For a folder a child process writes into: ``folders.make_folder(
        ctx.scratch_folder, name)`` makes it and holds it; read back what the child wrote through that tree
        (``open_read``, ``read_bytes``, ``subtree``), never by its path."""
        return self._scratch

    def output(self, name: str) -> Path:
        """The path the stage must write its output ``name`` to (its folder is created)."""
        try:
            filename = self._outputs[name].filename
        except KeyError:
            raise KeyError(f"stage declares no output {name!r}; declared: {sorted(self._outputs)}") from None
        parts = filename.split("/")
        if len(parts) > 1:
            self._scratch.mkdir(("out", *parts[:-1]))
        return self.out_dir / filename

    def resolve(self, path: str | Path) -> Path:
        """Resolve a recipe path (relative to the recipe file) and refuse paths outside allowed roots."""
        from trtflow.fsutil import resolve_user_path

        return resolve_user_path(path, self.recipe_dir, self._allowed_roots)

    def load_callable(self, spec: str, what: str = "callable") -> Any:
        """Import the user callable named in params (``python:file.py:function`` or ``python:pkg.module:function``)."""
        from trtflow.callables import load_callable
        from trtflow.fsutil import project_root

        return load_callable(spec, self.resolve, what, project_root(self.recipe_dir) or self.recipe_dir)

    def progress(self, fraction: float | None, message: str = "") -> None:
        """Report progress (0..1, or None when unknown); shown live by the CLI."""
        if self._progress_file is not None:
            import json

            line = json.dumps({"fraction": fraction, "message": message})
            if self._progress_file.parent == self.scratch:  # the engine's: through the held scratch folder
                self._scratch.append_text(self._progress_file.name, line + "\n")
            else:  # a context made by hand names a file of its own
                tree, rel = confined_locate(self._progress_file, self.scratch)
                tree.append_text(rel, line + "\n")
        self.log.info("progress %s %s", "" if fraction is None else f"{fraction:.0%}", message)

    @contextmanager
    def native_step(self, library: str, what: str, repro: str | None = None,
                    hint: str | None = None) -> Iterator[None]:
        """Mark a call into native code that may crash the process (a segfault, an abort, the OOM killer).

        If the process dies inside the block, the engine reports "crashed in ``library`` while ``what``" with
        the native trace, ``repro`` (the smallest command that reproduces the crash) and ``hint`` (a known
        cause the stage detected beforehand). Blocks may nest; the innermost one is reported.
        """
        import json
        import time

        record = {"library": library, "what": what, "repro": repro, "hint": hint, "started": time.time()}
        self._native_steps.append(record)
        self._scratch.write_text(NATIVE_STEP_FILE, json.dumps(record))
        self.log.info("native step: %s: %s", library, what)
        try:
            yield
        finally:
            self._native_steps.pop()
            if self._native_steps:
                self._scratch.write_text(NATIVE_STEP_FILE, json.dumps(self._native_steps[-1]))
            else:
                self._scratch.unlink(NATIVE_STEP_FILE)

    def shared_cache(self, name: str) -> SharedCache:
        """A shared mutable cache file under the store, e.g. ``timing/tensorrt-10.13-sm90.cache``."""
        safe = "/".join(part for part in Path(name).parts if part not in ("..", "/", "."))
        return SharedCache(self._cache_dir / safe, root=self._cache_dir)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()
