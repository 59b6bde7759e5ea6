"""The ``select`` stage: choose the candidate that best meets an objective under constraints, and say why.

Candidates are ONNX models or TensorRT engines (one many-slot, ``candidates``). Each brings the results of
the nodes that evaluated it: a validation (validate.json) and a benchmark (benchmark.json), taken through
the many-slots ``validations`` and ``benchmarks``. A result belongs to the candidate its node consumed
through one of ``evaluated_slots`` (the validate stage's ``candidate``, the benchmark stage's ``model``), so
a recipe wires them once, e.g. with a matrix over the candidates:

    - {name: validate, stage: validate, matrix: {c: [simplify, quantize]},
       inputs: {reference: export, candidate: "${{ matrix.c }}"}}
    - {name: benchmark, stage: benchmark, matrix: {c: [simplify, quantize]}, inputs: {model: "${{ matrix.c }}"}}
    - {name: select, stage: select,
       inputs: {candidates: [simplify, quantize], validations: validate, benchmarks: benchmark}}

Each candidate gets an operating point (a batch size, or a concurrency of a benchmark's ``load`` sweep) for
the objective: the lowest latency at a percentile and batch size, the highest throughput, the smallest size,
or the highest throughput whose latency stays within a budget (AITune's and Model Analyzer's strategies).
Constraints exclude candidates (validation passed, latency, throughput, size); the best eligible one wins,
candidates within ``tie_breakers.tolerance_percent`` of it (a preference band) are ties broken in the stated order.
The finalists, the candidates not clearly beaten on their stored benchmark figures, are timed again together in
round-robin windows (`measure.timing.finalists`, ``finalists``), so a 10% difference is seen even when the host's speed
moved by more than that between their benchmarks: for latency, throughput, load objectives (on their service at the
level's batch), time per output token and time to first token, ONNX models and engines alike
(`measure.timing.finalist_plans` says what each objective's windows run); where they cannot be timed here, the
stored figures decide and the selection says so. Every
candidate's metrics and the reason it won, lost or was excluded go to selection.json; the winner's artifact
and its companions (external weights, engine.json) are copied beside it. When no candidate qualifies, the
selection is still written (the report shows it) and the node's gate fails with the table.

It works for whatever backend benchmarked the candidates: ONNX Runtime on a CPU, TensorRT on a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trtflow.stage import (
    ENGINE,
    METRICS,
    ONNX,
    GateContext,
    Input,
    Output,
    RecipeError,
    Resources,
    Stage,
    StageContext,
)
from trtflow.summaries import SelectionSummary, evaluated_candidates

from .decision.candidates import Candidate, accuracy_of, performance_of
from .decision.params import Params
from .decision.reasons import table
from .decision.selection import decide

# ---------------------------------------------------------------------------------------------------------
# Gathering the inputs


def _kind(path: Path) -> str:
    from .formats.onnx_model import candidate_kind

    return candidate_kind(path)


def _artifact_size(path: Path) -> int:
    size = path.stat().st_size
    weights = path.with_name(path.name + "_data")
    if path.suffix == ".onnx" and weights.is_file():
        size += weights.stat().st_size
    return size


def _onnx_precision(path: Path) -> str | None:
    from .formats.onnx_model import inspect_model

    facts = inspect_model(path)
    parts = sorted(facts.quantized_types) + sorted(facts.reduced_floats)
    return "/".join(parts) if parts else "fp32"


def _engine_facts(path: Path, matrix: Mapping[str, Any]) -> tuple[str | None, list[str]]:
    from .runtimes.trt_runtime import provenance_for, read_provenance

    manifest = read_provenance(provenance_for(path))
    builder = (manifest.get("builder") if manifest else None) or {}
    precision = builder.get("precision")
    if precision in (None, "strongly-typed"):
        hint = next((matrix[k] for k in ("precision", "dtype", "mode") if isinstance(matrix.get(k), str)), None)
        precision = hint or precision
    profiles = [p.get("name", str(i)) for i, p in enumerate((manifest.get("profiles") if manifest else None) or [])]
    return precision, profiles


def _owner(source: Mapping[str, Any], names: Sequence[str], evaluated_slots: Sequence[str], slot: str) -> str:
    """The candidate a validation/benchmark node evaluated: the one candidate it takes through one of
    ``evaluated_slots``, never one it takes otherwise (a validation's reference is not what its gate judges)."""
    inputs = source.get("inputs") or {}
    evaluated = evaluated_candidates(inputs, names, evaluated_slots)
    if len(evaluated) == 1:
        return evaluated[0]
    owners = list(dict.fromkeys(n for nodes in inputs.values() for n in nodes if n in names))
    consumed = ", ".join(f"{s}: {', '.join(nodes)}" for s, nodes in inputs.items()) or "none"
    if not owners:
        raise RecipeError(
            f"node {source['node']!r} evaluated none of the candidates ({', '.join(names)}); its inputs: "
            f"{consumed}", field=f"inputs.{slot}",
            hint="list only nodes that take a candidate as input, or add the model it evaluated to candidates")
    took = "several candidates" if len(owners) > 1 else f"candidate {owners[0]!r}"
    raise RecipeError(
        f"node {source['node']!r} (in {slot}) took {took} ({consumed}) and "
        + ("none" if not evaluated else "more than one") + f" through evaluated_slots {list(evaluated_slots)}: "
        "its result belongs only to the candidate it evaluates", field="evaluated_slots",
        hint="wire the candidate into that node's evaluated slot (validate: candidate, benchmark: model), or "
        "name the slot through which it takes the model it evaluates in evaluated_slots")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    from trtflow.stage import StageFailed

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise StageFailed(f"cannot read {what} {path.name}: {error}",
                          hint="re-run the node that wrote it (`trtflow run` rebuilds a damaged output)") from error
    if not isinstance(data, dict):
        raise StageFailed(f"{what} {path.name} is not a JSON object")
    return data


def gather(inputs: Mapping[str, Any], sources: Mapping[str, Sequence[Mapping[str, Any]]],
           params: Params) -> tuple[list[Candidate], dict[str, Path]]:
    """The candidates with their validation and benchmark results; and each candidate's artifact path."""
    paths: dict[str, Path] = {}
    candidates: dict[str, Candidate] = {}
    for path, source in zip(inputs["candidates"], sources["candidates"], strict=True):
        path = Path(path)
        name = source["node"]
        kind = _kind(path)
        matrix = dict(source.get("matrix") or {})
        profiles: list[str]
        if kind == "onnx":
            precision, profiles = _onnx_precision(path), []
        else:
            precision, profiles = _engine_facts(path, matrix)
        candidates[name] = Candidate(name, kind, _artifact_size(path), precision, profiles, matrix)
        paths[name] = path
    if len(candidates) < 2:
        raise RecipeError(f"select needs at least two candidates, got {len(candidates)}: {', '.join(candidates)}",
                          field="inputs.candidates", hint="list the models or engines to choose among")
    kinds = {c.kind for c in candidates.values()}
    if len(kinds) > 1:
        by_kind = {k: [c.name for c in candidates.values() if c.kind == k] for k in sorted(kinds)}
        raise RecipeError(
            "the candidates mix ONNX models (" + ", ".join(by_kind["onnx"]) + ") and engines ("
            + ", ".join(by_kind["engine"]) + ")", field="inputs.candidates",
            hint="choose among one kind: what follows the selection (build, triton) takes one kind of artifact")
    names = list(candidates)
    for slot, attribute, reader in (("validations", "validation", accuracy_of),
                                    ("benchmarks", "benchmark", performance_of)):
        for path, source in zip(inputs.get(slot, []), sources.get(slot, []), strict=True):
            owner = _owner(source, names, params.evaluated_slots, slot)
            existing = getattr(candidates[owner], attribute)
            if existing is not None:
                raise RecipeError(
                    f"candidate {owner!r} has two {slot}: {existing['node']} and {source['node']}",
                    field=f"inputs.{slot}", hint=f"give each candidate one {attribute} node")
            record = reader(_read_json(Path(path), f"{attribute} of {owner}"), source["node"])
            if slot == "validations" and "gate_failures" in source:
                # the engine's verdict under today's thresholds beats the one the file was written with
                record["passed"] = not source["gate_failures"]
                record["failures"] = list(source["gate_failures"])
            setattr(candidates[owner], attribute, record)
    return list(candidates.values()), paths


def _link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def materialize_selected(ctx: StageContext, path: Path, kind: str) -> list[str]:
    """The winner and its companions as this node's outputs; returns the file names written."""
    written = []
    if kind == "onnx":
        _link_or_copy(path, ctx.output("model"))
        written.append(ctx.output("model").name)
        weights = path.with_name(path.name + "_data")
        if weights.is_file():
            _link_or_copy(weights, ctx.output("weights"))
            written.append(ctx.output("weights").name)
    else:
        _link_or_copy(path, ctx.output("engine"))
        written.append(ctx.output("engine").name)
        from .runtimes.trt_runtime import provenance_for

        provenance = provenance_for(path)
        if provenance is not None:
            _link_or_copy(provenance, ctx.output("provenance"))
            written.append(ctx.output("provenance").name)
    return written


def _cuda_timer() -> Any:
    """The cuda-python harness engine finalists are timed on (the tests' TensorRT fakes replace it)."""
    from .measure.timing.cuda_timing import CudaTimer

    return CudaTimer(device=0)  # the runner narrows CUDA_VISIBLE_DEVICES to the node's GPU


@contextmanager
def _timers(ctx: StageContext, plan: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The finalists' window timers for ``plan`` (`measure.timing.finalist_plans`), open for the ``with`` block."""
    from .measure.timing.finalists import engine_timers, onnxruntime_timers

    if plan["runtime"] == "generation":
        from .measure.serving.generation import generation_timers, lockstep_timer

        opener = lockstep_timer if plan["generation"]["concurrency"] == 1 else generation_timers
        timers = opener(plan["models"], plan["generation"], plan["options"], plan["device"], ctx.log, plan["which"])
        try:
            yield timers
        finally:  # generation's clients: their threads end
            for timer in (timers.values() if isinstance(timers, Mapping) else ()):
                getattr(timer, "close", lambda: None)()
    elif plan["runtime"] == "onnxruntime":
        yield onnxruntime_timers(plan["models"], plan["shapes"], plan["options"], plan["device"], plan["warmup_ms"],
                                 ctx.log, plan["data"], ctx.resolve)
    else:
        batches = plan["batch_size"] if isinstance(plan["batch_size"], Mapping) else \
            dict.fromkeys(plan["models"], plan["batch_size"])
        with engine_timers(plan["models"], plan["shapes"], batches, plan, _cuda_timer, ctx.log,
                           ctx.resolve) as timers:
            yield timers


def _time_finalists(ctx: StageContext, params: Params, selection: Mapping[str, Any],
                    paths: Mapping[str, Path]) -> dict[str, Any] | None:
    """The finalists (eligible, not clearly beaten on stored figures) timed together (`measure.timing.finalists`,
    planned per objective and runtime by `measure.timing.finalist_plans`), or why they could not be; None when there
    is nothing to time (one finalist, or finalists.measure off)."""
    from .measure.timing.finalist_plans import timing_plan
    from .measure.timing.finalists import measure_round_robin

    rows = [row for row in selection["candidates"] if row.get("eligible") and row.get("tie")]
    if not params.finalists.measure or len(rows) < 2:
        return None
    plan = timing_plan(rows, selection["objective"], paths, ctx.gpu, params.finalists.max_duration_s)
    if isinstance(plan, str):
        ctx.log.info("finalists not timed together: %s", plan)
        return {"why": plan}
    names = ", ".join(plan["models"])
    batch = plan["batch_size"]
    where = f"concurrency {plan['generation']['concurrency']}" if "generation" in plan else \
        f"batch {batch}" if not isinstance(batch, Mapping) else \
        "batch " + ", ".join(f"{b} ({n})" for n, b in batch.items())
    ctx.progress(0.0, f"timing the finalists {names} together at {where}")
    native = "onnxruntime" if plan["runtime"] in ("onnxruntime", "generation") else plan["runtime"]
    try:
        with ctx.native_step(native, f"timing the finalists {names} together"), _timers(ctx, plan) as timers:
            from .measure.serving.traffic import steady_interpreter

            with steady_interpreter():
                record = measure_round_robin(timers, batch, plan["figure"], params.tie_breakers.tolerance_percent,
                                             plan["window_s"], plan["max_seconds"])
    except Exception as error:  # an optional refinement: the stored figures still decide, and say so
        detail = getattr(error, "message", None) or f"{type(error).__name__}: {error}"
        why = f"timing them here failed ({detail}); the stored figures decided"
        ctx.log.warning("finalists not timed together: %s", why)
        return {"why": why}
    record.update({key: plan[key] for key in ("runtime", "which", "load_rule") if key in plan})
    ctx.log.info("finalists %s timed together: %d rounds", names, len(record["rounds"]))
    return record


def run(ctx: StageContext, inputs: dict[str, Any], params: Params) -> SelectionSummary:
    candidates, paths = gather(inputs, ctx.input_sources, params)
    names = [c.name for c in candidates]
    needs_benchmarks = params.objective.goal != "min_size" or params.constraints.max_latency_ms \
        or params.constraints.min_throughput_qps
    if needs_benchmarks and not inputs.get("benchmarks"):
        raise RecipeError(f"objective '{params.objective.describe()}' needs benchmark results but no benchmarks "
                          "are wired", field="inputs.benchmarks",
                          hint="add `benchmarks: <benchmark node>` (one benchmark per candidate) to the inputs")
    baseline = None
    if params.baseline is not None and "baseline" in inputs:
        raise RecipeError("both the baseline param and the baseline input are given", field="baseline",
                          hint="keep one: a candidate's name, or a benchmark.json wired as the baseline input")
    if params.baseline is not None:
        if params.baseline not in names:
            from trtflow.errors import did_you_mean

            raise RecipeError(f"baseline {params.baseline!r} is not a candidate", field="baseline",
                              hint=did_you_mean(params.baseline, names) or f"candidates: {', '.join(names)}")
        chosen = next(c for c in candidates if c.name == params.baseline)
        baseline = {"name": chosen.name, **(chosen.benchmark or {"points": []})}
    elif "baseline" in inputs:
        node = ctx.input_sources["baseline"][0]["node"]
        baseline = {"name": node, **performance_of(_read_json(Path(inputs["baseline"]), "baseline"), node)}

    selection = decide(candidates, params, baseline)
    finalists = _time_finalists(ctx, params, selection, paths)
    if finalists is not None:
        selection = decide(candidates, params, baseline, finalists)
    if selection["selected"] is not None:
        winner = selection["selected"]
        kind = next(c.kind for c in candidates if c.name == winner)
        selection["artifact"] = {"candidate": winner, "kind": kind,
                                 "files": materialize_selected(ctx, paths[winner], kind)}
        ctx.log.info("selected %s\n%s", winner, table(selection))
    else:
        ctx.log.error("no candidate qualifies\n%s", table(selection))
    ctx.output("selection").write_text(json.dumps(selection, indent=2) + "\n", encoding="utf-8")
    return selection


def _resources(params: Params) -> Resources:
    """Timing the finalists together is a measurement: nothing else runs beside it."""
    return Resources(cpu=1.0, exclusive=params.finalists.measure)


def gate(params: Params, summary: Mapping[str, Any], gate_ctx: GateContext) -> list[str]:
    if summary.get("selected") is not None or not summary.get("candidates"):
        return []
    return ["no candidate qualifies for " + summary["objective"]["description"] + ":\n" + table(summary)]


stage = Stage(
    name="select",
    version="1",
    description="Choose among candidate models or engines by an objective (latency, throughput, size, "
    "throughput under a latency budget) under constraints, from their validation and benchmark results; "
    "write selection.json with every candidate's metrics and why it won, lost or was excluded, and the "
    "winner's artifact.",
    params=Params,
    run=run,
    inputs={
        "candidates": Input((ONNX, ENGINE), "the models or engines to choose among", many=True),
        "validations": Input(METRICS, "validate.json of each candidate (from validate nodes)", optional=True,
                             many=True, accept_gate_failed=True),
        "benchmarks": Input(METRICS, "benchmark.json of each candidate (from benchmark nodes)", optional=True,
                            many=True, accept_gate_failed=True),
        "baseline": Input(METRICS, "benchmark.json of a reference that is not a candidate, for speed-ups",
                          optional=True),
    },
    outputs={
        "selection": Output(METRICS, "selection.json", "the decision: every candidate, its metrics and reason"),
        "model": Output(ONNX, "model.onnx", "the selected ONNX model", optional=True),
        "weights": Output("onnx_data", "model.onnx_data", "its external weights, when it has them", optional=True),
        "engine": Output(ENGINE, "model.engine", "the selected engine", optional=True),
        "provenance": Output(METRICS, "engine.json", "the selected engine's provenance", optional=True),
    },
    gate=gate,
    resources=_resources,
    preload=("onnx", "numpy"),
)
