"""Generation on the GPU through PyTorch: the benchmark stage's torch backend, its CUDA-event reference, and the
diagnosis of the earlier fp16 slowness.

``diagnose``: the earlier PyTorch decoder (`runtimes.generation.TorchDecoder`: a DynamicCache, eager) on GPT-2 124M
in fp32/fp16/bf16, per output token: requests on the main thread, each request on a fresh thread (what the
benchmark's clients were: new threads every window), fresh threads with cuDNN's attention off, a thread warmed
first (what the clients are now); the GPU time of the same steps by CUDA events; a profile of a fresh thread's
steps; then the old decoder through the benchmark's harness (`measure.serving.generation.measure_generation`).

``figures``: three families built from their configs with random weights (nothing downloads), saved as Hugging
Face folders: ``gpt2-124m`` (GPT2Config's defaults), ``llama-gqa-124m`` (12 layers, 768 wide, 12 query and 4
key/value heads, vocabulary 32000), ``qwen2-gqa-124m`` (the same sizes with Qwen2's q/k/v biases and 2 key/value
heads). For each and fp32/fp16/bf16: the benchmark stage (`trtflow.testing.run_stage`, backend torch, device cuda,
hf_model, torch_dtype, generation) ``--runs`` times with CUDA graphs (the default) and once eager
(``torch_cuda_graphs: false``); the reference, timed with CUDA events on the GPU: our decoder's prefill and decode
steps, and a plain loop of transformers' forward with its DynamicCache written here (none of trtflow's code); the
tokens our fp32 decoder generates against transformers' ``generate`` on the same GPU.

    python bench/generation_gpu.py --out results                     # on a CUDA machine
    python bench/generation_gpu.py --device cpu --tiny --out /tmp/x  # a dry run of every path on a CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gpt2-124m": ("GPT2Config", "GPT2LMHeadModel", {}),
    "llama-gqa-124m": ("LlamaConfig", "LlamaForCausalLM", {
        "vocab_size": 32000, "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
        "num_attention_heads": 12, "num_key_value_heads": 4, "max_position_embeddings": 2048}),
    "qwen2-gqa-124m": ("Qwen2Config", "Qwen2ForCausalLM", {
        "vocab_size": 32000, "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
        "num_attention_heads": 12, "num_key_value_heads": 2, "max_position_embeddings": 2048}),
}
TINY = {"GPT2Config": {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 500},
        "LlamaConfig": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 500,
                        "num_attention_heads": 4, "num_key_value_heads": 2},
        "Qwen2Config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 500,
                        "num_attention_heads": 4, "num_key_value_heads": 2}}
DTYPES = ("float32", "float16", "bfloat16")


def build(name: str, tiny: bool) -> Any:
    import torch
    import transformers

    config_class, model_class, kwargs = MODELS[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**{**kwargs, **(TINY[config_class] if tiny else {})})
    return getattr(transformers, model_class)(config).eval()


def spread(values: list[float]) -> str:
    middle = statistics.median(values)
    return f"{min(values):.4g}/{middle:.4g}/{max(values):.4g} ({(max(values) - min(values)) / middle * 100:.1f}%)"


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


# -- diagnose -------------------------------------------------------------------------------------------------
def in_thread(function: Any) -> Any:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = function()
        except BaseException as error:
            box["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def per_token_ms(decoder: Any, prompt: Any, new_tokens: int) -> float:
    from trtflow_stages.runtimes.generation import greedy

    return float(greedy(decoder, prompt, new_tokens, keep_logits=False).per_token_ms or 0.0)


def gpu_step_ms(decoder: Any, prompt: Any, new_tokens: int, device: str) -> tuple[float, float]:
    """(wall ms per decode step on the host, GPU ms per decode step by CUDA events) of one request."""
    import numpy as np
    import torch

    logits, cache = decoder.prefill(prompt)
    walls, gpu = [], []
    for _ in range(new_tokens - 1):
        token = np.asarray(decoder.pick(logits), dtype=np.int64)
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        began = time.perf_counter()
        logits, cache = decoder.step(token, cache)
        if device == "cuda":
            end.record()
            end.synchronize()
            gpu.append(start.elapsed_time(end))
        walls.append((time.perf_counter() - began) * 1000.0)
    return statistics.median(walls), statistics.median(gpu) if gpu else float("nan")


def diagnose(args: argparse.Namespace, log: Any) -> dict[str, Any]:
    import numpy as np
    import torch

    from trtflow_stages.formats.generation import model_layout
    from trtflow_stages.runtimes.generation import TorchDecoder

    device = args.device
    out: dict[str, Any] = {"torch": torch.__version__}
    if device == "cuda":
        out.update(card=torch.cuda.get_device_name(), cudnn=torch.backends.cudnn.version(),
                   sdp={"cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
                        "flash": torch.backends.cuda.flash_sdp_enabled(),
                        "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                        "math": torch.backends.cuda.math_sdp_enabled()})
    log(f"diagnose: {out}")
    base = build("gpt2-124m", args.tiny)
    layout = model_layout(base)[0]
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, layout.vocab_size, size=(1, args.context)) for _ in range(4)]
    rows = []
    for dtype in DTYPES:
        if device == "cpu" and dtype == "float16":
            continue
        model = build("gpt2-124m", args.tiny).to(device, getattr(torch, dtype))
        rows.append(diagnose_dtype(TorchDecoder(model, layout, device), dtype, prompts, args, log))
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    out["rows"] = rows
    return out


def diagnose_dtype(decoder: Any, dtype: str, prompts: list[Any], args: argparse.Namespace, log: Any
                   ) -> dict[str, Any]:
    import torch

    from trtflow_stages.measure.serving.generation import GenerationBench, measure_generation
    from trtflow_stages.measure.statistics.intervals import Precision
    from trtflow_stages.measure.timing.windows import WindowPlan

    device, tokens = args.device, args.new_tokens
    if True:  # one block: the old decoder in this dtype
        row: dict[str, Any] = {"dtype": dtype}
        main = [per_token_ms(decoder, p, tokens) for p in prompts]
        row["main_thread_cold_ms"], row["main_thread_warm_ms"] = main[0], statistics.median(main[1:])
        fresh = [in_thread(lambda p=p: per_token_ms(decoder, p, tokens)) for p in prompts[:3]]
        row["fresh_thread_ms"] = statistics.median(fresh)
        fresh_gpu = [in_thread(lambda p=p: gpu_step_ms(decoder, p, tokens, device)) for p in prompts[:3]]
        row["fresh_thread_step_wall_ms"] = statistics.median(w for w, _ in fresh_gpu)
        row["fresh_thread_step_gpu_ms"] = statistics.median(g for _, g in fresh_gpu)
        warm_gpu = [gpu_step_ms(decoder, p, tokens, device) for p in prompts[:3]]
        row["main_thread_step_wall_ms"] = statistics.median(w for w, _ in warm_gpu)
        row["main_thread_step_gpu_ms"] = statistics.median(g for _, g in warm_gpu)

        def warmed_then_timed(decoder: Any = decoder) -> list[float]:
            per_token_ms(decoder, prompts[0], tokens)
            return [per_token_ms(decoder, p, tokens) for p in prompts[1:]]

        row["warmed_thread_ms"] = statistics.median(in_thread(warmed_then_timed))
        if device == "cuda":
            torch.backends.cuda.enable_cudnn_sdp(False)
            try:
                row["fresh_thread_no_cudnn_attention_ms"] = statistics.median(
                    in_thread(lambda p=p: per_token_ms(decoder, p, tokens)) for p in prompts[:3])
            finally:
                torch.backends.cuda.enable_cudnn_sdp(True)
        shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
        log(f"  old decoder {dtype}: {json.dumps(shown)}")
        if dtype == "float16" or (device == "cpu" and dtype == "bfloat16"):
            row["profile_fresh_thread"] = in_thread(lambda: profile_steps(decoder, prompts[3], device))
            log("  profile of one request's decode steps on a fresh thread (self CPU time, top 12):\n" +
                row["profile_fresh_thread"])
        plan = WindowPlan(3, 6, 0.6, 1.2, Precision(5.0))
        bench = GenerationBench(context_length=args.context, new_tokens=tokens, concurrency=[1])
        level = measure_generation(decoder, bench, plan, device=device)[0]
        row["harness_now"] = {"ttft_p50_ms": level["ttft_ms"]["p50"], "tpot_p50_ms": level["tpot_ms"]["p50"],
                              "tpot_ci_ms": level["tpot_ms"]["ci"]["p50"], "n": level["requests"]}
        log(f"  old decoder {dtype} through the benchmark's harness now (clients warmed on their threads): "
            f"{row['harness_now']}")
    return row


def profile_steps(decoder: Any, prompt: Any, device: str) -> str:
    import numpy as np
    import torch

    logits, cache = decoder.prefill(prompt)
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(3):
            logits, cache = decoder.step(np.asarray(decoder.pick(logits), dtype=np.int64), cache)
        sync(device)
    return str(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))


# -- cudnn: eager steps on a warmed thread, cuDNN's attention on and off --------------------------------------
def cudnn(args: argparse.Namespace, log: Any) -> list[dict[str, Any]]:
    """Per output token on the (warmed) main thread, eager: the old decoder and the static one without graphs, with
    PyTorch's cuDNN attention on and off, and a profile of the static decoder's warmed eager steps."""
    import numpy as np
    import torch

    from trtflow_stages.formats.generation import model_layout
    from trtflow_stages.runtimes.generation import TorchDecoder
    from trtflow_stages.runtimes.torch_generation import open_decoder

    rows = []
    for name in ("gpt2-124m", "llama-gqa-124m"):
        for dtype in DTYPES:
            model = build(name, args.tiny).to(args.device, getattr(torch, dtype))
            layout = model_layout(model)[0]
            rng = np.random.default_rng(0)
            prompts = [rng.integers(0, layout.vocab_size, size=(1, args.context)) for _ in range(6)]
            decoders = {"old (DynamicCache)": TorchDecoder(model, layout, args.device),
                        "static, eager": open_decoder(model, args.device, args.context + args.new_tokens, False, 1)}
            row: dict[str, Any] = {"model": name, "dtype": dtype}
            for label, decoder in decoders.items():
                for on in (True, False):
                    torch.backends.cuda.enable_cudnn_sdp(on)
                    per_token_ms(decoder, prompts[0], args.new_tokens)  # warm-up on this thread
                    row[f"{label}, cudnn {'on' if on else 'off'}"] = statistics.median(
                        per_token_ms(decoder, p, args.new_tokens) for p in prompts[1:])
                torch.backends.cuda.enable_cudnn_sdp(True)
            if name == "llama-gqa-124m" and dtype == "float16":
                row["profile_static_eager_warmed"] = profile_steps(decoders["static, eager"], prompts[1], args.device)
            log(f"{name} {dtype} per output token ms (warmed thread): " + json.dumps(
                {k: round(v, 3) for k, v in row.items() if isinstance(v, float)}))
            if "profile_static_eager_warmed" in row:
                log(row["profile_static_eager_warmed"])
            rows.append(row)
            del decoders, model
            torch.cuda.empty_cache()
    return rows


# -- figures --------------------------------------------------------------------------------------------------
def stage_levels(folder: Path, dtype: str, args: argparse.Namespace, work: Path, graphs: bool | None,
                 concurrency: list[int]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from trtflow.testing import run_stage
    from trtflow_stages import benchmark

    params: dict[str, Any] = {
        "backend": "torch", "device": args.device, "hf_model": folder.name, "torch_dtype": dtype,
        "generation": {"context_length": args.context, "new_tokens": args.new_tokens, "concurrency": concurrency},
        "repeats": 3, "min_duration_s": args.duration, "max_duration_s": 2 * args.duration, "min_iterations": 10,
        "warmup_ms": 0}
    if graphs is not None:
        params["torch_cuda_graphs"] = graphs
    result = run_stage(benchmark.stage, params, workdir=work, recipe_dir=folder.parent)
    metrics = json.loads(Path(result.outputs["metrics"]).read_text())
    return result.summary["generation"], metrics["method"]["torch"]


def reference_ms(model: Any, folder: Path, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    """CUDA events around our decoder's prefill and steps, and around a plain transformers loop (DynamicCache)."""
    import numpy as np
    import torch
    import transformers

    from trtflow_stages.runtimes.torch_generation import open_decoder

    device = args.device
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, model.config.vocab_size, size=(1, args.context)) for _ in range(6)]
    decoder = open_decoder(model, device, args.context + args.new_tokens, True, 1)
    ours_prefill, ours_step, ours_wall = [], [], []
    for prompt in prompts:
        start = time.perf_counter()
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        _, cache = decoder.prefill(prompt)
        if device == "cuda":
            b.record()
            b.synchronize()
            ours_prefill.append(a.elapsed_time(b))
        step_wall, step_gpu = gpu_step_ms(decoder, prompt, args.new_tokens, device)
        ours_step.append(step_gpu)
        ours_wall.append(step_wall)
        del cache
        _ = time.perf_counter() - start
    plain_prefill, plain_step = [], []
    for prompt in prompts:
        ids = torch.as_tensor(prompt, device=device)
        with torch.inference_mode():
            cache = transformers.DynamicCache(config=model.config)
            events = [torch.cuda.Event(enable_timing=True) for _ in range(args.new_tokens + 1)] \
                if device == "cuda" else []
            if events:
                events[0].record()
            out = model(input_ids=ids, cache=cache, use_cache=True)
            if events:
                events[1].record()
            for index in range(args.new_tokens - 1):
                token = out.logits[:, -1].argmax(-1, keepdim=True)
                out = model(input_ids=token, cache=cache, use_cache=True)
                if events:
                    events[index + 2].record()
            sync(device)
        if events:
            plain_prefill.append(events[0].elapsed_time(events[1]))
            plain_step.append(statistics.median(events[i].elapsed_time(events[i + 1])
                                                for i in range(1, args.new_tokens)))

    def median(values: list[float]) -> float:
        return statistics.median(values[1:]) if len(values) > 1 else float("nan")

    record = {"ours_prefill_gpu_ms": median(ours_prefill), "ours_step_gpu_ms": median(ours_step),
              "ours_step_wall_ms": median(ours_wall), "plain_prefill_gpu_ms": median(plain_prefill),
              "plain_step_gpu_ms": median(plain_step), "requests": len(prompts) - 1,
              "decoder": decoder.describe()}
    if dtype == "float32":
        record["tokens_vs_generate"] = tokens_vs_generate(decoder, model, prompts[:3], args.new_tokens, device)
    return record


