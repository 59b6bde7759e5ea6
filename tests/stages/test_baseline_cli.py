"""`trtflow baseline pin` on a real run, and benchmark gates through the real runner: the pinned artifact re-measured
beside the candidate (paired A/B), the accepted reference of previous-run gating, stored figures as the labelled
fallback, and a gate that cannot decide failing with its own exit code (or warning, on request)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import trtflow_cli

#: one worker (CI: `--dist loadgroup`): the module-scoped pinned run made once per run, not once per worker
pytestmark = pytest.mark.xdist_group("baseline_cli")

REPO = Path(__file__).resolve().parents[2]

MODELS = """import torch
from torch import nn


def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4)).eval()


def bigger():  # 16 layers of 256: many times the work
    torch.manual_seed(0)
    layers = [nn.Linear(64, 256), nn.ReLU()]
    for _ in range(16):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(256, 4)).eval()
"""

RECIPE = """name: pinned
nodes:
  - name: export
    stage: export
    params: {model: 'python:m.py:%s', inputs: {input: {shape: [8, 64], dynamic_axes: {0: batch}}}}
  - name: bench
    stage: benchmark
    inputs: {model: export}
    params: {backend: onnxruntime, onnxruntime: {intra_op_threads: 1}, shapes: {input: [8, 64]},
             min_duration_s: 0.4, warmup_ms: 10, repeats: 4%s}
"""

trtflow = trtflow_cli
EXIT_INCONCLUSIVE = 5


def _recipe(tmp_path: Path, factory: str = "build", extra: str = "") -> Path:
    (tmp_path / "m.py").write_text(MODELS)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'pinned'\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE % (factory, extra))
    return recipe


@pytest.fixture(scope="module")
def pinned(tmp_path_factory) -> dict:
    """The recipe run, then pinned (`trtflow baseline pin`), once for this module: the project's folder, what pin
    printed, and the baseline file's text as pinned (each test that edits it writes its own copy)."""
    tmp_path = tmp_path_factory.mktemp("pinned")
    recipe = _recipe(tmp_path)
    refused = trtflow("baseline", "pin", str(recipe), cwd=tmp_path, check=1).stderr
    trtflow("run", str(recipe), cwd=tmp_path)
    pinned = trtflow("baseline", "pin", str(recipe), cwd=tmp_path).stdout
    return {"cwd": tmp_path, "refused": refused, "pinned": pinned,
            "document": (tmp_path / "baselines" / "pinned.json").read_text()}


def _verdicts(recipe: Path, cwd: Path) -> list[dict]:
    report = json.loads(trtflow("report", str(recipe), "-f", "json", cwd=cwd).stdout)
    return next(n for n in report["nodes"] if n["node"] == "bench")["summary"].get("verdicts", [])


@pytest.mark.slow
def test_pin_a_baseline_and_gate_on_its_artifact(pinned):
    tmp_path = pinned["cwd"]
    recipe = tmp_path / "r.yaml"
    assert "no benchmark or validate results" in pinned["refused"]  # before the first run
    path = tmp_path / "baselines" / "pinned.json"
    assert "wrote" in pinned["pinned"] and "baseline: baselines/pinned.json" in pinned["pinned"]
    assert "artifact" in pinned["pinned"] and "model.onnx" in pinned["pinned"]
    document = json.loads(pinned["document"])
    entry = document["nodes"]["bench"]
    assert document["format"] == "trtflow-baseline/1" and entry["artifact"]["inputs"]["model"]["file"] == "model.onnx"
    assert entry["facts"]["cpu"] and entry["params"]["backend"] == "onnxruntime"
    assert "artifact" in trtflow("baseline", "show", str(path), cwd=tmp_path).stdout
    assert list((tmp_path / "store" / "pins" / "pinned").glob("*.json"))  # kept by gc while pinned
    gc = trtflow("gc", cwd=tmp_path)
    assert gc.returncode == 0

    # gated on it: the pinned artifact enters the key (the pair is measured again) and is timed beside the candidate
    recipe.write_text(RECIPE % ("build", ",\n             baseline: baselines/pinned.json"))
    plan = json.loads(trtflow("plan", "--json", str(recipe), cwd=tmp_path).stdout)
    bench = next(step for step in plan if step["node"] == "bench")
    assert bench["status"] == "stale" and "the pinned reference artifact changed" in bench["reason"]
    run = trtflow("run", str(recipe), cwd=tmp_path, check=None)
    primary = [v for v in _verdicts(recipe, tmp_path) if v["primary"]]
    assert [v["basis"] for v in primary] == ["paired A/B"]
    # unchanged: a pass, or, where the host kept the benchmark waiting for a CPU half its time or more (a loaded
    # machine), unmeasurable (README's rule for paired verdicts too), said so; never a fail
    assert primary[0]["outcome"] == "pass" or (primary[0]["outcome"] == "inconclusive" and "unmeasurable" in
                                                primary[0]["reason"] and run.returncode == 5), primary[0]["reason"]
    assert primary[0]["pairs"] >= 8 and "fails a change of" in primary[0]["power"]

    # a model doing many times the work, gated on the same baseline: fails, naming the pairs
    recipe.write_text(RECIPE % ("bigger", ",\n             baseline: baselines/pinned.json"))
    failed = trtflow("run", str(recipe), cwd=tmp_path, check=1)
    assert "quality gate failed" in failed.stdout and "paired A/B" in failed.stdout

    # without its artifact (a baseline saved by an older trtflow), the stored figures decide, labelled; from
    # another CPU they are refused, saying why
    del entry["artifact"]
    entry["facts"]["cpu"] = "x86_64 Some Other CPU x64"
    path.write_text(json.dumps(document))
    refused = trtflow("run", str(recipe), cwd=tmp_path, check=1)
    assert "not compared with baseline" in refused.stdout and "Some Other CPU" in refused.stdout


