"""What `trtflow` imports on the commands users repeat most: an unchanged recipe's `trtflow run` (the no-op shortcut),
the same run planned, and `trtflow --help`. A deny-list per path: a module on it that one of these paths imports
fails here, naming the path and the modules, so a heavy import cannot creep back (typer 0.20+ imports pydantic to
coerce the arguments of every command: `run` and `plan` are click commands for that reason, `cli/run.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import trtflow_cli

#: Never imported by a no-op `trtflow run` that takes the shortcut.
HEAVY = {"torch", "onnx", "onnxruntime", "polygraphy", "modelopt", "tensorrt", "tensorrt_rtx", "numpy", "scipy",
         "transformers", "tensorflow", "ray", "fsspec", "s3fs", "jinja2"}
SHORTCUT_DENY = HEAVY | {"pydantic", "pydantic_core", "typer", "rich", "yaml", "trtflow_stages", "cryptography"}
#: Planning validates the recipe (stage params are pydantic models), so pydantic may load; the CLI layer may not;
#: nor, once a plan has checked the results' signatures, `cryptography` (`trtflow.storage.verified` remembers them).
PLANNING_DENY = HEAVY | {"typer", "rich", "cryptography"}
#: `--help` lists every command (typer and rich draw it) but loads no model library, no recipe schema and no
#: `cryptography` (`trtflow keys` is listed, not run).
HELP_DENY = HEAVY | {"pydantic", "pydantic_core", "cryptography"}

_IMPORTED = ("import runpy, sys\nsys.argv = ['trtflow', *sys.argv[1:]]\n"
             "try:\n    runpy.run_module('trtflow.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "print('MODULES', ' '.join(sorted({m.split('.')[0] for m in sys.modules})))")


def _imported(cwd: Path, *args: str, **env: str) -> set[str]:
    environ = dict(os.environ, TRTFLOW_STORE=str(cwd / "store"), **env)
    proc = subprocess.run([sys.executable, "-c", _IMPORTED, *args], cwd=cwd, capture_output=True, text=True,
                          env=environ, timeout=120)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("MODULES ")), None)
    assert line is not None, proc.stdout + proc.stderr
    return set(line.split()[1:])


@pytest.fixture(scope="module")
def unchanged(tmp_path_factory) -> Path:
    """A two-node recipe of the example plugin's cheap stage, run once (its no-op record left by the next run)."""
    folder = tmp_path_factory.mktemp("startup")
    (folder / "r.yaml").write_text("name: startup\nnodes:\n  - {name: a, stage: synth, params: {text: a}}\n"
                                   "  - {name: b, stage: synth, params: {text: b}, inputs: {source: a}}\n")
    trtflow_cli("run", "-q", "r.yaml", cwd=folder)
    return folder


def test_a_noop_run_that_takes_the_shortcut_imports_nothing_heavy(unchanged: Path) -> None:
    _imported(unchanged, "run", "-q", "r.yaml")  # plans, finds all up to date, leaves this command's no-op record
    modules = _imported(unchanged, "run", "-q", "r.yaml")
    assert "trtflow" in modules and "click" in modules
    assert not modules & SHORTCUT_DENY, f"the no-op run (shortcut) imports {sorted(modules & SHORTCUT_DENY)}"


def test_a_planned_noop_run_imports_no_cli_framework_beyond_click(unchanged: Path) -> None:
    _imported(unchanged, "run", "-q", "r.yaml", TRTFLOW_NO_SHORTCUT="1")  # checks the signatures (once)
    modules = _imported(unchanged, "run", "-q", "r.yaml", TRTFLOW_NO_SHORTCUT="1")
    assert "pydantic" in modules  # it did plan: the recipe was validated
    assert not modules & PLANNING_DENY, f"the planned no-op run imports {sorted(modules & PLANNING_DENY)}"


def test_help_imports_no_model_library_and_no_schema(tmp_path: Path) -> None:
    modules = _imported(tmp_path, "--help")
    assert "typer" in modules
    assert not modules & HELP_DENY, f"`trtflow --help` imports {sorted(modules & HELP_DENY)}"



_COLLECTOR = ("import gc, runpy, sys\nimport trtflow.execution.observers as o\nseen = []\n"
              "started = o.HooksObserver.node_started\n"
              "def node_started(self, start):\n    seen.append(gc.isenabled())\n    started(self, start)\n"
              "o.HooksObserver.node_started = node_started\nsys.argv = ['trtflow', *sys.argv[1:]]\n"
              "try:\n    runpy.run_module('trtflow.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
              "print('COLLECTOR', all(seen), len(seen), gc.isenabled())")


def test_nodes_run_with_the_cyclic_collector_on(tmp_path: Path) -> None:
    """Start-up loads with Python's cyclic collector off (cli/startup.py); it is on again for every node's start
    and after the command, whatever the command."""
    (tmp_path / "r.yaml").write_text("name: gc\nnodes:\n  - {name: a, stage: synth, params: {text: a}}\n"
                                     "  - {name: b, stage: synth, params: {text: b}, inputs: {source: a}}\n")
    for args in (("run", "-q", "r.yaml"), ("plan", "r.yaml"), ("status",), ("run", "-q", "missing.yaml")):
        proc = subprocess.run([sys.executable, "-c", _COLLECTOR, *args], cwd=tmp_path, capture_output=True,
                              text=True, env=dict(os.environ, TRTFLOW_STORE=str(tmp_path / "store")), timeout=120)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("COLLECTOR ")), None)
        assert line is not None, proc.stdout + proc.stderr
        nodes_on, nodes, on_after = line.split()[1:4]
        assert nodes_on == "True" and on_after == "True", (args, line)
        assert int(nodes) == (2 if args[0] == "run" and args[2] == "r.yaml" else 0), (args, line)


def test_a_forked_node_runs_with_the_collector_on_and_the_servers_objects_frozen(tmp_path: Path) -> None:
    """The fork server imports with the collector off and freezes what it holds before each fork; the node process
    turns the collector on before its stage runs."""
    import json

    from tests.reliability.plugins import subprocess_env, write_plugin_distribution

    (tmp_path / "r.yaml").write_text("name: forked\nnodes:\n  - {name: p, stage: probe, params: {gpus: 0}}\n")
    env = subprocess_env(write_plugin_distribution(tmp_path / "plugins"), dict(os.environ))
    proc = subprocess.run([sys.executable, "-m", "trtflow.cli", "run", "-q", "r.yaml"], cwd=tmp_path, env=dict(
        env, TRTFLOW_STORE=str(tmp_path / "store")), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = json.loads((tmp_path / "build" / "forked" / "p" / "devices.json").read_text())
    assert seen["gc_enabled"] is True and seen["gc_frozen"] > 10_000, seen


def test_the_collector_someone_else_turned_off_stays_off() -> None:
    import gc

    from trtflow.cli import startup

    frozen_before = gc.get_freeze_count()
    try:
        gc.disable()
        startup.collector_off()
        startup.collector_on()
        assert not gc.isenabled()
        gc.enable()
        startup.collector_off()
        assert not gc.isenabled()
        startup.collector_on()
        assert gc.isenabled() and gc.get_freeze_count() > frozen_before  # what start-up made: never scanned again
        startup.collector_on()  # once
        assert gc.isenabled()
    finally:
        gc.enable()
