"""Does select see a real difference under noise? Its own finalist code driven by seeded models of a host's noise.

Every trial runs what the ``select`` stage runs when it times its finalists together
(`measure.timing.finalists.measure_round_robin`, then `decision.ties.paired_ties`), with the window timers replaced
by a seeded model of a host: two finalists, the one the tie-breaker prefers (``accurate``) truly ``faster`` slower
than the other (``fast``). The faster one is *chosen* when the preferred one loses beyond the 5% preference band
with confidence; a trial where they stay tied (within the band, or undecided at the cap) goes to the preference.
Nothing is timed: hundreds of trials take seconds.

Hosts (`Scale`): ``gpu`` an H100 timing a small model with CUDA events (500 queries in a 0.6 s window, each +-2%,
levels wandering 5% with 0.95 correlation, a 9 s cap per finalist); ``cpu`` this 2-core machine (24 queries in a
0.06 s window, each +-10%, 3% stalled 2-5x, levels wandering 7%, a 0.9 s cap). Noise classes on top (`NOISE`):

- ``benign``: the host's wandering level only;
- ``window5``: every window 5% slower or faster at random (log-normal, independent);
- ``bimodal``: one window in ten 40% slower;
- ``heavy``: heavy-tailed queries (2% of them slowed by 1 + a Pareto(1.5) factor);
- ``switch_fast`` / ``switch_3`` / ``switch_slow``: a co-tenant that switches on and off (each state lasting an
  exponential time with a mean of a fifth of a window, three windows, or thirty windows) and slows the host by
  35% while on.

    python bench/select_power.py --trials 400        # a table of how often the faster finalist is chosen
    python bench/select_power.py --trials 200 --objective throughput --objective tpot --objective ttft
    python bench/select_power.py --trials 400 --out results/select-power.json

Objectives (``--objective``, `trial`): ``latency`` (the default: p50 of fixed-batch windows), ``throughput`` (load
objectives: finalists timed on their level's service, fixed-batch windows' throughput), ``tpot`` and ``ttft``
(generation: windows of closed-loop requests, `GENERATION`, the figure their times per output token or to first
token, the other figure the same for both finalists). Engines are timed on the latency/throughput windows of the
CUDA-event harness: the ``gpu`` rows are theirs.

Exit code 1 when a check fails: the faster one is chosen >= 90% of the time 10% faster on the gpu host and 20%
faster on the cpu host, under every noise class; 2% apart (inside the 5% band), the preference decides >= 90%.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from trtflow_stages.measure.statistics.intervals import Window  # noqa: E402


@dataclass(frozen=True)
class Scale:
    """A host timing a model: what one window holds and how the host's level wanders."""

    name: str
    latency_ms: float
    window_s: float
    max_seconds: float
    query_noise: float
    stall_rate: float
    stall_factor: tuple[float, float]
    drift: float
    correlation: float


@dataclass(frozen=True)
class Noise:
    """What disturbs the host on top of its wandering level."""

    window_sigma: float = 0.0  # iid log-normal per window
    bimodal_rate: float = 0.0  # share of windows slowed by bimodal_factor
    bimodal_factor: float = 1.4
    pareto_rate: float = 0.0  # share of queries slowed by 1 + Pareto(1.5)
    switch_windows: float | None = None  # co-tenant: mean time in each state, in windows
    switch_slowdown: float = 0.35


@dataclass(frozen=True)
class Generation:
    """A generation benchmark's requests on a host: prefill and decode-step times at concurrency 1."""

    ttft_ms: float
    tpot_ms: float
    new_tokens: int


#: gpu: a small LLM on an H100 (15 ms to the first token, 4 ms a token, 32 new tokens); cpu: the tiny test models here
#: (3 ms, 1.5 ms, 8 new tokens).
GENERATION = {"gpu": Generation(15.0, 4.0, 32), "cpu": Generation(3.0, 1.5, 8)}
#: The objectives a trial can time: what a finalist's window is and the figure the rounds compare.
OBJECTIVES = ("latency", "throughput", "tpot", "ttft")

SCALES = {
    "gpu": Scale("gpu", 1.2, 0.6, 9.0, 0.02, 0.005, (1.5, 3.0), 0.05, 0.95),
    "cpu": Scale("cpu", 2.5, 0.06, 0.9, 0.10, 0.03, (2.0, 5.0), 0.07, 0.9),
}
NOISE = {
    "benign": Noise(),
    "window5": Noise(window_sigma=0.05),
    "bimodal": Noise(bimodal_rate=0.1),
    "heavy": Noise(pareto_rate=0.02),
    "switch_fast": Noise(switch_windows=0.2),
    "switch_3": Noise(switch_windows=3.0),
    "switch_slow": Noise(switch_windows=30.0),
}


