"""`trtflow init` for an encoder-decoder (T5, BART, Marian, Whisper, ...): a recipe for generation with the
decoder's KV cache (`formats.seq2seq`).

A Hugging Face folder whose model is an encoder-decoder that generates (config.json's architectures name a class of
transformers' seq2seq-LM or speech-seq2seq mapping, or ``--task text2text-generation-with-past`` /
``automatic-speech-recognition-with-past``) gets: the encoder exported (the source -> the cross-attention cache)
and built into its own engine; the decoder exported with both caches as inputs (two optimization profiles, as for a
causal LM: ``prefill``, the start token with an empty past; ``decode``, one token after a past), its fp32, fp16 and
int8 candidates validated by greedy generation (the exported encoder feeding every decoder) and benchmarked for time
to first token (encoder included) and time per output token, the lowest time per output token selected and built.

Sizes: ``--dim sequence_length=MIN:OPT:MAX`` (decoder tokens; MAX is the decoder's context),
``--dim past_sequence_length=MIN:OPT:MAX`` (OPT: the decode profile's), ``--dim encoder_sequence_length=MIN:OPT:MAX``
(source token ids; a speech encoder's input has a fixed length).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.errors import UsageError

from .init_generation import DEFAULT_CONTEXT

#: The source lengths proposed (token ids; the encoder's positions cap them).
DEFAULT_SOURCE = (1, 64, 256)


def seq2seq_task(folder: Path, task: str | None) -> str | None:
    """The generation task `trtflow init` writes for this folder (None: not an encoder-decoder that generates)."""
    from ..formats.hf_tasks import architecture_task
    from ..formats.seq2seq import SPEECH_TASK, TASKS, TEXT_TASK

    if task is not None:
        return task if task in TASKS else None
    from trtflow.errors import StageFailed

    from ..formats.detect import read_json_config

    try:
        config = read_json_config(folder)
    except (OSError, StageFailed):
        return None  # the ordinary path reports it
    if not config.get("is_encoder_decoder"):
        return None
    return {"text2text-generation": TEXT_TASK, "automatic-speech-recognition": SPEECH_TASK}.get(
        architecture_task(config) or "")


def read_layout(folder: Path, task: str) -> Any:
    """The folder's layout, from the cache its model's forward() returns (built from the config, its weights left
    uninitialised: only the shapes are read)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    from transformers.initialization import no_init_weights

    from trtflow.errors import StageFailed

    from ..formats.hf_tasks import TASKS
    from ..formats.seq2seq import layout_of

    transformers.utils.logging.set_verbosity_error()
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
        model_type = str(getattr(config, "model_type", ""))
        autos = [auto for auto, constant in TASKS[task].autos if model_type in _mapping(constant)]
        if not autos:
            decoder_only = not getattr(config, "is_encoder_decoder", False)
            raise UsageError(f"a {model_type!r} model cannot do task {task} (transformers has no "
                             f"{TASKS[task].autos[0][0]} for it)" + (": it is no encoder-decoder" if decoder_only
                                                                       else ""),
                             hint="a decoder-only LM: --task text-generation-with-past" if decoder_only else
                             "leave --task out to take the task from config.json's architectures")
        with no_init_weights():
            model = getattr(transformers, autos[0]).from_config(config, attn_implementation="eager",
                                                                trust_remote_code=False).eval()
        return layout_of(model)
    except (ValueError, KeyError, OSError) as error:
        raise UsageError(f"transformers cannot build an encoder-decoder from {folder}/config.json: "
                         f"{' '.join(str(error).split())[:300]}",
                         hint="check config.json's model_type and architectures, or pass --task") from None
    except StageFailed as error:  # the model does not fit the task: a usage mistake (exit 2), as in `trtflow run`
        raise UsageError(error.message, hint=error.hint) from None


def _mapping(constant: str) -> dict[str, Any]:
    from transformers.models.auto import modeling_auto

    return dict(getattr(modeling_auto, constant, {}) or {})


