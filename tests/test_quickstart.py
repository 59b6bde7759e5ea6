"""The shipped quickstart, run for real with the `trtflow` CLI: it chooses among candidates and exports the choice
for Triton; its report decides; `trtflow init` on its exported model writes a recipe that runs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.checkout_guard import checkout_files
from tests.conftest import short_benchmarks, trtflow_cli

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = "pipelines/quickstart.yaml"  # as README prints it, run in a fresh checkout

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("quickstart")]


trtflow = trtflow_cli


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> Path:
    """A fresh checkout (the files git tracks, as they are in the working tree) where README's first command ran:
    `trtflow run pipelines/quickstart.yaml`. One run, shared by every test of this module (one xdist group)."""
    checkout = tmp_path_factory.mktemp("checkout")
    for source in checkout_files(REPO):
        if source.is_file() and not source.is_symlink():
            name = source.relative_to(REPO)
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, checkout / name)
    proc = trtflow("run", QUICKSTART, cwd=checkout)
    assert "13 built" in proc.stdout, proc.stdout
    return checkout


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


def test_init_on_the_exported_model_writes_a_recipe_that_runs(quickstart, tmp_path):
    (tmp_path / "model.onnx").write_bytes((quickstart / "build" / "quickstart" / "export" / "model.onnx").read_bytes())
    proc = trtflow("init", "model.onnx", "-o", "recipe.yaml", cwd=tmp_path)
    assert "WARNING: no --data given" in proc.stderr
    run = trtflow("run", "recipe.yaml", *short_benchmarks(tmp_path / "recipe.yaml"), cwd=tmp_path)
    assert "13 built" in run.stdout
    assert (tmp_path / "build" / "model" / "select" / "selection.json").is_file()
    assert (tmp_path / "build" / "model" / "triton" / "model" / "config.pbtxt").is_file()


#: README's commands that set the environment up rather than use trtflow: the tests run in that environment (CI
#: installs it as README says) and are the test suite itself. A new command of another kind fails the test below.
SETUP = ("python3 -m venv .venv", ". .venv/bin/activate", 'pip install -e ".[all,dev]"', "python -m pytest -q -n 2",
         'pip install -c constraints/known-good.txt -e ".[all,dev]"')


def readme_commands(text: str) -> list[str]:
    """Every command README prints, in its order: each line of a ```bash block (`&&` chains split, comments cut,
    a command quoted in a comment included), and each `$ ` line of a plain block."""
    commands: list[str] = []
    for block in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        quoted: list[str] = []  # what a comment says to run "then": after the block's own commands
        for line in block.group(2).splitlines():
            line = line.strip()
            if block.group(1) == "bash":
                code, _, comment = line.partition("#")
                commands += [c.strip() for c in code.split("&&") if c.strip()]
                quoted += re.findall(r"`(trtflow [^`]+)`", comment)
            elif line.startswith("$ "):
                commands.append(line[2:].strip())
        commands += quoted
    return commands


def test_every_readme_command_runs_as_printed(quickstart):
    """The new user's walk: each command README prints, run in a fresh checkout exactly as printed (a shell, the
    paths as written), after README's first command (the quickstart run this module shares)."""
    import importlib.util
    import os
    import sys

    commands = readme_commands((REPO / "README.md").read_text(encoding="utf-8"))
    assert commands[:4] == ["python3 -m venv .venv", ". .venv/bin/activate", 'pip install -e ".[all,dev]"',
                            "trtflow run pipelines/quickstart.yaml"]
    others = [c for c in commands if not c.startswith("trtflow ")]
    assert set(others) <= set(SETUP), f"README commands this test does not know how to run: {set(others) - set(SETUP)}"
    env = dict(os.environ, COLUMNS="200", TRTFLOW_STORE=str(quickstart / "store"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    outputs = {}
    for command in dict.fromkeys(c for c in commands if c.startswith("trtflow ")):
        proc = subprocess.run(["bash", "-c", command], cwd=quickstart, env=env, capture_output=True, text=True,
                              timeout=900)
        out = proc.stdout + proc.stderr
        if proc.returncode == 3 and "--check" in command and importlib.util.find_spec("otava") is None:
            assert "history" in out, out  # the nightly gate names the extra it needs ([all] installs it)
        elif proc.returncode == 5 and "--check" in command:  # README: undecided until each figure has --min-runs
            assert "history check undecided" in out and "fewer than --min-runs" in out, out
        else:
            assert proc.returncode == 0, f"`{command}` exited {proc.returncode}:\n{out}"
        assert "Traceback" not in out and "internal error" not in out, f"`{command}`:\n{out}"
        outputs[command] = proc.stdout
    # the report README's first block points at: the decision first, the history drawn, no script
    page = (quickstart / "report.html").read_text()
    assert page.count("<svg") >= 3 and "<script" not in page
    assert "Nothing to do: all 13 nodes are up to date" in outputs["trtflow run pipelines/quickstart.yaml"]
    markdown = subprocess.run(["bash", "-c", "trtflow report pipelines/quickstart.yaml"], cwd=quickstart, env=env,
                              capture_output=True, text=True).stdout
    assert markdown.index("## Decision") < markdown.index("## Nodes")
    assert re.search(r"\*\*Selected: (simplify|convert|quantize)\*\*: lowest p50 latency at batch 8", markdown)
    # what the new user tripped on (issue 35)
    assert "Removed outdated outputs" not in outputs["trtflow run pipelines/quickstart.yaml --rerun benchmark"]
    import yaml

    shown = yaml.safe_load(outputs["trtflow show pipelines/quickstart.yaml select"])
    assert shown["summary"]["selected"] and "summary" not in shown["last_run"]  # the summary once, no JSON copy
    assert (quickstart / "pipelines" / "baselines" / "quickstart.json").is_file()
    export = json.loads(subprocess.run(["bash", "-c", "trtflow show pipelines/quickstart.yaml export --json"],
                                       cwd=quickstart, env=env, capture_output=True, text=True).stdout)
    assert not export["summary"].get("warnings"), export["summary"]["warnings"]  # the quickstart warns of nothing
