"""The summaries that cross a seam (`trtflow.summaries`) are what the stages build and all the reports read.

The stages' real summaries (a benchmark and a validation run on a tiny real model, a selection decided on their
files, top kernels of a real kernel record) are checked against their declared types, so a key renamed in a stage
fails here; and every key the decision and kernel reports read is declared there (or built by the report itself),
so a key the report reads cannot go undeclared. The pinned baselines' readers (`measure.judging.baseline`) take
the same declared types.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from typing_extensions import is_typeddict

from trtflow import summaries
from trtflow.storage.records import benchmark_of, selection_of
from trtflow.summaries import (
    BenchmarkSummary,
    CandidatePerformance,
    KernelRow,
    SelectionSummary,
    ValidateSummary,
    problems,
)
from trtflow.testing import run_stage
from trtflow_stages import benchmark, validate
from trtflow_stages.decision.candidates import Candidate, accuracy_of, performance_of
from trtflow_stages.decision.params import Params
from trtflow_stages.decision.selection import decide
from trtflow_stages.measure.timing.kernel_profile import summarize, top_kernels

SHORT = {"warmup_ms": 5, "min_iterations": 5, "min_duration_s": 0.0}
REPORT = Path(__file__).parents[2] / "trtflow" / "report"


@pytest.fixture(scope="module")
def measured(tiny_mlp_onnx, tmp_path_factory):
    """A real benchmark (batch 1 and 2) and a real validation of the tiny MLP against itself."""
    folder = tmp_path_factory.mktemp("summaries")
    bench = run_stage(benchmark.stage, {**SHORT, "shapes": {"input": [1, 16]}, "batch_sizes": [1, 2]},
                      {"model": tiny_mlp_onnx}, workdir=folder / "benchmark")
    check = run_stage(validate.stage, {"data": {"random": {"seed": 3, "num_samples": 4}}, "batch_size": 2},
                      {"candidate": tiny_mlp_onnx, "reference": tiny_mlp_onnx}, workdir=folder / "validate")
    return bench, check


@pytest.fixture(scope="module")
def selection(measured) -> SelectionSummary:
    bench, check = measured
    benchmark_json = json.loads(bench.outputs["metrics"].read_text())
    validate_json = json.loads(check.outputs["metrics"].read_text())
    candidates = [Candidate(name, "onnx", size, "fp32", validation=dict(accuracy_of(validate_json, f"v-{name}")),
                            benchmark=dict(performance_of(benchmark_json, f"b-{name}")))
                  for name, size in (("fp32", 4_000_000), ("copy", 3_000_000))]
    return decide(candidates, Params.model_validate({"baseline": "fp32"}),
                  baseline={"name": "fp32", **performance_of(benchmark_json, "b-fp32")})


def test_a_real_benchmark_summary_has_what_its_readers_read(measured):
    summary = measured[0].summary
    assert problems(summary, BenchmarkSummary) == []
    assert benchmark_of(summary) is summary


def test_a_real_validate_summary_has_what_its_readers_read(measured):
    summary = measured[1].summary
    assert problems(summary, ValidateSummary) == []
    assert all(isinstance(o["cosine_similarity"], float) for o in summary["outputs"].values())


def test_a_real_selection_has_what_the_report_reads(selection):
    assert problems(selection, SelectionSummary) == []
    assert selection_of(selection) is selection and selection["selected"] in ("fp32", "copy")
    row = selection["candidates"][0]
    assert problems(row["benchmark"], CandidatePerformance) == []
    assert isinstance((row["validation"] or {}).get("cosine_similarity"), float)


def test_top_kernels_of_a_kernel_record_are_kernel_rows():
    record = {"iterations": 4, "kernels": summarize({"gemm": [10.0, 12.0, 11.0], "relu": [1.0, 1.5]})}
    rows = top_kernels(record)
    assert [row["name"] for row in rows] == ["gemm", "relu"]
    assert problems(rows, list[KernelRow]) == []


def test_a_renamed_key_fails_with_its_path(selection, measured):
    renamed = json.loads(json.dumps(selection))
    validation = renamed["candidates"][1]["validation"]
    validation["cosine"] = validation.pop("cosine_similarity")
    assert problems(renamed, SelectionSummary) == ["candidates.1.validation.cosine_similarity: Field required"]
    bench = json.loads(json.dumps(measured[0].summary))
    bench["points"][0]["p50_ms"] = bench["points"][0].pop("median_ms")
    assert problems(bench, BenchmarkSummary) == ["points.0.median_ms: Field required"]
    bench["points"][0]["median_ms"] = "fast"
    assert problems(bench, BenchmarkSummary)[0].startswith("points.0.median_ms: Input should be a valid number")


def _declared_keys() -> set[str]:
    keys: set[str] = set()
    for value in vars(summaries).values():
        if isinstance(value, type) and is_typeddict(value):
            keys |= set(value.__annotations__)
    return keys


#: Keys of the run's data around each node's summary (`report.documents.collect`), not of a stage's summary.
RUN_DATA = {"nodes", "node", "summary"}


def _keys(path: Path) -> tuple[set[str], set[str]]:
    """(keys read, keys built) by string literal in one report module: ``x["k"]``, ``x.get("k")`` read one;
    a dict literal or ``dict(..., k=...)`` builds one."""
    read, built = set(), set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str) and isinstance(node.ctx, ast.Load):
            read.add(node.slice.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            read.add(node.args[0].value)
        elif isinstance(node, ast.Dict):
            built |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            built |= {k.arg for k in node.keywords if k.arg}
    return read, built


@pytest.mark.parametrize("module", ["decision.py", "kernels.py"])
def test_every_key_the_report_reads_of_a_summary_is_declared(module):
    read, built = _keys(REPORT / module)
    undeclared = read - _declared_keys() - built - RUN_DATA
    assert not undeclared, f"report/{module} reads {sorted(undeclared)}: declare them in trtflow/summaries.py"
