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

    def check_fits(self, layout: Any) -> None:
        """The requests fit the model: prompt and new tokens within its context; an encoder-decoder's source within
        its encoder and the new tokens (after the start token) within its decoder."""
        context = layout.context_length
        if getattr(layout, "seq2seq", False):
            if layout.source_length and not layout.speech and self.context_length > layout.source_length:
                raise StageFailed(f"context_length {self.context_length} (the source's token ids) exceeds the "
                                  f"encoder's {layout.source_length} positions",
                                  hint=f"keep context_length <= {layout.source_length}")
            if context and self.new_tokens + 1 > context:
                raise StageFailed(f"new_tokens {self.new_tokens} and the start token exceed the decoder's "
                                  f"{context} positions", hint=f"keep new_tokens <= {context - 1}")
            return
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


class Clients:
    """``count`` closed-loop client threads that live for a whole level: each warms up on its own thread, then runs
    requests in every window it is given (`window`). A runtime keeps state per thread (cuBLAS handles, the graphs
    cuDNN's attention builds per shape, a thread's first CUDA call), so clients made afresh for each window paid
    for it in the timed requests: a PyTorch decoder in fp16 measured 5-10 times slower per token than in fp32
    (bench/results/generation/figures.md), while the same decoder warmed on the thread that times it does not."""

    def __init__(self, decoder: Any, prompts: Sequence[Any], new_tokens: int, count: int,
                 clock: Callable[[], int] = time.perf_counter_ns, warmup_requests: int = 1) -> None:
        self.decoder, self.prompts, self.new_tokens, self.count, self.clock = decoder, prompts, new_tokens, count, clock
        self.warmup_requests = max(warmup_requests, 0)
        self.barrier = threading.Barrier(count + 1)
        self.lock = threading.Lock()
        self.errors: list[BaseException] = []
        self.deadline = 0
        self.stopping = False
        self.ttft: list[float] = []
        self.tpot: list[float] = []
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(count)]
        for thread in self.threads:
            thread.start()

    def _client(self, index: int) -> None:
        from ...runtimes.generation import greedy

        try:
            for request in range(self.warmup_requests):
                greedy(self.decoder, self.prompts[(index + request * self.count) % len(self.prompts)],
                       self.new_tokens, keep_logits=False)
            served = 0
            while True:
                self.barrier.wait()  # a window starts (or the level ends)
                if self.stopping:
                    return
                done = 0
                while not self.stopping and (done == 0 or self.clock() < self.deadline):
                    prompt = self.prompts[(index + served * self.count) % len(self.prompts)]
                    run = greedy(self.decoder, prompt, self.new_tokens, keep_logits=False, clock=self.clock)
                    done += 1
                    served += 1
                    with self.lock:
                        self.ttft.append(run.first_token_ms)
                        self.tpot.append(run.per_token_ms or 0.0)
                self.barrier.wait()  # the window ends when every client's last request has
        except threading.BrokenBarrierError:
            return
        except BaseException as error:  # reported in the caller's thread
            self.errors.append(error)
            self.stopping = True
            self.barrier.abort()

    def _meet(self) -> None:
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            raise (self.errors[0] if self.errors else RuntimeError("a generation client stopped")) from None

    def window(self, seconds: float) -> tuple[Window, Window, int]:
        """One window of closed-loop requests: (TTFT window, TPOT window, tokens)."""
        with self.lock:
            self.ttft, self.tpot = [], []
        wait_before = thread_wait_ns()
        begin = self.clock()
        self.deadline = begin + int(seconds * 1e9)
        self._meet()
        self._meet()
        wall_ms = (self.clock() - begin) / 1e6
        wait_after = thread_wait_ns()
        waited = (wait_after - wait_before) / 1e6 if wait_before is not None and wait_after is not None else None
        with self.lock:
            ttft, tpot = list(self.ttft), list(self.tpot)
        return Window(ttft, wall_ms, waited), Window(tpot, wall_ms, waited), len(ttft) * self.new_tokens

    def close(self) -> None:
        self.stopping = True
        try:
            self.barrier.wait(timeout=60.0)
        except threading.BrokenBarrierError:
            pass
        for thread in self.threads:
            thread.join(timeout=60.0)

    def __enter__(self) -> Clients:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:  # the others end after the request they are in: none outlives the level
            self.stopping = True
            self.barrier.abort()
            for thread in self.threads:
                thread.join(timeout=60.0)
            return
        self.close()


