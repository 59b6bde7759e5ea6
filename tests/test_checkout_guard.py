"""The guard that keeps the checkout read-only to the suite (tests/checkout_guard.py) sees every kind of change to a
file of the checkout, a time put back included, and the suite runs it after every test file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checkout_guard import CheckoutGuard, checkout_files

REPO = Path(__file__).resolve().parent.parent


def _checkout(root: Path, git: bool) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "module.py").write_text("x = 1\n")
    (root / "README.md").write_text("readme\n")
    (root / "build").mkdir()
    (root / "build" / "output.bin").write_bytes(b"made by a run")
    if git:
        subprocess.run(["git", "init", "-q"], cwd=root, check=True)
        subprocess.run(["git", "add", "pkg", "README.md"], cwd=root, check=True)
    return root


@pytest.mark.parametrize("git", [True, False], ids=["git", "unpacked"])
def test_every_change_to_a_file_of_the_checkout_is_seen(tmp_path: Path, git: bool) -> None:
    root = _checkout(tmp_path / "checkout", git)
    assert sorted(str(p.relative_to(root)) for p in checkout_files(root)) == ["README.md", "pkg/module.py"]
    guard = CheckoutGuard(root)
    assert guard.changed() == []
    (root / "build" / "output.bin").write_bytes(b"a run's output is not the checkout")
    assert guard.changed() == []

    module = root / "pkg" / "module.py"
    before = module.stat()
    os.utime(module, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    os.utime(module, ns=(before.st_atime_ns, before.st_mtime_ns))  # the time put back: its status time changed
    assert guard.changed() == ["pkg/module.py"]
    assert guard.changed() == []  # taken again: one change is reported once

    module.write_text("x = 2\n")
    assert guard.changed() == ["pkg/module.py"]
    (root / "README.md").unlink()
    assert guard.changed() == ["README.md"]


def test_the_suite_runs_the_guard_after_every_test_file(request: pytest.FixtureRequest) -> None:
    conftest = sys.modules.get("conftest") or next(
        p for p in request.config.pluginmanager.get_plugins()
        if getattr(p, "__file__", "") == str(REPO / "tests" / "conftest.py"))
    assert isinstance(conftest._CHECKOUT, CheckoutGuard)
    assert REPO / "tests" / "conftest.py" in conftest._CHECKOUT.files
    assert request.config.pluginmanager.hook.pytest_runtest_teardown.get_hookimpls()
    assert any(impl.plugin is conftest for impl in request.config.pluginmanager.hook.pytest_runtest_teardown
               .get_hookimpls())
