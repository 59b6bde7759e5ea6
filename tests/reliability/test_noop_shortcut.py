"""The no-op shortcut of `trtflow run` (issue 19.4) keeps the cache promise: it answers "nothing to do" only while
nothing its record rests on has changed; any change sends the run through the planner, which decides.

Each change below is one a user makes between two runs: the recipe, its base, an environment variable it names,
a data file or folder, `python:` code (and a new module its imports now find), the stage's code, a fact, the
store. After each, the shortcut must step aside and the planner must rebuild exactly what the change touches.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.plugins import activate_in_process
from trtflow import api
from trtflow.execution.results import RunOptions
from trtflow.storage.store import Store

BASE = "defaults:\n  copy: {make: 'python:helpers.py:make'}\n"
RECIPE = """\
name: keyed
extends: base.yaml
nodes:
  - {name: one, stage: copy, params: {path: data.txt}}
  - {name: tree, stage: copy, params: {path: folder}}
  - {name: after, stage: synth, params: {text: "${GREETING:-hi}"}, inputs: {source: one}}
"""
HELPERS = ("try:\n    from extra import bonus\nexcept ImportError:\n    bonus = ''\n\n\n"
           "def make():\n    return 'm' + bonus\n")


def _inline() -> RunOptions:
    """Options of the in-process runs: the test plugins are importable in this process, not in node processes."""
    return RunOptions(jobs=2, executor="inline")


def _settle(*paths: Path) -> None:
    """Date files 10 s back: older than the stat cache's racy window, as files edited a while ago are."""
    old = time.time() - 10
    for path in paths:
        for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
            os.utime(p, (old, old))