class TeamTimer:
    """A window timer over `Clients` (the same threads in every window, ended by `close`): each window's requests'
    times per output token (``which`` "tpot"), to first token ("ttft"), or both ("both": latencies per output token,
    ``first_tokens_ms`` to first token; `measure.timing.ab.window_figures` makes ``ttft_*`` and ``tpot_*`` pair
    figures of it: what a gated generation level is paired on)."""

    def __init__(self, team: Clients, which: str = "tpot") -> None:
        if which not in ("tpot", "ttft", "both"):
            raise ValueError(f"which must be tpot, ttft or both, not {which!r}")
        self.team, self.which = team, which

    def __call__(self, seconds: float, index: int) -> Window:
        first, per_token, _ = self.team.window(seconds)
        if self.which == "both":
            return Window(per_token.latencies_ms, per_token.wall_ms, per_token.wait_ms, first.latencies_ms)
        return per_token if self.which == "tpot" else first

    def close(self) -> None:
        self.team.close()


def request_window(decoder: Any, prompts: Sequence[Any], new_tokens: int, clients: int,
                   clock: Callable[[], int] = time.perf_counter_ns) -> TeamTimer:
    """The reference's side of a gated generation level: a `TeamTimer` of both figures over its own clients (warmed
    up on their threads); the caller closes it."""
    return TeamTimer(Clients(decoder, prompts, new_tokens, clients, clock), "both")


def measure_level(decoder: Any, prompts: Sequence[Any], new_tokens: int, clients: int, plan: WindowPlan,
                  warmup_requests: int = 1, clock: Callable[[], int] = time.perf_counter_ns,
                  progress: Callable[[str], None] | None = None, pairing: Any = None) -> dict[str, Any]:
    """One concurrency level, timed in windows until both medians are precise enough (or the cap), by clients
    that live for the whole level and warmed up on their own threads (`Clients`). ``pairing`` (a
    `measure.timing.ab.Pairing` with the reference's `request_window`): each window is rounds of blocks of the
    reference's requests and the candidate's in a random order, until the pairing is done too (its record holds
    both figures per block)."""
    first: list[Window] = []
    per_token: list[Window] = []
    tokens = 0
    spent_s = 0.0
    unmet: list[str] = []
    with Clients(decoder, prompts, new_tokens, clients, clock, warmup_requests) as team:
        ours = TeamTimer(team, "both")
        while True:
            if pairing is not None and not pairing.done:
                both = pairing.step(ours, plan.window_s, len(first))
                ttft_window = Window(both.first_tokens_ms or [], both.wall_ms, both.wait_ms)
                tpot_window = Window(both.latencies_ms, both.wall_ms, both.wait_ms)
                produced = len(both.latencies_ms) * new_tokens
            else:
                ttft_window, tpot_window, produced = team.window(plan.window_s)
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
            unmet = [f"time to first token {text}"
                     for text in plan.precision.unmet(window_uncertainty(first, 1, keys))]
            unmet += [f"time per output token {text}"
                      for text in plan.precision.unmet(window_uncertainty(per_token, 1, keys))]
            if (not unmet or spent_s >= plan.max_duration_s) and (pairing is None or pairing.done):
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


def gate_level(bench: GenerationBench) -> int:
    """The concurrency a gated generation benchmark pairs with its reference and judges: its first level."""
    return bench.concurrency[0]


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


def random_prompts(count: int, length: int, layout: Any, seed: int) -> list[Any]:
    """``count`` prompts of ``length`` random token ids, each ``[1, length]``; an encoder-decoder's sources
    (`formats.seq2seq.Seq2SeqLayout.sources`: token ids, or Whisper's log-mel features), each with a batch of 1."""
    import numpy as np

    if getattr(layout, "seq2seq", False):
        return [source[None, ...] for source in layout.sources(count, length, seed)]
    rng = np.random.default_rng(seed)
    return [rng.integers(0, layout.vocab_size, size=(1, length), dtype=np.int64) for _ in range(count)]