def tokens_vs_generate(decoder: Any, model: Any, prompts: list[Any], new_tokens: int, device: str) -> str:
    import torch
    import transformers

    from trtflow_stages.runtimes.generation import greedy

    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                           eos_token_id=None, pad_token_id=0)
    saved, model.generation_config = model.generation_config, config
    same = 0
    try:
        for prompt in prompts:
            ids = torch.as_tensor(prompt, device=device)
            with torch.inference_mode():
                expected = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids))[0, ids.shape[1]:]
            ours = greedy(decoder, prompt, new_tokens, keep_logits=False).tokens[0]
            same += int((expected.cpu().numpy() == ours).sum())
    finally:
        model.generation_config = saved
    return f"{same}/{len(prompts) * new_tokens}"


def figures(args: argparse.Namespace, log: Any) -> list[dict[str, Any]]:
    import torch

    root = Path(tempfile.mkdtemp(prefix="gen-gpu-"))
    rows: list[dict[str, Any]] = []
    card = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    for name in args.models:
        folder = root / name
        build(name, args.tiny).save_pretrained(folder)
        for dtype in args.dtypes:
            if args.device == "cpu" and dtype == "float16":
                continue
            for run in range(1, args.runs + 1):
                levels, described = stage_levels(folder, dtype, args, root / f"w-{name}-{dtype}-{run}", None, [1])
                rows.append(row_of(name, dtype, card, "graphs", run, levels[0], described))
                log(f"{name} {dtype} run {run}: {short(rows[-1])}")
            levels, described = stage_levels(folder, dtype, args, root / f"w-{name}-{dtype}-eager", False, [1])
            rows.append(row_of(name, dtype, card, "eager", 1, levels[0], described))
            log(f"{name} {dtype} eager: {short(rows[-1])}")
            if args.concurrency > 1 and dtype == "float16":
                levels, described = stage_levels(folder, dtype, args, root / f"w-{name}-{dtype}-c",
                                                 None, [args.concurrency])
                rows.append(row_of(name, dtype, card, "graphs", 1, levels[0], described))
                log(f"{name} {dtype} concurrency {args.concurrency}: {short(rows[-1])}")
            from trtflow_stages.runtimes.torch_generation import load_causal_lm

            model = load_causal_lm(folder, dtype, args.device, name)
            reference = reference_ms(model, folder, dtype, args)
            rows.append({"model": name, "dtype": dtype, "card": card, "reference": reference})
            log(f"{name} {dtype} reference (CUDA events): {json.dumps(reference)}")
            del model
            if args.device == "cuda":
                torch.cuda.empty_cache()
    return rows


