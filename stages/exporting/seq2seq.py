"""An encoder-decoder's two graphs with the decoder's KV cache (`formats.seq2seq`) to ONNX: each checked against
PyTorch at its sample and its profiles' corners; the decoder also by greedy generation (its PyTorch encoder's
cross-attention cache fed to the exported decoder, teacher-forced) against transformers' generate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtflow.stage import StageContext, StageFailed

from ..accuracy.generation import GenerationCheck
from .output_names import with_declared
from .params import ExportParams
from .pytorch import export_pytorch


def export_seq2seq(ctx: StageContext, params: ExportParams, wrapped: Any, target: Path) -> dict[str, Any]:
    """One graph of an encoder-decoder (``wrapped``: a `formats.seq2seq.Seq2SeqModel`), and for the decoder the
    greedy-generation check."""
    from ..formats.generation import export_checks
    from ..formats.seq2seq import name_output_dims

    # the layout's names (Optimum's) are what every consumer reads: they are not the recipe's to rename
    declared = with_declared(params, wrapped.inputs, wrapped.outputs).model_copy(
        update={"outputs": list(wrapped.outputs)})
    if declared.dynamo:
        raise StageFailed(f"task {params.task} exports with the TorchScript exporter: the decoder's attention spans "
                          "the past and the new tokens, a relation torch.export's named dims cannot state",
                          hint="remove dynamo: true")
    layout = wrapped.layout
    checks = None
    if wrapped.part == "decoder":
        checks = export_checks({n: s.shape for n, s in declared.inputs.items()}, declared.profiles, layout)
    summary = export_pytorch(ctx, declared, target, wrapped.module, checks=checks)[0]
    name_output_dims(target, wrapped)
    summary["kv_cache"] = {"part": wrapped.part, "layers": layout.layers, "kv_heads": layout.kv_heads,
                           "head_dim": layout.head_dim, "cross_heads": layout.cross_heads,
                           "cross_head_dim": layout.cross_head_dim, "vocab_size": layout.vocab_size,
                           "context_length": layout.context_length, "source": layout.source,
                           "decoder_start_token_id": layout.decoder_start}
    if not params.check or wrapped.part != "decoder":
        return summary
    ctx.progress(0.92, "greedy generation: the exported decoder (ONNX Runtime) against transformers' generate")
    from ..accuracy.seq2seq import check_seq2seq_against_torch

    check = params.generation or GenerationCheck()
    record, failures = check_seq2seq_against_torch(target, wrapped, check, params.atol, params.rtol, ctx.resolve)
    summary["generation_check"] = record
    ctx.log.info("greedy generation vs transformers: tokens matched per source %s of %d; largest logit error %.3g",
                 record["tokens_matched"], record["new_tokens"], record["max_abs_logit_error"])
    if failures:
        raise StageFailed("the exported decoder does not generate what PyTorch generates: " + "; ".join(failures[:3]),
                          hint="see generation_check in the node's log; a near tie may flip on a tiny error: "
                          "set generation: {allow_near_ties: true} if that is all it is")
    return summary