def bench_prompts(decoder: Any, bench: GenerationBench) -> list[Any]:
    """The prompts every level of ``bench`` draws its requests from (and a gated level's reference too)."""
    return random_prompts(max(8, max(bench.concurrency)), bench.context_length, decoder.layout, bench.seed)


def measure_generation(decoder: Any, bench: GenerationBench, plan: WindowPlan,
                       progress: Callable[[str], None] | None = None, device: str = "cpu",
                       pairing: Any = None) -> list[dict[str, Any]]:
    """Every concurrency level of ``bench`` on ``decoder`` (`runtimes.generation`), in order, each judged for a
    busy host and CPU waiting (`judge_host`) over what else ran while it was timed. ``pairing``: the gate level
    (the first, `gate_level`) is timed in A/B rounds with the reference (`measure_level`)."""
    from ..timing.interference import HostWatch
    from .traffic import steady_interpreter

    bench.check_fits(decoder.layout)
    prompts = bench_prompts(decoder, bench)
    # no garbage collection while timing: a full collection in a process holding a model takes tens of ms, which
    # would land in some requests' figures (seen on a GPU before this was here: TPOT 46 ms instead of 5)
    levels = []
    with steady_interpreter():
        for clients in bench.concurrency:
            watch = HostWatch()
            level = measure_level(decoder, prompts, bench.new_tokens, clients, plan, progress=progress,
                                  pairing=pairing if clients == gate_level(bench) else None)
            levels.append(judge_host(level, watch.report(), device))
    return levels


def level_line(level: dict[str, Any]) -> str:
    """One line of a level's figures, for logs and bench scripts."""
    first, per = level["ttft_ms"], level["tpot_ms"]
    return (f"concurrency {level['concurrency']}: TTFT p50 {first['p50']:.4g} ms [{first['ci']['p50'][0]:.4g}, "
            f"{first['ci']['p50'][1]:.4g}], TPOT p50 {per['p50']:.4g} ms [{per['ci']['p50'][0]:.4g}, "
            f"{per['ci']['p50'][1]:.4g}], n={level['requests']} requests, "
            f"{level['output_tokens_per_s']:.4g} tokens/s" + ("" if level["converged"] else " (not converged)"))


def _decoders(models: Mapping[str, Path], requests: Mapping[str, Any], options: Mapping[str, Any], device: str,
              log: Any) -> dict[str, tuple[Any, list[Any]]]:
    """Per ONNX model with its KV cache: a decoder on an ONNX Runtime session with the benchmark's ``options`` on
    ``device``, warmed by one request, and the benchmark's prompts for it. An encoder-decoder's decoder: time per
    output token does not depend on the cross-attention cache's values, so a random one of its shape stands in for
    the encoder (not timed here)."""
    from ...accuracy.recovery import runtime_options
    from ...runtimes.generation import OrtDecoder, greedy
    from ...runtimes.ort import OrtOptions, create_session
    from ...runtimes.seq2seq import OrtSeq2SeqDecoder, session_layout, synthetic_encoder
    from ..timing.calls import ort_providers

    found = {}
    for name, model in models.items():
        settings = runtime_options(model, OrtOptions.model_validate(dict(options)), log).options
        session = create_session(model, settings, ort_providers(device))
        decoder: Any
        if any(".decoder.key" in i.name for i in session.get_inputs()):
            layout = session_layout(session, None, need_start=False)
            decoder = OrtSeq2SeqDecoder(session, synthetic_encoder(layout, session), layout)
        else:
            decoder = OrtDecoder(session)
        prompts = random_prompts(max(8, int(requests["concurrency"])), int(requests["context_length"]),
                                 decoder.layout, int(requests.get("seed") or 0))
        greedy(decoder, prompts[0], int(requests["new_tokens"]), keep_logits=False)  # warm-up
        found[name] = (decoder, prompts)
    return found


