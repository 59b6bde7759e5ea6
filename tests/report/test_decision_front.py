"""The decision in front, through the real `trtflow` command on a tiny CNN with two candidates (fp32, fp16): `run`
ends with what `select` chose and why (also when every node is up to date), `status` prints whole ids off a
terminal, `show` prints YAML or JSON, and reports of a no-op run give each reused result the time of the run that
built it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from tests.conftest import trtflow_cli, trtflow_in_process
from trtflow.report.decision import headline

#: one worker (CI: `--dist loadgroup`): the module-scoped front made once per run, not once per worker
pytestmark = pytest.mark.xdist_group("decision_front")

REPO = Path(__file__).resolve().parents[2]
trtflow = trtflow_cli

RECIPE = """
name: front
nodes:
  - name: export
    stage: export
    params:
      model: python:tiny_cnn.py:build
      inputs:
        input: {shape: [1, 3, 32, 32], dynamic_axes: {0: batch}}
      outputs: [logits]
  - name: simplify
    stage: simplify
  - name: convert
    stage: convert
    inputs: {model: simplify}
    params: {precision: fp16, calibration_data: {path: cnn_calib.npz}}
  - name: validate
    stage: validate
    matrix: {candidate: [simplify, convert]}
    inputs: {reference: export, candidate: "${{ matrix.candidate }}"}
    params:
      data: {path: cnn_calib.npz}
      tolerances: {check_error_stat: mean, atol: 0.05, rtol: 0.05, min_cosine_similarity: 0.99}
  - name: benchmark
    stage: benchmark
    matrix: {candidate: [simplify, convert]}
    inputs: {model: "${{ matrix.candidate }}"}
    params:
      backend: onnxruntime
      onnxruntime: {intra_op_threads: 1}
      shapes: {input: [1, 3, 32, 32]}
      batch_sizes: [1]
      min_duration_s: 0.1
  - name: select
    stage: select
    inputs: {candidates: [simplify, convert], validations: validate, benchmarks: benchmark}
    params: {finalists: {measure: false}}