@pytest.mark.slow
def test_previous_run_gating_compares_with_the_last_accepted_result(tmp_path):
    recipe = _recipe(tmp_path, extra=",\n             max_regression_percent: 10")
    trtflow("run", str(recipe), cwd=tmp_path)
    assert _verdicts(recipe, tmp_path) == []  # nothing accepted yet: this result becomes the reference
    accepted = list((tmp_path / "store" / "pins" / "accepted").rglob("*.json"))
    assert len(accepted) == 1
    first = json.loads(accepted[0].read_text())["record"]["key"]

    recipe.write_text(RECIPE % ("bigger", ",\n             max_regression_percent: 10"))
    failed = trtflow("run", str(recipe), cwd=tmp_path, check=1)
    assert "against the last accepted result's, beyond max_regression_percent 10" in failed.stdout
    # a failed result never becomes the reference: the next night still compares with the accepted one
    assert json.loads(accepted[0].read_text())["record"]["key"] == first


@pytest.mark.slow
def test_a_gate_that_cannot_decide_fails_with_its_own_exit_code_or_warns(pinned, tmp_path):
    """A pinned baseline without its artifact whose median is known only loosely (a wide interval): stored figures
    cannot tell the new run is within 10%, nor beyond. By default that fails the run with exit code 5 (JUnit: a
    failure of type inconclusive); with on_inconclusive: warn, the run succeeds and console and JUnit say so.
    The baseline is the module's pinned one (this machine's run, the recipe unchanged), copied here."""
    recipe = _recipe(tmp_path)
    path = tmp_path / "baselines" / "pinned.json"
    path.parent.mkdir()
    document = json.loads(pinned["document"])
    entry = document["nodes"]["bench"]
    del entry["artifact"]
    (point,) = entry["points"]
    median = point["latency_ms"]["p50"]
    point["latency_ci_ms"]["p50"] = [median / 20, median * 20]  # a baseline measured on a very noisy day
    point["throughput_ci_qps"] = [point["throughput_qps"] / 20, point["throughput_qps"] * 20]
    path.write_text(json.dumps(document))

    recipe.write_text(RECIPE % ("build", ",\n             baseline: baselines/pinned.json"))
    store = ("--store", str(tmp_path / "fresh"))  # measured again, against the baseline
    ran = trtflow("run", str(recipe), *store, cwd=tmp_path, check=EXIT_INCONCLUSIVE)
    assert "quality gate failed" in ran.stdout and "inconclusive" in ran.stdout
    assert "stored figures: drift between runs not cancelled" in ran.stdout
    junit = trtflow("report", str(recipe), *store, "-f", "junit", cwd=tmp_path).stdout
    assert 'failures="1"' in junit and 'type="inconclusive"' in junit
    markdown = trtflow("report", str(recipe), *store, cwd=tmp_path).stdout
    assert "## Gate verdicts" in markdown and "| bench | baseline baselines/pinned.json | batch 8 | **INCONCLUSIVE** " \
        "| stored figures |" in markdown

    recipe.write_text(RECIPE % ("build", ",\n             baseline: baselines/pinned.json, on_inconclusive: warn"))
    warned = trtflow("run", str(recipe), *store, cwd=tmp_path)  # re-judged (a gate param): exit 0
    assert "gate inconclusive" in warned.stdout and "on_inconclusive: warn" in warned.stdout
    junit = trtflow("report", str(recipe), *store, "-f", "junit", cwd=tmp_path).stdout
    assert 'failures="0"' in junit and '<property name="gate" value="inconclusive"/>' in junit
