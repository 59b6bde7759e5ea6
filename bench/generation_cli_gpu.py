"""Issue 42 item 2, as a user reaches it: GPU generation on PyTorch through `trtflow run`, against an independent
reference on the same GPU.

For each model (GPT-2 124M, optionally the Llama-style GQA 124M of `generation_gpu.py`, random weights from the
config, nothing downloads) this script:

1. saves the model as a Hugging Face folder in a fresh project folder (``pyproject.toml`` marker) and writes the
   recipe README shows for GPU generation through PyTorch: a ``benchmark`` node, ``backend: torch``, ``hf_model``,
   ``torch_dtype`` from a matrix over float32/float16/bfloat16, ``device: cuda``, ``generation: {context_length,
   new_tokens, concurrency: [1]}``; nothing else (no ``torch_cuda_graphs``: the default must give graphs; the timing
   settings are the stage's defaults);
2. runs ``python -m trtflow.cli run recipe.yaml`` as a subprocess ``--runs`` times, each with a fresh store and output
   folder (every node measured anew), and reads each benchmark node's ``metrics.json`` (TTFT/TPOT medians with their
   95% intervals, ``method.torch``: whether CUDA graphs ran and why not);
3. times the reference in this process after each CLI run, written here with transformers and PyTorch only (none
   of trtflow's code): transformers' ``StaticCache``, the prompt prefilled eagerly, each decode step captured once
   as a ``torch.cuda.CUDAGraph`` and replayed; per request the same client-side clock as the benchmark (host
   prompt to first token on the host: TTFT; first to last token / (new_tokens - 1): TPOT), and the GPU time of a
   replay by CUDA events. The "eager prefill of the same length" is that prefill (static cache, the same writes);
   a prefill without a cache is recorded beside it;
4. fp32 tokens: the CLI's benchmark records no tokens, so the tokens of the stage's decoder, opened as the node
   opens it (``runtimes.torch_generation.open_decoder``, graphs on), and of the reference are compared with
   transformers' ``generate`` on the same GPU;
5. prints and writes ``generation-cli-gpu.json`` and a Markdown table; exits 1 when a goal fails:
   TPOT within 10% of the reference's per dtype, fp16/bf16 TPOT not above fp32's, TTFT within 20% of the eager
   prefill, fp32 tokens equal to ``generate``'s, CUDA graphs on in every node.

    python bench/generation_cli_gpu.py --out bench/results/generation-cli          # on a CUDA machine
    python bench/generation_cli_gpu.py --device cpu --tiny --out /tmp/gen-cli       # a dry run on a CPU
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generation_gpu import DTYPES, MODELS, build  # the same model builders

SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
GOAL_TPOT = 1.10      # TPOT within 10% of the reference's
GOAL_TTFT = 1.20      # TTFT within 20% of an eager prefill of the same length

RECIPE = """\
name: generation-cli
description: GPU generation through PyTorch as README shows it (issue 42 item 2).
nodes:
{nodes}"""
NODE = """\
  - name: {name}
    stage: benchmark
    matrix: {{dtype: [{dtypes}]}}
    params:
      backend: torch
      device: {device}
      hf_model: {folder}
      torch_dtype: ${{{{ matrix.dtype }}}}
      generation: {{context_length: {context}, new_tokens: {new_tokens}, concurrency: [1]}}
