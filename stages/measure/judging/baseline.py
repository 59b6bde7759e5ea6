"""Pinned baselines: a recipe's artifacts and measurements in a file that is committed, and what gates read of it.

Comparing with the previous run lets a slow drift under the threshold pass run after run; a pinned baseline does
not move until someone pins a new one. ``trtflow baseline pin RECIPE`` writes, per benchmark and validate node,
the latency and throughput of each measured point, the accuracy figures, the facts of the machine that measured
them (GPU, CPU, driver, TensorRT / ONNX Runtime / PyTorch versions), and, for a benchmark node, its *artifact*:
the digests of the model it measured with what it needs to run (external weights, engine.json, the code of a
``python:`` model factory), kept in the store by a pin (`trtflow.storage.pins`), and the node's params.

A benchmark gated on the file re-measures that artifact beside the candidate (paired A/B, `Stage.reference`):
drift between runs cancels. Where the artifact cannot be laid out or run here, the stored figures are compared,
and they are refused, with the reason, when the hardware or the runtime differs: timings from another GPU or
another TensorRT version say nothing about a regression (pin a new baseline on the new machine instead).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trtflow.stage import Pin, RecipeError
from trtflow.summaries import BenchmarkSummary, ValidateSummary

FORMAT = "trtflow-baseline/1"
#: Facts that must match for timings to be comparable: the hardware that did the work and the runtime.
TIMING_FACTS_GPU = ("gpu", "tensorrt", "tensorrt_rtx")
TIMING_FACTS_CPU = ("cpu",)
RUNTIME_FACT = {"onnxruntime": "onnxruntime", "torch": "torch"}
#: Facts that must match for accuracy figures to be comparable (an engine's numerics follow GPU and TensorRT).
ACCURACY_FACTS = ("gpu", "tensorrt", "tensorrt_rtx")


#: What a baseline keeps of each point's uncertainty, so that gates weigh the noise of both sides.
POINT_UNCERTAINTY = ("queries", "latency_ci_ms", "throughput_ci_qps", "open_intervals", "converged",
                     "cpu_wait_ms_per_query")


# -- what a baseline holds ------------------------------------------------------------------------------------
def benchmark_entry(summary: BenchmarkSummary, facts: Mapping[str, str],
                    artifact: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A benchmark node's entry: its points with their uncertainty, its machine's facts and its pinned artifact
    (``artifact``: {identity, artifact: `Pin.describe`}, from `trtflow.api.pin_latest`)."""
    entry = {
        "stage": "benchmark",
        "backend": summary.get("backend"),
        "device": summary.get("device"),
        "repeats": summary.get("repeats", 1),
        "facts": dict(facts),
        "points": [
            {"batch_size": p.get("batch_size"), "streams": p.get("streams", 1),
             "latency_ms": p.get("latency_ms") or {"p50": p.get("median_ms"), "p99": p.get("p99_ms")},
             "throughput_qps": p.get("throughput_qps"),
             **{key: value for key, value in p.items() if key in POINT_UNCERTAINTY}}
            for p in summary.get("points", []) if isinstance(p, Mapping)
        ],
        "load": [dict(p) for p in summary.get("load", []) if isinstance(p, Mapping)],
    }
    levels = [generation_entry(level) for level in summary.get("generation") or [] if isinstance(level, Mapping)]
    if levels:
        entry["generation"] = levels
    if artifact:
        entry["artifact"] = dict(artifact["artifact"])
        entry["identity"] = artifact["identity"]
        entry["params"] = dict(artifact.get("params") or {})
    return entry


#: What a baseline keeps of a generation level (`measure.serving.generation`): what its gates judge.
GENERATION_KEPT = ("concurrency", "requests", "ttft_ms", "tpot_ms", "output_tokens_per_s", "cpu_wait_share",
                   "unmeasurable", "flags")


def generation_entry(level: Mapping[str, Any]) -> dict[str, Any]:
    return {key: level[key] for key in GENERATION_KEPT if key in level}