def row_of(name: str, dtype: str, card: str, mode: str, run: int, level: dict[str, Any],
           described: dict[str, Any]) -> dict[str, Any]:
    first, per = level["ttft_ms"], level["tpot_ms"]
    return {"model": name, "dtype": dtype, "card": card, "mode": mode, "run": run,
            "concurrency": level["concurrency"], "ttft_p50_ms": first["p50"], "ttft_ci_ms": first["ci"]["p50"],
            "tpot_p50_ms": per["p50"], "tpot_ci_ms": per["ci"]["p50"], "n": level["requests"],
            "tokens_per_s": level["output_tokens_per_s"], "flags": level["flags"], "decoder": described}


def short(row: dict[str, Any]) -> str:
    return (f"TTFT {row['ttft_p50_ms']:.4g} [{row['ttft_ci_ms'][0]:.4g}, {row['ttft_ci_ms'][1]:.4g}] ms, TPOT "
            f"{row['tpot_p50_ms']:.4g} [{row['tpot_ci_ms'][0]:.4g}, {row['tpot_ci_ms'][1]:.4g}] ms, n={row['n']}, "
            f"{row['tokens_per_s']:.4g} tok/s, flags {row['flags']}, graphs {row['decoder'].get('cuda_graphs')}"
            + (f" ({row['decoder']['cuda_graphs_off']})" if row["decoder"].get("cuda_graphs_off") else ""))


