"""End-to-end CLI tests: the real `trtflow` command on the shipped quickstart recipe, in a temp directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import trtflow_cli

#: one worker (CI: `--dist loadgroup`): the module-scoped built made once per run, not once per worker
pytestmark = pytest.mark.xdist_group("cli")

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "pipelines" / "quickstart.yaml"


trtflow = trtflow_cli


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The export -> simplify part of the quickstart, run once for the tests of this module."""
    cwd = tmp_path_factory.mktemp("cli")
    proc = trtflow("run", str(QUICKSTART), "simplify", cwd=cwd)
    assert "export" in proc.stdout and "done in" in proc.stdout
    assert (cwd / "build" / "quickstart" / "simplify" / "model.onnx").is_file()
    return cwd


def test_second_run_does_nothing(built):
    proc = trtflow("run", str(QUICKSTART), "simplify", cwd=built)
    assert "Nothing to do: all 2 nodes are up to date" in proc.stdout


def test_plan_json_and_changed_parameter(built):
    steps = json.loads(trtflow("plan", "--json", str(QUICKSTART), "simplify", cwd=built).stdout)
    assert [(s["node"], s["status"]) for s in steps] == [("export", "fresh"), ("simplify", "fresh")]
    assert {"node", "stage", "status", "reason"} <= set(steps[0])
    changed = json.loads(trtflow("plan", "--json", "--set", "nodes.export.params.opset=18", str(QUICKSTART),
                                 "simplify", cwd=built).stdout)
    assert changed[0]["status"] == "stale" and changed[0]["reason"] == "params.opset changed 17 -> 18"
    assert changed[1]["status"] == "stale"
    table = trtflow("plan", str(QUICKSTART), "simplify", cwd=built).stdout
    assert "fresh" in table and "2 nodes: 2 fresh, 0 stale" in table


def test_changing_one_parameter_reruns_only_that_node_and_downstream(built):
    proc = trtflow("run", "--set", "nodes.simplify.params.check_n=1", str(QUICKSTART), "simplify", cwd=built)
    assert "▶ simplify" in proc.stdout and "▶ export" not in proc.stdout
    assert "params.check_n changed 3 -> 1" in proc.stdout
    assert "1 built" in proc.stdout and "1 up to date" in proc.stdout


def test_show_status_report_verify(built):
    shown = json.loads(trtflow("show", "--json", str(QUICKSTART), "export", cwd=built).stdout)
    assert shown["status"] == "fresh" and shown["params"]["opset"] == 17 and shown["key"]
    assert shown["outputs"]["model"]["filename"] == "model.onnx" and shown["summary"]["checked"] is True
    assert shown["last_run"]["log_path"] is None or shown["last_run"]["status"] in ("done", "fresh")
    status = json.loads(trtflow("status", "--json", cwd=built).stdout)
    assert status["runs"] and status["runs"][0]["recipe"] == "quickstart"
    junit = trtflow("report", "-f", "junit", str(QUICKSTART), cwd=built).stdout
    suite = ET.fromstring(junit)
    assert suite.tag == "testsuite" and suite.get("failures") == "0"
    assert {case.get("name") for case in suite} >= {"export", "simplify"}
    markdown = trtflow("report", str(QUICKSTART), cwd=built).stdout
    assert "# trtflow report: quickstart" in markdown and "| export | export |" in markdown
    assert "checked on 2 objects" not in trtflow("verify", cwd=built).stdout
    assert "clean" in trtflow("verify", cwd=built).stdout


def test_schema_documents_stage_params(tmp_path):
    schema = json.loads(trtflow("schema", cwd=tmp_path).stdout)
    assert schema["title"] == "trtflow recipe"
    export_params = schema["$defs"]["export_params"]
    assert export_params["properties"]["opset"]["description"]
    assert any(b["if"]["properties"]["stage"]["const"] == "simplify" for b in schema["$defs"]["NodeSpec"]["allOf"])
    assert any(b["if"]["properties"]["stage"]["const"] == "synth" for b in schema["$defs"]["NodeSpec"]["allOf"])
    builtin = json.loads(trtflow("schema", "--builtin", cwd=tmp_path).stdout)
    assert all(b["if"]["properties"]["stage"]["const"] != "synth" for b in builtin["$defs"]["NodeSpec"]["allOf"])
    shipped = json.loads((REPO / "schema" / "recipe.schema.json").read_text())
    regenerate = "trtflow schema --builtin -o schema/recipe.schema.json"
    assert shipped == builtin, f"schema/recipe.schema.json is stale: run `{regenerate}`"


