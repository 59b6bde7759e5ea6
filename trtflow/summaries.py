"""The summaries that cross a seam, declared once: what the reports read of a chooser's selection and of a
benchmark's summary, and what the stages that build them promise.

A node's summary is plain JSON-ready data (it goes into the journal and the store's manifest). Most of it is the
stage's own business; the keys below are the ones somebody else reads: the reports (`trtflow.report.decision`,
`trtflow.report.kernels`), the ``select`` stage, which reads validations and benchmarks, and pinned baselines
(`measure.judging.baseline`), which keep a validation's and a benchmark's figures. The stages that build these
summaries (``benchmark.summary_of``, ``validate.run``, ``decision.selection.decide``, ``decision.candidates``'
``accuracy_of`` and ``performance_of``) are annotated with these types, and ``tests/stages/test_summaries.py``
checks each real summary against its type with `problems`, so a key renamed in a stage fails a test, not a report
at run time. The
engine never imports the stages: the declarations live here, in the engine, and the stages point at them.

Keys marked ``Required`` are always there; the others are there when the measurement made them (``top_kernels``
only with ``profile_kernels``, ``load`` only with a load sweep, ...). A reader ``.get``\\ s those.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import (
    Any,
    Required,  # pydantic reads typing_extensions.TypedDict on Python < 3.12
)

from typing_extensions import TypedDict

#: Latency statistics by name (p50, p90, p95, p99, mean) in milliseconds; a 95% interval is ``[low, high]``.
Latencies = dict[str, float]
Intervals = dict[str, list[float]]


class KernelRow(TypedDict, total=False):
    """One of the top CUDA kernels of a benchmark's timed work (`measure.timing.kernel_profile.top_kernels`)."""

    name: Required[str]
    percent: float  # share of kernel time
    average_us: float
    per_iteration: float  # launches per timed iteration


class BenchmarkPoint(TypedDict, total=False):
    """One batch size of a benchmark's summary (`benchmark.summary_of`)."""

    batch_size: Required[int]
    streams: Required[int]
    median_ms: Required[float]
    p99_ms: Required[float]
    latency_ms: Required[Latencies]
    throughput_qps: Required[float | None]
    flags: Required[list[str]]
    latency_ci_ms: Intervals
    throughput_ci_qps: list[float]


class BenchmarkSummary(TypedDict, total=False):
    """What a benchmark node's summary promises to its readers (the report's latency series and kernel table,
    pinned baselines)."""

    backend: Required[str]
    device: Required[str]
    repeats: Required[int]
    points: Required[list[BenchmarkPoint]]
    load: list[dict[str, Any]]  # with a closed-loop load sweep (kept whole by pinned baselines)
    generation: list[dict[str, Any]]  # with generation: the levels of a causal LM's timed generation
    top_kernels: list[KernelRow]  # with profile_kernels
    kernel_time_per_iteration_ms: float | None


class OutputAccuracy(TypedDict, total=False):
    """One output of a validation: the candidate's against the reference's, over the whole data set."""

    cosine_similarity: Required[float | None]
    max_abs_error: Required[float | None]
    mean_abs_error: Required[float | None]


class ValidateSummary(TypedDict, total=False):
    """What a validate node's summary promises to its readers (pinned baselines, `measure.judging.baseline`;
    select reads the same keys from validate.json)."""

    passed: Required[bool]  # under the thresholds of the run that measured it; the engine re-judges
    outputs: Required[dict[str, OutputAccuracy]]
    task_metrics: Required[dict[str, Any]]


class CandidateAccuracy(TypedDict, total=False):
    """A candidate's accuracy as a selection keeps it (`decision.candidates.accuracy_of` of a validate.json)."""

    node: Required[str]
    passed: Required[bool]
    cosine_similarity: Required[float | None]  # the worst output's
    mean_abs_error: Required[float | None]
    max_abs_error: float | None
    tokens_matched: float  # a generation check's mean leading tokens matched per prompt
    tokens_until_difference: float  # mean per prompt: tokens until free-running generation first leaves the reference
    uncertainty: dict[str, dict[str, float]]  # per figure: its numerical resolution and 95% spread over the rows
    task_metrics: dict[str, Any]  # per task metric: its value
    failures: list[str]  # the gates it failed (the engine's verdict when select re-judges it)
    uncalibrated_data: bool


class PerformancePoint(TypedDict, total=False):
    """One batch size of a candidate's performance as a selection keeps it."""

    batch_size: Required[int | None]
    latency_ms: Required[Latencies]
    throughput_qps: Required[float | None]
    flags: Required[list[str]]
    latency_ci_ms: Intervals
    throughput_ci_qps: list[float]


