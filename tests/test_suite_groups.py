"""The suite's own scheduling: under CI's `pytest -n 2 --dist loadgroup`, the tests of one ``xdist_group`` run on one
worker, so a grouped module's module-scoped fixture (the quickstart run, the init projects) is made once per run.
pytest 9.2 with pytest-xdist 3.8 silently ignored the groups (pytest-dev/pytest-xdist#1386); tests/conftest.py's
`_restore_xdist_groups` puts them back, and this test fails if they are lost again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from tests.conftest import _restore_xdist_groups


def pytest_collection_modifyitems(config, items):
    _restore_xdist_groups(config, items)
"""

GROUPED = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("one")
MADE = []


@pytest.fixture(scope="module")
def made():
    MADE.append(os.environ["PYTEST_XDIST_WORKER"])
    with open("made.txt", "a") as out:
        out.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
    return MADE


@pytest.mark.parametrize("case", ["a", "b@c", "d", "e", "f", "g"])
def test_grouped(made, case):
    assert made
"""


def test_a_grouped_module_runs_on_one_worker_and_makes_its_fixture_once(tmp_path):
    pytest.importorskip("xdist")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_other.py").write_text("".join(f"def test_{i}():\n    pass\n\n\n" for i in range(12)))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "loadgroup", "-v"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    grouped = [line for line in proc.stdout.splitlines() if "PASSED test_grouped.py" in line]
    assert len(grouped) == 6 and all(line.rstrip().endswith("@one") for line in grouped), proc.stdout
    assert len({line.split("]")[0] for line in grouped}) == 1, proc.stdout  # one worker ("[gw0]")
    assert len((tmp_path / "made.txt").read_text().split()) == 1  # the module fixture made once
