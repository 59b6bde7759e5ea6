"""Greedy generation of an encoder-decoder (`formats.seq2seq`) checked against transformers' generate: the sources
(token ids, or Whisper's log-mel features drawn from a seed), the exported decoder fed the PyTorch encoder's
cross-attention cache, teacher-forced and compared step by step as for a decoder-only model (`accuracy.generation`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trtflow.stage import StageFailed

from .generation import (
    GenerationCheck,
    compare_generation,
    forced_candidate,
    free_candidate,
    informative_reference,
    judge_generation,
    logit_failures,
    seq2seq_reference,
)


def source_loader(layout: Any, resolve: Any = None) -> Callable[[Any], list[Any]]:
    """A `data.prompts.Prompts` spec -> the encoder's sources: token ids (random, or from the file), or for a speech
    encoder random log-mel features of its fixed length from the spec's seed (a file of token ids cannot feed it)."""
    from ..data.prompts import load_prompts

    def load(spec: Any) -> list[Any]:
        if not layout.speech:
            prompts = load_prompts(spec, layout.vocab_size, resolve)
            if layout.source_length and max(len(p) for p in prompts) > layout.source_length:
                raise StageFailed(f"a source of {max(len(p) for p in prompts)} token ids is longer than the "
                                  f"encoder's {layout.source_length} positions",
                                  hint=f"keep prompts at most {layout.source_length} ids long")
            return prompts
        if spec.path is not None:
            raise StageFailed(f"prompts from a file ({spec.path}) are token ids; a speech encoder takes log-mel "
                              f"features ({layout.mel_bins} bins x {layout.source_length} frames)",
                              hint="leave prompts: path out: random features are drawn from prompts: seed")
        return layout.sources(spec.count, spec.length, spec.seed)

    return load


def describe_sources(spec: Any, layout: Any) -> str:
    """What the generation check's sources are, for records and messages."""
    if getattr(layout, "speech", False):
        return (f"{spec.count} random log-mel input(s) of {layout.mel_bins} bins x {layout.source_length} frames "
                f"(seed {spec.seed})")
    return str(spec.describe())


def check_seq2seq_against_torch(onnx_path: Any, wrapped: Any, check: GenerationCheck, atol: float, rtol: float,
                                resolve: Any = None) -> tuple[dict[str, Any], list[str]]:
    """The exported decoder (ONNX Runtime; the cross-attention cache from the PyTorch encoder) teacher-forced on
    transformers' greedy generation: the record (tokens matched per source, logit errors) and its failures."""
    from ..formats.seq2seq import wrap
    from ..runtimes.ort import create_session
    from ..runtimes.seq2seq import OrtSeq2SeqDecoder, torch_encoder

    layout = wrapped.layout
    if layout.context_length and check.new_tokens + 1 > layout.context_length:
        raise StageFailed(f"the generation check needs {check.new_tokens + 1} decoder positions (the start token and "
                          f"new tokens) but the model has {layout.context_length}", hint="use fewer new_tokens")
    decoder = OrtSeq2SeqDecoder(create_session(onnx_path), torch_encoder(wrap(wrapped.model, "encoder", layout).module),
                                layout)
    sources, reference, informative = informative_reference(
        check.prompts, layout.vocab_size, check.new_tokens,
        lambda chosen, tokens: seq2seq_reference(wrapped.model, chosen, tokens), resolve,
        load=source_loader(layout, resolve))
    candidate = forced_candidate(decoder, sources, reference)
    allowance = atol if check.near_tie_margin is None else check.near_tie_margin
    free = free_candidate(decoder, sources, check.new_tokens) if check.allow_near_ties else None
    record, _, _ = compare_generation(sources, reference, candidate, allowance, free)
    record["prompts_from"] = describe_sources(check.prompts, layout)
    record["reference_informative"] = informative
    record["reference"] = "transformers generate (PyTorch, greedy)"
    failures = judge_generation(record, check) + logit_failures(record, reference, candidate, atol, rtol)
    return record, failures
