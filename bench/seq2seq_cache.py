"""Time per output token of an encoder-decoder's decoder with its KV cache (`formats.seq2seq`) against the decoder
without one (task text2text-generation: the whole prefix recomputed at every step), and whether both generate the
same tokens.

A T5 of d_model 256, 4 encoder and 4 decoder layers, 8 heads, vocabulary 512, random weights (built from its config;
nothing downloads), exported by the export stage in this process (`trtflow.testing.run_stage`) both ways; ONNX
Runtime on the CPU, one intra-op thread. Each request: a source of 32 random token ids, 64 greedy tokens; time per
output token = (last token - first token) / 63 on the host clock. ``--runs`` runs of ``--requests`` requests each:
the median of each and their ratio per run, and the tokens both decoders agree on.

    python bench/seq2seq_cache.py /tmp/seq2seq-bench --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

NEW_TOKENS, SOURCE, VOCAB = 64, 32, 512


def _session(path: str) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _export(folder: Path) -> dict[tuple[str, str], str]:
    import torch
    import transformers

    from trtflow.testing import run_stage
    from trtflow_stages import export

    transformers.logging.set_verbosity_error()
    if not (folder / "t5").exists():
        torch.manual_seed(0)
        config = transformers.T5Config(vocab_size=VOCAB, d_model=256, d_kv=32, d_ff=1024, num_layers=4, num_heads=8,
                                       decoder_start_token_id=0)
        transformers.T5ForConditionalGeneration(config).eval().save_pretrained(folder / "t5")
    paths = {}
    for task in ("text2text-generation-with-past", "text2text-generation"):
        for part in ("encoder", "decoder"):
            run = run_stage(export.stage, {"model": "t5", "task": task, "part": part, "check": False},
                            workdir=folder / f"{task}-{part}", recipe_dir=folder)
            paths[(task, part)] = str(run.outputs["model"])
    return paths


def _recomputing(encoder: Any, decoder: Any, source: Any) -> tuple[list[int], float]:
    """Greedy tokens and time per output token of the decoder without a cache (the prefix recomputed)."""
    import numpy as np

    ids = source[None, :]
    mask = np.ones_like(ids)
    hidden = encoder.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    names = {i.name for i in decoder.get_inputs()}
    tokens, times = [0], []
    start = time.perf_counter_ns()
    for _ in range(NEW_TOKENS):
        feed = {"input_ids": np.array([tokens], dtype=np.int64), "encoder_hidden_states": hidden}
        if "encoder_attention_mask" in names:
            feed["encoder_attention_mask"] = mask
        tokens.append(int(decoder.run(None, feed)[0][0, -1].argmax()))
        times.append((time.perf_counter_ns() - start) / 1e6)
    return tokens[1:], (times[-1] - times[0]) / (NEW_TOKENS - 1)


def main() -> None:
    import numpy as np
    import torch

    from trtflow_stages.runtimes.generation import greedy
    from trtflow_stages.runtimes.seq2seq import open_decoder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    (args.folder / "pyproject.toml").touch()
    torch.set_num_threads(1)
    paths = _export(args.folder)
    cached = open_decoder(_session(paths[("text2text-generation-with-past", "decoder")]),
                          _session(paths[("text2text-generation-with-past", "encoder")]))
    encoder = _session(paths[("text2text-generation", "encoder")])
    decoder = _session(paths[("text2text-generation", "decoder")])
    rng = np.random.default_rng(0)
    ratios = []
    for run in range(args.runs):
        with_cache, without, same = [], [], 0
        for _ in range(args.requests):
            source = rng.integers(0, VOCAB, size=SOURCE, dtype=np.int64)
            generated = greedy(cached, source[None, :], NEW_TOKENS, keep_logits=False)
            with_cache.append(generated.per_token_ms or 0.0)
            tokens, per_token = _recomputing(encoder, decoder, source)
            without.append(per_token)
            same += tokens == generated.tokens[0].tolist()
        ratio = statistics.median(without) / statistics.median(with_cache)
        ratios.append(ratio)
        print(f"run {run}: TPOT p50 with the cache {statistics.median(with_cache):.3f} ms, recomputing the prefix "
              f"{statistics.median(without):.3f} ms (n = {args.requests} requests each; {ratio:.2f}x); the same "
              f"{NEW_TOKENS} tokens on {same} of {args.requests} sources")
    print(f"ratio over {args.runs} runs: {min(ratios):.2f}x .. {max(ratios):.2f}x")


if __name__ == "__main__":
    main()
