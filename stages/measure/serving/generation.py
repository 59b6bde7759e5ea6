"""Time to first token and time per output token of greedy generation, at a context length and a concurrency.

Each *request* is a prompt of ``context_length`` random token ids followed by ``new_tokens`` greedy tokens
(`runtimes.generation.greedy`: prefill, then one decode step per token). For each request:

- **time to first token** (TTFT): from the request's start to its first token known on the host (prefill and the
  first argmax; for PyTorch on a GPU, the copy of the token to the host waits for the GPU);
- **time per output token** (TPOT): the time from the first token to the last, divided by ``new_tokens - 1``:
  the mean gap between tokens a client sees (GenAI-Perf's inter-token latency).

``concurrency`` requests are in flight at once (closed loop: each of that many clients starts its next request when
its previous one ends; they share one decoder, which is stateless). A level is timed in windows like every
benchmark point (`measure.timing.windows`: ``repeats`` windows at least, ``min_iterations`` requests and
``min_duration_s`` at least, then more windows until the 95% intervals of both medians are within ``precision_percent``
or ``max_duration_s`` is spent, else flagged ``not-converged``), with the interpreter steadied as for every host-timed
benchmark (`measure.serving.traffic.steady_interpreter`: garbage collection off); each figure's interval is the one
every latency gets (`measure.statistics.intervals.uncertainty`: order statistics for the percentiles, a bootstrap for
the mean, widened by the windows' spread), so each figure carries its count of requests (n) and its 95% interval.
Like every point, a level is flagged ``busy-host`` when the host disturbed it and ``unmeasurable`` when its requests
waited for a CPU most of their time (`judge_host`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from trtflow.stage import StageFailed, StageParams

from ..statistics.intervals import Window
from ..statistics.stats import summarize
from ..timing.interference import thread_wait_ns
from ..timing.windows import WindowPlan, window_uncertainty

#: The statistics kept for each figure (keys of `measure.statistics.stats.summarize`).
KEPT = ("p50", "p90", "p95", "p99", "mean", "min", "max", "cv_percent")


class GenerationBench(StageParams):
    """What a generation benchmark runs: requests of a prompt length and a number of new tokens, at concurrencies."""

    context_length: int = Field(128, ge=1, description="Tokens of each request's prompt (the prefill length); "
                                "context_length + new_tokens must fit the model's context.")
    new_tokens: int = Field(32, ge=2, le=8192, description="Tokens generated per request (greedy).")
    concurrency: list[int] = Field(default_factory=lambda: [1], description="Requests in flight at once "
                                   "(closed loop); each level is measured on its own.")
    seed: int = Field(0, description="Seed of the random prompts (token ids below the vocabulary size).")

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, levels: list[int]) -> list[int]:
        if not levels or any(not 1 <= level <= 256 for level in levels):
            raise ValueError(f"concurrency levels must be between 1 and 256, got {levels}")
        return levels

    def check_fits(self, context: int) -> None:
        if context and self.context_length + self.new_tokens > context:
            raise StageFailed(f"context_length {self.context_length} + new_tokens {self.new_tokens} exceeds the "
                              f"model's context of {context} positions",
                              hint=f"keep context_length + new_tokens <= {context}")


def _figures(windows: Sequence[Window]) -> dict[str, Any]:
    """A figure's statistics with n and the 95% intervals of its percentiles and mean."""
    pooled = [v for w in windows for v in w.latencies_ms]
    summary = summarize(pooled)
    found = window_uncertainty(windows, 1)
    return {"n": len(pooled), **{k: summary[k] for k in KEPT if k in summary},
            "ci": {k: v for k, v in found.latency_ci_ms.items()}, "open_intervals": found.open,
            "precision_percent": {k: v for k, v in found.precision_percent.items() if k != "throughput"}}


