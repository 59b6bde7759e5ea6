"""Open a candidate: the one place that decides what a model input is and what runs it (validate, benchmark).

`open_candidate` reads the model's kind (ONNX model or engine), finds an engine's provenance (engine.json), picks
the backend (``auto``: the flavour that built the engine, ONNX Runtime for an ONNX model), refuses a backend that
cannot run that kind (a recipe error naming the ``backend`` field), skips the stage when engines cannot execute
here, and deserialises an engine through `trt_runtime.open_engine`. It returns one `Candidate`; its with-block
holds the engine's execution context (nothing to enter for other backends). Host runtimes (an ONNX Runtime
session, a PyTorch module) are opened by the stage that times or compares them, from ``candidate.backend``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtflow.stage import RecipeError, StageContext, StageSkipped

from ..data import InputSpec, onnx_input_specs
from ..formats.onnx_model import candidate_kind
from .tensorrt import FLAVOURS as TRT_FLAVOURS

if TYPE_CHECKING:
    from .records import EngineRecord
    from .trt_runtime import EngineSession


@dataclass
class Candidate:
    """A model input, decided and opened: its path and kind, the backend that runs it and, for an engine, its
    provenance and the deserialised engine (whose execution context lives inside this object's with-block)."""

    path: Path | None
    kind: str | None  # 'onnx', 'engine', or None when the node has no model input
    backend: str      # a TensorRT flavour, 'onnxruntime', or what the stage runs itself ('torch', 'fake-quant')
    provenance: Path | None = None
    manifest: EngineRecord | None = None  # its engine.json
    engine: EngineSession | None = None

    def __enter__(self) -> Candidate:
        if self.engine is not None:
            self.engine.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.engine is not None:
            self.engine.__exit__(*exc)

    def input_specs(self) -> list[InputSpec] | None:
        """The model's inputs (an engine's or an ONNX model's); None when there is no model to read them from."""
        if self.engine is not None:
            return self.engine.input_specs()
        if self.kind == "onnx" and self.path is not None:
            return onnx_input_specs(self.path)
        return None


def _what(kind: str | None) -> str:
    return "missing" if kind is None else "an ONNX model" if kind == "onnx" else "an engine"


def open_candidate(ctx: StageContext, path: Path | None, requested: str, *, slot: str = "candidate",
                   provenance: Path | None = None, need_cuda_python: bool = False) -> Candidate:
    """The `Candidate` for the model input ``slot`` at ``path`` run with ``requested`` (a backend name or 'auto').

    Raises `RecipeError` (field ``backend``) when the backend cannot run the model's kind, `StageSkipped` when an
    engine's flavour cannot execute here (``need_cuda_python``: the timing harness needs cuda-python too)."""
    from .trt_runtime import (
        engine_backend,
        open_engine,
        provenance_for,
        read_provenance,
        runtime_available,
        runtime_needs,
    )

    kind = candidate_kind(path) if path is not None else None
    if kind == "engine":
        assert path is not None
        provenance = provenance_for(path, provenance)
    else:
        provenance = None
    manifest = read_provenance(provenance)
    backend = requested
    if backend == "auto":
        if kind is None:
            raise RecipeError(f"backend auto needs a {slot} input (an ONNX model or an engine)", field="backend")
        backend = engine_backend("auto", manifest) if kind == "engine" else "onnxruntime"
    if backend in TRT_FLAVOURS and kind != "engine":
        raise RecipeError(f"backend {backend} runs engines, but the {slot} input is {_what(kind)}", field="backend",
                          hint=f"wire a build node's engine as `{slot}` in the recipe, or set backend: onnxruntime")
    if backend == "onnxruntime" and kind != "onnx":
        raise RecipeError(f"backend onnxruntime runs ONNX models, but the {slot} input is {_what(kind)}",
                          field="backend", hint=f"wire a node's ONNX model as `{slot}` in the recipe, or set "
                          "backend: auto (an engine runs with the TensorRT flavour that built it)")
    candidate = Candidate(path, kind, backend, provenance, manifest)
    if backend in TRT_FLAVOURS:
        assert path is not None
        reason = runtime_available(backend, ctx.gpu, need_cuda_python=need_cuda_python)
        if reason:
            raise StageSkipped(f"cannot run the engine {slot} on {backend}: {reason}",
                               needs=runtime_needs(backend) + (" and cuda-python" if need_cuda_python else ""))
        if manifest is None:
            ctx.log.warning("no provenance (engine.json) for the engine: its flavour/version/GPU are not checked")
        with ctx.native_step(backend, f"deserialising the {slot} {path.name}"):
            candidate.engine = open_engine(path, provenance, backend, ctx.gpu)
    return candidate
