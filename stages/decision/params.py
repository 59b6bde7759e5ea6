"""The ``select`` stage's params: the objective, the constraints, the tie-breakers and the finalists' timing."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from trtflow.stage import StageParams

from ..measure.statistics.unpaired import RUN_TO_RUN_PERCENT
from .generation import GOAL as GENERATION_GOAL
from .generation import GOALS as GENERATION_GOALS
from .generation import TTFT_GOAL

Goal = Literal["min_latency", "max_throughput", "min_size", "max_throughput_under_latency", "min_time_per_token",
               "min_time_to_first_token"]
Statistic = Literal["p50", "p90", "p95", "p99", "mean"]
TieBreaker = Literal["accuracy", "size", "latency", "throughput"]
DEFAULT_ORDER: tuple[TieBreaker, ...] = ("accuracy", "size")

GOAL_TEXT = {
    "min_latency": "lowest {stat} latency",
    "max_throughput": "highest throughput",
    "min_size": "smallest size",
    "max_throughput_under_latency": "highest throughput with {stat} latency <= {budget:g} ms",
    "min_time_per_token": "lowest {stat} time per output token",
    "min_time_to_first_token": "lowest {stat} time to first token",
}
#: Goals judged on a time (lower is better, in ms).
TIME_GOALS = ("min_latency", "min_time_per_token", "min_time_to_first_token")


class Objective(StageParams):
    """What the best candidate is best at."""

    goal: Goal = Field(
        "min_latency",
        description="'min_latency': the lowest latency (statistic `percentile`) at `batch_size`; "
        "'max_throughput': the highest throughput (at `batch_size`, or the best over every measured batch "
        "size and load level); 'min_size': the smallest artifact; 'max_throughput_under_latency': the highest "
        "throughput among the operating points (load levels of the benchmark's `load` sweep when present, "
        "else batch sizes) whose latency stays within `latency_budget_ms`; 'min_time_per_token': the lowest time "
        "per output token of greedy generation (benchmark params: generation) at `concurrency`, among candidates "
        "whose time to first token (same statistic) is within `max_ttft_ms`; 'min_time_to_first_token': the lowest "
        "time to first token of greedy generation at `concurrency`.",
    )
    percentile: Statistic = Field("p50", description="The latency statistic judged: p50, p90, p95, p99 or mean.")
    batch_size: int | None = Field(
        None, ge=1, description="The benchmarked batch size to judge. Default: for latency, the smallest batch "
        "size every candidate was benchmarked at; for throughput, the best over all measured points.",
    )
    latency_budget_ms: float | None = Field(
        None, gt=0, description="For max_throughput_under_latency: the latency (at `percentile`) no operating "
        "point may exceed, e.g. a p99 service-level objective.",
    )
    max_ttft_ms: float | None = Field(
        None, gt=0, description="For min_time_per_token: the time to first token (at `percentile`) a candidate may "
        "take at most.")
    concurrency: int | None = Field(
        None, ge=1, description="For min_time_per_token and min_time_to_first_token: the generation benchmark's "
        "concurrency level to judge (default: the lowest measured).")

    @model_validator(mode="after")
    def _budget_for_its_goal(self) -> Objective:
        if self.goal == "max_throughput_under_latency" and self.latency_budget_ms is None:
            raise ValueError("goal max_throughput_under_latency needs latency_budget_ms")
        if self.goal != "max_throughput_under_latency" and self.latency_budget_ms is not None:
            raise ValueError(f"latency_budget_ms is only used by goal max_throughput_under_latency; for goal "
                             f"{self.goal} limit latency with constraints.max_latency_ms")
        if (self.goal != GENERATION_GOAL and self.max_ttft_ms is not None) or \
                (self.goal not in GENERATION_GOALS and self.concurrency is not None):
            raise ValueError(f"max_ttft_ms and concurrency are used by goal {GENERATION_GOAL} (concurrency also by "
                             f"{TTFT_GOAL}, which judges the time to first token itself), not {self.goal}")
        return self

    def describe(self) -> str:
        text = GOAL_TEXT[self.goal].format(stat=self.percentile, budget=self.latency_budget_ms or 0)
        if self.goal in GENERATION_GOALS:
            budget = f" with {self.percentile} time to first token <= {self.max_ttft_ms:g} ms" if self.max_ttft_ms \
                else ""
            return text + budget + (f" at concurrency {self.concurrency}" if self.concurrency else "")
        if self.batch_size is not None and self.goal != "min_size":
            text += f" at batch {self.batch_size}"
        return text


class Constraints(StageParams):
    """What a candidate must meet to be eligible at all."""

    validation: Literal["passed", "not_required"] = Field(
        "passed", description="'passed': a candidate needs a validation result that passed; 'not_required': "
        "candidates without one stay eligible (a failed validation still excludes).",
    )
    max_latency_ms: float | None = Field(
        None, gt=0, description="Highest latency (statistic `objective.percentile`) at the operating point.")
    min_throughput_qps: float | None = Field(
        None, gt=0, description="Lowest throughput (inferences per second) at the operating point.")
    max_size_mb: float | None = Field(
        None, gt=0, description="Largest artifact, in MB (10^6 bytes), external weights included.")

    def describe(self, stat: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.validation == "passed":
            out.append({"name": "validation", "limit": "passed", "text": "validation passed"})
        if self.max_latency_ms is not None:
            out.append({"name": "max_latency_ms", "limit": self.max_latency_ms,
                        "text": f"{stat} latency <= {self.max_latency_ms:g} ms"})
        if self.min_throughput_qps is not None:
            out.append({"name": "min_throughput_qps", "limit": self.min_throughput_qps,
                        "text": f"throughput >= {self.min_throughput_qps:g} qps"})
        if self.max_size_mb is not None:
            out.append({"name": "max_size_mb", "limit": self.max_size_mb,
                        "text": f"size <= {self.max_size_mb:g} MB"})
        return out


class TieBreakers(StageParams):
    """How near-equal candidates are told apart (benchmarks are noisy: 1% is not a real difference)."""

    tolerance_percent: float = Field(
        5.0, ge=0, le=100, description="A preference band, not a noise allowance: how much of the objective you "
        "give up for the tie-breakers. A candidate loses to the best one only when it is worse by more than this "
        "many percent with confidence (measured side by side with it, `finalists`); within the band, or when that "
        "cannot be told, the tie-breakers decide. 0: the objective alone decides whatever can be told apart.")
    run_to_run_percent: float = Field(
        RUN_TO_RUN_PERCENT, ge=0, le=100, description="For candidates compared on their stored benchmark figures "
        "only (finalists timed together cancel it): how much faster or slower the host itself may run between two "
        "benchmarks, which neither one's interval sees; a candidate loses on stored figures only beyond "
        "tolerance_percent and this too. 0 on a dedicated, quiet machine.")
    order: list[TieBreaker] = Field(
        default_factory=lambda: list(DEFAULT_ORDER),
        description="Criteria applied in turn to tied candidates: accuracy (higher cosine similarity to the "
        "reference), size (smaller), latency (lower), throughput (higher).",
    )


class Finalists(StageParams):
    """Timing the candidates that are not clearly beaten side by side, before choosing among them."""

    measure: bool = Field(
        True, description="Time the finalists (eligible candidates not clearly beaten on their stored benchmark "
        "figures) again together at the operating point, one window each per round in a random order, until each "
        "one's ratio to the leader is decided against tolerance_percent or the cap, for every objective but size "
        "(load levels: on their service at the level's batch, `measure.timing.finalist_plans`). It needs their "
        "runtime here: ONNX models benchmarked on ONNX Runtime (CPU, or CUDA with a GPU given to this node), or "
        "engines benchmarked on one TensorRT backend (a GPU they run on given to this node); otherwise the stored "
        "figures decide and the selection says so.")
    max_duration_s: float | None = Field(
        None, gt=0, description="Timed seconds per finalist at most (default: twice its benchmark's "
        "max_duration_s: short rounds under a co-tenant need more rounds than one benchmark point needs windows).")


class Params(StageParams):
    objective: Objective = Field(default_factory=Objective, description="What the chosen candidate is best at.")
    constraints: Constraints = Field(default_factory=Constraints, description="What every candidate must meet.")
    tie_breakers: TieBreakers = Field(default_factory=TieBreakers, description="How ties are broken.")
    finalists: Finalists = Field(default_factory=Finalists, description="Timing the finalists side by side.")
    baseline: str | None = Field(
        None, description="A candidate (node name) that speed-ups are computed against, e.g. the fp32 model; "
        "exclusive with the `baseline` input (a benchmark.json of something that is not a candidate).",
    )
    evaluated_slots: list[str] = Field(
        default_factory=lambda: ["candidate", "model"],
        description="Input slots through which a validation or benchmark node takes the model it evaluates "
        "(validate: candidate, benchmark: model): a result belongs only to the candidate its node takes through "
        "one of these, never to one it takes otherwise (e.g. as its reference).",
    )
