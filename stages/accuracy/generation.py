"""Validation by greedy generation: do a candidate's first N generated tokens equal the reference's?

The reference generates greedily from each prompt (PyTorch through transformers' own ``generate``, or an ONNX model
through `runtimes.generation`), keeping the tokens and the logits each was chosen from. The candidate is then run
*teacher-forced*: fed the reference's tokens, so that its inputs equal the reference's at every step and its logits
can be compared at every step, even after its own choice would have differed. Its argmax at each step is the token
it would have generated; up to its first difference from the reference, teacher forcing and free generation are the
same computation, so the count of leading equal tokens (``tokens_matched``) is exactly how many tokens free greedy
generation would have shared.

A difference where the reference's own margin (its top logit minus its logit of the candidate's token) is within
the *near-tie allowance* is a near tie: two logits that close may swap under an error the validation accepts. The
allowance is fixed before the candidate is seen (``near_tie_margin``, default the logits' absolute tolerance for the
candidate's precision, `accuracy.compare.DEFAULT_TOLERANCES`): it never grows with the candidate's own error, so a
worse candidate is not forgiven more. The logits of all steps and prompts are compared as one output named ``logits``
with the same measurements and tolerances as any other output (`accuracy.compare`).

The candidate also generates *freely* (its own tokens fed back, `free_candidate`): per prompt the tokens until its
first difference from the reference and the tokens matched position by position (``free_running``). With near ties
allowed, each forgiven prompt still left the reference there, and `judge_generation` gates how many prompts may
(``max_diverged_share``): a candidate that leaves the reference early on every prompt fails, whatever its margins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field

from trtflow.stage import StageFailed, StageParams

from ..data.prompts import Prompts


class GenerationCheck(StageParams):
    """Greedy generation from prompts, compared token by token and step by step."""

    prompts: Prompts = Field(default_factory=Prompts, description="The prompts (token ids): random (count, length, "
                             "seed) or from a file (path).")
    new_tokens: int = Field(8, ge=1, le=4096, description="Tokens generated per prompt (greedy: the argmax).")
    min_tokens_matched: int | None = Field(
        None, ge=0, description="Leading generated tokens every prompt must share with the reference (default: "
        "all new_tokens).")
    allow_near_ties: bool = Field(
        False, description="Count a differing token as matched when the reference's own margin between the two "
        "tokens is within near_tie_margin (an error the validation accepts may swap two logits that close), as long "
        "as at most max_diverged_share of the prompts left the reference early in free-running generation. Off: "
        "the tokens must be equal.")
    near_tie_margin: float | None = Field(
        None, ge=0, description="The near-tie allowance, in logits: a differing token is a near tie when the "
        "reference's margin between the two tokens is at most this. Default: the absolute tolerance of the logits "
        "for the candidate's precision (fp32 1e-5, fp16 1e-2, int8 5e-2; `tolerances`/`output_tolerances.logits` "
        "override it). Never derived from the candidate's own error.")
    max_diverged_share: float = Field(
        0.25, ge=0, le=1, description="With allow_near_ties: the largest share of prompts whose free-running "
        "generation may leave the reference before min_tokens_matched (near ties included).")

    def required(self) -> int:
        return self.new_tokens if self.min_tokens_matched is None else min(self.min_tokens_matched, self.new_tokens)


def torch_reference(model: Any, prompts: Sequence[Any], new_tokens: int) -> list[tuple[Any, Any]]:
    """Per prompt, the tokens and raw logits of transformers' greedy ``generate`` (no end-of-sequence stop, no logit
    processors: the argmax of the model's logits at every step)."""
    import numpy as np
    import torch
    import transformers

    config = transformers.GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=new_tokens,
                                           min_new_tokens=None, eos_token_id=None, pad_token_id=0,
                                           output_logits=True, return_dict_in_generate=True)
    results = []
    # generate() fills what a passed config leaves unset (the end-of-sequence id) from the model's own config: the
    # model's is replaced for the call instead, so nothing of it (eos, processors) applies
    saved, model.generation_config = model.generation_config, config
    try:
        outputs = []
        for prompt in prompts:
            ids = torch.from_numpy(np.asarray(prompt, dtype=np.int64)).reshape(1, -1)
            with torch.inference_mode():
                outputs.append((ids.shape[1], model.generate(input_ids=ids, attention_mask=torch.ones_like(ids))))
    finally:
        model.generation_config = saved
    for length, out in outputs:
        tokens = out.sequences[0, length:].numpy()
        logits = torch.stack(list(out.logits), dim=1)[0].float().numpy()
        if tokens.shape[0] != new_tokens:
            raise StageFailed(f"transformers' generate stopped after {tokens.shape[0]} of {new_tokens} tokens")
        results.append((tokens, logits))
    return results


