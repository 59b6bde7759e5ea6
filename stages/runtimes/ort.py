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


#: The ``onnxruntime.GraphOptimizationLevel`` member each recipe level names: the one mapping in the tree (a test
#: fails if another module spells a member). ``layout`` is ONNX Runtime's own level between extended and all
#: (ORT_ENABLE_LAYOUT: extended plus the layout transformations such as NCHWc, without the rest of ``all``).
LEVEL_MEMBERS: dict[str, str] = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",
    "all": "ORT_ENABLE_ALL",
}


def level_member(name: OptimizationLevel) -> str:
    """The name of the ``GraphOptimizationLevel`` member the installed ONNX Runtime runs for ``name``: an ONNX
    Runtime without ORT_ENABLE_LAYOUT runs ``layout`` as ORT_ENABLE_ALL (the nearest level that still has the
    layout transformations). Repro commands print this name, so they create the session that ran."""
    import onnxruntime as ort

    member = LEVEL_MEMBERS[name]
    return member if hasattr(ort.GraphOptimizationLevel, member) else LEVEL_MEMBERS["all"]


def session_options(options: OrtOptions | None) -> Any:
    """An ``onnxruntime.SessionOptions`` for ``options`` (ONNX Runtime's defaults where unset)."""
    import onnxruntime as ort

    options = options or OrtOptions()
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level_member(options.graph_optimization_level))
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