@pytest.fixture
def project(tmp_path: Path, plugin_paths: list[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GREETING", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the inline executor imports the project's code here
    for module in ("extra", "helpers"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    (tmp_path / "data.txt").write_text("data")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.txt").write_text("a")
    (tmp_path / "helpers.py").write_text(HELPERS)
    _settle(*tmp_path.iterdir())
    yield tmp_path
    for module in ("extra", "helpers"):
        sys.modules.pop(module, None)


def _full(project: Path) -> dict[str, str]:
    _, _, summary = api.run(project / "recipe.yaml", store=project / "store", options=_inline())
    assert summary.ok, [(r.node, r.error) for r in summary.results.values()]
    return {n: r.status for n, r in summary.results.items()}


def _shortcut(project: Path) -> bool:
    summary = api.run_unchanged(project / "recipe.yaml", store=project / "store", options=_inline())
    if summary is not None:
        assert summary.ok and {r.status for r in summary.results.values()} == {"fresh"}
    return summary is not None


def _settled_again(project: Path) -> None:
    """The planner runs once more on the unchanged project and leaves a record: the shortcut is back."""
    assert set(_full(project).values()) == {"fresh"}
    assert _shortcut(project)


def _changed(project: Path, rebuilt: set[str]) -> None:
    assert not _shortcut(project), "the shortcut answered although something it rests on changed"
    statuses = _full(project)
    assert {n for n, s in statuses.items() if s == "done"} == rebuilt, statuses
    _settled_again(project)


def test_the_shortcut_steps_aside_for_every_change_that_matters(project: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(_full(project).values()) == {"done"}
    _settled_again(project)
    assert _shortcut(project), "nothing changed: the shortcut answers"

    (project / "data.txt").write_text("DATA")  # a data file the parameters name
    _settle(project / "data.txt")
    _changed(project, {"one", "after"})

    (project / "folder" / "b.txt").write_text("b")  # a file added to a folder the parameters name
    _settle(project / "folder")
    _changed(project, {"tree"})

    (project / "helpers.py").write_text(HELPERS.replace("'m'", "'n'"))  # the python: code
    _settle(project / "helpers.py")
    _changed(project, {"one", "tree", "after"})

    (project / "extra.py").write_text("bonus = '+'\n")  # a module the code's unchanged import now finds
    _settle(project / "extra.py", project)
    _changed(project, {"one", "tree", "after"})

    (project / "recipe.yaml").write_text(RECIPE.replace("text: ", "size: 100, text: "))  # the recipe
    _changed(project, {"after"})

    (project / "base.yaml").write_text(BASE.replace("helpers.py", "./helpers.py") + "# edited\n")  # its base
    _changed(project, set())  # the same code by another spelling: the planner finds the keys unchanged

    monkeypatch.setenv("GREETING", "hello")  # an environment variable the recipe names
    _changed(project, {"after"})

    monkeypatch.setenv("TRTFLOW_FACT_PYTHON", "3.99")  # a fact the stages declare
    _changed(project, {"one", "tree"})


def test_a_stage_whose_code_file_changed_is_judged_by_the_planner(
        project: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The stage's module is touched (same content, a new time): the shortcut steps aside, and the planner finds
    everything up to date. The module is this test's own (a stage registered from a folder of its own): touching a
    module of the source tree would send every other test process's shortcut aside while it ran (seen in CI), and
    the checkout guard (`tests/checkout_guard.py`) fails the test file after which a file of the checkout changed."""
    name = f"edited_{uuid.uuid4().hex[:12]}"
    plugins = tmp_path_factory.mktemp("edited_stage")
    module = plugins / f"{name}_stage.py"
    module.write_text("import dataclasses\n\nfrom trtflow_test_probe import copy_stage\n\n"
                      f"stage = dataclasses.replace(copy_stage, name={name!r})\n")
    info = plugins / f"{name}-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(f"[trtflow.stages]\n{name} = {name}_stage:stage\n")
    _settle(plugins)
    activate_in_process([str(plugins)])  # the fixture restores sys.path; the registry is cleared at the end
    try:
        (project / "recipe.yaml").write_text(f"name: edited\nnodes:\n  - {{name: one, stage: {name}, "
                                             "params: {path: data.txt}}\n")
        _settle(project / "recipe.yaml")
        _full(project)
        _settled_again(project)
        old = time.time() - 5  # a new time, still older than the stat cache's racy window
        os.utime(module, (old, old))
        assert not _shortcut(project)
        assert set(_full(project).values()) == {"fresh"}  # same content: the planner finds it up to date
    finally:
        sys.modules.pop(f"{name}_stage", None)
        from trtflow import registry

        registry.stage_entry_points.cache_clear()
        registry.get_stage.cache_clear()


def test_the_shortcut_steps_aside_when_the_store_lost_a_result(project: Path) -> None:
    _full(project)
    _settled_again(project)
    store = Store(project / "store")
    key = store.refs.current("recipe.yaml")["tree"]
    digest = store.read_manifest(key)["outputs"]["data"]["digest"]
    os.chmod(store.object_path(digest), 0o644)
    store.object_path(digest).unlink()  # as `trtflow verify --fix` does with a damaged object
    _changed(project, {"tree"})


def test_the_cli_takes_the_shortcut_restores_outputs_and_records_the_run(project: Path, trtflow) -> None:
    def run() -> str:
        proc = trtflow("run", "recipe.yaml", "--store", str(project / "store"), cwd=project)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    assert "3 built" in run()
    assert "Nothing to do: all 3 nodes are up to date" in run()  # the planner decides, and leaves a record
    (record,) = (project / "store" / "noop").iterdir()
    written = record.stat()
    output = project / "build" / "keyed" / "one" / "data.bin"
    output.unlink()
    assert "Nothing to do: all 3 nodes are up to date" in run()
    assert record.stat().st_ino == written.st_ino, "the planner ran: it rewrites the record"
    assert output.read_text() == "datam", "an output removed from build/ is put back, as the planner's path does"
    runs = json.loads(trtflow("status", "recipe.yaml", "--store", str(project / "store"), "--json",
                              cwd=project).stdout)
    assert [r["status"] for r in runs["runs"]][:3] == ["ok", "ok", "ok"], runs


def test_a_linked_noop_folder_is_never_written_through(project: Path, tmp_path_factory: pytest.TempPathFactory
                                                       ) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (project / "store").mkdir()
    (project / "store" / "noop").symlink_to(elsewhere)  # e.g. planted in a cloned repository's .trtflow
    _full(project)
    assert set(_full(project).values()) == {"fresh"}
    assert not _shortcut(project)
    assert list(elsewhere.iterdir()) == []