def _window(decoder: Any, prompts: Sequence[Any], new_tokens: int, clients: int, seconds: float,
            clock: Callable[[], int]) -> tuple[Window, Window, int]:
    """One window of closed-loop requests from ``clients`` threads: (TTFT window, TPOT window, tokens)."""
    from ...runtimes.generation import greedy

    lock = threading.Lock()
    ttft: list[float] = []
    tpot: list[float] = []
    errors: list[BaseException] = []
    begin = clock()
    deadline = begin + int(seconds * 1e9)

    def client(index: int) -> None:
        count = 0
        try:
            while count == 0 or clock() < deadline:
                prompt = prompts[(index + count * clients) % len(prompts)]
                run = greedy(decoder, prompt, new_tokens, keep_logits=False, clock=clock)
                count += 1
                with lock:
                    ttft.append(run.first_token_ms)
                    tpot.append(run.per_token_ms or 0.0)
        except BaseException as error:  # reported in the caller's thread
            errors.append(error)

    wait_before = thread_wait_ns()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall_ms = (clock() - begin) / 1e6
    wait_after = thread_wait_ns()
    if errors:
        raise errors[0]
    waited = (wait_after - wait_before) / 1e6 if wait_before is not None and wait_after is not None else None
    return Window(ttft, wall_ms, waited), Window(tpot, wall_ms, waited), len(ttft) * new_tokens