class Host:
    """A seeded host: a wandering level (AR(1), log scale), a clock, and the noise class's disturbances."""

    def __init__(self, scale: Scale, noise: Noise, seed: int) -> None:
        self.scale, self.noise = scale, noise
        self.rng = np.random.default_rng(seed)
        self.level = self.rng.normal(0.0, scale.drift)
        self.clock = 0.0
        self.on = bool(self.rng.random() < 0.5)
        self.next_switch = self._hold()

    def _hold(self) -> float:
        mean = (self.noise.switch_windows or 1.0) * self.scale.window_s
        return self.clock + float(self.rng.exponential(mean))

    def _tenant_share(self, seconds: float) -> float:
        """The share of the next ``seconds`` the co-tenant is on (advancing its switches)."""
        if self.noise.switch_windows is None:
            return 0.0
        start, end, on_time = self.clock, self.clock + seconds, 0.0
        at = start
        while self.next_switch < end:
            on_time += (self.next_switch - at) if self.on else 0.0
            at = self.next_switch
            self.on = not self.on
            self.clock = at
            self.next_switch = self._hold()
        on_time += (end - at) if self.on else 0.0
        return on_time / seconds if seconds > 0 else 0.0

    def _level(self) -> float:
        """The host's slowdown for the next window, before the co-tenant: its wandering level (one AR(1) step a
        window), the window's noise, a bimodal window."""
        s, n = self.scale, self.noise
        innovation = s.drift * math.sqrt(1.0 - s.correlation ** 2)
        self.level = s.correlation * self.level + self.rng.normal(0.0, innovation)
        level = self.level + (self.rng.normal(0.0, n.window_sigma) if n.window_sigma else 0.0)
        if n.bimodal_rate and self.rng.random() < n.bimodal_rate:
            level += math.log(n.bimodal_factor)
        return math.exp(level)

    def _tenant(self, seconds: float) -> float:
        """The co-tenant's slowdown over the next ``seconds`` (advancing its switches and the clock)."""
        share = self._tenant_share(seconds)
        return 1.0 + self.noise.switch_slowdown * share

    def _multiplier(self, seconds: float) -> float:
        """The host's slowdown over the next window of ``seconds``: its level and the co-tenant's share of it."""
        return self._level() * self._tenant(seconds)

    def _queries(self, base: float, count: int) -> np.ndarray:
        """``count`` query times around ``base`` ms: query noise, stalls, heavy tails."""
        s, n = self.scale, self.noise
        latencies = base * np.exp(self.rng.normal(0.0, s.query_noise, count))
        stalls = self.rng.random(count) < s.stall_rate
        latencies[stalls] *= self.rng.uniform(*s.stall_factor, int(stalls.sum()))
        if n.pareto_rate:
            tails = self.rng.random(count) < n.pareto_rate
            latencies[tails] *= 1.0 + self.rng.pareto(1.5, int(tails.sum()))
        return latencies

    def window(self, factor: float, seconds: float) -> Window:
        base = self.scale.latency_ms * factor * self._multiplier(seconds)
        latencies = self._queries(base, max(1, round(seconds * 1000.0 / base)))
        wall = float(latencies.sum())
        self.clock += wall / 1000.0
        return Window([float(v) for v in latencies], wall)

    def requests(self, gen: Generation, first: float, per_token: float, seconds: float) -> Window:
        """A generation window (`measure.serving.generation`, one client): requests back to back until ``seconds``
        (at least one), each a prefill (``first`` x the scale's) then ``gen.new_tokens - 1`` decode steps
        (``per_token`` x); its latencies are the requests' times per output token, ``first_tokens_ms`` their times
        to first token."""
        multiplier = self._multiplier(seconds)
        firsts, tokens, wall = [], [], 0.0
        while not firsts or wall < seconds * 1000.0:
            prefill = float(self._queries(gen.ttft_ms * first * multiplier, 1)[0])
            steps = self._queries(gen.tpot_ms * per_token * multiplier, gen.new_tokens - 1)
            firsts.append(prefill)
            tokens.append(float(steps.mean()))
            wall += prefill + float(steps.sum())
        self.clock += wall / 1000.0
        return Window(tokens, wall, first_tokens_ms=firsts)

    def lockstep(self, gen: Generation, slower: dict[str, tuple[float, float]],
                 order: list[str]) -> dict[str, tuple[float, float]]:
        """One request of each finalist interleaved token by token (`measure.serving.generation.lockstep`): the
        prefills in ``order``, then each decode step of each in turn (reversed every step); ``slower``: per name its
        (first, per-token) factors. The co-tenant's state is drawn per step, the host's level once per request.
        Per name: (time to first token, time per output token), ms."""
        level = self._level()
        found = {}
        for name in order:
            first_factor = slower[name][0]
            base = gen.ttft_ms * first_factor * level
            value = float(self._queries(base * self._tenant(base / 1000.0), 1)[0])
            self.clock += value / 1000.0
            found[name] = [value, 0.0]
        turn = list(order)
        for _ in range(gen.new_tokens - 1):
            for name in turn:
                base = gen.tpot_ms * slower[name][1] * level
                value = float(self._queries(base * self._tenant(base / 1000.0), 1)[0])
                self.clock += value / 1000.0
                found[name][1] += value
            turn.reverse()
        return {name: (first, total / (gen.new_tokens - 1)) for name, (first, total) in found.items()}