"""


def node_name(model: str) -> str:
    return f"benchmark-{model}"


def write_project(root: Path, args: argparse.Namespace, dtypes: list[str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text('[project]\nname = "generation-cli"\nversion = "0"\n')
    nodes = []
    for name in args.models:
        build(name, args.tiny).save_pretrained(root / name)
        nodes.append(NODE.format(name=node_name(name), dtypes=", ".join(dtypes), device=args.device, folder=name,
                                 context=args.context, new_tokens=args.new_tokens))
    recipe = root / "recipe.yaml"
    recipe.write_text(RECIPE.format(nodes="".join(nodes)))
    return recipe


def cli_run(root: Path, run: int, out: Path, log: Any) -> tuple[int, float, Path]:
    """`trtflow run recipe.yaml` with a fresh store and output folder; (exit code, wall s, output folder)."""
    store, output = root / f".store-{run}", root / f"build-{run}"
    command = [sys.executable, "-m", "trtflow.cli", "run", "recipe.yaml", "--store", str(store),
               "--output-dir", str(output)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    began = time.perf_counter()
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - began
    (out / f"cli-run-{run}.log").write_text(f"$ (cd {root} && {' '.join(command)})\n" + done.stdout + done.stderr)
    log(f"trtflow run {run}: exit {done.returncode} in {wall:.1f} s")
    if done.returncode != 0:
        log((done.stdout + done.stderr)[-4000:])
    return done.returncode, wall, output


def node_metrics(output: Path, model: str, dtype: str) -> dict[str, Any] | None:
    """The benchmark node's output among the run's (build-N/<node>-<dtype>/benchmark.json: the levels and
    ``method.torch``, what the node's metrics hold)."""
    found = [p for p in output.glob(f"{node_name(model)}-{dtype}/*.json") if not p.name.startswith(".")]
    if len(found) != 1:
        return None
    return json.loads(found[0].read_text())


def level_row(metrics: dict[str, Any]) -> dict[str, Any]:
    level = metrics["generation"][0]
    first, per = level["ttft_ms"], level["tpot_ms"]
    return {"ttft_p50_ms": first["p50"], "ttft_ci_ms": first["ci"]["p50"], "tpot_p50_ms": per["p50"],
            "tpot_ci_ms": per["ci"]["p50"], "n": level["requests"], "flags": level.get("flags"),
            "torch": metrics.get("method", {}).get("torch")}


# -- the independent reference: transformers + PyTorch only -------------------------------------------------------
def load_model(folder: Path, dtype: str, device: str) -> Any:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True,
                                                              dtype=getattr(torch, dtype), attn_implementation="sdpa")
    return model.to(device=device, dtype=getattr(torch, dtype)).eval()


class Reference:
    """Greedy decoding with transformers' StaticCache: an eager prefill, then each step one CUDA graph replay."""

    def __init__(self, model: Any, device: str, max_length: int) -> None:
        import torch
        import transformers

        self.model, self.device, self.max_length = model, device, max_length
        self.cache = transformers.StaticCache(config=model.config, max_cache_len=max_length)
        self.arange = torch.arange(max_length, device=device)
        self.ids = torch.zeros((1, 1), dtype=torch.int64, device=device)
        self.position = torch.zeros((1,), dtype=torch.int64, device=device)
        self.graph: Any = None
        self.logits: Any = None
        # transformers 5.x renames forward's past_key_values to cache
        self.keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        if device == "cuda":
            self._capture()

    def _forward(self, ids: Any, positions: Any, mask: Any) -> Any:
        out = self.model(input_ids=ids, attention_mask=mask, cache_position=positions, use_cache=True,
                         position_ids=positions.unsqueeze(0), logits_to_keep=1, **{self.keyword: self.cache})
        return out.logits[:, -1, :]

    def prefill(self, prompt: Any) -> Any:
        """The eager prefill: the prompt from the host, its logits' argmax on the host."""
        import torch

        with torch.inference_mode():
            ids = torch.as_tensor(prompt, dtype=torch.int64).to(self.device)
            length = ids.shape[1]
            mask = (self.arange < length).to(torch.int64).unsqueeze(0)
            logits = self._forward(ids, self.arange[:length], mask)
            return logits.argmax(-1).cpu()

    def _step(self) -> Any:
        import torch

        mask = (self.arange <= self.position).to(torch.int64).unsqueeze(0)
        return self._forward(self.ids, self.position, mask)

    def _capture(self) -> None:
        import numpy as np
        import torch

        first = self.prefill(np.zeros((1, 4), dtype=np.int64))  # allocates the cache's tensors
        with torch.inference_mode():
            self.ids.copy_(first.reshape(1, 1))
            self.position.fill_(4)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._step()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = self._step()
        torch.cuda.synchronize()

    def request(self, prompt: Any, new_tokens: int, events: list[float] | None = None
                ) -> tuple[list[int], float, float]:
        """(tokens, TTFT ms, TPOT ms) of one greedy request, timed on the host as the benchmark's clients time."""
        import torch

        with torch.inference_mode():
            self.cache.reset()  # zeroes in place (the graph's addresses stay)
        if self.device == "cuda":
            torch.cuda.synchronize()
        length = prompt.shape[1]
        start = time.perf_counter()
        token = self.prefill(prompt)
        first = time.perf_counter()
        tokens = [int(token[0])]
        with torch.inference_mode():
            for index in range(new_tokens - 1):
                self.ids.copy_(token.reshape(1, 1))
                self.position.fill_(length + index)
                if self.graph is not None:
                    if events is not None:
                        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        a.record()
                    self.graph.replay()
                    if events is not None:
                        b.record()
                    logits = self.logits
                else:
                    logits = self._step()
                token = logits.argmax(-1).cpu()
                if events is not None and self.graph is not None:
                    events.append(a.elapsed_time(b))
                tokens.append(int(token[0]))
        last = time.perf_counter()
        return tokens, (first - start) * 1e3, (last - first) * 1e3 / max(new_tokens - 1, 1)