def lockstep(decoders: Mapping[str, Any], prompt: Any, new_tokens: int, order: Sequence[str],
             clock: Callable[[], int] = time.perf_counter_ns) -> dict[str, tuple[float, float]]:
    """One greedy request of ``prompt`` on every decoder, interleaved token by token: the prefills in ``order``, then
    each decode step of every decoder in turn (the order reversed every step, so neither side always goes first);
    per decoder (its time to first token, its time per output token), in ms. Each step of one is timed next to the
    same step of the others, milliseconds apart: a co-tenant switching on and off slows both alike."""
    import numpy as np

    state: dict[str, list[Any]] = {}
    for name in order:
        decoder = decoders[name]
        start = clock()
        logits, cache = decoder.prefill(prompt)
        chosen = decoder.pick(logits)
        state[name] = [chosen, cache, (clock() - start) / 1e6, 0.0]
    turn = list(order)
    for _ in range(new_tokens - 1):
        for name in turn:
            decoder, held = decoders[name], state[name]
            start = clock()
            logits, held[1] = decoder.step(np.asarray(held[0], dtype=np.int64), held[1])
            held[0] = decoder.pick(logits)
            held[3] += (clock() - start) / 1e6
        turn.reverse()
    return {name: (held[2], held[3] / max(new_tokens - 1, 1)) for name, held in state.items()}


def lockstep_timer(models: Mapping[str, Path], requests: Mapping[str, Any], options: Mapping[str, Any], device: str,
                   log: Any, which: str = "tpot") -> Any:
    """Select's generation finalists at concurrency 1, timed together (`measure.timing.finalists.Together`): each
    round's window is requests of the benchmark's prompts, one on every finalist at a time, in `lockstep`; each
    finalist's window holds its requests' times per output token (``which`` "tpot") or to first token ("ttft")."""
    from ..timing.finalists import Together

    if which not in ("tpot", "ttft"):
        raise ValueError(f"which must be tpot or ttft, not {which!r}")
    opened = _decoders(models, requests, options, device, log)
    decoders = {name: decoder for name, (decoder, _) in opened.items()}
    prompts = next(iter(opened.values()))[1]
    new_tokens = int(requests["new_tokens"])
    count = [0]

    def run(order: Sequence[str], seconds: float) -> dict[str, Window]:
        times: dict[str, list[float]] = {name: [] for name in order}
        walls = dict.fromkeys(order, 0.0)
        begin = time.perf_counter_ns()
        while not times[order[0]] or (time.perf_counter_ns() - begin) / 1e9 < seconds:
            found = lockstep(decoders, prompts[count[0] % len(prompts)], new_tokens, order)
            count[0] += 1
            for name, (first, per_token) in found.items():
                times[name].append(first if which == "ttft" else per_token)
                walls[name] += first + per_token * (new_tokens - 1)
        return {name: Window(times[name], walls[name]) for name in order}

    return Together(list(models), run)


def generation_timers(models: Mapping[str, Path], requests: Mapping[str, Any], options: Mapping[str, Any],
                      device: str, log: Any, which: str = "tpot") -> dict[str, Callable[[float, int], Window]]:
    """A window timer per ONNX model with its KV cache (select's finalists judged on generation at a concurrency
    above 1; at 1, `lockstep_timer`): each window runs the benchmark's closed-loop requests (``requests``:
    context_length, new_tokens, seed, concurrency) on an ONNX Runtime session with the benchmark's ``options`` on
    ``device``, by clients that live for all the rounds (`TeamTimer`, closed by the caller), and returns the
    requests' times per output token (``which`` "tpot") or to first token ("ttft")
    (`measure.timing.finalists.measure_round_robin` takes their statistics per round)."""
    if which not in ("tpot", "ttft"):
        raise ValueError(f"which must be tpot or ttft, not {which!r}")
    clients = int(requests["concurrency"])
    new_tokens = int(requests["new_tokens"])
    return {name: TeamTimer(Clients(decoder, prompts, new_tokens, clients), which)
            for name, (decoder, prompts) in _decoders(models, requests, options, device, log).items()}