@dataclass
class Seq2SeqScaffold:
    name: str
    model_ref: str
    source_name: str  # the model as given on the command line
    task: str
    layout: Any
    batch: tuple[int, int, int]
    decoder: tuple[int, int, int]  # decoder tokens: min, opt, max (= the decoder's context)
    past_opt: int
    source: tuple[int, int, int]  # source token ids (a speech encoder: its fixed frames)
    prompts_ref: str | None

    @property
    def context(self) -> int:
        return self.decoder[2]

    def headline(self) -> str:
        layout = self.layout
        return (f"an encoder-decoder for generation ({self.task}): the encoder (-> the cross-attention cache) and "
                f"the decoder with its KV cache ({layout.layers} layers, {layout.kv_heads} heads of "
                f"{layout.head_dim}); decoder context {self.context}")

    def describe(self) -> list[str]:
        source = (f"{self.layout.mel_bins} mel bins x {self.layout.source_length} frames (fixed)" if
                  self.layout.speech else f"{self.source[0]}..{self.source[2]} token ids (opt {self.source[1]})")
        return [f"profile 'encoder': sources of {source}, batch {self.batch[0]}..{self.batch[2]}",
                f"profile 'prefill': 1..{self.context} decoder tokens (opt {self.decoder[1]}), past 0",
                f"profile 'decode': one token after a past of 1..{self.context - 1} (opt {self.past_opt})"]

    def render(self, schema: str, _flow: Callable[[Any], str]) -> str:
        """The recipe; ``_flow`` writes a value as one line of YAML flow style (`cli.init_recipe.flow`)."""
        layout = self.layout
        profiles = layout.profiles(self.batch, self.context, self.decoder[1], self.source, self.past_opt)
        check_tokens = max(1, min(16, self.context - 1))
        source_opt = self.source[1]
        prompts: dict[str, Any] = {"path": self.prompts_ref} if self.prompts_ref else \
            {"count": 4, "length": max(1, min(16, self.source[2])), "seed": 0}
        check = {"prompts": prompts, "new_tokens": check_tokens}
        bench = {"context_length": source_opt, "new_tokens": max(2, min(32, self.context - 1)), "concurrency": [1]}
        ranges = {"input_ids": [0, layout.vocab_size], "encoder_attention_mask": [1, 2]}
        data = {"random": {"seed": 0, "num_samples": 8, "shapes": layout.shapes(1, 1, self.past_opt, source_opt),
                           "ranges": {k: v for k, v in ranges.items() if layout.encoder_mask or k == "input_ids"}}}
        candidates = "[simplify, convert, quantize]"
        description = f"generation with a decoder KV cache: fp32, fp16 and int8 decoders of {self.source_name}"
        what = "log-mel input_features" if layout.speech else "source token ids"
        lines = [f"# yaml-language-server: $schema={schema}",
                 f"# Written by `trtflow init {self.source_name}` (huggingface, {self.task}): a starting point; edit "
                 "it freely.",
                 f"# Encoder: {what} -> the cross-attention cache ({layout.layers} layers x {layout.cross_heads} "
                 f"heads x head_dim {layout.cross_head_dim}), computed once per request.",
                 f"# Decoder: its own KV cache ({layout.kv_heads} heads x head_dim {layout.head_dim}) in and out, "
                 f"the cross-attention cache in; vocabulary {layout.vocab_size}; starts from token "
                 f"{layout.decoder_start}; context {self.context}" + (
                     f" of the model's {layout.context_length} positions." if layout.context_length else
                     " (relative positions: --dim sequence_length=MIN:OPT:MAX sets it)."),
                 "#",
                 "# WARNING: int8 and fp16 are calibrated on RANDOM inputs (`random:` below); give real ones for a",
                 "# quantization that means something.",
                 "# The generation checks use random " + ("log-mel features from a seed." if layout.speech else
                                                          "sources (token ids); --data prompts.json gives real ones."),
                 f"name: {self.name}",
                 f"description: {_flow(description)}",
                 "",
                 "profiles:"]
        for phase, comment in (("encoder", "the encoder's sources"), ("prefill", "the start token, past 0"),
                               ("decode", "one token after a past")):
            lines.append(f"  {phase}:{' ' * (28 - len(phase))}# {comment}")
            lines += [f"    {name}: {_flow(shape)}" for name, shape in profiles[phase].items()]
        lines += ["",
                  "nodes:",
                  "  - name: export-encoder        # the source -> present.{i}.encoder.key/value",
                  "    stage: export",
                  "    params:",
                  f"      model: {_flow(self.model_ref)}",
                  f"      task: {self.task}",
                  "      part: encoder",
                  "      profiles: [encoder]",
                  "",
                  "  - name: export                # the decoder: past_key_values.{i}.decoder/encoder.* in, logits",
                  "    stage: export               # and present.{i}.decoder.* out; checked by greedy generation",
                  "    params:",
                  f"      model: {_flow(self.model_ref)}",
                  f"      task: {self.task}",
                  "      part: decoder",
                  "      profiles: [prefill, decode]",
                  f"      generation: {_flow(check)}",
                  "",
                  "  - name: simplify              # the fp32 candidate",
                  "    stage: simplify",
                  "    inputs: {model: export}",
                  f"    params: {{input_shapes: {_flow(layout.shapes(1, 1, self.past_opt, source_opt))}}}",
                  "",
                  "  - name: convert               # fp16 candidate (ModelOpt AutoCast)",
                  "    stage: convert",
                  "    inputs: {model: simplify}",
                  f"    params: {{precision: fp16, calibration_data: &data {_flow(data)}}}",
                  "",
                  "  - name: quantize              # int8 candidate (ModelOpt post-training quantization)",
                  "    stage: quantize",
                  "    inputs: {model: simplify}",
                  "    params: {mode: int8, calibration_data: *data}",
                  "",
                  "  - name: validate              # greedy generation, the exported encoder feeding every decoder",
                  "    stage: validate",
                  f"    matrix: {{candidate: {candidates}}}",
                  '    inputs: {reference: export, encoder: export-encoder, candidate: "${{ matrix.candidate }}"}',
                  "    params:",
                  f"      generation: {_flow({**check, 'allow_near_ties': True})}",
                  "      tolerances: {check_error_stat: mean, atol: 0.05, rtol: 0.05, min_cosine_similarity: 0.99}",
                  "",
                  "  - name: benchmark             # time to first token (encoder included) and per output token",
                  "    stage: benchmark",
                  f"    matrix: {{candidate: {candidates}}}",
                  '    inputs: {model: "${{ matrix.candidate }}", encoder: export-encoder}',
                  "    params:",
                  "      backend: onnxruntime",
                  "      onnxruntime: {intra_op_threads: 1}   # one core: timings that hold on a shared machine",
                  f"      generation: {_flow(bench)}",
                  "      min_duration_s: 1.0",
                  "",
                  "  - name: select                # the lowest time per output token that generates the same tokens",
                  "    stage: select",
                  f"    inputs: {{candidates: {candidates}, validations: validate, benchmarks: benchmark}}",
                  "    params:",
                  "      objective: {goal: min_time_per_token, percentile: p50}",
                  "      baseline: simplify",
                  "",
                  "  - name: build                 # the decoder's engine, both profiles",
                  "    stage: build",
                  "    inputs: {model: select}",
                  "    params: {backend: auto, profiles: [prefill, decode]}",
                  "",
                  "  - name: build-encoder         # the encoder's engine",
                  "    stage: build",
                  "    inputs: {model: export-encoder}",
                  "    params: {backend: auto, profiles: [encoder]}"]
        return "\n".join(lines) + "\n"