def test_doctor_lists_backends(tmp_path):
    info = json.loads(trtflow("doctor", "--json", cwd=tmp_path).stdout)
    backends = {b["backend"]: b for b in info["backends"]}
    assert set(backends) >= {"tensorrt", "tensorrt-rtx", "onnxruntime", "torch"}
    assert backends["onnxruntime"]["run"] is True
    assert {s["name"] for s in info["stages"]} >= {"export", "simplify"}


def test_recipe_error_exit_code_and_location(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nnodes:\n  - name: a\n    stage: exprot\n")
    proc = trtflow("plan", str(bad), cwd=tmp_path, check=2)
    assert "bad.yaml:4:12" in proc.stderr and "did you mean 'export'" in proc.stderr


def test_failing_factory_names_node_log_and_resume_command(tmp_path):
    (tmp_path / "broken.py").write_text("def build():\n    raise ValueError('weights missing')\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: broken\nnodes:\n  - name: export\n    stage: export\n    params:\n"
                      "      model: python:broken.py:build\n      inputs: {x: {shape: [1, 4]}}\n")
    proc = trtflow("run", str(recipe), cwd=tmp_path, check=1)
    assert "export" in proc.stdout and "ValueError: weights missing" in proc.stdout
    assert "log:" in proc.stdout and "export.log" in proc.stdout
    assert f"trtflow run {recipe}" in proc.stdout


def test_benchmark_regression_gate_uses_the_last_accepted_result(tmp_path):
    """A benchmark re-run after its input changed re-measures the node's last accepted model beside the new one."""
    (tmp_path / "m.py").write_text((REPO / "examples" / "models" / "tiny_mlp.py").read_text())
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "name: reg\nnodes:\n"
        "  - {name: export, stage: export, params: {model: 'python:m.py:build', inputs: {input: {shape: [1, 16]}}}}\n"
        "  - name: bench\n    stage: benchmark\n    inputs: {model: export}\n"
        "    params: {backend: onnxruntime, shapes: {input: [1, 16]}, min_duration_s: 0.2, warmup_ms: 20,\n"
        "             max_regression_percent: 0.001}\n")
    trtflow("run", str(recipe), cwd=tmp_path)
    # a different export (hidden width) is a different model: the benchmark re-runs beside the accepted one
    proc = trtflow("run", "--set", "nodes.export.params.factory_args.hidden=4096", str(recipe), cwd=tmp_path,
                   check=None)
    # about 2x slower: a failure (exit 1), unless a host too busy to measure (the other half of a parallel test
    # run, a CI neighbour) left the pairs undecided at their cap, which fails with exit 5 and says so
    # (tests/stages/test_gates.py checks the verdicts themselves on fixed pairs)
    assert proc.returncode in (1, 5), proc.stdout + proc.stderr
    assert "against the last accepted result's" in proc.stdout and "paired A/B" in proc.stdout
    if proc.returncode == 1:
        assert "quality gate failed" in proc.stdout and "beyond max_regression_percent 0.001" in proc.stdout
    else:
        assert "inconclusive" in proc.stdout


def test_a_registered_stage_that_cannot_be_imported_is_named_with_its_package(tmp_path):
    """A half-removed plugin (its entry point left behind) gives exit 3 and what to reinstall, not a traceback."""
    info = tmp_path / "plugins" / "broken_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[trtflow.stages]\nbroken = no_such_module_anywhere:stage\n")
    (tmp_path / "r.yaml").write_text("name: r\nnodes:\n  - {name: a, stage: broken}\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "plugins"), TRTFLOW_STORE=str(tmp_path / "store"))
    proc = subprocess.run([sys.executable, "-m", "trtflow.cli", "plan", "r.yaml"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "stage 'broken' is registered" in proc.stderr and "No module named" in proc.stderr
    assert "reinstall broken-plugin" in proc.stderr and "Traceback" not in proc.stderr