def table(rows: list[dict[str, Any]], log: Any) -> None:
    log("\n| model | dtype | mode | c | TTFT p50 ms [95% CI] per run | TPOT p50 ms [95% CI] per run | n | spread "
        "TTFT; TPOT |")
    log("|---|---|---|---|---|---|---|---|")
    keys: list[tuple[Any, ...]] = []
    for row in rows:
        key = (row["model"], row["dtype"], row.get("mode"), row.get("concurrency"))
        if "mode" in row and key not in keys:
            keys.append(key)
    for key in keys:
        chosen = [r for r in rows if (r["model"], r["dtype"], r.get("mode"), r.get("concurrency")) == key]
        ttft = "; ".join(f"{r['ttft_p50_ms']:.4g} [{r['ttft_ci_ms'][0]:.4g}, {r['ttft_ci_ms'][1]:.4g}]"
                         for r in chosen)
        tpot = "; ".join(f"{r['tpot_p50_ms']:.4g} [{r['tpot_ci_ms'][0]:.4g}, {r['tpot_ci_ms'][1]:.4g}]"
                         for r in chosen)
        both = (f"{spread([r['ttft_p50_ms'] for r in chosen])}; {spread([r['tpot_p50_ms'] for r in chosen])}"
                if len(chosen) > 1 else "-")
        log(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {ttft} | {tpot} | "
            f"{'/'.join(str(r['n']) for r in chosen)} | {both} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", choices=["diagnose", "cudnn", "figures"],
                        default=["diagnose", "figures"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--duration", type=float, default=1.0, help="min_duration_s of each stage run")
    parser.add_argument("--concurrency", type=int, default=4, help="fp16 also at this concurrency (1: not)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny models (a dry run)")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    result: dict[str, Any] = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    if "diagnose" in args.sections:
        result["diagnose"] = diagnose(args, log)
        log(f"diagnose done at {time.perf_counter() - started:.0f} s")
    if "cudnn" in args.sections:
        result["cudnn"] = cudnn(args, log)
    if "figures" in args.sections:
        result["rows"] = figures(args, log)
        table(result["rows"], log)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    (args.out / "generation-gpu-torch.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    log(f"wrote {args.out / 'generation-gpu-torch.json'} ({result['wall_s']} s)")


if __name__ == "__main__":
    main()
