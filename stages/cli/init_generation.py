"""`trtflow init` for a causal language model: a recipe for generation with a KV cache.

A Hugging Face folder whose model is a causal LM (``config.architectures`` ends in ``ForCausalLM`` or
``LMHeadModel``, or ``--task text-generation-with-past``) gets a generation recipe: export with the cache as inputs
and outputs (`formats.generation`), two optimization profiles in disjoint shape regimes (``prefill``: a prompt of 1
to the context length with an empty past; ``decode``: one token after a past of 1 to the context length - 1), the
fp32 model and fp16 and int8 candidates, each validated by greedy generation against the export (tokens matched per
prompt, logits per step), benchmarked for time to first token and time per output token on ONNX Runtime, the
lowest time per output token selected, built into an engine with both profiles and written for Triton.

The context length and the opt sizes come from the config (its position table, capped at 512 here so the export
checks stay quick) or from ``--dim sequence_length=MIN:OPT:MAX`` (prompt lengths; MAX is the context length) and
``--dim past_sequence_length=MIN:OPT:MAX`` (decode pasts; OPT is the decode profile's opt).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.errors import UsageError

#: The context length proposed at most (the config's may be far longer: 128k positions).
DEFAULT_CONTEXT = 512
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
DEFAULT_BATCH = "1:1:4"


def is_generation(folder: Path, task: str | None) -> bool:
    """Whether `trtflow init` writes a generation recipe for this folder and task."""
    from ..formats.generation import TASK

    if task is not None:
        return task == TASK
    from trtflow.errors import StageFailed

    from ..formats.detect import read_json_config

    try:
        config = read_json_config(folder)
    except (OSError, StageFailed):
        return False  # the ordinary path reports it
    if config.get("is_encoder_decoder"):
        return False
    return any(str(a).endswith(CAUSAL_SUFFIXES) for a in config.get("architectures") or [])


def read_layout(folder: Path) -> tuple[Any, str | None]:
    """The folder's cache layout as its model's forward() returns it for a two-token prompt (the model built from
    the config, its weights left uninitialised: only shapes are read), and how the config's own fields disagree,
    where they do (`formats.generation.model_layout`)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    from trtflow.errors import StageFailed

    transformers.utils.logging.set_verbosity_error()
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
        if getattr(config, "is_encoder_decoder", False):
            raise UsageError(f"a {getattr(config, 'model_type', '?')!r} model is an encoder-decoder; "
                             "text-generation-with-past exports decoder-only LMs",
                             hint="--task text2text-generation-with-past (speech: automatic-speech-recognition-"
                             "with-past), or leave --task out")
        return layout_from_config(config)
    except (ValueError, KeyError, OSError) as error:
        raise UsageError(f"transformers cannot build a causal LM from {folder}/config.json: "
                           f"{' '.join(str(error).split())[:300]}",
                           hint="check config.json's model_type and architectures, or pass --task") from None
    except StageFailed as error:  # the model does not fit the task: a usage mistake (exit 2), as in `trtflow run`
        raise UsageError(error.message, hint=error.hint) from None


def layout_from_config(config: Any) -> tuple[Any, str | None]:
    """`read_layout` of a config already read: the causal LM built from it (weights uninitialised) and its cache read
    from its forward() (`formats.generation.model_layout`)."""
    import transformers
    from transformers.initialization import no_init_weights

    from trtflow.errors import StageFailed

    from ..formats.generation import model_layout, sdpa_else_eager

    def build(attention: str) -> Any:
        with no_init_weights():
            return transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=False,
                                                                 attn_implementation=attention).eval()

    try:
        model = sdpa_else_eager(build)
    except (RuntimeError, MemoryError) as error:  # sizes this machine cannot hold, or the model's own checks
        raise StageFailed(f"transformers cannot build the {getattr(config, 'model_type', '?')!r} model of this "
                          f"config to read its cache: {type(error).__name__}: {' '.join(str(error).split())[:200]}",
                          hint="check config.json's sizes (vocab_size, hidden_size, num_hidden_layers): init builds "
                          "the model, weights uninitialised, to run it once on two tokens") from None
    return model_layout(model)