def seq2seq_reference(model: Any, sources: Sequence[Any], new_tokens: int) -> list[tuple[Any, Any]]:
    """Per source, the tokens and raw logits of transformers' greedy generation for an encoder-decoder (the base
    ``GenerationMixin.generate``: Whisper's own generate adds language detection and timestamps), from the
    decoder's start token, without end-of-sequence stop or logit processors."""
    import numpy as np
    import torch
    import transformers
    from transformers.generation.utils import GenerationMixin

    from ..formats.seq2seq import layout_of

    layout = layout_of(model)
    config = transformers.GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=new_tokens,
                                           min_new_tokens=None, eos_token_id=None, pad_token_id=0,
                                           decoder_start_token_id=layout.decoder_start, forced_bos_token_id=None,
                                           forced_eos_token_id=None, output_logits=True,
                                           return_dict_in_generate=True)
    saved, model.generation_config = model.generation_config, config
    results = []
    try:
        for source in sources:
            array = np.asarray(source)[None, ...]
            if layout.speech:
                feed = {"input_features": torch.from_numpy(array.astype(np.float32))}
            else:
                ids = torch.from_numpy(array.astype(np.int64))
                feed = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            with torch.inference_mode():
                out = GenerationMixin.generate(model, **feed, generation_config=config)
            tokens = out.sequences[0, 1:].numpy()
            if tokens.shape[0] != new_tokens:
                raise StageFailed(f"transformers' generate stopped after {tokens.shape[0]} of {new_tokens} tokens")
            results.append((tokens, torch.stack(list(out.logits), dim=1)[0].float().numpy()))
    finally:
        model.generation_config = saved
    return results


def decoder_reference(decoder: Any, prompts: Sequence[Any], new_tokens: int) -> list[tuple[Any, Any]]:
    """Per prompt, the tokens and logits of free greedy generation with a decoder (`runtimes.generation`)."""
    from ..runtimes.generation import greedy

    runs = [greedy(decoder, prompt[None, ...], new_tokens) for prompt in prompts]
    return [(run.tokens[0], run.logits[0] if run.logits is not None else None) for run in runs]


def distinct_tokens(reference: Sequence[tuple[Any, Any]]) -> list[int]:
    """Per prompt, how many different tokens the reference generated."""
    return [len({int(t) for t in tokens}) for tokens, _ in reference]