def scaffold(folder: Path, task: str, model_ref: str, source_name: str, name: str, batch: tuple[int, int, int],
             dims: dict[str, tuple[int, int, int]], prompts_ref: str | None) -> Seq2SeqScaffold:
    from ..formats.generation import PAST, SEQUENCE
    from ..formats.seq2seq import ENCODER_SEQUENCE

    unknown = sorted(set(dims) - {SEQUENCE, PAST, ENCODER_SEQUENCE})
    if unknown:
        raise UsageError(f"--dim names no dimension of an encoder-decoder generation recipe: {', '.join(unknown)}",
                         hint=f"give {SEQUENCE}=MIN:OPT:MAX (decoder tokens; MAX is its context), {PAST}=MIN:OPT:MAX "
                         f"(the decode profile's pasts) or {ENCODER_SEQUENCE}=MIN:OPT:MAX (source token ids)")
    layout = read_layout(folder, task)
    if prompts_ref is not None and layout.speech:
        raise UsageError("--data gives token-id prompts; a speech encoder-decoder takes log-mel features",
                         hint="leave --data out: the generation checks draw features from a seed")
    limit = layout.context_length
    if SEQUENCE in dims:
        decoder = dims[SEQUENCE]
        if decoder[2] < 2 or (limit and decoder[2] > limit):
            raise UsageError(f"--dim {SEQUENCE}: a decoder context of {decoder[2]} does not fit the model, which has "
                             f"{limit} decoder positions (and generation needs 2 or more)",
                             hint=f"keep MAX between 2 and {limit}")
    else:
        context = min(limit, DEFAULT_CONTEXT) if limit else DEFAULT_CONTEXT
        if context < 2:
            raise UsageError(f"the decoder has {limit} position(s): too few to generate")
        decoder = (1, 1, context)
    past_opt = max(1, min(decoder[2] // 2, 64))
    if PAST in dims:
        if dims[PAST][2] > decoder[2] - 1:
            raise UsageError(f"--dim {PAST}: a past of {dims[PAST][2]} leaves no room for the next token in a "
                             f"context of {decoder[2]}", hint=f"keep MAX <= {decoder[2] - 1}")
        past_opt = dims[PAST][1]
    if layout.speech:
        if ENCODER_SEQUENCE in dims:
            raise UsageError(f"--dim {ENCODER_SEQUENCE}: a speech encoder takes a fixed {layout.source_length} "
                             "frames of log-mel features", hint=f"leave --dim {ENCODER_SEQUENCE} out")
        source: tuple[int, int, int] = (layout.source_length, layout.source_length, layout.source_length)
    else:
        top = layout.source_length
        low, opt, high = (min(v, top) if top else v for v in DEFAULT_SOURCE)
        source = dims.get(ENCODER_SEQUENCE) or (low, opt, high)
        if top and source[2] > top:
            raise UsageError(f"--dim {ENCODER_SEQUENCE}: {source[2]} token ids exceed the encoder's {top} positions",
                             hint=f"keep MAX <= {top}")
    return Seq2SeqScaffold(name, model_ref, source_name, task, layout, batch, decoder, past_opt,
                           (int(source[0]), int(source[1]), int(source[2])), prompts_ref)
