"""Crash recovery (accuracy/recovery): a real ONNX Runtime crash, found and stepped around in child processes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.stages.ort_crasher import CRASH_OPTIONS, CULPRIT, crasher_model
from trtflow.errors import StageFailed
from trtflow.testing import run_stage
from trtflow_stages import convert, validate
from trtflow_stages.accuracy import recovery
from trtflow_stages.runtimes.ort import OrtOptions

#: one worker (CI: `--dist loadgroup`): the module-scoped crasher made once per run, not once per worker
pytestmark = pytest.mark.xdist_group("recovery")


@pytest.fixture(scope="module")
def crasher(tmp_path_factory) -> Path:
    path = crasher_model(tmp_path_factory.mktemp("crasher") / "model.onnx")
    first = recovery.probe(path, OrtOptions(**CRASH_OPTIONS))
    if first.ok:
        pytest.skip("this ONNX Runtime no longer crashes on the generated model (fixed upstream by PR #32407)")
    return path


def test_probe_reports_the_real_crash_without_dying(crasher):
    attempt = recovery.probe(crasher, OrtOptions(**CRASH_OPTIONS))
    assert attempt.crashed and attempt.outcome.startswith("crashed: SIG"), attempt
    assert recovery.probe(crasher, OrtOptions()).ok  # constant folding on: the pattern is folded away


def test_recover_finds_the_level_then_the_one_optimizer(crasher):
    found = recovery.recover(crasher, OrtOptions(**CRASH_OPTIONS))
    assert found.recovered
    assert found.options.graph_optimization_level == "all"
    assert found.options.disabled_optimizers == ["ConstantFolding", CULPRIT]
    outcomes = [(a.level, a.ok) for a in found.attempts]
    assert outcomes[:2] == [("all", False), ("layout", True)]  # the lower level first, then the optimiser
    record = found.record()
    assert record["recovered_from"].startswith("ONNX Runtime SIG") and "level all" in record["recovered_from"]
    assert record["tried"][0]["outcome"].startswith("crashed")
    assert CULPRIT in found.note()


def test_a_model_that_runs_costs_one_probe_and_is_left_as_asked(tiny_mlp_onnx):
    found = recovery.recover(tiny_mlp_onnx, OrtOptions())
    assert not found.recovered and found.attempts == []
    assert found.record() == {"onnxruntime": {"graph_optimization_level": "all", "disabled_optimizers": []}}


def test_an_error_is_not_a_crash_and_is_not_searched(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    found = recovery.recover(bad, OrtOptions())
    assert not found.recovered
    assert len(found.attempts) == 1 and found.attempts[0].outcome.startswith("error:")


def test_recorded_settings_narrow_the_recipe_options(tmp_path):
    (tmp_path / "convert.json").write_text(json.dumps({"runtime_settings": {"onnxruntime": {
        "graph_optimization_level": "layout", "disabled_optimizers": ["X"]}}}))
    merged = recovery.merge(OrtOptions(disabled_optimizers=["Y"]), recovery.recorded_settings(tmp_path / "m.onnx"))
    assert merged.graph_optimization_level == "layout" and merged.disabled_optimizers == ["Y", "X"]
    lower = recovery.merge(OrtOptions(graph_optimization_level="basic"),
                           recovery.recorded_settings(tmp_path / "m.onnx"))
    assert lower.graph_optimization_level == "basic"


def test_validate_runs_a_candidate_that_crashes_onnxruntime(crasher, tmp_path):
    reference = crasher_model(tmp_path / "reference.onnx", fp16_weight=False)
    result = run_stage(validate.stage, {"data": {"random": {"seed": 1, "num_samples": 4}}, "batch_size": 2,
                                        "onnxruntime": CRASH_OPTIONS},
                       {"reference": reference, "candidate": crasher}, workdir=tmp_path / "work")
    settings = result.summary["runtime_settings"]
    assert settings["candidate"]["onnxruntime"]["disabled_optimizers"] == ["ConstantFolding", CULPRIT]
    assert "recovered_from" in settings["candidate"] and "recovered_from" not in settings["reference"]
    assert result.summary["passed"], result.summary["failures"]


def test_the_search_fails_only_when_no_level_runs(monkeypatch, tmp_path):
    """The search itself, with the child's answers scripted (the crash is the real one's in the tests above)."""
    seen = []

    def probe(model, options, feed=None, timeout=0.0):
        seen.append(options.graph_optimization_level)
        return recovery.Attempt(options.graph_optimization_level, tuple(options.disabled_optimizers),
                                "crashed: SIGSEGV")

    monkeypatch.setattr(recovery, "probe", probe)
    with pytest.raises(StageFailed) as caught:
        recovery.recover(tmp_path / "m.onnx", OrtOptions())
    assert seen == list(recovery.LEVELS)
    assert "at every graph optimisation level" in caught.value.message
    assert "level disable: crashed: SIGSEGV" in caught.value.message


@pytest.mark.slow
def test_convert_keeps_the_fp16_model_and_records_what_runs(tiny_mlp_onnx, tmp_path, monkeypatch):
    """A crash in an optimiser of the extended level (the test hook: a real SIGSEGV in the probe child while
    that optimiser is enabled; ModelOpt's fp16 output of a tiny model does not crash ONNX Runtime by itself)."""
    optimizer = next(n for n in recovery.optimizers_at("extended") if n not in recovery.optimizers_at("basic"))
    monkeypatch.setenv(recovery.TEST_CRASH_ENV, f"{optimizer}@extended")
    result = run_stage(convert.stage, {}, {"model": tiny_mlp_onnx}, workdir=tmp_path)
    settings = result.summary["runtime_settings"]
    assert settings["onnxruntime"] == {"graph_optimization_level": "all", "disabled_optimizers": [optimizer]}
    assert [t["graph_optimization_level"] for t in settings["tried"][:4]] == ["all", "layout", "extended", "basic"]
    written = json.loads(result.outputs["summary"].read_text())
    assert written["runtime_settings"] == settings
    assert "note" in result.summary["onnxruntime_check"]
    # validate and benchmark read the settings from convert.json beside the model: no search there
    found = recovery.runtime_options(result.outputs["model"], OrtOptions())
    assert found.options.disabled_optimizers == [optimizer] and not found.recovered
    assert np.isfinite(result.summary["onnxruntime_check"]["non_finite_outputs"])


@pytest.mark.slow
def test_plan_and_show_say_what_was_recovered(crasher, tmp_path):
    from tests.conftest import trtflow_cli

    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "crasher.onnx").write_bytes(crasher.read_bytes())
    (tmp_path / "recipe.yaml").write_text(
        "name: crash\nnodes:\n"
        "  - {name: export, stage: export, params: {model: crasher.onnx}}\n"
        "  - name: validate\n    stage: validate\n    inputs: {reference: export, candidate: export}\n"
        "    params: {data: {random: {seed: 0, num_samples: 2}}, batch_size: 2,\n"
        "             onnxruntime: {disabled_optimizers: [ConstantFolding]}}\n")
    trtflow_cli("run", "recipe.yaml", cwd=tmp_path)  # the node's process survives: the crashes were in children
    plan = trtflow_cli("plan", "recipe.yaml", cwd=tmp_path).stdout
    assert "note: candidate model: ONNX Runtime SIG" in plan and CULPRIT in plan
    shown = trtflow_cli("show", "recipe.yaml", "validate", "--json", cwd=tmp_path).stdout
    settings = json.loads(shown)["summary"]["runtime_settings"]
    assert settings["candidate"]["onnxruntime"]["disabled_optimizers"] == ["ConstantFolding", CULPRIT]


