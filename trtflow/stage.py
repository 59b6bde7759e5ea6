"""The stage contract: what a stage declares and what it receives when it runs.

A stage is a `Stage` object exposed through the ``trtflow.stages`` entry-point group. Its module must be
cheap to import (no torch, onnx, TensorRT at module level): the planner imports it to read the
declarations, and the no-op path of ``trtflow run`` must stay fast. Heavy imports go inside ``run``.

Each input arrives as a path in a private folder; the other outputs of the node that produced it lie in
the same folder (``inputs["model"].parent``), so an ONNX model's external weights or an engine's
provenance manifest travel with it.

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
    StageFailed,
    StageSkipped,
    TrtflowError,
)
from trtflow.recipe.schema import ProfileSpec, ShapeRange

__all__ = [
    "CodeReference",
    "EnvironmentUnavailable",
    "GateFailed",
    "Input",
    "Output",
    "ProfileSpec",
    "RecipeError",
    "ShapeRange",
    "SharedCache",
    "Stage",
    "StageContext",
    "StageFailed",
    "StageParams",
    "StageSkipped",
    "TrtflowError",
]

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
    """Base class for a stage's parameters: unknown keys are errors; every field needs a description."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Input:
    """An input slot of a stage, filled by another node's output of one of the accepted kinds."""

    kind: str | tuple[str, ...]
    description: str = ""
    optional: bool = False

    @property
    def kinds(self) -> tuple[str, ...]:
        return (self.kind,) if isinstance(self.kind, str) else tuple(self.kind)


@dataclass(frozen=True)
class Output:
    """An output of a stage: one file, stored by content digest."""

    kind: str
    filename: str
    description: str = ""
    optional: bool = False


ParamsFn = Callable[[Any], Any]


@dataclass(frozen=True)
class Stage:
    """Everything the engine needs to know about a stage.

    - ``resources``: subset of {"cpu", "gpu"}; a callable receives the validated params.
    - ``environment``: names of environment facts (see `trtflow.environment.FACTS`) the result depends
      on; they are part of the node key. A callable receives the validated params.
    - ``files``: a callable returning the paths (relative to the recipe) whose content the result depends
      on beyond its graph inputs (a model file, calibration data); they are hashed into the node key.
    - ``check``: called before any work with the params; raises `StageSkipped` (backend cannot run here)
      or `EnvironmentUnavailable`/`RecipeError` with a clear message.
    """

    name: str
    version: str
    description: str
    params: type[StageParams]
    run: Callable[[StageContext, dict[str, Path], Any], Mapping[str, Any] | None]
    inputs: Mapping[str, Input] = field(default_factory=dict)
    outputs: Mapping[str, Output] = field(default_factory=dict)
    resources: frozenset[str] | Callable[[Any], frozenset[str]] = frozenset({"cpu"})
    environment: Sequence[str] | Callable[[Any], Sequence[str]] = ()
    files: Callable[[Any], Sequence[str]] | None = None
    check: Callable[[Any], None] | None = None

    def resources_for(self, params: Any) -> frozenset[str]:
        return frozenset(self.resources(params) if callable(self.resources) else self.resources)

    def environment_for(self, params: Any) -> tuple[str, ...]:
        return tuple(self.environment(params) if callable(self.environment) else self.environment)

    def files_for(self, params: Any) -> tuple[str, ...]:
        return tuple(self.files(params)) if self.files else ()


class SharedCache:
    """A mutable file shared by many nodes (e.g. a TensorRT timing cache), guarded by a file lock.

    It is never part of a node key. Read it under ``lock()``, work on a private copy, and write it back
    with ``replace_atomically`` under ``lock()`` again (merging with what others wrote meanwhile).
    """

    def __init__(self, path: Path, lock_timeout: float = 600.0) -> None:
        self.path = path
        self.lock_timeout = lock_timeout
        path.parent.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def lock(self) -> Iterator[Path]:
        from filelock import FileLock

        with FileLock(str(self.path) + ".lock", timeout=self.lock_timeout):
            yield self.path

    def read_bytes(self) -> bytes | None:
        return self.path.read_bytes() if self.path.exists() else None

    def replace_atomically(self, data: bytes) -> None:
        """Write new contents (call while holding ``lock()``)."""
        from trtflow.fsutil import atomic_write_bytes

        atomic_write_bytes(self.path, data)


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
    ) -> None:
        self.node = node
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
        self.out_dir = scratch / "out"
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def output(self, name: str) -> Path:
        """The path the stage must write its output ``name`` to."""
        try:
            return self.out_dir / self._outputs[name].filename
        except KeyError:
            raise KeyError(f"stage declares no output {name!r}; declared: {sorted(self._outputs)}") from None

    def resolve(self, path: str | Path) -> Path:
        """Resolve a recipe path (relative to the recipe file) and refuse paths outside allowed roots."""
        from trtflow.fsutil import resolve_user_path

        return resolve_user_path(path, self.recipe_dir, self._allowed_roots)

    def load_callable(self, spec: str, what: str = "callable") -> Any:
        """Import the user callable named in params (``python:file.py:function`` or ``python:pkg.module:function``)."""
        from trtflow.callables import load_callable

        return load_callable(spec, self.resolve, what)

    def progress(self, fraction: float | None, message: str = "") -> None:
        """Report progress (0..1, or None when unknown); shown live by the CLI."""
        if self._progress_file is not None:
            import json

            line = json.dumps({"fraction": fraction, "message": message})
            with open(self._progress_file, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        self.log.info("progress %s %s", "" if fraction is None else f"{fraction:.0%}", message)

    def shared_cache(self, name: str) -> SharedCache:
        """A shared mutable cache file under the store, e.g. ``timing/tensorrt-10.13-sm90.cache``."""
        safe = "/".join(part for part in Path(name).parts if part not in ("..", "/"))
        return SharedCache(self._cache_dir / safe)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()