"""


@pytest.fixture(scope="module")
def front(tmp_path_factory) -> dict:
    """The recipe run twice: built, then every node up to date."""
    cwd = tmp_path_factory.mktemp("front-with-a-long-folder-name-that-a-terminal-would-cut")
    shutil.copy(REPO / "examples" / "models" / "tiny_cnn.py", cwd)
    shutil.copy(REPO / "examples" / "data" / "cnn_calib.npz", cwd)
    (cwd / "recipe.yaml").write_text(RECIPE)
    first = trtflow("run", "recipe.yaml", cwd=cwd)
    again = trtflow("run", "recipe.yaml", cwd=cwd)
    selection = json.loads((cwd / "build" / "front" / "select" / "selection.json").read_text())
    return {"cwd": cwd, "first": first.stdout, "again": again.stdout, "selection": selection}


def _decision_line(stdout: str) -> str:
    lines = stdout.splitlines()
    [line] = [line for line in lines if line.startswith("select: ")]
    return line


def test_run_ends_with_what_select_chose_why_and_the_benchmarks_flags(front):
    selection = front["selection"]
    line = _decision_line(front["first"])
    lines = front["first"].splitlines()
    done = next(i for i, text in enumerate(lines) if text.startswith("Done in"))
    assert lines[done + 1] == line and lines[done + 2].startswith("Outputs in")
    winner = selection["selected"]
    reason = next(c["reason"] for c in selection["candidates"] if c["name"] == winner)
    assert line.startswith(f"select: chose {winner}: ") and reason.removeprefix("selected: ") in line
    assert "lowest p50 latency at batch 1" in line and re.search(r"ms \[[0-9.]+, [0-9.]+\]", line)  # the interval
    assert line == headline("select", selection)
    for candidate in selection["candidates"]:  # every flag its benchmarks raised is named, with the benchmark
        for flag in {f for p in candidate["benchmark"]["points"] for f in p["flags"]}:
            assert f"{candidate['benchmark']['node']} " in line and f"{flag} (batch 1)" in line
    flagged = any(p["flags"] for c in selection["candidates"] for p in c["benchmark"]["points"])
    assert ("benchmarks flagged:" in line) == flagged


def test_a_run_with_every_node_up_to_date_still_shows_the_decision(front):
    assert "Nothing to do: all 8 nodes are up to date" in front["again"]
    assert _decision_line(front["again"]) == _decision_line(front["first"])


def test_status_off_a_terminal_prints_whole_run_ids_and_recipe_names(front):
    cwd = front["cwd"]
    runs = json.loads(trtflow_in_process("status", "--json", cwd=cwd).stdout)["runs"]
    env = dict(os.environ, COLUMNS="40", TRTFLOW_STORE=str(cwd / "store"))
    text = subprocess.run([sys.executable, "-m", "trtflow.cli", "status"], cwd=cwd, capture_output=True, text=True,
                          env=env, check=True).stdout
    assert "…" not in text
    for run in runs:
        assert run["id"] in text and (run["recipe_id"] or run["recipe"]) in text
    assert str(cwd / "recipe.yaml") in text  # longer than the 40 columns the environment claims


def test_show_prints_yaml_or_json_never_python_reprs(front):
    cwd = front["cwd"]
    as_yaml = trtflow_in_process("show", "recipe.yaml", "select", cwd=cwd).stdout
    as_json = json.loads(trtflow_in_process("show", "--format", "json", "recipe.yaml", "select", cwd=cwd).stdout)
    as_json_flag = trtflow_in_process("show", "--json", "recipe.yaml", "select", cwd=cwd).stdout
    assert yaml.safe_load(as_yaml) == as_json == json.loads(as_json_flag)
    assert as_json["summary"]["selected"] == front["selection"]["selected"]
    assert "{'" not in as_yaml and "Pretty" not in as_yaml
    bad = trtflow_in_process("show", "--format", "xml", "recipe.yaml", "select", cwd=cwd, check=2)
    assert "expected yaml or json" in bad.stderr


def test_reports_after_a_no_op_run_give_the_time_of_the_run_that_built_each_result(front):
    cwd = front["cwd"]
    data = json.loads(trtflow_in_process("report", "-f", "json", "recipe.yaml", cwd=cwd).stdout)
    first_run = json.loads(trtflow_in_process("status", "--json", "--runs", "2", cwd=cwd).stdout)["runs"][1]["id"]
    assert data["run"]["id"] != first_run
    for node in data["nodes"]:
        assert node["status"] == "fresh" and node["built_in_run"] == first_run
        assert node["duration"] > 0 and not node["run_duration"]
    markdown = trtflow_in_process("report", "recipe.yaml", cwd=cwd).stdout
    export = next(n for n in data["nodes"] if n["node"] == "export")
    assert f"| export | export | fresh | {export['duration']:.1f}s | up to date (reused from run {first_run}" \
        in markdown
    suite = ET.fromstring(trtflow_in_process("report", "-f", "junit", "recipe.yaml", cwd=cwd).stdout)
    for case in suite:
        node = next(n for n in data["nodes"] if n["node"] == case.get("name"))
        assert case.get("time") == f"{node['duration']:.3f}" != "0.000"
        assert case.find("properties/property[@name='reused_from_run']").get("value") == first_run
        assert f"reused: the result of run {first_run}" in case.find("system-out").text


def test_the_report_tells_the_candidates_cosine_similarities_apart(front):
    markdown = trtflow_in_process("report", "recipe.yaml", cwd=front["cwd"]).stdout
    cosines = {c["name"]: c["validation"]["cosine_similarity"] for c in front["selection"]["candidates"]}
    shown = {}
    for line in markdown[:markdown.index("## Nodes")].splitlines():  # the decision table
        cells = [cell.strip().strip("*") for cell in line.split("|")]
        if len(cells) > 5 and cells[1] in cosines:
            shown[cells[1]] = cells[5]
    assert set(shown) == set(cosines)
    assert (shown["simplify"] != shown["convert"]) == (cosines["simplify"] != cosines["convert"])
    for name, text in shown.items():
        assert float(text) == pytest.approx(cosines[name], abs=10 ** -(len(text.split(".")[1]) - 1))