def measure_level(decoder: Any, prompts: Sequence[Any], new_tokens: int, clients: int, plan: WindowPlan,
                  warmup_requests: int = 1, clock: Callable[[], int] = time.perf_counter_ns,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """One concurrency level, timed in windows until both medians are precise enough (or the cap)."""
    from ...runtimes.generation import greedy

    for index in range(max(warmup_requests, 0) * clients):
        greedy(decoder, prompts[index % len(prompts)], new_tokens, keep_logits=False)
    first: list[Window] = []
    per_token: list[Window] = []
    tokens = 0
    spent_s = 0.0
    unmet: list[str] = []
    while True:
        ttft_window, tpot_window, produced = _window(decoder, prompts, new_tokens, clients, plan.window_s, clock)
        first.append(ttft_window)
        per_token.append(tpot_window)
        tokens += produced
        spent_s += ttft_window.wall_ms / 1000.0
        requests = sum(len(w.latencies_ms) for w in first)
        if progress is not None:
            progress(f"concurrency {clients}: {requests} requests in {len(first)} window(s)")
        if len(first) < plan.repeats or spent_s < plan.min_duration_s or requests < plan.min_iterations:
            continue
        keys = plan.precision.keys  # the stopping rule computes only the intervals it reads
        unmet = [f"time to first token {text}" for text in plan.precision.unmet(window_uncertainty(first, 1, keys))]
        unmet += [f"time per output token {text}"
                  for text in plan.precision.unmet(window_uncertainty(per_token, 1, keys))]
        if not unmet or spent_s >= plan.max_duration_s:
            break
    wall_ms = sum(w.wall_ms for w in first)
    rates = [len(w.latencies_ms) * new_tokens / w.wall_ms * 1000.0 for w in first if w.wall_ms > 0]
    waits = [w.wait_ms for w in first]
    level: dict[str, Any] = {
        "concurrency": clients,
        "requests": sum(len(w.latencies_ms) for w in first),
        "windows": len(first),
        "ttft_ms": _figures(first),
        "tpot_ms": _figures(per_token),
        "output_tokens_per_s": tokens / wall_ms * 1000.0 if wall_ms > 0 else None,
        "output_tokens_per_s_by_window": rates,
        "converged": not unmet,
        "flags": ["not-converged"] if unmet else [],
    }
    if all(isinstance(w, (int, float)) for w in waits) and wall_ms > 0:
        level["cpu_wait_percent"] = round(sum(waits) / wall_ms * 100.0, 2)  # type: ignore[arg-type]
        durations = [a + b * (new_tokens - 1) for w, v in zip(first, per_token, strict=True)
                     for a, b in zip(w.latencies_ms, v.latencies_ms, strict=True)]
        if durations:
            level["cpu_wait_ms_per_request"] = sum(waits) / len(durations)  # type: ignore[arg-type]
            level["cpu_wait_share"] = min(level["cpu_wait_ms_per_request"] / (sum(durations) / len(durations)), 1.0)
    if unmet:
        level["not_converged_because"] = unmet
    return level


def judge_host(level: dict[str, Any], host: dict[str, Any], device: str) -> dict[str, Any]:
    """The rules every benchmark point gets, for a generation level: a ``busy-host`` warning when the host disturbed
    it (`measure.timing.interference.busy_warning`, from what else ran over the level and its own threads' CPU wait),
    and ``unmeasurable`` when its requests waited for a CPU at least half of their time
    (`measure.statistics.unpaired.UNMEASURABLE_WAIT`): its figures then time the host, and select and the gates
    do not rank on them."""
    from ..statistics.unpaired import UNMEASURABLE_WAIT
    from ..timing.interference import busy_warning

    level["host"] = {**host, **({"wait_percent": level["cpu_wait_percent"]} if "cpu_wait_percent" in level else {})}
    warnings = [w for w in level.get("warnings") or [] if w.get("flag") != "busy-host"]
    warning = busy_warning(level["host"], device)
    if warning is not None:
        warnings.append(warning)
    share = level.get("cpu_wait_share")
    if isinstance(share, (int, float)) and share >= UNMEASURABLE_WAIT:
        level["unmeasurable"] = f"unmeasurable: the benchmark waited for a CPU {share * 100:.0f}% of the time"
        warnings.append({"flag": "unmeasurable", "message": level["unmeasurable"] + " (its requests' own time): "
                         "the figures time the host, not the model"})
    level["warnings"] = warnings
    level["flags"] = sorted({*level.get("flags", []), *(w["flag"] for w in warnings)})
    return level


def random_prompts(count: int, length: int, vocab_size: int, seed: int) -> list[Any]:
    """``count`` prompts of ``length`` random token ids, each ``[1, length]``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, size=(1, length), dtype=np.int64) for _ in range(count)]


def measure_generation(decoder: Any, bench: GenerationBench, plan: WindowPlan,
                       progress: Callable[[str], None] | None = None, device: str = "cpu") -> list[dict[str, Any]]:
    """Every concurrency level of ``bench`` on ``decoder`` (`runtimes.generation`), in order, each judged for a
    busy host and CPU waiting (`judge_host`) over what else ran while it was timed."""
    from ..timing.interference import HostWatch
    from .traffic import steady_interpreter

    bench.check_fits(decoder.layout.context_length)
    prompts = random_prompts(max(8, max(bench.concurrency)), bench.context_length, decoder.layout.vocab_size,
                             bench.seed)
    # no garbage collection while timing: a full collection in a process holding a model takes tens of ms, which
    # would land in some requests' figures (seen on a GPU before this was here: TPOT 46 ms instead of 5)
    levels = []
    with steady_interpreter():
        for clients in bench.concurrency:
            watch = HostWatch()
            level = measure_level(decoder, prompts, bench.new_tokens, clients, plan, progress=progress)
            levels.append(judge_host(level, watch.report(), device))
    return levels


def level_line(level: dict[str, Any]) -> str:
    """One line of a level's figures, for logs and bench scripts."""
    first, per = level["ttft_ms"], level["tpot_ms"]
    return (f"concurrency {level['concurrency']}: TTFT p50 {first['p50']:.4g} ms [{first['ci']['p50'][0]:.4g}, "
            f"{first['ci']['p50'][1]:.4g}], TPOT p50 {per['p50']:.4g} ms [{per['ci']['p50'][0]:.4g}, "
            f"{per['ci']['p50'][1]:.4g}], n={level['requests']} requests, "
            f"{level['output_tokens_per_s']:.4g} tokens/s" + ("" if level["converged"] else " (not converged)"))


def generation_timers(models: Mapping[str, Path], requests: Mapping[str, Any], options: Mapping[str, Any],
                      device: str, log: Any) -> dict[str, Callable[[float, int], Window]]:
    """A window timer per ONNX model with its KV cache (select's finalists judged on time per output token): each
    window runs the benchmark's closed-loop requests (``requests``: context_length, new_tokens, seed, concurrency)
    on an ONNX Runtime session with the benchmark's ``options`` on ``device`` and returns the requests' times per
    output token (`measure.timing.finalists.measure_round_robin` takes their statistics per round)."""
    from ...accuracy.recovery import runtime_options
    from ...runtimes.generation import OrtDecoder, greedy
    from ...runtimes.ort import OrtOptions, create_session
    from ..timing.calls import ort_providers

    clients = int(requests["concurrency"])
    new_tokens = int(requests["new_tokens"])
    timers: dict[str, Callable[[float, int], Window]] = {}
    for name, model in models.items():
        settings = runtime_options(model, OrtOptions.model_validate(dict(options)), log).options
        decoder = OrtDecoder(create_session(model, settings, ort_providers(device)))
        prompts = random_prompts(max(8, clients), int(requests["context_length"]), decoder.layout.vocab_size,
                                 int(requests.get("seed") or 0))
        greedy(decoder, prompts[0], new_tokens, keep_logits=False)  # warm-up

        def timer(seconds: float, index: int, decoder: Any = decoder, prompts: Any = prompts) -> Window:
            return _window(decoder, prompts, new_tokens, clients, seconds, time.perf_counter_ns)[1]

        timers[name] = timer
    return timers