def trial(scale: Scale, noise: Noise, faster: float, seed: int, objective: str = "latency") -> tuple[bool, int]:
    """One selection between two finalists timed together; (was the faster one chosen, rounds timed).
    ``objective``: latency (p50 of fixed-batch windows), throughput (load objectives: the level's service, fixed-batch
    windows, their throughput), tpot / ttft (generation windows of requests: their times per output token, or to
    first token, the other figure unchanged), each window sized as select's `finalist_plans` sizes it."""
    from trtflow_stages.decision.ties import paired_ties
    from trtflow_stages.measure.timing.finalists import Together, finalist_cap, finalist_window, measure_round_robin
    from trtflow_stages.measure.timing.windows import MIN_WINDOW_S

    host = Host(scale, noise, seed)
    cap = finalist_cap(scale.max_seconds)
    if objective in ("tpot", "ttft"):
        gen = GENERATION[scale.name]
        slow_first, slow_token = (1.0 + faster, 1.0) if objective == "ttft" else (1.0, 1.0 + faster)
        slower = {"accurate": (slow_first, slow_token), "fast": (1.0, 1.0)}

        def run(order: Any, seconds: float) -> dict[str, Window]:  # one request each per round, as select's
            found = host.lockstep(gen, slower, list(order))           # lockstep_timer at concurrency 1
            return {name: Window([first if objective == "ttft" else token],
                                 first + token * (gen.new_tokens - 1)) for name, (first, token) in found.items()}

        timers = Together(["accurate", "fast"], run)
        window = MIN_WINDOW_S  # generation_plan's window at concurrency 1: one request each
        record = measure_round_robin(timers, 1, "p50", 5.0, window, cap, seed=seed)
    else:
        timers = {"accurate": lambda seconds, index: host.window(1.0 + faster, seconds),
                  "fast": lambda seconds, index: host.window(1.0, seconds)}
        window = finalist_window(scale.latency_ms * (1.0 + faster), scale.window_s)  # as timing_plan sizes it
        figure = "throughput" if objective == "throughput" else "p50"
        record = measure_round_robin(timers, 8, figure, 5.0, window, cap, seed=seed)
    leader, duels = paired_ties(record)
    chosen = leader == "fast" and duels["accurate"]["outcome"] == "loses"
    return chosen, len(record["rounds"])


def rates(trials: int, seed: int, scales: dict[str, Scale], noises: dict[str, Noise],
          objectives: tuple[str, ...] = ("latency",)) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for objective in objectives:
        for scale_name, scale in scales.items():
            difference = 0.10 if scale_name == "gpu" else 0.20
            for noise_name, noise in noises.items():
                row: dict[str, Any] = {}
                for label, faster in (("faster", difference), ("within_band", 0.02)):
                    outcomes = [trial(scale, noise, faster, seed * 1_000_003 + i, objective) for i in range(trials)]
                    row[label] = {"difference": faster, "chosen": sum(c for c, _ in outcomes) / trials,
                                  "mean_rounds": sum(r for _, r in outcomes) / trials}
                key = f"{scale_name}/{noise_name}" if objective == "latency" else \
                    f"{objective}:{scale_name}/{noise_name}"
                found[key] = row
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scale", choices=sorted(SCALES), action="append")
    parser.add_argument("--noise", choices=sorted(NOISE), action="append")
    parser.add_argument("--objective", choices=OBJECTIVES, action="append",
                        help="latency (default), throughput (load objectives), tpot, ttft; repeat for several")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    started = time.perf_counter()
    scales = {k: SCALES[k] for k in (args.scale or SCALES)}
    noises = {k: NOISE[k] for k in (args.noise or NOISE)}
    objectives = tuple(args.objective or ("latency",))
    found = rates(args.trials, args.seed, scales, noises, objectives)
    margin = 1.96 * math.sqrt(0.9 * 0.1 / args.trials)
    ok = True
    print(f"{args.trials} trials per row; the faster finalist chosen (gpu: 10% faster, cpu: 20%) and, 2% apart, "
          "chosen against the preference (should be rare); mean rounds timed")
    for key, row in found.items():
        good = row["faster"]["chosen"] >= 0.90 and row["within_band"]["chosen"] <= 0.10
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} {key:31s} faster chosen {row['faster']['chosen']:.3f} "
              f"({row['faster']['mean_rounds']:.1f} rounds)   2% apart chosen {row['within_band']['chosen']:.3f} "
              f"({row['within_band']['mean_rounds']:.1f} rounds)")
    print(f"(a rate's sampling error at 90%: +-{margin:.3f}); {time.perf_counter() - started:.1f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"trials": args.trials, "seed": args.seed, "objectives": objectives,
                                        "rates": found, "generation": {k: v.__dict__ for k, v in GENERATION.items()},
                                        "scales": {k: v.__dict__ for k, v in scales.items()},
                                        "noise": {k: v.__dict__ for k, v in noises.items()}}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

