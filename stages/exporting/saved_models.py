"""Saved PyTorch models to ONNX: a TorchScript archive, a .pt2 program or a Hugging Face folder, through the PyTorch
exporters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtflow.stage import (
    StageContext,
)

from .causal_lm import export_generation
from .output_names import with_declared
from .params import ExportParams
from .pytorch import export_pytorch


def export_saved_torch(ctx: StageContext, params: ExportParams, fmt: str, source: Path, target: Path,
                        extra: dict[str, Any]) -> dict[str, Any]:
    """A TorchScript archive, a .pt2 program or a Hugging Face folder through the PyTorch exporters."""
    if fmt == "torchscript":
        from ..formats.torch_archives import load_torchscript, script_input_names

        module = load_torchscript(source, params.model)
        forced = params.model_copy(update={"dynamo": False})  # a scripted module needs the TorchScript exporter
        return export_pytorch(ctx, forced, target, module, by_name=script_input_names(module))[0]
    if fmt == "exported_program":
        from ..formats.torch_archives import load_program

        program = load_program(source, params.model)
        # outputs: named from what the program's module returns (a dict's keys), not its graph's node names
        declared = with_declared(params, program.inputs).model_copy(update={"dynamo": True})
        return export_pytorch(ctx, declared, target, program.module, program=program.program,
                               by_name=list(program.inputs), dim_names=program.dim_names)[0]
    from ..formats.huggingface import load_model

    hf = load_model(source, params.task, params.model, params.part)
    extra.update(task=hf.task, model_type=hf.model_type, **({"part": hf.part} if hf.part else {}))
    params = params.model_copy(update={"task": hf.task})  # the task resolved: messages speak of a Hugging Face folder
    if hf.generation is not None:
        return export_generation(ctx, params, hf.generation, target)
    if hf.seq2seq is not None:
        from .seq2seq import export_seq2seq

        return export_seq2seq(ctx, params, hf.seq2seq, target)
    return export_pytorch(ctx, with_declared(params, hf.inputs, hf.outputs), target, hf.module, limits=hf.limits)[0]
