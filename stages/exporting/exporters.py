"""Run one PyTorch exporter (TorchScript or torch.export) into an ONNX file, and find the dims it fixed that the
recipe marks dynamic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtflow.stage import (
    StageContext,
    StageFailed,
)

from ..formats.torch_check import (
    sample_inputs,
    tensors,
)
from .params import ExportParams


def run_exporter(ctx: StageContext, params: ExportParams, model: Any, binding: Any, dynamo: bool, target: Path,
            program: Any = None) -> None:
    """Run one exporter (on ``program``, a torch.export program, when given); StageFailed with the known cause and
    fix when it raises."""
    import warnings

    import torch

    from ..formats.torch_export import explain_export_error, export_dynamo, export_torchscript

    sample = tensors(params, sample_inputs(params, {n: s.shape for n, s in params.inputs.items()}))
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            if dynamo:
                export_dynamo(program if program is not None else model, binding, sample, target,
                              params.dynamic_axes, params.outputs or [], params.opset, params.dim_ranges())
            else:
                export_torchscript(model, binding, sample, target, params.dynamic_axes, params.outputs or [],
                                   params.opset)
    except Exception as exc:
        ctx.log.exception("torch.onnx.export failed")
        what, fix = explain_export_error(exc, dynamo)
        raise StageFailed(what, hint=fix) from exc


def specialised(params: ExportParams, path: Path) -> str | None:
    from ..formats.torch_export import specialised_axes

    fixed = specialised_axes(path, params.dynamic_axes)
    if not fixed:
        return None
    shown = "; ".join(f"axis {axis} ({dim!r}) of input {name!r} came out fixed at {size}"
                      for name, axis, dim, size in fixed)
    return f"torch.export made dims fixed that dynamic_axes marks dynamic: {shown}"