def informative_enough(distinct: int, new_tokens: int) -> bool:
    """A reference of ``new_tokens`` tokens is informative when at least a quarter of them differ (at least 2): a
    random-weight model often repeats one or two tokens (GPT-2 6 distinct in 64, BLOOM 4), and a candidate that
    matches a repetition proves little."""
    return distinct >= min(new_tokens, max(2, new_tokens // 4))


#: Random prompts: rounds of ``count`` more prompts drawn (the same generator, continued) while the reference of
#: some prompt is degenerate; the ``count`` most informative are kept.
EXTRA_ROUNDS = 3


def informative_reference(spec: Any, vocab_size: int, new_tokens: int, generate: Any, resolve: Any = None,
                          load: Any = None) -> tuple[list[Any], list[tuple[Any, Any]], dict[str, Any]]:
    """The prompts, their greedy reference (``generate(prompts, new_tokens)``) and a record of how informative it is.
    Random prompts whose reference repeats few tokens are replaced: up to `EXTRA_ROUNDS` rounds of ``count`` more
    prompts are drawn from the same seeded generator (the first ``count`` are the recipe's) and the ``count`` whose
    references hold the most distinct tokens are kept, in the order drawn. Prompts from a file are kept as given.
    Either way the record says when the reference stays degenerate (``degenerate_prompts``, a ``note``).
    ``load`` (a spec -> its prompts) draws an encoder-decoder's sources (`accuracy.seq2seq.source_loader`)."""
    from ..data.prompts import load_prompts

    if load is None:
        def load(chosen: Any) -> list[Any]:
            return load_prompts(chosen, vocab_size, resolve)

    prompts = load(spec)
    reference = generate(prompts, new_tokens)
    drawn = len(prompts)
    if spec.path is None:
        rounds = 0
        while rounds < EXTRA_ROUNDS and not all(informative_enough(d, new_tokens) for d in distinct_tokens(reference)):
            rounds += 1
            more = load(spec.model_copy(update={"count": spec.count * (rounds + 1)}))[drawn:]
            prompts, reference = prompts + more, reference + generate(more, new_tokens)
            drawn = len(prompts)
        if drawn > spec.count:
            counts = distinct_tokens(reference)
            kept = sorted(sorted(range(drawn), key=lambda i: (-counts[i], i))[:spec.count])
            prompts, reference = [prompts[i] for i in kept], [reference[i] for i in kept]
    counts = distinct_tokens(reference)
    degenerate = sum(not informative_enough(d, new_tokens) for d in counts)
    record: dict[str, Any] = {"reference_distinct_tokens": counts, "degenerate_prompts": degenerate,
                              "prompts_drawn": drawn}
    if drawn > len(prompts):
        record["prompts_kept"] = "the most informative of the drawn prompts (most distinct reference tokens)"
    if degenerate:
        record["note"] = (f"the reference is degenerate on {degenerate} of {len(counts)} prompts (distinct tokens per "
                          f"prompt {counts} of {new_tokens}): a model that repeats a token matches it easily, so "
                          "tokens matched prove little there; give real prompts (prompts: {path: ...}) or a trained "
                          "model's weights")
    return prompts, reference, record


def forced_candidate(decoder: Any, prompts: Sequence[Any],
                     reference: Sequence[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Per prompt, the candidate's argmax tokens and logits when fed the reference's tokens (teacher forcing)."""
    from ..runtimes.generation import greedy

    results = []
    for prompt, (tokens, _) in zip(prompts, reference, strict=True):
        run = greedy(decoder, prompt[None, ...], len(tokens), forced=tokens.reshape(1, -1))
        results.append((run.tokens[0], run.logits[0] if run.logits is not None else None))
    return results


def free_candidate(decoder: Any, prompts: Sequence[Any], new_tokens: int) -> list[Any]:
    """Per prompt, the tokens the candidate generates freely (greedy, its own tokens fed back)."""
    from ..runtimes.generation import greedy

    return [greedy(decoder, prompt[None, ...], new_tokens, keep_logits=False).tokens[0] for prompt in prompts]


def compare_prompt(reference: tuple[Any, Any], candidate: tuple[Any, Any], allowance: float) -> dict[str, Any]:
    """Tokens matched, where the first difference is and whether it is a near tie (the reference's margin between
    the two tokens within ``allowance``, which does not depend on the candidate), and the logit error per step."""
    import numpy as np

    ref_tokens, ref_logits = reference
    cand_tokens, cand_logits = candidate
    errors = np.abs(cand_logits.astype(np.float64) - ref_logits.astype(np.float64)).max(axis=-1)
    differs = [int(i) for i in np.nonzero(ref_tokens != cand_tokens)[0]]
    margins = {step: float(ref_logits[step, ref_tokens[step]] - ref_logits[step, cand_tokens[step]])
               for step in differs}
    near_ties = [step for step in differs if margins[step] <= allowance]
    matched = differs[0] if differs else len(ref_tokens)
    unexplained = [s for s in differs if s not in near_ties]
    return {
        "prompt_length": None,
        "new_tokens": len(ref_tokens),
        "tokens_matched": matched,
        "tokens_matched_with_near_ties": unexplained[0] if unexplained else len(ref_tokens),
        "first_difference": differs[0] if differs else None,
        "steps_agreeing": len(ref_tokens) - len(differs),
        "near_tie_steps": near_ties,
        "margins": {str(step): margin for step, margin in margins.items()},
        "max_abs_logit_error": float(errors.max()) if errors.size else 0.0,
        "max_abs_logit_error_per_step": [float(e) for e in errors],
        "reference_tokens": [int(t) for t in ref_tokens],
        "candidate_tokens": [int(t) for t in cand_tokens],
    }


def free_running(reference: Sequence[tuple[Any, Any]], free: Sequence[Any]) -> dict[str, Any]:
    """Free-running divergence: per prompt the tokens until the candidate's own generation first differs from the
    reference's and the tokens matched position by position, and the share of all tokens matched."""
    import numpy as np

    until, matched = [], []
    for (ref_tokens, _), tokens in zip(reference, free, strict=True):
        same = np.asarray(ref_tokens) == np.asarray(tokens)
        until.append(int(np.argmin(same)) if not same.all() else int(same.size))
        matched.append(int(same.sum()))
    total = sum(len(tokens) for tokens, _ in reference)
    return {"tokens_until_difference": until, "tokens_matched": matched,
            "share_matched": sum(matched) / total if total else 1.0}


def compare_generation(prompts: Sequence[Any], reference: Sequence[tuple[Any, Any]],
                       candidate: Sequence[tuple[Any, Any]], allowance: float,
                       free: Sequence[Any] | None = None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(the generation record, all steps' reference logits, the candidate's) over every prompt; ``free``: the
    candidate's freely generated tokens per prompt (`free_candidate`), recorded as ``free_running``."""
    import numpy as np

    rows = []
    for index, (prompt, ref, cand) in enumerate(zip(prompts, reference, candidate, strict=True)):
        row = compare_prompt(ref, cand, allowance)
        row["prompt"] = index
        row["prompt_length"] = int(prompt.shape[-1])
        rows.append(row)
    record = {
        "prompts": len(rows),
        "new_tokens": rows[0]["new_tokens"] if rows else 0,
        "near_tie_allowance": allowance,
        "prompts_fully_matched": sum(r["tokens_matched"] == r["new_tokens"] for r in rows),
        "tokens_matched": [r["tokens_matched"] for r in rows],
        "min_tokens_matched": min((r["tokens_matched"] for r in rows), default=0),
        "max_abs_logit_error": max((r["max_abs_logit_error"] for r in rows), default=0.0),
        "per_prompt": rows,
    }
    if free is not None:
        record["free_running"] = free_running(reference, free)
    joined_ref = {"logits": np.concatenate([ref[1] for ref in reference], axis=0)}
    joined_cand = {"logits": np.concatenate([cand[1] for cand in candidate], axis=0)}
    return record, joined_ref, joined_cand


def judge_generation(record: Mapping[str, Any] | None, check: GenerationCheck) -> list[str]:
    """Failures of the token gate: a prompt whose leading matched tokens are fewer than required."""
    if not record:
        return []
    required = check.required()
    key = "tokens_matched_with_near_ties" if check.allow_near_ties else "tokens_matched"
    failures = []
    rows = record.get("per_prompt") or []
    if check.allow_near_ties and rows:
        until = (record.get("free_running") or {}).get("tokens_until_difference") or \
            [row["tokens_matched"] for row in rows]
        diverged = sum(count < required for count in until)
        if diverged > check.max_diverged_share * len(rows):
            failures.append(
                f"generation: {diverged} of {len(rows)} prompts left the reference before {required} tokens in "
                f"free-running generation (tokens until the first difference: {list(until)}); near ties forgive at "
                f"most max_diverged_share {check.max_diverged_share:g} of the prompts")
    for row in rows:
        if row[key] < required:
            step = row["first_difference"]
            tie = " (a near tie)" if step in row["near_tie_steps"] else ""
            failures.append(
                f"generation: prompt #{row['prompt']} matched {row[key]} of {row['new_tokens']} tokens (needs "
                f"{required}): at step {step} the candidate chose {row['candidate_tokens'][step]}, the reference "
                f"{row['reference_tokens'][step]}{tie}; largest logit error at that step "
                f"{row['max_abs_logit_error_per_step'][step]:.3g}")
    return failures


def logit_failures(record: Mapping[str, Any], reference: Sequence[tuple[Any, Any]],
                   candidate: Sequence[tuple[Any, Any]], atol: float, rtol: float) -> list[str]:
    """Steps whose logits differ beyond ``atol`` + ``rtol`` x |reference| (numpy's allclose), one line per prompt."""
    import numpy as np

    failures = []
    for row, (_, ref), (_, cand) in zip(record["per_prompt"], reference, candidate, strict=True):
        bad = [step for step in range(ref.shape[0])
               if not np.allclose(cand[step], ref[step], atol=atol, rtol=rtol, equal_nan=True)]
        if bad:
            failures.append(f"generation: prompt #{row['prompt']}: logits differ beyond atol {atol:g}, rtol {rtol:g} "
                            f"at step(s) {bad[:8]} (largest error {row['max_abs_logit_error']:.3g})")
    return failures


def check_against_torch(onnx_path: Any, model: Any, check: GenerationCheck, atol: float, rtol: float,
                        resolve: Any = None, options: Any = None) -> tuple[dict[str, Any], list[str]]:
    """Greedy generation of an exported KV-cache model (ONNX Runtime, teacher-forced) against transformers'
    ``generate`` on the PyTorch model: the record (tokens matched per prompt, logit errors) and its failures."""
    from ..data.prompts import load_prompts
    from ..runtimes.generation import OrtDecoder
    from ..runtimes.ort import create_session

    decoder = OrtDecoder(create_session(onnx_path, options))
    longest = (max(len(p) for p in load_prompts(check.prompts, decoder.layout.vocab_size, resolve))
               + check.new_tokens)
    from ..formats.generation import context_limit

    limit = context_limit(model.config.get_text_config(decoder=True))
    if limit and longest > limit:
        raise StageFailed(f"the generation check needs {longest} positions (prompt + new tokens) but the model has "
                          f"{limit}", hint="use shorter prompts or fewer new_tokens")
    prompts, reference, informative = informative_reference(
        check.prompts, decoder.layout.vocab_size, check.new_tokens,
        lambda chosen, tokens: torch_reference(model, chosen, tokens), resolve)
    candidate = forced_candidate(decoder, prompts, reference)
    allowance = atol if check.near_tie_margin is None else check.near_tie_margin
    free = free_candidate(decoder, prompts, check.new_tokens) if check.allow_near_ties else None
    record, _, _ = compare_generation(prompts, reference, candidate, allowance, free)
    record["prompts_from"] = check.prompts.describe()
    record["reference_informative"] = informative
    record["reference"] = "transformers generate (PyTorch, greedy)"
    failures = judge_generation(record, check) + logit_failures(record, reference, candidate, atol, rtol)
    return record, failures
