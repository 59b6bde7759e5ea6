"""The names of an exported model's inputs and outputs: the recipe's or the model's own, and its outputs' dynamic dims
named after the input dims they follow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtflow.stage import (
    RecipeMismatch,
    StageContext,
    StageFailed,
)

from ..formats.torch_check import (
    ShapeResult,
)
from .params import ExportParams


def named_outputs(params: ExportParams, found: list[str]) -> ExportParams:
    """``params`` with output names: the recipe's (one per output tensor), else the model's own."""
    if params.outputs is None:
        return params.model_copy(update={"outputs": found})
    if len(params.outputs) != len(found):
        raise RecipeMismatch(f"outputs: names {len(params.outputs)} output(s) {params.outputs}, but the model returns "
                          f"{len(found)} tensor(s) (its own names: {found})",
                          hint="give one name per output tensor, or leave outputs out to use the model's own names")
    return params


def name_output_dims(ctx: StageContext, params: ExportParams, target: Path, compared: list[ShapeResult]) -> None:
    """Give the outputs' dynamic dims the names of the input dims they follow (`formats.dim_names`)."""
    from ..formats.dim_names import Observation, dynamic_output_axes, output_dim_names, rename_output_dims

    sample = params.dim_sizes()
    observations = []
    for result in compared:
        if result.output_shapes is None or len(result.output_shapes) != len(params.outputs or []):
            continue
        dims = dict(sample)
        if result.check.dim is not None and result.check.size is not None:
            dims[result.check.dim] = result.check.size
        observations.append(Observation(dims, dict(zip(params.outputs or [], result.output_shapes, strict=True))))
    names = output_dim_names(observations, dynamic_output_axes(target))
    renamed = rename_output_dims(target, names)
    if renamed:
        ctx.log.info("output dims named after the input dims they follow: %s", renamed)


def with_declared(params: ExportParams, inputs: dict[str, dict[str, Any]], outputs: list[str] | None = None
                  ) -> ExportParams:
    """``params`` with the inputs (and output names) the model declares, unless the recipe gave its own."""
    update: dict[str, Any] = {}
    if not params.inputs:
        update["inputs"] = inputs
    if params.outputs is None and outputs:
        update["outputs"] = outputs
    if not update:
        return params
    try:
        return type(params).model_validate({**params.model_dump(), **update})
    except ValueError as error:
        raise StageFailed(f"the inputs the model declares do not fit the recipe: {error}",
                          hint=f"the model's inputs: {inputs}") from error
