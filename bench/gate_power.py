"""What the gates and select can tell: false alarms and power of the stage's own decision code, on models of noise.

Every trial runs the code a gated benchmark runs (`measure.timing.ab.Pairing` timing pairs in a random order through
window timers, its sequential looks, then `measure.judging.gates.Comparison.paired` making the verdict) and the code
select runs (`measure.timing.finalists.measure_round_robin`, then `decision.ties.paired_ties`), with the window timers
replaced by a seeded model of a host's noise. Nothing is timed: thousands of trials take seconds.

Host models (`NoiseModel`: a level the host drifts through, a step per ``window_s`` of time, times per-query noise
with occasional stalls):

``cpu``  this 2-core machine with one CPU-bound neighbour: the level wanders with a 7% standard deviation between
         runs and 0.9 correlation from one stretch to the next; each query +-10% (log-normal), 3% of them stalled
         2-5x; 2.5 ms queries, 0.06 s windows, a cap of 0.9 s (the quickstart's batch 8); threshold 10%.
``gpu``  an H100 timing a small model with CUDA events: levels wander 5%, 0.95 correlation; each query +-2%, 0.5%
         stalled 1.5-3x; 1.2 ms queries, 0.6 s windows, a cap of 9 s; threshold 5%.

Noise classes on top (`NoiseClass`, `CLASSES`), each a process in time, so a gate that times in shorter blocks meets
the same noise: ``switch-P``: a co-tenant on for half of every P pairs of ungated windows (P = 0.3, 1, 3, 10),
the model 1.6x slower while it is on; ``bimodal``: one stretch in ten 40% slower; ``heavy-tail``: stretches with a
Student t (3 degrees of freedom) x 3% on the log scale, and 5x the stalls with a Pareto tail; ``window-5%``: each
stretch log-normal 5%; ``all``: switch-1, bimodal, heavy tail and 5% window noise together.

Checks (exit code 1 when one fails), per host model and noise class: an unchanged candidate fails at most 1% of
verdicts and ends red (fail or undecided: CI red either way) at most 5%; one exactly at the threshold fails at
most 1% (+ sampling error); one at twice the threshold fails at least 90% and never passes; a recipe of 3 unchanged
gated nodes fails at most 5% of runs; select (unless --no-select) sees a 20% (cpu) / 10% (gpu) win at least 90% of
the time, and within the 5% band the preference decides; every look within its cost mark. Each row also gives the
gated cost: the seconds both sides were timed over what the point times ungated (its min_duration_s, a third of
the model's cap), the mean and the largest, and the share of trials that stopped at each look (the marks 2x, 4x,
6x, 8x of the default gate_cost_budget; ``--budget N`` tries another).

    python bench/gate_power.py check --trials 400             # the checks above, a table of rates (95% intervals)
    python bench/gate_power.py check --budget 2 --no-select   # the same within another cost budget
    python bench/gate_power.py noise --seconds 60              # this machine's A/A pairs (quickstart CNN, ORT 1 thread)

``noise`` runs the benchmark's own window timers on two sessions of the same ONNX model (with ``--neighbours``
busy-looping processes beside them) and prints the spread of the pairs' log-ratios: the figure the cpu model
stands for. Results go to --out as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trtflow_stages.measure.statistics.intervals import Window  # noqa: E402
from trtflow_stages.measure.timing.ab import Pairing  # noqa: E402


@dataclass(frozen=True)
class NoiseModel:
    name: str
    drift: float  # standard deviation of the host's level (log scale), between runs
    correlation: float  # of the level from one stretch of window_s to the next
    query_noise: float  # per query (log-normal sigma)
    stall_rate: float
    stall_factor: tuple[float, float]
    queries: int  # per window of window_s (the latency sets how many fit in a window of another length)
    latency_ms: float
    window_s: float
    max_seconds: float  # the point's max_duration_s: the candidate side of the pairs is timed at most this long
    threshold: float = 10.0  # max_regression_percent the trials gate at


@dataclass(frozen=True)
class NoiseClass:
    """Interference on top of a host model, each a process in *time* (not per timed call: a gate that times in
    shorter blocks meets the same noise): the host's multiplier changes at the model's ``window_s`` boundaries (the
    stretch an ungated window lasts) and whenever a co-tenant switches."""

    name: str
    switch_pairs: float | None = None  # a co-tenant on for half of this period, in pairs of the gate's windows
    switch_slowdown: float = 1.6  # how much slower the model runs while the co-tenant is on
    bimodal: tuple[float, float] | None = None  # (share of stretches, slowdown): one in ten 40% slower
    window_noise: float = 0.0  # log-normal sigma of each stretch
    heavy: float = 0.0  # each stretch: a Student t (3 degrees of freedom) times this, log scale; queries stall
    # with a Pareto tail (alpha 1.5) at 5x the host model's stall rate


CLASSES = {
    "benign": NoiseClass("benign"),
    "switch-0.3": NoiseClass("switch-0.3", switch_pairs=0.3),
    "switch-1": NoiseClass("switch-1", switch_pairs=1.0),
    "switch-3": NoiseClass("switch-3", switch_pairs=3.0),
    "switch-10": NoiseClass("switch-10", switch_pairs=10.0),
    "bimodal": NoiseClass("bimodal", bimodal=(0.1, 1.4)),
    "heavy-tail": NoiseClass("heavy-tail", heavy=0.03),
    "window-5%": NoiseClass("window-5%", window_noise=0.05),
    "all": NoiseClass("all", switch_pairs=1.0, bimodal=(0.1, 1.4), window_noise=0.05, heavy=0.03),
}


MODELS = {
    "cpu": NoiseModel("cpu", 0.07, 0.9, 0.10, 0.03, (2.0, 5.0), 24, 2.5, 0.06, 0.9, 10.0),
    "gpu": NoiseModel("gpu", 0.05, 0.95, 0.02, 0.005, (1.5, 3.0), 500, 1.2, 0.6, 9.0, 5.0),
}


class Host:
    """A host whose speed wanders (AR(1) on the log scale, a step per ``window_s`` of time), with ``noise``'s
    interference on top, shared by everything timed on it in one trial; a clock advances with every query."""

    def __init__(self, model: NoiseModel, rng: random.Random, noise: NoiseClass | None = None,
                 pair_s: float | None = None) -> None:
        import numpy as np

        self.model = model
        self.noise = noise or CLASSES["benign"]
        self.rng = rng
        self.np = np.random.default_rng(rng.getrandbits(64))
        self.level = rng.gauss(0.0, model.drift)  # this run's level: runs differ by the drift
        self.clock_ms = 0.0
        self.stretch = -1
        self.multiplier = 1.0
        period = self.noise.switch_pairs * (pair_s or 2 * model.window_s) * 1000.0 if self.noise.switch_pairs else None
        self.period_ms = period
        self.phase_ms = rng.uniform(0.0, period) if period else 0.0

    def _advance_stretch(self) -> None:
        m, n = self.model, self.noise
        stretch = int(self.clock_ms // (m.window_s * 1000.0))
        while self.stretch < stretch:
            self.stretch += 1
            innovation = m.drift * math.sqrt(1.0 - m.correlation ** 2)
            self.level = m.correlation * self.level + self.rng.gauss(0.0, innovation)
            extra = self.rng.gauss(0.0, n.window_noise) if n.window_noise else 0.0
            if n.heavy:
                extra += n.heavy * float(self.np.standard_t(3))
            if n.bimodal and self.rng.random() < n.bimodal[0]:
                extra += math.log(n.bimodal[1])
            self.multiplier = math.exp(self.level + extra)

    def _cotenant(self) -> tuple[bool, float]:
        """Whether the co-tenant is on now, and the milliseconds until it switches."""
        if not self.period_ms:
            return False, math.inf
        position = (self.clock_ms + self.phase_ms) % self.period_ms
        half = self.period_ms / 2.0
        return position < half, (half - position) if position < half else (self.period_ms - position)

    def window(self, factor: float, seconds: float | None = None) -> Window:
        """One window of ``seconds`` (default the model's) of a model ``factor`` times the base latency."""
        m, n = self.model, self.noise
        target = (seconds or m.window_s) * 1000.0
        latencies: list[float] = []
        spent = 0.0
        while spent < target or not latencies:
            self._advance_stretch()
            on, until = self._cotenant()
            to_stretch = (self.stretch + 1) * m.window_s * 1000.0 - self.clock_ms
            per = m.latency_ms * factor * self.multiplier * (n.switch_slowdown if on else 1.0)
            span = max(min(until, to_stretch, target - spent), 1e-9)
            count = max(1, math.ceil(span / per))
            values = per * self.np.lognormal(0.0, m.query_noise, count)
            stall_rate = m.stall_rate * (5.0 if n.heavy else 1.0)
            stalls = self.np.random(count) < stall_rate
            if n.heavy:
                values[stalls] *= 1.0 + self.np.pareto(1.5, int(stalls.sum()))
            else:
                values[stalls] *= self.np.uniform(*m.stall_factor, int(stalls.sum()))
            latencies.extend(values.tolist())
            spent += float(values.sum())
            self.clock_ms += float(values.sum())
        return Window(latencies, spent)


def timer(host: Host, factor: float) -> Any:
    return lambda seconds, index: host.window(factor, seconds)


def gate_trial(model: NoiseModel, change: float, seed: int, family: int = 1, noise: NoiseClass | None = None,
               budget: float | None = None) -> tuple[str, int, float, int, float]:
    """One gated benchmark: the candidate ``change`` slower than the reference, beside ``noise``, within the cost
    budget ``budget`` (default the stage's, `COST_BUDGET`); returns its primary verdict's outcome, the pairs it
    took, the seconds both sides were timed over the seconds the point times ungated at least (its
    min_duration_s: the budget's unit), the look it stopped at (1 the first, at 2x; the last at the budget) and the
    cost before the round that crossed that look's mark (a round's queries are never interrupted)."""
    from bisect import bisect_left

    from trtflow_stages.measure.judging.gates import Comparison
    from trtflow_stages.measure.judging.reference import pair_plan
    from trtflow_stages.measure.params import Params
    from trtflow_stages.measure.timing.ab import COST_BUDGET

    rng = random.Random(seed)
    params = Params.model_validate({"backend": "onnxruntime", "max_regression_percent": model.threshold})
    plan = pair_plan(params, model.window_s, model.max_seconds / 3.0, family, 8, seed=seed,
                     cost_budget=budget or COST_BUDGET)
    host = Host(model, rng, noise, pair_s=2 * plan.window_s)
    pairing = Pairing(plan, timer(host, 1.0))
    candidate = timer(host, 1.0 + change)
    index = 0
    while not pairing.done:
        pairing.step(candidate, model.window_s, index)
        index += 1
    verdict = Comparison("regression", "the reference's", model.threshold, params, family).paired(
        pairing.record, "p50", "batch 8", primary=True)
    marks = [mark / plan.cost_budget for mark in plan.marks]
    at = bisect_left(marks, (pairing.record.fractions or [1.0])[-1] - 1e-9) + 1
    last = pairing.record.pairs[-1]
    round_s = sum(float(last[side]["mean"]) * float(last[side]["queries"]) for side in ("reference", "candidate"))
    cost = float(pairing.summary()["cost"])
    return verdict.outcome, verdict.pairs or 0, cost, at, cost - round_s / 1000.0 / plan.ungated_s


def select_trial(model: NoiseModel, faster: float, seed: int) -> bool:
    """Two finalists, the preferred one (by the tie-breaker) ``faster`` slower than the other, timed together:
    does the faster one win (the preferred one loses beyond the 5% band)?"""
    from trtflow_stages.decision.ties import paired_ties
    from trtflow_stages.measure.timing.finalists import measure_round_robin

    rng = random.Random(seed)
    host = Host(model, rng)
    timers = {"accurate": timer(host, 1.0 + faster), "fast": timer(host, 1.0)}
    record = measure_round_robin(timers, 8, "p50", 5.0, model.window_s, model.max_seconds, seed=seed)
    leader, duels = paired_ties(record)
    return leader == "fast" and duels["accurate"]["outcome"] == "loses"


def _row(outcomes: list[tuple[str, int, float, int, float]], budget: float | None = None) -> dict[str, Any]:
    from trtflow_stages.measure.timing.ab import COST_BUDGET, look_marks

    marks = look_marks(budget or COST_BUDGET)
    count = len(outcomes)
    looks: dict[int, list[float]] = {}
    for _, _, cost, at, _ in outcomes:
        looks.setdefault(at, []).append(cost)
    return {"trials": count, "fail": sum(o[0] == "fail" for o in outcomes) / count,
            "pass": sum(o[0] == "pass" for o in outcomes) / count,
            "inconclusive": sum(o[0] == "inconclusive" for o in outcomes) / count,
            "mean_pairs": sum(o[1] for o in outcomes) / count,
            "max_cost": max(o[2] for o in outcomes), "mean_cost": sum(o[2] for o in outcomes) / count,
            # each look within its mark but for the round that crossed it: at most 1
            "over_mark": max(o[4] / marks[o[3] - 1] for o in outcomes),
            "with_last_round": max(o[2] / marks[o[3] - 1] for o in outcomes),
            "looks": {str(at): {"share": len(costs) / count, "mean_cost": sum(costs) / len(costs),
                                "max_cost": max(costs)} for at, costs in sorted(looks.items())}}


def wilson(rate: float, count: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson interval of a rate measured in ``count`` trials."""
    centre = (rate + z * z / (2 * count)) / (1 + z * z / count)
    half = z * math.sqrt(rate * (1 - rate) / count + z * z / (4 * count * count)) / (1 + z * z / count)
    return max(0.0, centre - half), min(1.0, centre + half)


ROWS = (("unchanged", 0.0), ("at_threshold", 1.0), ("2x_threshold", 2.0))


def _class_row(task: tuple[str, str, str, float, int, int, float | None]) -> tuple[str, str, str, dict[str, Any]]:
    model, noise, label, multiple, trials, seed, budget = task
    host = MODELS[model]
    return model, noise, label, _row([gate_trial(host, multiple * host.threshold / 100.0, seed * 1_000_003 + i,
                                                 noise=CLASSES[noise], budget=budget) for i in range(trials)],
                                     budget)


def _families(task: tuple[str, int, int, float | None]) -> tuple[str, dict[str, Any]]:
    model, runs, seed, budget = task
    families = [[gate_trial(MODELS[model], 0.0, 7_000_003 * seed + 3 * i + k, family=3, budget=budget)[0]
                 for k in range(3)]
                for i in range(runs)]
    return model, {"any_fail": sum("fail" in f for f in families) / runs, "runs": runs}


def rates_all(trials: int, seed: int, classes: tuple[str, ...], select: bool, jobs: int = 1,
              budget: float | None = None, models: tuple[str, ...] = tuple(MODELS)) -> dict[str, Any]:
    """Per host model and noise class: an unchanged candidate, one exactly at the threshold and one at twice it,
    ``trials`` gated benchmarks each; a recipe of three unchanged gated nodes (benign noise); select's trials.
    ``jobs``: processes to spread the rows over."""
    tasks = [(m, c, label, multiple, trials, seed, budget) for m in models for c in classes
             for label, multiple in ROWS]
    family_tasks = [(m, max(trials // 3, 1), seed, budget) for m in models]
    if jobs > 1:
        from multiprocessing import Pool

        with Pool(jobs) as pool:
            rows = []
            for row in pool.imap_unordered(_class_row, tasks):
                rows.append(row)
                print(f"  {row[0]} {row[1]} {row[2]}: {row[3]}", flush=True)
            families = pool.map(_families, family_tasks)
    else:
        rows, families = [_class_row(t) for t in tasks], [_families(t) for t in family_tasks]
    found: dict[str, Any] = {m: {"model": MODELS[m].__dict__, "classes": {c: {} for c in classes}} for m in models}
    for model, noise, label, row in rows:
        found[model]["classes"][noise][label] = row
    for model, row in families:
        found[model]["recipe_of_3_unchanged"] = row
    if select:
        for model in models:
            for label, faster in (("select_10", 0.10), ("select_20", 0.20), ("select_2", 0.02)):
                wins = [select_trial(MODELS[model], faster, 13 * seed + i) for i in range(trials)]
                found[model][label] = {"faster_wins": sum(wins) / trials}
    return found


def check(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    classes = tuple(args.classes.split(",")) if args.classes else tuple(CLASSES)
    models = tuple(args.models.split(",")) if args.models else tuple(MODELS)
    results = rates_all(args.trials, args.seed, classes, not args.no_select, args.jobs, args.budget, models)
    margin = 1.96 * math.sqrt(0.01 * 0.99 / args.trials)  # sampling error of a 1% rate
    criteria = []
    for name, result in results.items():
        for noise, rows in result["classes"].items():
            red = rows["unchanged"]["fail"] + rows["unchanged"]["inconclusive"]
            criteria += [
                (f"{name} {noise}: unchanged fails <= 1% of verdicts", rows["unchanged"]["fail"] <= 0.01 + margin),
                (f"{name} {noise}: unchanged ends red (fail or undecided) <= 5%", red <= 0.05),
                (f"{name} {noise}: at the threshold fails <= 1% (+ sampling error)",
                 rows["at_threshold"]["fail"] <= 0.01 + margin),
                (f"{name} {noise}: twice the threshold fails >= 90%", rows["2x_threshold"]["fail"] >= 0.90),
                (f"{name} {noise}: twice the threshold never passes", rows["2x_threshold"]["pass"] == 0.0),
                (f"{name} {noise}: every look within its cost mark but for the round that crossed it",
                 max(r["over_mark"] for r in rows.values()) <= 1.0 + 1e-3),
            ]
        criteria.append((f"{name}: a recipe of 3 unchanged nodes fails <= 5% of runs",
                         result["recipe_of_3_unchanged"]["any_fail"] <= 0.05))
        if not args.no_select:
            criteria += [(f"{name}: select sees a {20 if name == 'cpu' else 10}% win >= 90%",
                          result["select_20" if name == "cpu" else "select_10"]["faster_wins"] >= 0.90),
                         (f"{name}: within the band (2%), the preference decides >= 90%",
                          result["select_2"]["faster_wins"] <= 0.10)]
    for name, result in results.items():
        model = MODELS[name]
        print(f"{name} model, threshold {model.threshold:g}% ({args.trials} trials per row; red = fail or undecided):")
        print(f"  {'noise':12s} {'unchanged red':>22s} {'at threshold fail':>22s} {'2x fail':>22s} "
              f"{'2x undecided':>13s} {'pairs':>6s}  cost, mean (unchanged / at / 2x) and max; share stopping at "
              "each look (unchanged / 2x)")
        for noise, rows in result["classes"].items():
            red = rows["unchanged"]["fail"] + rows["unchanged"]["inconclusive"]
            cells = [(red, args.trials), (rows["at_threshold"]["fail"], args.trials),
                     (rows["2x_threshold"]["fail"], args.trials)]
            shown = [f"{v:.3f} [{wilson(v, n)[0]:.3f}, {wilson(v, n)[1]:.3f}]" for v, n in cells]
            costs = " / ".join(f"{rows[label]['mean_cost']:.2f}" for label, _ in ROWS)
            at_looks = " / ".join(",".join(f"{rows[label]['looks'].get(str(k), {}).get('share', 0.0):.2f}"
                                           for k in range(1, 5)) for label in ("unchanged", "2x_threshold"))
            print(f"  {noise:12s} {shown[0]:>22s} {shown[1]:>22s} {shown[2]:>22s} "
                  f"{rows['2x_threshold']['inconclusive']:>13.3f} {rows['2x_threshold']['mean_pairs']:>6.0f}  "
                  f"{costs}, max {max(r['max_cost'] for r in rows.values()):.2f}; {at_looks}")
        print(f"  recipe of 3 unchanged nodes: a false alarm in {result['recipe_of_3_unchanged']['any_fail']:.3f} "
              "of runs")
        if not args.no_select:
            print(f"  select: the faster one wins {result['select_20']['faster_wins']:.3f} (20% faster), "
                  f"{result['select_10']['faster_wins']:.3f} (10%), {result['select_2']['faster_wins']:.3f} (2%: "
                  "within the band, the preference decides)")
    for label, ok in criteria:
        print(f"{'ok  ' if ok else 'FAIL'} {label}")
    results["criteria"] = {label: ok for label, ok in criteria}
    results["seconds"] = round(time.perf_counter() - started, 1)
    print(f"{results['seconds']} s")
    return results


def noise(args: argparse.Namespace) -> dict[str, Any]:
    """A/A pairs of the quickstart CNN on this machine, timed by the benchmark's own window timers."""
    import contextlib
    import subprocess
    import tempfile

    import numpy as np
    import torch

    from examples.models.tiny_cnn import build
    from trtflow_stages.measure.statistics.paired import noise as robust_sd
    from trtflow_stages.measure.timing.ab import window_figures
    from trtflow_stages.measure.timing.windows import host_window
    from trtflow_stages.runtimes.ort import OrtOptions, create_session

    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "cnn.onnx"
        torch.onnx.export(build(), torch.randn(args.batch, 3, 32, 32), str(model), input_names=["input"],
                          output_names=["logits"], dynamic_axes={"input": {0: "batch"}}, opset_version=17,
                          dynamo=False)
        options = OrtOptions(intra_op_threads=1)
        sessions = [create_session(model, options) for _ in range(2)]
        feed = {"input": np.random.default_rng(0).standard_normal((args.batch, 3, 32, 32)).astype(np.float32)}
        timers = [host_window(lambda s=s: s.run(None, feed), 200.0) for s in sessions]
        neighbours = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.neighbours)]
        draw = random.Random(0)
        ratios: list[float] = []
        waits: list[float] = []
        try:
            started = time.perf_counter()
            index = 0
            while time.perf_counter() - started < args.seconds:
                order = [0, 1] if draw.random() < 0.5 else [1, 0]
                figures = {}
                for side in order:
                    window = timers[side](args.window, index)
                    figures[side] = window_figures(window, args.batch)
                index += 1
                ratios.append(math.log(figures[1]["p50"] / figures[0]["p50"]))
                waits.append((figures[0].get("wait_share", 0) + figures[1].get("wait_share", 0)) / 2)
        finally:
            for process in neighbours:
                process.terminate()
            for process in neighbours:
                with contextlib.suppress(Exception):
                    process.wait(timeout=30)
    data = np.asarray(ratios)
    found = {"pairs": len(ratios), "window_s": args.window, "batch": args.batch, "neighbours": args.neighbours,
             "robust_sd": robust_sd(ratios), "sd": float(data.std(ddof=1)),
             "quantiles": dict(zip(("1%", "5%", "50%", "95%", "99%"),
                                   (float(v) for v in np.quantile(data, [0.01, 0.05, 0.5, 0.95, 0.99])),
                                   strict=True)),
             "mean_wait_share": float(np.mean(waits)), "log_ratios": ratios}
    print(f"{len(ratios)} A/A pairs of {args.window:g} s windows at batch {args.batch} with {args.neighbours} "
          f"neighbour(s): robust sd {found['robust_sd']:.4f}, sd {found['sd']:.4f}, quantiles "
          f"{ {k: round(v, 3) for k, v in found['quantiles'].items()} }, waited for a CPU "
          f"{found['mean_wait_share']:.0%} of the time")
    model_sd = MODELS["cpu"]
    print(f"(the cpu model's pairs: robust sd ~{_model_spread(model_sd):.4f})")
    return found


def _model_spread(model: NoiseModel, pairs: int = 4000) -> float:
    from trtflow_stages.measure.statistics.paired import noise as robust_sd
    from trtflow_stages.measure.timing.ab import window_figures

    host = Host(model, random.Random(1))
    values = []
    for _ in range(pairs):
        a, b = host.window(1.0), host.window(1.0)
        values.append(math.log(window_figures(b, 1)["p50"] / window_figures(a, 1)["p50"]))
    return robust_sd(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["check", "noise"])
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--classes", default="", help="noise classes, comma-separated (default: all)")
    parser.add_argument("--no-select", action="store_true", help="leave select's trials out")
    parser.add_argument("--jobs", type=int, default=1, help="processes to spread the trials over")
    parser.add_argument("--budget", type=float, default=None,
                        help="the gate's cost budget (default the stage's gate_cost_budget default)")
    parser.add_argument("--models", default="", help="host models, comma-separated (default: all)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--window", type=float, default=0.06)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--neighbours", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("gate-power-results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = check(args) if args.what == "check" else noise(args)
    (args.out / f"{args.what}.json").write_text(json.dumps(result, indent=1, default=str))
    if args.what == "check":
        return 0 if all(result["criteria"].values()) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
