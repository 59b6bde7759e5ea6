"""The benchmark stage's parameters, in groups: timing (windows, precision), serving load, gates.

`Params` of the benchmark stage inherits all three; the libraries that read a group take it as their type.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from trtflow.stage import StageParams

from .serving.traffic import DynamicBatching
from .statistics.intervals import Precision
from .statistics.unpaired import RUN_TO_RUN_PERCENT
from .timing.ab import COST_BUDGET
from .timing.windows import WindowPlan

DURATION_CAP_FACTOR = 3.0  # max_duration_s by default: three times the minimum


class TimingFields(StageParams):
    """How each fixed-batch point is timed: warm-up, windows, minimums, precision and cap."""

    repeats: int = Field(5, ge=1, le=50, description="Time each fixed-batch point in at least this many windows "
                         "(min_duration_s split among them): their spread enters the intervals, so drift on the "
                         "host widens them instead of passing for precision. 1: one window.")
    warmup_ms: float = Field(200.0, ge=0, description="Warm-up time before timing (trtexec: 200 ms).")
    min_iterations: int = Field(10, ge=1, description="At least this many timed queries (trtexec: 10).")
    min_duration_s: float = Field(3.0, ge=0, description="And at least this long, over all windows (trtexec: 3 s).")
    precision_percent: float = Field(
        5.0, gt=0, description="Keep timing (window by window, up to max_duration_s) until the 95% interval of "
        "each point's median latency is within this many percent of it.")
    tail_precision_percent: float | None = Field(
        None, gt=0, description="Also wait for p99's interval to be within this many percent (it needs 368 "
        "queries to exist at all). Unset: p99's interval is reported, not waited for.")
    max_duration_s: float | None = Field(
        None, gt=0, description="Timed seconds per point at most while the precision is not reached (default: "
        "3 x min_duration_s), plus one window; a point that stops here is flagged not-converged (stopped: cap). "
        "Past its minimums, a point whose threads waited for a CPU 20% of the time stops there (stopped: busy-host).")
    ab_seed: int | None = Field(
        None, description="Seed of the gate point's AB/BA orders (pairs with the reference). Unset: a new one "
        "each run, recorded in the summary's reference.paired.seed; set it to that number to replay a run's order.")
    gate_cost_budget: float = Field(
        COST_BUDGET, ge=2.0, le=100.0,
        description="What a gated benchmark may cost: the gate point's timed seconds, the reference's and the "
        "candidate's together, at most this many times what the point times ungated at least (min_duration_s, at "
        "least one window), at every look. The verdict's looks are planned within it (the first at 2x, when the "
        "candidate's side has been timed min_duration_s); undecided at the budget, the verdict says what budget "
        "would decide at the noise it measured.")

    def window_plan(self) -> WindowPlan:
        cap = self.max_duration_s if self.max_duration_s is not None else DURATION_CAP_FACTOR * self.min_duration_s
        return WindowPlan(self.repeats, self.min_iterations, self.min_duration_s, cap,
                          Precision(self.precision_percent, self.tail_precision_percent))


class LoadFields(StageParams):
    """Serving load: closed-loop clients, Server (open-loop) levels, MLPerf scenarios, batching, GPUs."""

    # -- serving load ------------------------------------------------------------------------------------------
    concurrency: list[int] = Field(
        default_factory=list, description="Closed-loop load: per level, this many requests in flight (each "
        "client sends its next request when its previous one completes); benchmark.json gets a 'load' entry "
        "per level with throughput and latency p50/p90/p95/p99, queueing included.",
    )
    request_size: int | None = Field(
        None, ge=1, description="Samples per closed-loop request (default: the batch of the shapes "
        "benchmarked; 1 with dynamic_batching). Open-loop requests are single samples.",
    )
    arrival_rate_qps: list[float] = Field(
        default_factory=list, description="Open-loop load (MLPerf's Server scenario): per level, single-sample "
        "requests arriving as a Poisson process at this many per second, whatever the model's pace.",
    )
    scenarios: list[Literal["Offline", "SingleStream", "MultiStream"]] = Field(
        default_factory=list, description="MLPerf scenarios to run through LoadGen besides the Server levels: "
        "Offline (every sample at once: samples per second), SingleStream (one sample at a time: p90 latency), "
        "MultiStream (multi_stream_samples per query: p99 query latency).",
    )
    load_generator: Literal["auto", "loadgen", "trtflow"] = Field(
        "auto", description="What drives the Server levels (arrival_rate_qps): 'loadgen' (MLPerf LoadGen, the "
        "loadgen extra: its clock and its early-stopping verdict on the budget), 'trtflow' (our own Poisson "
        "generator), or 'auto': LoadGen where installed. Closed-loop concurrency levels are always trtflow's "
        "(LoadGen has no closed loop of several clients).",
    )
    multi_stream_samples: int = Field(8, ge=1, description="Samples per MultiStream query (MLPerf: 8).")
    loadgen_min_queries: int | None = Field(
        None, ge=1, description="LoadGen's min_query_count per level; default: what its early stopping needs to "
        "claim the judged percentile (Server: 459 for p99 with no query over the budget; SingleStream: 64 for p90; "
        "MultiStream: 662 for p99).",
    )
    dynamic_batching: DynamicBatching | None = Field(
        None, description="Merge queued requests into batches (Triton's dynamic batcher): max_batch_size "
        "(within the profile's limits), max_queue_delay_ms, preferred_batch_sizes.",
    )
    latency_budget_ms: float | None = Field(
        None, gt=0, description="Open-loop p99 latency budget: requests over it are counted late, and the "
        "highest arrival rate that meets it is reported (with LoadGen: a VALID Server run, p99 within the budget "
        "with confidence; with trtflow's generator: a p99 within it).",
    )
    rate_search_probes: int = Field(
        0, ge=0, le=20, description="With latency_budget_ms and arrival_rate_qps: this many more open-loop levels "
        "searching for the highest rate whose p99 meets the budget (doubling the best listed rate until one "
        "misses, then bisecting).",
    )
    confirm_duration_s: float = Field(
        10.0, ge=0, description="After a rate search (rate_search_probes), confirm the rate it found in both "
        "directions with levels at least this long (and long enough for the queue to settle: 30 of its relaxation "
        "times at that rate, up to 2x this; at least the queries the p99 needs): confirm_steps levels, an "
        "up-and-down staircase on a geometric grid of confirm_step_percent (up one grid rate after a level whose "
        "p99 meets the budget, down one after a miss). The serving capacity is where the median level's p99 per "
        "rate, made non-decreasing in the rate, crosses the budget, interpolated between the grid rate below it "
        "(meets) and the one above (misses), with an interval; so it does not depend on load_duration_s, on where "
        "the search stopped, or on one lucky level. 0: no confirmation (the figure is the search's, at "
        "load_duration_s).")
    confirm_steps: int = Field(8, ge=1, le=40, description="Confirmation levels (all are run: the capacity is "
                               "read off all of them). Fewer than confirm_visits a side of the crossing: the capacity "
                               "is reported unsettled; none that met below one that missed: none, only a lower bound.")
    confirm_step_percent: float = Field(2.5, gt=0, lt=50, description="The confirmation grid's step: each rate is "
                                        "this much above the one below it.")
    confirm_visits: int = Field(2, ge=1, le=10, description="Levels the confirmation needs at or below the rate "
                                "that meets and at or above the one that misses for the capacity to be settled.")
    load_duration_s: float = Field(3.0, gt=0, description="Measured time per load level.")
    load_warmup_s: float = Field(0.5, ge=0, description="Unmeasured time at the start of each load level.")
    gpus: Literal["all"] | int = Field(
        1, description="GPUs to serve from under load: N or 'all', one replica process per GPU; reports the "
        "aggregate throughput and the scaling efficiency against one GPU (tensorrt, or device cuda).",
    )
    seed: int = Field(0, description="Seed of the open-loop arrival times.")

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, sizes: list[int]) -> list[int]:
        if any(b < 1 for b in sizes):
            raise ValueError(f"values must be >= 1, got {sizes}")
        return sizes

    @field_validator("arrival_rate_qps")
    @classmethod
    def _positive_rates(cls, rates: list[float]) -> list[float]:
        if any(rate <= 0 for rate in rates):
            raise ValueError(f"arrival rates must be > 0, got {rates}")
        return sorted(rates)

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, gpus: str | int) -> str | int:
        if isinstance(gpus, int) and gpus < 1:
            raise ValueError(f"gpus must be >= 1 or 'all', got {gpus}")
        return gpus

    @property
    def has_load(self) -> bool:
        return bool(self.concurrency or self.arrival_rate_qps or self.scenarios)


class GateFields(StageParams):
    """Gates, judged by the engine on the summary (changing them re-judges cached measurements)."""

    max_latency_ms_p50: float | None = Field(
        None, gt=0, description="Gate: median latency at most this. Every limit is judged on the figure's 95% "
        "interval at every measured point: fail when all of it is beyond the limit, pass when all of it is within, "
        "inconclusive when it straddles the limit (see on_inconclusive).")
    max_latency_ms_p90: float | None = Field(None, gt=0, description="Gate: p90 latency at most this.")
    max_latency_ms_p95: float | None = Field(None, gt=0, description="Gate: p95 latency at most this.")
    max_latency_ms_p99: float | None = Field(None, gt=0, description="Gate: p99 latency at most this.")
    max_latency_ms_mean: float | None = Field(None, gt=0, description="Gate: mean latency at most this.")
    min_throughput_qps: float | None = Field(None, gt=0, description="Gate: throughput (samples/s) at least "
                                             "this.")
    max_regression_percent: float | None = Field(
        None, gt=0,
        description="Gate: compare with the pinned baseline (with baseline; default 10) or else the node's last "
        "accepted result: the reference artifact is re-measured beside the candidate in randomised, interleaved "
        "A/B blocks at the gate point (gate_batch_size, gate_figure), adding pairs until it can decide (or its "
        "cost budget, gate_cost_budget): fail when the change is beyond this many percent with "
        "confidence, pass when within it with confidence, inconclusive only at the budget (see on_inconclusive). "
        "Where the reference cannot run here, stored figures are compared instead, and the verdict says so.")
    gate_batch_size: int | None = Field(
        None, ge=1, description="The point whose regression verdict decides the node (one stream): default the "
        "largest measured batch size. The other points' changes are reported, not judged.")
    gate_figure: Literal["p50", "p99", "mean", "throughput"] = Field(
        "p50", description="The figure the regression verdict judges at the gate point: p50 (median latency, "
        "the default), p99, mean latency, or throughput.")
    on_inconclusive: Literal["fail", "warn"] = Field(
        "fail", description="What a gate that could not decide at its cap does: 'fail' (the default, also in CI: "
        "the node fails, the run exits with code 5 when nothing else failed, and JUnit shows a failure of type "
        "inconclusive) or 'warn' (reported on the console, in reports and JUnit, and fails nothing; such a "
        "result never becomes the reference of later runs).")
    run_to_run_percent: float = Field(
        RUN_TO_RUN_PERCENT, ge=0, le=100,
        description="For comparisons with stored figures only (paired A/B cancels it): how much faster or slower "
        "the host itself may run from one run to the next, which neither run's intervals see; a regression fails "
        "only beyond max_regression_percent and this too. Measure your CI's with bench/reproducibility.py.")
    baseline: str | None = Field(
        None, description="A pinned baseline file (`trtflow baseline pin`), relative to the recipe: its pinned "
        "artifact is re-measured beside the candidate (paired A/B); where it cannot run here, its stored figures "
        "are compared (figures from another GPU or runtime are refused, saying so).",
    )
    baseline_node: str | None = Field(
        None, description="The node's name in the baseline file (default: the node's own name, else the file's only "
        "benchmark node).",
    )