def validate_entry(summary: ValidateSummary, facts: Mapping[str, str],
                   artifact: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {
        "stage": "validate",
        "facts": dict(facts),
        "passed": summary.get("passed"),
        "outputs": {name: dict(values) for name, values in (summary.get("outputs") or {}).items()},
        "task_metrics": dict(summary.get("task_metrics") or {}),
    }


ENTRY_MAKERS = {"benchmark": benchmark_entry, "validate": validate_entry}


def make_baseline(recipe: str, results: Mapping[str, Mapping[str, Any]],
                  artifacts: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """A baseline document from `trtflow.api.latest_results` (per node: stage, summary, facts) and the pinned
    artifacts of its benchmark nodes (`trtflow.api.pin_latest`)."""
    nodes = {}
    for name, result in sorted(results.items()):
        maker = ENTRY_MAKERS.get(str(result.get("stage")))
        if maker is not None and result.get("summary"):
            nodes[name] = maker(result["summary"], result.get("facts") or {}, (artifacts or {}).get(name))
    return {"format": FORMAT, "recipe": recipe, "saved": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "nodes": nodes}


def read_baseline(path: Path) -> dict[str, Any]:
    """The baseline file at ``path``, read bounded and checked against its declared type (`records.BASELINE`)."""
    from trtflow.storage import records
    from trtflow.userfiles import read_file

    try:
        document = records.parse(records.BASELINE, read_file(path, records.BASELINE.limits.bytes), str(path))
    except FileNotFoundError:
        raise RecipeError(f"baseline file {path} does not exist", field="baseline",
                          hint="pin one with `trtflow baseline pin RECIPE -o FILE` and commit it") from None
    except records.Damaged as error:
        if error.typed and isinstance(error.value, dict) and error.value.get("format") != FORMAT:
            document = error.value  # another format: said below
        else:
            raise RecipeError(error.message, field="baseline", hint=error.hint) from None
    except (OSError, ValueError) as error:
        raise RecipeError(f"cannot read baseline file {path}: {error}", field="baseline") from error
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise RecipeError(f"{path} is not a trtflow baseline (format {document.get('format')!r} where "
                          f"{FORMAT!r} was expected)" if isinstance(document, dict) else
                          f"{path} is not a trtflow baseline", field="baseline",
                          hint="pin one with `trtflow baseline pin RECIPE -o FILE`")
    return document


def baseline_node(document: Mapping[str, Any], stage: str, node: str | None, path: Path) -> dict[str, Any]:
    """The entry of ``node`` (or the only ``stage`` node when ``node`` is None) in a baseline document."""
    nodes = document.get("nodes") or {}
    if node is not None:
        entry = nodes.get(node)
        if entry is None:
            raise RecipeError(f"baseline {path} has no node {node!r}; it has {sorted(nodes) or 'none'}",
                              field="baseline_node", hint="save the baseline again after running that node")
        return entry
    candidates = [name for name, entry in nodes.items() if entry.get("stage") == stage]
    if len(candidates) != 1:
        raise RecipeError(f"baseline {path} has {len(candidates)} {stage} nodes ({', '.join(candidates) or 'none'}): "
                          "name the one to compare with", field="baseline_node",
                          hint="set baseline_node: <node name in the baseline file>")
    return nodes[candidates[0]]


# -- comparability --------------------------------------------------------------------------------------------
def timing_facts(backend: str | None, device: str | None) -> tuple[str, ...]:
    hardware = TIMING_FACTS_CPU if device == "cpu" else TIMING_FACTS_GPU
    runtime = RUNTIME_FACT.get(str(backend))
    return hardware + ((runtime,) if runtime else ())


def differences(recorded: Mapping[str, str], current: Mapping[str, str], keys: tuple[str, ...]) -> list[str]:
    """``"gpu: A -> B"`` for each fact in ``keys`` that either side records and the two disagree on."""
    found = []
    for key in keys:
        old, new = recorded.get(key), current.get(key)
        if (old is not None or new is not None) and old != new:
            found.append(f"{key}: {old or 'unset'} -> {new or 'unset'}")
    return found


def _refusal(what: str, path: Path, changed: list[str]) -> str:
    return (f"not compared with baseline {path}: the {what} was recorded on another setup ({'; '.join(changed)}); "
            "timings and numerics from other hardware or another runtime version say nothing about a regression. "
            "Pin a new baseline on this machine (`trtflow baseline pin RECIPE`) and commit it")


# -- comparisons ----------------------------------------------------------------------------------------------
def timing_refusal(entry: Mapping[str, Any], summary: Mapping[str, Any], facts: Mapping[str, str],
                   path: Path) -> str | None:
    """Why the stored figures of a benchmark entry cannot be compared with ``summary`` (another GPU, CPU or
    runtime version), or None."""
    changed = differences(entry.get("facts") or {}, facts, timing_facts(summary.get("backend"),
                                                                       summary.get("device")))
    return _refusal("benchmark", path, changed) if changed else None


def artifact_identity(entry: Mapping[str, Any]) -> str | None:
    """The identity of the artifact a benchmark entry pins (None: it pins none, or not readably)."""
    pin = Pin.from_dict(entry.get("artifact"))
    return pin.identity if pin is not None else None


def compare_accuracy(baseline: Mapping[str, Any], summary: Mapping[str, Any], facts: Mapping[str, str],
                     path: Path, max_cosine_drop: float = 1e-3, max_error_increase_percent: float = 10.0,
                     max_task_metric_drop: float = 0.01) -> list[str]:
    """Failures of a validate summary against its baseline entry: per output, cosine similarity more than
    ``max_cosine_drop`` below the baseline's or max/mean absolute error more than ``max_error_increase_percent``
    above it; per task metric, more than ``max_task_metric_drop`` below it."""
    changed = differences(baseline.get("facts") or {}, facts, ACCURACY_FACTS)
    if changed:
        return [_refusal("accuracy", path, changed)]
    failures = []
    recorded = baseline.get("outputs") or {}
    for name, now in (summary.get("outputs") or {}).items():
        old = recorded.get(name)
        if old is None:
            failures.append(f"{name}: baseline {path} has no such output; save the baseline again")
            continue
        new_cos, old_cos = now.get("cosine_similarity"), old.get("cosine_similarity")
        if isinstance(new_cos, (int, float)) and isinstance(old_cos, (int, float)) and \
                old_cos - new_cos > max_cosine_drop:
            failures.append(f"{name}: cosine similarity {new_cos:.6g} is {old_cos - new_cos:.3g} below the "
                            f"baseline's {old_cos:.6g} (max_cosine_drop {max_cosine_drop:g})")
        for key in ("max_abs_error", "mean_abs_error"):
            new, base = now.get(key), old.get(key)
            if isinstance(new, (int, float)) and isinstance(base, (int, float)) and base > 0:
                change = (new / base - 1.0) * 100.0
                if change > max_error_increase_percent:
                    failures.append(f"{name}: {key} {new:.4g} is {change:.1f}% above the baseline's {base:.4g} "
                                    f"(max_error_increase_percent {max_error_increase_percent:g})")
    old_metrics = baseline.get("task_metrics") or {}
    for metric, value in (summary.get("task_metrics") or {}).items():
        base = old_metrics.get(metric)
        if isinstance(value, (int, float)) and isinstance(base, (int, float)) and base - value > max_task_metric_drop:
            failures.append(f"task metric {metric}: {value:.4g} is {base - value:.3g} below the baseline's "
                            f"{base:.4g} (max_task_metric_drop {max_task_metric_drop:g})")
    return failures


# -- gates ----------------------------------------------------------------------------------------------------
def baseline_entry(baseline: str, node: str | None, stage: str, resolve: Any,
                   own: str = "") -> tuple[dict[str, Any], Path]:
    """The entry of a node in the baseline file ``baseline`` (a recipe path, ``resolve``d) and the file's path:
    ``node`` names it, else the node's ``own`` name where the file has it, else the file's only ``stage`` node."""
    path = resolve(baseline) if resolve is not None else Path(baseline)
    document = read_baseline(path)
    if node is None and own and own in (document.get("nodes") or {}):
        node = own
    return baseline_node(document, stage, node, path), path


def baseline_reference(baseline: str | None, node: str | None, resolve: Any, name: str) -> dict[str, Any] | None:
    """What a benchmark node gated on ``baseline`` re-measures (`Stage.reference`): the artifact the file pins for
    it, with its params and figures; None when the file pins no artifact (an older file: stored figures only)."""
    if baseline is None:
        return None
    entry, path = baseline_entry(baseline, node, "benchmark", resolve, name)
    pin = Pin.from_dict(entry.get("artifact"))
    if pin is None:
        return None
    return dict(pin.describe(), record={"params": dict(entry.get("params") or {}), "points": entry.get("points", []),
                                        "generation": entry.get("generation") or [],
                                        "facts": dict(entry.get("facts") or {}), "baseline": str(path)})


def accuracy_gate(baseline: str | None, node: str | None, summary: Mapping[str, Any], gate_ctx: Any,
                  **tolerances: float) -> list[str]:
    """The validate stage's baseline gate (its one-line hook): no baseline, no failures; ``tolerances`` are
    `compare_accuracy`'s keyword arguments."""
    if baseline is None:
        return []
    entry, path = baseline_entry(baseline, node, "validate", gate_ctx.resolve, gate_ctx.node)
    return compare_accuracy(entry, summary, gate_ctx.facts, path, **tolerances)
