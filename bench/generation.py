"""Generation with a KV cache: tokens matched, time to first token and time per output token, for two causal LMs.

Two GPT-2-small-sized models built from their configs with random weights (latency does not depend on the values;
nothing downloads): ``gpt2-124m`` (GPT2Config's defaults: 12 layers, 12 heads, 768 wide, vocabulary 50257) and
``llama-gqa-124m`` (a Llama of 12 layers, 768 wide, 12 query heads and 4 key/value heads: grouped-query attention,
vocabulary 32000, about 124M parameters).

``cpu``: ONNX Runtime on this machine, through the real stages in this process (`trtflow.testing.run_stage`):
the export stage (task text-generation-with-past; its greedy-generation check against transformers' generate gives
the tokens matched), then the benchmark stage (generation: TTFT and TPOT at a context length and concurrencies)
``--runs`` times. ``gpu``: PyTorch (eager, the Hugging Face model itself, its cache a DynamicCache) on a CUDA GPU,
fp32 and fp16, timed with the same harness (`measure.serving.generation`); tokens matched by teacher forcing against
transformers' generate on the CPU in fp32 (`accuracy.generation`).

Each figure is the median with its 95% interval and n (requests) of one run; the table gives every run and the
spread (max - min over the runs' medians, as a share of their median). A cross-check that needs none of our code,
against TTFT + (new_tokens - 1) x TPOT at concurrency 1: the wall time of one request written out with onnxruntime
and numpy alone (cpu), or of transformers' own ``generate`` (gpu; it does more per step than a bare loop).

    python bench/generation.py cpu --runs 3 --out bench/results/generation
    python bench/generation.py gpu --runs 3 --out results            # on a CUDA machine
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gpt2-124m": ("GPT2Config", "GPT2LMHeadModel", {}),
    "llama-gqa-124m": ("LlamaConfig", "LlamaForCausalLM", {
        "vocab_size": 32000, "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
        "num_attention_heads": 12, "num_key_value_heads": 4, "max_position_embeddings": 2048}),
}


def build(name: str) -> Any:
    import torch
    import transformers

    config_class, model_class, kwargs = MODELS[name]
    torch.manual_seed(0)
    return getattr(transformers, model_class)(getattr(transformers, config_class)(**kwargs)).eval()


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    middle = statistics.median(values)
    return f"{min(values):.4g}/{middle:.4g}/{max(values):.4g} ({(max(values) - min(values)) / middle * 100:.1f}%)"


def generate_wall_ms(model: Any, prompt: Any, new_tokens: int, device: str, repeats: int = 5) -> float:
    """Median wall time of transformers' greedy generate for one request (the cross-check)."""
    import torch
    import transformers

    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                           eos_token_id=None, pad_token_id=0)
    saved, model.generation_config = model.generation_config, config
    ids = torch.as_tensor(prompt, device=device)
    times = []
    try:
        for _ in range(repeats + 1):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids))
            out.cpu()
            times.append((time.perf_counter() - start) * 1000.0)
    finally:
        model.generation_config = saved
    return statistics.median(times[1:])


def plain_onnxruntime_ms(path: Path, prompt: Any, new_tokens: int, repeats: int = 5) -> float:
    """Median wall time of one request written out with onnxruntime and numpy alone (none of trtflow's code): the
    cross-check of the ONNX Runtime figures."""
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    past_inputs = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        ids, length = prompt, 0
        past = [np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32) for i in past_inputs]
        for _ in range(new_tokens):
            feed = {"input_ids": ids, "attention_mask": np.ones((1, length + ids.shape[1]), np.int64)}
            if "position_ids" in names:
                feed["position_ids"] = np.arange(length, length + ids.shape[1], dtype=np.int64)[None]
            feed.update({i.name: value for i, value in zip(past_inputs, past, strict=True)})
            logits, *past = session.run(None, feed)
            length += ids.shape[1]
            ids = logits[:, -1].argmax(-1).reshape(1, 1).astype(np.int64)
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times[1:])


