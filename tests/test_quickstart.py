"""The shipped quickstart, run for real with the `trtflow` CLI: it chooses among candidates and exports the choice
for Triton; its report decides; `trtflow init` on its exported model writes a recipe that runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import trtflow_cli

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "pipelines" / "quickstart.yaml"

pytestmark = pytest.mark.slow


trtflow = trtflow_cli


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("quickstart")
    proc = trtflow("run", str(QUICKSTART), cwd=cwd)
    assert "13 built" in proc.stdout, proc.stdout
    return cwd


def test_selection_names_the_winner_and_why_each_other_lost(quickstart):
    out = quickstart / "build" / "quickstart"
    [path] = list(out.rglob("selection.json"))
    selection = json.loads(path.read_text())
    names = [c["name"] for c in selection["candidates"]]
    assert names == ["simplify", "convert", "quantize"] and selection["selected"] in names
    for candidate in selection["candidates"]:
        assert candidate["validation"]["node"] == f"validate-{candidate['name']}"
        assert candidate["benchmark"]["backend"] == "onnxruntime"
        assert {p["batch_size"] for p in candidate["benchmark"]["points"]} == {1, 4, 8}
        if candidate["name"] != selection["selected"]:
            assert candidate["reason"] and selection["selected"] in candidate["reason"]
    assert (path.parent / "model.onnx").read_bytes() == (out / selection["selected"] / "model.onnx").read_bytes()


def test_triton_repository_agrees_with_the_profile(quickstart):
    from google.protobuf import text_format

    from trtflow_stages.triton import model_config_module

    out = quickstart / "build" / "quickstart"
    [config_path] = list(out.rglob("config.pbtxt"))
    config = text_format.Parse(config_path.read_text(), model_config_module().ModelConfig())
    versions = [p for p in config_path.parent.iterdir() if p.is_dir() and p.name.isdigit()]
    assert [v.name for v in versions] == ["1"] and (versions[0] / "model.onnx").is_file()
    assert config.platform == "onnxruntime_onnx" and config.max_batch_size == 8  # profile batch1to8
    assert list(config.input[0].dims) == [3, 32, 32]
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    engine = json.loads((out / "build" / "engine.json").read_text())
    assert engine["backend"] == "tensorrt-rtx"


def test_reports_lead_with_the_decision(quickstart):
    markdown = trtflow("report", str(QUICKSTART), cwd=quickstart).stdout
    assert markdown.index("## Decision") < markdown.index("## Nodes")
    assert re.search(r"\*\*Selected: (simplify|convert|quantize)\*\*: lowest p50 latency at batch 8", markdown)
    trtflow("report", "-f", "html", "-o", "report.html", str(QUICKSTART), cwd=quickstart)
    page = (quickstart / "report.html").read_text()
    assert page.count("<svg") >= 3 and "<script" not in page
    again = trtflow("run", str(QUICKSTART), cwd=quickstart)
    assert "Nothing to do: all 13 nodes are up to date" in again.stdout


def test_init_on_the_exported_model_writes_a_recipe_that_runs(quickstart, tmp_path):
    (tmp_path / "model.onnx").write_bytes((quickstart / "build" / "quickstart" / "export" / "model.onnx").read_bytes())
    proc = trtflow("init", "model.onnx", "-o", "recipe.yaml", cwd=tmp_path)
    assert "WARNING: no --data given" in proc.stderr
    run = trtflow("run", "recipe.yaml", cwd=tmp_path)
    assert "13 built" in run.stdout
    assert (tmp_path / "build" / "model" / "select" / "selection.json").is_file()
    assert (tmp_path / "build" / "model" / "triton" / "model" / "config.pbtxt").is_file()