def plain_prefill_ms(model: Any, prompt: Any, device: str) -> float:
    """A prefill with no cache at all: the prompt from the host, the argmax on the host."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.inference_mode():
        ids = torch.as_tensor(prompt, dtype=torch.int64).to(device)
        model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[:, -1].argmax(-1).cpu()
    return (time.perf_counter() - start) * 1e3


def reference_run(model: Any, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, model.config.vocab_size, size=(1, args.context)) for _ in range(args.ref_requests + 3)]
    reference = Reference(model, args.device, args.context + args.new_tokens)
    ttft, tpot, gpu, plain = [], [], [], []
    for index, prompt in enumerate(prompts):
        _, first, per = reference.request(prompt, args.new_tokens)
        plain_ms = plain_prefill_ms(model, prompt, args.device)
        if index >= 3:  # three warm-up requests
            ttft.append(first)
            tpot.append(per)
            plain.append(plain_ms)
    for prompt in prompts[:5]:  # the GPU time of a replay, by CUDA events, in requests apart from the timed ones
        reference.request(prompt, args.new_tokens, gpu)
    return {"ttft_p50_ms": statistics.median(ttft), "tpot_p50_ms": statistics.median(tpot),
            "replay_gpu_p50_ms": statistics.median(gpu) if gpu else None,
            "plain_prefill_p50_ms": statistics.median(plain), "requests": len(ttft),
            "cuda_graphs": reference.graph is not None}


def tokens_check(model: Any, args: argparse.Namespace) -> dict[str, Any]:
    """fp32 greedy tokens of the stage's decoder (as the node opens it) and of the reference vs `generate`."""
    import numpy as np
    import torch
    import transformers

    from trtflow_stages.runtimes.generation import greedy
    from trtflow_stages.runtimes.torch_generation import open_decoder

    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, model.config.vocab_size, size=(1, args.context)) for _ in range(3)]
    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=args.new_tokens,
                                           min_new_tokens=args.new_tokens, eos_token_id=None, pad_token_id=0)
    saved, model.generation_config = model.generation_config, config
    decoder = open_decoder(model, args.device, args.context + args.new_tokens, True, 1)
    reference = Reference(model, args.device, args.context + args.new_tokens)
    stage_same = reference_same = 0
    try:
        for prompt in prompts:
            ids = torch.as_tensor(prompt, device=args.device)
            with torch.inference_mode():
                expected = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids))[0, ids.shape[1]:]
            expected_list = expected.cpu().numpy()
            ours = greedy(decoder, prompt, args.new_tokens, keep_logits=False).tokens[0]
            stage_same += int((expected_list == ours).sum())
            theirs, _, _ = reference.request(prompt, args.new_tokens)
            reference_same += int((expected_list == np.asarray(theirs)).sum())
    finally:
        model.generation_config = saved
    total = len(prompts) * args.new_tokens
    return {"stage_decoder_vs_generate": f"{stage_same}/{total}", "reference_vs_generate": f"{reference_same}/{total}",
            "equal": stage_same == total, "stage_decoder": decoder.describe()}


# -- the table and the goals ----------------------------------------------------------------------------------
def spread(values: list[float]) -> dict[str, float]:
    middle = statistics.median(values)
    return {"min": min(values), "median": middle, "max": max(values),
            "spread_percent": (max(values) - min(values)) / middle * 100.0}