class LoadLevel(TypedDict, total=False):
    """One concurrency of a load sweep as a selection keeps it."""

    concurrency: Required[int | None]
    latency_ms: Required[Latencies]
    throughput_qps: Required[float | None]


class GenerationLevel(TypedDict, total=False):
    """One concurrency of a generation benchmark as a selection keeps it (`decision.generation.levels_of`)."""

    concurrency: Required[int | None]
    flags: Required[list[str] | None]
    ttft_ms: GenerationFigures  # time to first token per request
    tpot_ms: GenerationFigures  # time per output token per request
    output_tokens_per_s: float | None


class GenerationFigures(TypedDict, total=False):
    """One generation figure of a level: per statistic (p50, p90, ..., mean) its value, and ``ci``: per statistic
    its 95% interval."""

    ci: dict[str, list[float]]


class CandidatePerformance(TypedDict, total=False):
    """A candidate's benchmark as a selection keeps it (`decision.candidates.performance_of` of a benchmark.json)."""

    node: Required[str]
    backend: Required[str | None]
    device: Required[str | None]
    points: Required[list[PerformancePoint]]
    load: Required[list[LoadLevel]]
    generation: list[GenerationLevel]  # a selection made before generation benchmarks has none (readers .get it)
    method: dict[str, Any]  # how it was measured (benchmark's method: windows, repeats, ...)
    passed: bool  # with gates: the engine's verdict under today's thresholds
    failures: list[str]


class OperatingPointSummary(TypedDict):
    """Where a candidate is judged: its latency and throughput there, with their 95% intervals."""

    batch_size: int | None
    concurrency: int | None
    latency_ms: float | None
    throughput_qps: float | None
    latency_ci_ms: list[float] | None
    throughput_ci_qps: list[float] | None
    description: str


class CandidateRow(TypedDict, total=False):
    """One candidate of a selection: what it is, its figures, and why it won, lost or was excluded."""

    name: Required[str]
    kind: Required[str]
    precision: Required[str | None]
    profiles: Required[list[str]]
    size_bytes: Required[int]
    validation: Required[CandidateAccuracy | None]
    benchmark: Required[CandidatePerformance | None]
    operating_point: Required[OperatingPointSummary | None]
    eligible: Required[bool]
    reason: Required[str]
    pareto: Required[bool]
    tie: bool  # within noise of the best (eligible candidates)
    speedup: float | None  # against the baseline, when there is one
    unmeasurable: str  # why its figures cannot be trusted (the host was busy)


class Objective(TypedDict, total=False):
    percentile: Required[str]
    description: Required[str]


class Constraint(TypedDict, total=False):
    text: Required[str]


class SelectionSummary(TypedDict, total=False):
    """A chooser node's summary (the ``select`` stage's, or any stage's of the same shape): the decision the
    report leads with."""

    selected: Required[str | None]
    candidates: Required[list[CandidateRow]]
    objective: Required[Objective]
    constraints: Required[list[Constraint]]
    tied: Required[list[str]]
    baseline: Required[str | None]
    unmeasurable: Required[dict[str, str]]
    artifact: dict[str, Any]  # the selected candidate's artifact: its name, kind, ...


def problems(summary: Any, declared: type) -> list[str]:
    """What in ``summary`` breaks its declared type: each missing key or wrongly typed value, by its path
    (``candidates.0.validation.cosine_similarity: Field required``); empty when it conforms. Extra keys are the
    stage's own business and pass."""
    from pydantic import TypeAdapter, ValidationError

    try:
        TypeAdapter(declared).validate_python(summary)
    except ValidationError as error:
        return [".".join(str(part) for part in e["loc"]) + ": " + e["msg"] for e in error.errors()]
    return []


def evaluated_candidates(inputs: Mapping[str, Iterable[str]], candidates: Collection[str],
                         evaluated_slots: Collection[str]) -> list[str]:
    """The ``candidates`` that a validation or benchmark node (its ``inputs``: slot -> producer nodes) takes through
    one of ``evaluated_slots``, each once: its result (and its gate) belongs to the one candidate found, never to
    one it takes only otherwise, e.g. as its reference. The one rule of the ``select`` stage (which result is whose)
    and of the run's outcome (`execution.outcome`: whose failed gate is a rejection)."""
    return list(dict.fromkeys(n for slot, nodes in inputs.items() if slot in evaluated_slots for n in nodes
                              if n in candidates))