@dataclass
class GenerationScaffold:
    name: str
    model_ref: str
    source: str
    layout: Any
    batch: tuple[int, int, int]
    prompt: tuple[int, int, int]  # prompt lengths: min, opt, max (= the context length)
    past_opt: int
    prompts_ref: str | None  # a recipe path of real prompts, or None for random ones
    rule_disagrees: str | None = None  # how the config's fields differ from the model's cache, where they do

    @property
    def context(self) -> int:
        return self.prompt[2]

    def render(self, schema: str, _flow: Callable[[Any], str]) -> str:
        """The recipe; ``_flow`` writes a value as one line of YAML flow style (`cli.init_recipe.flow`)."""
        layout = self.layout
        profiles = layout.profiles(self.batch, self.context, self.prompt[1], self.past_opt)
        check_tokens = max(1, min(16, self.context // 4))
        check_length = max(1, min(16, self.context - check_tokens))
        prompts: dict[str, Any] = {"path": self.prompts_ref} if self.prompts_ref else \
            {"count": 4, "length": check_length, "seed": 0}
        check = {"prompts": prompts, "new_tokens": check_tokens}
        bench_tokens = max(2, min(32, self.context - self.prompt[1]))
        bench_context = min(self.prompt[1], self.context - bench_tokens)
        bench = {"context_length": bench_context, "new_tokens": bench_tokens, "concurrency": [1]}
        calibration_shapes = layout.shapes(1, self.prompt[1], 0)
        ranges = {"input_ids": [0, layout.vocab_size], "attention_mask": [1, 2]}
        if layout.position_ids:
            ranges["position_ids"] = [0, self.prompt[1]]
        data = {"random": {"seed": 0, "num_samples": 8, "shapes": calibration_shapes, "ranges": ranges}}
        candidates = "[simplify, convert, quantize]"
        lines = [f"# yaml-language-server: $schema={schema}",
                 f"# Written by `trtflow init {self.source}` (huggingface, text-generation-with-past): a starting "
                 "point; edit it freely.",
                 f"# KV cache: {layout.layers} layers x {layout.kv_heads} key/value heads x head_dim "
                 f"{layout.head_dim}; vocabulary {layout.vocab_size}; " + (
                     f"context {self.context} of the model's {layout.context_length} positions." if
                     layout.context_length else f"context {self.context}: the model has no position table "
                     "(ALiBi), the profiles set it (--dim sequence_length=MIN:OPT:MAX)."),
                 *([f"# The cache layout is read from the model's forward(); {_disagreement_text(self)}"]
                   if self.rule_disagrees else []),
                 "#",
                 "# WARNING: int8 and fp16 are calibrated on RANDOM token ids (`random:` below); for a",
                 "# quantization that means something, give real inputs (path: samples.npz with input_ids,",
                 "# attention_mask" + (", position_ids" if layout.position_ids else "") + " and the "
                 "past_key_values.* arrays)."]
        if self.prompts_ref is None:
            lines += ["# The generation checks use random prompts (token ids); `trtflow init ... --data prompts.json`",
                      "# (a list of lists of token ids) gives real ones."]
        description = "generation with a KV cache: fp32, fp16 and int8 candidates of " + self.source
        lines += [f"name: {self.name}", f"description: {_flow(description)}", "",
                  "profiles:                      # the two phases of generation: disjoint shape regimes, each its "
                  "own opt"]
        for phase, what in (("prefill", "a prompt, past 0"), ("decode", "one token after a past")):
            lines.append(f"  {phase}:{' ' * (28 - len(phase))}# {what}")
            lines += [f"    {name}: {_flow(shape)}" for name, shape in profiles[phase].items()]
        lines += ["",
                  "nodes:",
                  "  - name: export                # past_key_values.* in, logits and present.* out (Optimum's layout)",
                  "    stage: export",
                  "    params:",
                  f"      model: {_flow(self.model_ref)}",
                  "      task: text-generation-with-past",
                  "      profiles: [prefill, decode]   # checked against PyTorch at each profile's min, opt and max",
                  f"      generation: &check {_flow(check)}",
                  "",
                  "  - name: simplify              # the fp32 candidate",
                  "    stage: simplify",
                  "    inputs: {model: export}",
                  f"    params: {{input_shapes: {_flow(layout.shapes(1, 1, self.past_opt))}}}",
                  "",
                  "  - name: convert               # fp16 candidate (ModelOpt AutoCast; fp32 where values "
                  "overflow fp16)",
                  "    stage: convert",
                  "    inputs: {model: simplify}",
                  f"    params: {{precision: fp16, calibration_data: &data {_flow(data)}}}",
                  "",
                  "  - name: quantize              # int8 candidate (ModelOpt post-training quantization)",
                  "    stage: quantize",
                  "    inputs: {model: simplify}",
                  "    params: {mode: int8, calibration_data: *data}",
                  "",
                  "  - name: validate              # greedy generation: the first tokens must equal the export's",
                  "    stage: validate             # (a swap of two logits closer than the logits' atol, a near tie,",
                  f"    matrix: {{candidate: {candidates}}}  # counts as matched on at most a quarter of the prompts)",
                  '    inputs: {reference: export, candidate: "${{ matrix.candidate }}"}',
                  "    params:",
                  f"      generation: {_flow({**check, 'allow_near_ties': True})}",
                  "      tolerances: {check_error_stat: mean, atol: 0.05, rtol: 0.05, min_cosine_similarity: 0.99}",
                  "",
                  "  - name: benchmark             # time to first token and per output token, on ONNX Runtime",
                  "    stage: benchmark",
                  f"    matrix: {{candidate: {candidates}}}",
                  '    inputs: {model: "${{ matrix.candidate }}"}',
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
                  "      objective: {goal: min_time_per_token, percentile: p50}   # add max_ttft_ms: a first-token "
                  "budget",
                  "      baseline: simplify",
                  "",
                  "  - name: build                 # an engine with both profiles (TensorRT-RTX builds on CPUs)",
                  "    stage: build",
                  "    inputs: {model: select}",
                  "    params: {backend: auto, profiles: [prefill, decode]}",
                  "",
                  "  - name: triton                # a Triton model repository; the client keeps the cache between "
                  "calls",
                  "    stage: triton",
                  "    inputs: {model: select}",
                  "    params: {profiles: [prefill, decode], max_batch_size: 0, instance_kind: gpu}"]
        return "\n".join(lines) + "\n"

    def headline(self) -> str:
        layout = self.layout
        return (f"generation with a KV cache ({layout.layers} layers, {layout.kv_heads} key/value heads of "
                f"{layout.head_dim}); context {self.context}" + ("" if layout.context_length else
                " (no position table: --dim sequence_length=MIN:OPT:MAX sets it)"))

    def describe(self) -> list[str]:
        return [f"profile 'prefill': prompt 1..{self.context} (opt {self.prompt[1]}), past 0, batch "
                f"{self.batch[0]}..{self.batch[2]}",
                f"profile 'decode': one token after a past of 1..{self.context - 1} (opt {self.past_opt}), batch "
                f"{self.batch[0]}..{self.batch[2]}"] + (
                    [f"cache layout read from the model's forward(); {_disagreement_text(self)}"]
                    if self.rule_disagrees else [])


def _disagreement_text(plan: GenerationScaffold) -> str:
    return f"its config's fields say otherwise ({plan.rule_disagrees})"


def scaffold(folder: Path, model_ref: str, source: str, name: str, batch: tuple[int, int, int],
             dims: dict[str, tuple[int, int, int]], prompts_ref: str | None) -> GenerationScaffold:
    from ..formats.generation import PAST, SEQUENCE

    unknown = sorted(set(dims) - {SEQUENCE, PAST})
    if unknown:
        raise UsageError(f"--dim names no dimension of a generation recipe: {', '.join(unknown)}",
                           hint=f"give {SEQUENCE}=MIN:OPT:MAX (prompt lengths; MAX is the context length) or "
                           f"{PAST}=MIN:OPT:MAX (the decode profile's pasts; OPT is its opt)")
    layout, disagrees = read_layout(folder)
    limit = layout.context_length  # 0: no position table (ALiBi): the profiles set the context
    if SEQUENCE in dims:
        prompt = dims[SEQUENCE]
        if prompt[2] < 2 or (limit and prompt[2] > limit):
            raise UsageError(f"--dim {SEQUENCE}: a context of {prompt[2]} does not fit the model, which attends "
                               f"over {limit} positions (and generation needs 2 or more)",
                               hint=f"keep MAX between 2 and {limit}")
    else:
        context = min(limit, DEFAULT_CONTEXT) if limit else DEFAULT_CONTEXT
        if context < 2:
            raise UsageError(f"the model attends over {limit} position(s): too few to generate")
        prompt = (1, max(1, min(128, context // 2)), context)
    past_opt = prompt[1]
    if PAST in dims:
        if dims[PAST][2] > prompt[2] - 1:
            raise UsageError(f"--dim {PAST}: a past of {dims[PAST][2]} leaves no room for the next token in a "
                               f"context of {prompt[2]}", hint=f"keep MAX <= {prompt[2] - 1}")
        past_opt = dims[PAST][1]
    return GenerationScaffold(name, model_ref, source, layout, batch, prompt, past_opt, prompts_ref, disagrees)
