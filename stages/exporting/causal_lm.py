"""A causal LM with its KV cache as inputs and outputs (`formats.generation`) to ONNX, checked at the corners of each
profile and by greedy generation against transformers' generate (`accuracy.generation`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtflow.stage import (
    StageContext,
    StageFailed,
)

from ..accuracy.generation import GenerationCheck
from .output_names import with_declared
from .params import ExportParams
from .pytorch import export_pytorch


def export_generation(ctx: StageContext, params: ExportParams, generation: Any, target: Path) -> dict[str, Any]:
    """A causal LM with its KV cache as inputs and outputs (`formats.generation`), checked at the corners of each
    profile and by greedy generation against transformers' generate (`accuracy.generation`)."""
    from ..accuracy.generation import check_against_torch
    from ..formats.generation import check_profiles, export_checks, name_output_dims

    # the layout's names (Optimum's) are what every consumer of the model reads: they are not the recipe's to rename
    declared = with_declared(params, generation.inputs, generation.outputs).model_copy(
        update={"outputs": list(generation.outputs)})
    if declared.dynamo:
        raise StageFailed("task text-generation-with-past exports with the TorchScript exporter: the attention "
                          "mask's length is the past's plus the sequence's, a relation torch.export's named dims "
                          "cannot state", hint="remove dynamo: true")
    layout = generation.layout
    check_profiles(declared.profiles, layout)
    checks = export_checks({n: s.shape for n, s in declared.inputs.items()}, declared.profiles, layout)
    summary = export_pytorch(ctx, declared, target, generation.module, checks=checks)[0]
    name_output_dims(target, layout)
    summary["kv_cache"] = {"layers": layout.layers, "kv_heads": layout.kv_heads, "head_dim": layout.head_dim,
                           "vocab_size": layout.vocab_size, "context_length": layout.context_length,
                           "position_ids": layout.position_ids}
    if generation.rule_disagrees:
        summary["kv_cache"]["config_rule_disagrees"] = generation.rule_disagrees
        ctx.log.warning("the cache layout is read from the model's forward(); its config's fields say otherwise: %s",
                        generation.rule_disagrees)
    if not params.check:
        return summary
    ctx.progress(0.92, "greedy generation: ONNX Runtime against transformers' generate")
    check = params.generation or GenerationCheck()
    record, failures = check_against_torch(target, generation.model, check, params.atol, params.rtol, ctx.resolve)
    summary["generation_check"] = record
    ctx.log.info("greedy generation vs transformers: tokens matched per prompt %s of %d; largest logit error %.3g",
                 record["tokens_matched"], record["new_tokens"], record["max_abs_logit_error"])
    if failures:
        raise StageFailed("the exported model does not generate what PyTorch generates: " + "; ".join(failures[:3]),
                          hint="see generation_check in the node's log; a near tie may flip on a tiny error: "
                          "set generation: {allow_near_ties: true} if that is all it is")
    return summary
