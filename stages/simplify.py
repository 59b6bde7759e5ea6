"""simplify: onnxsim constant folding and graph cleanup, with its own output check."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from trtflow.stage import ONNX, Input, Output, Stage, StageContext, StageFailed, StageParams

from .accuracy.model_problems import hint_text, memory_findings, onnxsim_repro


class Params(StageParams):
    check_n: int = Field(default=3, ge=0, description="Random inputs on which onnxsim checks the simplified model.")
    input_shapes: dict[str, list[int]] = Field(
        default_factory=dict,
        description="Concrete shapes for dynamic inputs used by the check (the model stays dynamic), e.g. "
        "{input: [1, 3, 224, 224]}. Dynamic dims without one are checked with size 1.",
    )
    skip_fuse_bn: bool = Field(default=False, description="Keep BatchNormalization nodes separate.")
    skipped_optimizers: list[str] = Field(default_factory=list, description="onnxoptimizer passes to skip.")
    on_failure: Literal["error", "passthrough"] = Field(
        default="error",
        description="What to do when onnxsim cannot handle the model: 'error' fails the node; 'passthrough' "
        "copies the input unchanged and records why in the summary.",
    )


def _histogram(model: Any) -> Counter:
    return Counter(node.op_type for node in model.graph.node)


def _check_shapes(model: Any, given: dict[str, list[int]]) -> dict[str, list[int]]:
    init = {i.name for i in model.graph.initializer}
    shapes: dict[str, list[int]] = {}
    for value in model.graph.input:
        if value.name in init:
            continue
        dims = value.type.tensor_type.shape.dim
        if any(d.dim_param or d.dim_value <= 0 for d in dims):
            shapes[value.name] = given.get(value.name) or [d.dim_value if d.dim_value > 0 else 1 for d in dims]
    unknown = set(given) - {v.name for v in model.graph.input}
    if unknown:
        raise StageFailed(f"input_shapes names inputs the model lacks: {sorted(unknown)}",
                          hint=f"model inputs: {[v.name for v in model.graph.input if v.name not in init]}")
    return shapes


def run(ctx: StageContext, inputs: dict[str, Path], params: Params) -> dict[str, Any]:
    import onnx
    import onnxsim

    source = inputs["model"]
    try:
        model = onnx.load(str(source))
    except Exception as exc:
        raise StageFailed(f"cannot load the input ONNX model: {str(exc)[:300]}") from exc
    before = _histogram(model)
    test_shapes = _check_shapes(model, params.input_shapes)
    ctx.progress(0.2, "simplifying")
    try:
        with ctx.native_step("onnxsim", f"simplifying {source.name}", repro=onnxsim_repro(source, test_shapes),
                             hint=hint_text(memory_findings(source, 3.0, "onnxsim"))):
            simplified, ok = onnxsim.simplify(
                model, check_n=params.check_n, skip_fuse_bn=params.skip_fuse_bn,
                skipped_optimizers=params.skipped_optimizers or None, test_input_shapes=test_shapes or None,
            )
        failure = None if ok else "onnxsim's check found the simplified model's outputs differ from the original"
    except Exception as exc:
        ctx.log.exception("onnxsim failed")
        simplified, failure = None, f"onnxsim raised {type(exc).__name__}: {str(exc)[:400]}"
    if failure:
        if params.on_failure == "error":
            raise StageFailed(failure, hint="set `on_failure: passthrough` to continue with the unsimplified model, "
                              "or skip this stage")
        ctx.log.warning("%s; passing the model through unchanged", failure)
        shutil.copyfile(source, ctx.output("model"))
        return {"simplified": False, "reason": failure, "nodes_before": sum(before.values()),
                "nodes_after": sum(before.values())}
    onnx.save(simplified, str(ctx.output("model")))
    after = _histogram(simplified)
    removed = {op: before[op] - after.get(op, 0) for op in before if before[op] > after.get(op, 0)}
    return {"simplified": True, "nodes_before": sum(before.values()), "nodes_after": sum(after.values()),
            "removed_by_op": removed, "checked_on": params.check_n}


stage = Stage(
    name="simplify",
    version="1",
    description="Simplify an ONNX model with onnxsim (constant folding, fusions), checked on random inputs.",
    params=Params,
    run=run,
    inputs={"model": Input(ONNX, "The ONNX model to simplify.")},
    outputs={"model": Output(ONNX, "model.onnx", "The simplified ONNX model.")},
    environment=("onnx", "onnxsim", "onnxruntime"),
    preload=("onnxsim", "onnx", "onnxruntime"),
)
