"""Fixtures of the reliability tests: the test stages as plugins, and `trtflow` run as a real subprocess."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from .plugins import activate_in_process, subprocess_env, write_plugin_distribution


@pytest.fixture(scope="session")
def plugin_paths(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    paths = write_plugin_distribution(tmp_path_factory.mktemp("plugins"))
    activate_in_process(paths)
    return paths


@pytest.fixture(scope="session")
def plugin_env(plugin_paths: list[str]) -> dict[str, str]:
    return subprocess_env(plugin_paths)


TRTFLOW = [sys.executable, "-m", "trtflow.cli"]


@pytest.fixture
def trtflow_home(tmp_path: Path) -> Path:
    """The folder the `trtflow` fixture runs in: tmp_path (a module may name another, e.g. a project it restores)."""
    return tmp_path


@pytest.fixture
def trtflow(trtflow_home: Path, plugin_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess]:
    """Run `trtflow ARGS` in trtflow_home, tmp_path (store in trtflow_home/store unless --store is given); capture
    output."""

    def call(*args: str, timeout: float = 120, cwd: Path | None = None,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        argv = [*TRTFLOW, *args]
        if args and args[0] in ("run", "plan", "verify", "status", "show", "gc", "report") and "--store" not in args:
            argv += ["--store", str(trtflow_home / "store")]
        return subprocess.run(argv, cwd=cwd or trtflow_home, env=env or plugin_env, capture_output=True, text=True,
                              timeout=timeout)

    return call