def row(model: str, where: str, run: int, level: dict[str, Any], matched: str, generate_ms: float | None) -> dict:
    first, per = level["ttft_ms"], level["tpot_ms"]
    return {"model": model, "where": where, "run": run, "concurrency": level["concurrency"],
            "tokens_matched": matched, "ttft_p50_ms": first["p50"], "ttft_ci_ms": first["ci"]["p50"],
            "tpot_p50_ms": per["p50"], "tpot_ci_ms": per["ci"]["p50"], "n": level["requests"],
            "tokens_per_s": level["output_tokens_per_s"], "converged": level["converged"],
            "generate_wall_ms": generate_ms}


def print_table(rows: list[dict[str, Any]], new_tokens: int) -> None:
    print(f"\n| model | where | concurrency | tokens matched | TTFT p50 ms [95% CI] | TPOT p50 ms [95% CI] | n | "
          f"TTFT + {new_tokens - 1} x TPOT vs a plain loop ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        check = "-" if r["generate_wall_ms"] is None else \
            f"{r['ttft_p50_ms'] + (new_tokens - 1) * r['tpot_p50_ms']:.4g} vs {r['generate_wall_ms']:.4g}"
        print(f"| {r['model']} | {r['where']} run {r['run']} | {r['concurrency']} | {r['tokens_matched']} | "
              f"{r['ttft_p50_ms']:.4g} [{r['ttft_ci_ms'][0]:.4g}, {r['ttft_ci_ms'][1]:.4g}] | "
              f"{r['tpot_p50_ms']:.4g} [{r['tpot_ci_ms'][0]:.4g}, {r['tpot_ci_ms'][1]:.4g}] | {r['n']} | {check} |"
              + ("" if r["converged"] else " (not converged)"))
    print("\nspread over runs (min/median/max of the runs' p50, (max - min) / median):")
    keys = sorted({(r["model"], r["where"], r["concurrency"]) for r in rows})
    for key in keys:
        chosen = [r for r in rows if (r["model"], r["where"], r["concurrency"]) == key]
        print(f"  {key[0]} {key[1]} concurrency {key[2]}: TTFT {spread([r['ttft_p50_ms'] for r in chosen])} ms; "
              f"TPOT {spread([r['tpot_p50_ms'] for r in chosen])} ms")


def cpu(args: argparse.Namespace) -> list[dict[str, Any]]:
    from trtflow.testing import run_stage
    from trtflow_stages import benchmark, export

    rows = []
    check = {"prompts": {"count": 4, "length": 32}, "new_tokens": args.check_tokens}
    for name in MODELS:
        folder = Path(tempfile.mkdtemp(prefix=f"gen-{name}-"))
        model = build(name)
        model.save_pretrained(folder / name)
        started = time.perf_counter()
        exported = run_stage(export.stage, {"model": name, "task": "text-generation-with-past", "generation": check},
                             workdir=folder / "export", recipe_dir=folder)
        record = exported.summary["generation_check"]
        matched = f"{sum(record['tokens_matched'])}/{record['prompts'] * record['new_tokens']}"
        print(f"{name}: exported in {time.perf_counter() - started:.0f} s; tokens matched per prompt "
              f"{record['tokens_matched']} of {record['new_tokens']} (largest logit error "
              f"{record['max_abs_logit_error']:.2g})", flush=True)
        import numpy as np

        prompt = np.random.default_rng(0).integers(0, model.config.vocab_size, size=(1, args.context))
        reference_ms = plain_onnxruntime_ms(exported.outputs["model"], prompt, args.new_tokens)
        params = {"generation": {"context_length": args.context, "new_tokens": args.new_tokens,
                                 "concurrency": args.concurrency}, "repeats": 3, "min_duration_s": args.duration,
                  "max_duration_s": 3 * args.duration, "min_iterations": args.min_requests, "warmup_ms": 0}
        for run in range(1, args.runs + 1):
            result = run_stage(benchmark.stage, params, {"model": exported.outputs["model"]},
                               workdir=folder / f"bench-{run}")
            for level in result.summary["generation"]:
                rows.append(row(name, "onnxruntime cpu", run, level, matched, reference_ms))
                print(f"  run {run}: {rows[-1]}", flush=True)
    return rows


def gpu(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    from trtflow_stages.accuracy.generation import compare_generation, forced_candidate, torch_reference
    from trtflow_stages.data.prompts import Prompts, load_prompts
    from trtflow_stages.formats.generation import model_layout
    from trtflow_stages.measure.serving.generation import GenerationBench, measure_generation
    from trtflow_stages.measure.statistics.intervals import Precision
    from trtflow_stages.measure.timing.windows import WindowPlan
    from trtflow_stages.runtimes.generation import TorchDecoder

    device = args.torch_device
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu: no CUDA device")
    rows = []
    plan = WindowPlan(3, args.min_requests, args.duration, 3 * args.duration, Precision(5.0))
    bench = GenerationBench(context_length=args.context, new_tokens=args.new_tokens, concurrency=args.concurrency)
    for name in args.models or list(MODELS):
        model = build(name)
        layout = model_layout(model)[0]
        prompts = load_prompts(Prompts(count=4, length=32), layout.vocab_size)
        reference = torch_reference(model, prompts, args.check_tokens)  # fp32 on the CPU
        for dtype in args.dtypes:
            if device == "cpu" and dtype == "float16":
                continue  # a dry run of this path on a CPU: fp16 matmuls are not what a CPU runs
            cuda_model = copy.deepcopy(model).to(device, getattr(torch, dtype))
            decoder = TorchDecoder(cuda_model, layout, device)
            candidate = forced_candidate(decoder, prompts, reference)
            record, _, _ = compare_generation(prompts, reference, candidate, 0.0)
            matched = f"{sum(record['tokens_matched'])}/{record['prompts'] * record['new_tokens']}"
            import numpy as np

            prompt = np.random.default_rng(0).integers(0, layout.vocab_size, size=(1, args.context))
            reference_ms = generate_wall_ms(cuda_model, prompt, args.new_tokens, device)
            name_of = torch.cuda.get_device_name() if device == "cuda" else "cpu"
            where = f"pytorch {device} {dtype} ({name_of})"
            print(f"{name} {dtype}: tokens matched per prompt {record['tokens_matched']} (largest logit error "
                  f"{record['max_abs_logit_error']:.2g})", flush=True)
            for run in range(1, args.runs + 1):
                for level in measure_generation(decoder, bench, plan):
                    rows.append(row(name, where, run, level, matched, reference_ms))
                    print(f"  run {run}: {rows[-1]}", flush=True)
            del decoder, cuda_model
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("where", choices=["cpu", "gpu"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--context", type=int, default=128, help="prompt tokens per request")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--check-tokens", type=int, default=16, help="greedy tokens compared per prompt")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--duration", type=float, default=2.0, help="min_duration_s per level")
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--min-requests", type=int, default=10, help="min_iterations: requests per level at least")
    parser.add_argument("--torch-device", default="cuda", help="gpu: the PyTorch device (cpu for a dry run)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), help="gpu: these models only (default: all)")
    parser.add_argument("--dtypes", nargs="+", choices=["float32", "float16"], default=["float32", "float16"],
                        help="gpu: these precisions only")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = cpu(args) if args.where == "cpu" else gpu(args)
    print_table(rows, args.new_tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / f"generation-{args.where}.json"
    target.write_text(json.dumps({"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                                  "rows": rows, "wall_s": round(time.perf_counter() - started, 1)}, indent=2) + "\n")
    print(f"\nwrote {target} ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