def test_an_optimiser_error_is_searched_and_one_no_level_avoids_is_left_to_the_caller(monkeypatch, tmp_path):
    """The search for an error at session creation, with the child's answers scripted: an error at level all that
    layout avoids is recovered; one that every level gives is returned unrecovered (the caller raises it)."""
    def scripted(failing_levels):
        def probe(model, options, feed=None, timeout=0.0):
            level = options.graph_optimization_level
            outcome = "error: [ONNXRuntimeError] : 1 : FAIL : Exception during initialization" \
                if level in failing_levels and "Culprit" not in options.disabled_optimizers else "ok"
            return recovery.Attempt(level, tuple(options.disabled_optimizers), outcome)
        return probe

    monkeypatch.setattr(recovery, "optimizers_at", lambda level: ["Culprit"] if level == "all" else [])
    monkeypatch.setattr(recovery, "probe", scripted({"all"}))
    found = recovery.recover(tmp_path / "m.onnx", OrtOptions())
    assert found.recovered and found.options.disabled_optimizers == ["Culprit"]
    assert found.record()["recovered_from"].startswith("ONNX Runtime failed (error:")
    monkeypatch.setattr(recovery, "probe", scripted(set(recovery.LEVELS)))
    monkeypatch.setattr(recovery, "optimizers_at", lambda level: [])
    left = recovery.recover(tmp_path / "m.onnx", OrtOptions())
    assert not left.recovered and len(left.attempts) == len(recovery.LEVELS)
    assert left.options == OrtOptions()