def summarise(rows: dict[str, Any], args: argparse.Namespace, dtypes: list[str], log: Any) -> list[str]:
    failures: list[str] = []
    log("\n| model | dtype | trtflow TPOT p50 ms [95% CI] per run | ref TPOT ms per run | TPOT ratio | trtflow TTFT "
        "p50 ms [95% CI] per run | eager prefill ms per run | TTFT ratio | vs fp32 TPOT | graphs |")
    log("|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models:
        for dtype in dtypes:
            cell = rows[model][dtype]
            cli, ref = cell["cli"], cell["reference"]
            if not cli or not ref:
                failures.append(f"{model} {dtype}: no figures ({len(cli)} CLI runs, {len(ref)} reference runs)")
                continue
            tpot = spread([r["tpot_p50_ms"] for r in cli])
            ttft = spread([r["ttft_p50_ms"] for r in cli])
            ref_tpot = spread([r["tpot_p50_ms"] for r in ref])
            ref_prefill = spread([r["ttft_p50_ms"] for r in ref])
            plain = spread([r["plain_prefill_p50_ms"] for r in ref])
            cell["tpot"], cell["ttft"], cell["ref_tpot"], cell["ref_prefill"] = tpot, ttft, ref_tpot, ref_prefill
            cell["plain_prefill"] = plain
            cell["ref_replay_gpu_ms"] = spread([r["replay_gpu_p50_ms"] for r in ref]) \
                if ref[0]["replay_gpu_p50_ms"] is not None else None
            cell["tpot_ratio"] = tpot["median"] / ref_tpot["median"]
            cell["ttft_ratio"] = ttft["median"] / ref_prefill["median"]
            cell["ttft_ratio_plain_prefill"] = ttft["median"] / plain["median"]
            graphs = [bool((r["torch"] or {}).get("cuda_graphs")) for r in cli]
            offs = sorted({str((r["torch"] or {}).get("cuda_graphs_off")) for r in cli
                           if (r["torch"] or {}).get("cuda_graphs_off")})
            cell["graphs"] = {"on_in_runs": sum(graphs), "runs": len(graphs), "off_reasons": offs}
            fp32 = rows[model].get("float32", {}).get("tpot")
            cell["vs_fp32"] = tpot["median"] / fp32["median"] if fp32 and dtype != "float32" else None
            if args.device == "cuda":
                if cell["tpot_ratio"] > GOAL_TPOT:
                    failures.append(f"{model} {dtype}: TPOT {tpot['median']:.4g} ms is {cell['tpot_ratio']:.3f}x "
                                    f"the reference's {ref_tpot['median']:.4g} ms (goal <= {GOAL_TPOT})")
                if cell["ttft_ratio"] > GOAL_TTFT:
                    failures.append(f"{model} {dtype}: TTFT {ttft['median']:.4g} ms is {cell['ttft_ratio']:.3f}x "
                                    f"the eager prefill's {ref_prefill['median']:.4g} ms (goal <= {GOAL_TTFT})")
                if cell["vs_fp32"] is not None and cell["vs_fp32"] > 1.0:
                    failures.append(f"{model} {dtype}: TPOT {tpot['median']:.4g} ms is above fp32's "
                                    f"{fp32['median']:.4g} ms ({cell['vs_fp32']:.3f}x)")
                if not all(graphs):
                    failures.append(f"{model} {dtype}: CUDA graphs off in {len(graphs) - sum(graphs)} of "
                                    f"{len(graphs)} runs ({'; '.join(offs)})")
            runs_tpot = "; ".join(f"{r['tpot_p50_ms']:.4g} [{r['tpot_ci_ms'][0]:.4g}, {r['tpot_ci_ms'][1]:.4g}]"
                                  for r in cli)
            runs_ttft = "; ".join(f"{r['ttft_p50_ms']:.4g} [{r['ttft_ci_ms'][0]:.4g}, {r['ttft_ci_ms'][1]:.4g}]"
                                  for r in cli)
            ref_tpots = "; ".join(f"{r['tpot_p50_ms']:.4g}" for r in ref)
            ref_ttfts = "; ".join(f"{r['ttft_p50_ms']:.4g}" for r in ref)
            vs = "-" if cell["vs_fp32"] is None else f"{cell['vs_fp32']:.3f}"
            on = f"{sum(graphs)}/{len(graphs)}" + (f" ({'; '.join(offs)})" if offs else "")
            log(f"| {model} | {SHORT[dtype]} | {runs_tpot} (spread {tpot['spread_percent']:.1f}%) | {ref_tpots} | "
                f"{cell['tpot_ratio']:.3f} | {runs_ttft} (spread {ttft['spread_percent']:.1f}%) | {ref_ttfts} | "
                f"{cell['ttft_ratio']:.3f} | {vs} | {on} |")
        tokens = rows[model].get("tokens")
        if tokens is not None:
            log(f"{model} fp32 tokens vs generate: stage decoder {tokens['stage_decoder_vs_generate']}, reference "
                f"{tokens['reference_vs_generate']}")
            if args.device == "cuda" and not tokens["equal"]:
                failures.append(f"{model} fp32: the stage decoder's tokens differ from generate's "
                                f"({tokens['stage_decoder_vs_generate']})")
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="separate `trtflow run`s, each with a fresh store")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--ref-requests", type=int, default=30, help="timed reference requests per run")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=["gpt2-124m"])
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny models (a dry run)")
    parser.add_argument("--work", type=Path, default=None, help="the project folder (default: a fresh temporary one)")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device")
    dtypes = [d for d in args.dtypes if not (args.device == "cpu" and d == "float16")]
    args.out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    started = time.perf_counter()
    root = args.work or Path(tempfile.mkdtemp(prefix="gen-cli-"))
    recipe = write_project(root, args, dtypes)
    log(f"project {root}; recipe:\n{recipe.read_text()}")
    import transformers

    card = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    result: dict[str, Any] = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "card": card,
        "torch": torch.__version__, "transformers": transformers.__version__, "recipe": recipe.read_text(),
        "runs_are": "separate `trtflow run` processes, each with a fresh store (--store) and output folder; the "
                    "stage's own windows inside each (its default repeats/durations)", "cli": []}
    rows: dict[str, Any] = {m: {d: {"cli": [], "reference": []} for d in dtypes} for m in args.models}
    models: dict[tuple[str, str], Any] = {}
    for run in range(1, args.runs + 1):
        code, wall, output = cli_run(root, run, args.out, log)
        result["cli"].append({"run": run, "exit": code, "wall_s": round(wall, 1)})
        for name in args.models:
            for dtype in dtypes:
                metrics = node_metrics(output, name, dtype)
                if metrics is None:
                    log(f"run {run} {name} {dtype}: no metrics.json found under {output}")
                    continue
                row = level_row(metrics)
                rows[name][dtype]["cli"].append(row)
                log(f"run {run} {name} {SHORT[dtype]} trtflow: TTFT {row['ttft_p50_ms']:.4g} ms, TPOT "
                    f"{row['tpot_p50_ms']:.4g} [{row['tpot_ci_ms'][0]:.4g}, {row['tpot_ci_ms'][1]:.4g}] ms, "
                    f"n={row['n']}, flags {row['flags']}, torch {json.dumps(row['torch'])}")
        # the reference after each CLI run, one model/dtype at a time, nothing else on the GPU
        for name in args.models:
            for dtype in dtypes:
                model = models.get((name, dtype))
                if model is None:
                    model = models[(name, dtype)] = load_model(root / name, dtype, args.device)
                ref = reference_run(model, args, seed=100 + run)
                rows[name][dtype]["reference"].append(ref)
                log(f"run {run} {name} {SHORT[dtype]} reference: {json.dumps(ref)}")
    for name in args.models:
        if "float32" in dtypes:
            rows[name]["tokens"] = tokens_check(models[(name, "float32")], args)
    failures = summarise(rows, args, dtypes, log)
    if any(c["exit"] != 0 for c in result["cli"]):
        failures.append("a `trtflow run` failed: " + ", ".join(f"run {c['run']} exit {c['exit']}"
                                                                for c in result["cli"] if c["exit"]))
    result.update(rows=rows, failures=failures, wall_s=round(time.perf_counter() - started, 1))
    log("\ngoals: " + ("all pass" if not failures else "FAIL\n  " + "\n  ".join(failures)))
    (args.out / "generation-cli-gpu.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (args.out / "generation-cli-gpu.log").write_text("\n".join(lines) + "\n")
    log(f"wrote {args.out / 'generation-cli-gpu.json'} ({result['wall_s']} s)")
    sys.exit(1 if failures and args.device == "cuda" else 0)


if __name__ == "__main__":
    main()
