"""Make the test stages (`synth` from examples/plugin; `faulty`, `probe`, `copy` from faults_plugin) discoverable.

They are registered exactly as a third-party plugin is: a ``*.dist-info`` directory with an
``entry_points.txt`` in the ``trtflow.stages`` group, found on the Python path. This works whether or
not examples/plugin is pip-installed (CI installs only trtflow itself).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_PLUGIN = REPO / "examples" / "plugin"
FAULTS_PLUGIN = Path(__file__).resolve().parent / "faults_plugin"


def _installed_stage_names() -> set[str]:
    from importlib import metadata

    return {ep.name for ep in metadata.entry_points(group="trtflow.stages")}


def write_plugin_distribution(directory: Path) -> list[str]:
    """Write a dist-info registering the test stages into ``directory``; return the paths to put on sys.path."""
    directory.mkdir(parents=True, exist_ok=True)
    info = directory / "trtflow_reliability_plugins-0.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trtflow-reliability-plugins\nVersion: 0.0\n")
    lines = ["[trtflow.stages]", "faulty = trtflow_test_faults:stage", "probe = trtflow_test_probe:stage",
             "copy = trtflow_test_probe:copy_stage", "hold = trtflow_test_probe:hold_stage"]
    if "synth" not in _installed_stage_names():
        lines.append("synth = trtflow_example_plugin:stage")
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return [str(directory), str(FAULTS_PLUGIN), str(EXAMPLE_PLUGIN)]


def subprocess_env(paths: list[str], base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for `trtflow` subprocesses that sees the test stages."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["COLUMNS"] = "200"  # keep messages on one line so tests can match them
    env.pop("TRTFLOW_STORE", None)
    return env


def activate_in_process(paths: list[str]) -> None:
    """Put the test stages on this process's path and make the registry look again."""
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)
    importlib.invalidate_caches()
    from trtflow import registry

    registry.stage_entry_points.cache_clear()
    registry.get_stage.cache_clear()
