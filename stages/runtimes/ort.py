"""ONNX Runtime sessions with recipe-settable options: one definition for every stage that runs ONNX Runtime.

Some models crash or mis-compute in one of ONNX Runtime's graph optimisers (e.g. the CPU NCHWc layout
transformer on some fp16 models); these options let a recipe step around such a bug without a code change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from trtflow.stage import StageParams

OptimizationLevel = Literal["disable", "basic", "extended", "layout", "all"]


class OrtOptions(StageParams):
    """ONNX Runtime session options."""

    graph_optimization_level: OptimizationLevel = Field(
        "all", description="Graph optimisations: disable, basic, extended, layout (extended plus layout "
        "transformations such as NCHWc) or all. Lower it when a session crashes or mis-computes while optimising.")
    disabled_optimizers: list[str] = Field(
        default_factory=list, description="Names of ONNX Runtime graph optimisers to turn off, e.g. "
        "['NchwcTransformer'], a narrower work-around than lowering graph_optimization_level.")
    intra_op_threads: int | None = Field(
        None, ge=0, description="Threads used inside one operator (0 or unset: ONNX Runtime's default, one per "
        "physical core).")
    inter_op_threads: int | None = Field(
        None, ge=0, description="Threads used to run independent operators in parallel (unset: default).")


def _level(ort: Any, name: OptimizationLevel) -> Any:
    levels = ort.GraphOptimizationLevel
    return {
        "disable": levels.ORT_DISABLE_ALL,
        "basic": levels.ORT_ENABLE_BASIC,
        "extended": levels.ORT_ENABLE_EXTENDED,
        "layout": getattr(levels, "ORT_ENABLE_LAYOUT", levels.ORT_ENABLE_ALL),
        "all": levels.ORT_ENABLE_ALL,
    }[name]


def session_options(options: OrtOptions | None) -> Any:
    """An ``onnxruntime.SessionOptions`` for ``options`` (ONNX Runtime's defaults where unset)."""
    import onnxruntime as ort

    options = options or OrtOptions()
    so = ort.SessionOptions()
    so.graph_optimization_level = _level(ort, options.graph_optimization_level)
    if options.intra_op_threads is not None:
        so.intra_op_num_threads = options.intra_op_threads
    if options.inter_op_threads is not None:
        so.inter_op_num_threads = options.inter_op_threads
    return so


def create_session(model: Path | str, options: OrtOptions | None = None,
                   providers: list[str] | None = None) -> Any:
    """An ONNX Runtime inference session on ``model`` with the given options and execution providers."""
    import onnxruntime as ort

    options = options or OrtOptions()
    kwargs: dict[str, Any] = {"sess_options": session_options(options),
                              "providers": providers or ["CPUExecutionProvider"]}
    if options.disabled_optimizers:
        kwargs["disabled_optimizers"] = list(options.disabled_optimizers)
    return ort.InferenceSession(str(model), **kwargs)
