"""Every install is complete: the wheel built from this tree holds every module and data file of ``trtflow/`` and
``stages/`` (installed as ``trtflow_stages``), nothing else, and every entry point it declares.

A wheel built while pyproject.toml listed the packages by hand lacked ``trtflow.storage.remote``, so `trtflow run`
from a non-editable install ended with exit 70; an editable install (README's, CI's) hid it. Packages are found by
setup.py now; this test is what keeps any new sub-package, template or marker file from being left out again.
CI also installs the wheel into a clean environment and runs the quickstart from it (.ci/run).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
INSTALLED_AS = {"trtflow": "trtflow", "stages": "trtflow_stages"}  # source folder -> package in the wheel
BUILD_FILES = ("pyproject.toml", "setup.py", "README.md")  # what setuptools reads besides the package folders


def _source_files() -> list[str]:
    """The files of the package folders, as git sees them (tracked, and new ones not ignored), else on disk."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--",
                                 *INSTALLED_AS], cwd=REPO, capture_output=True, check=True, timeout=60).stdout
        files = [f for f in listed.decode().split("\0") if f and (REPO / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        files = [str(p.relative_to(REPO)) for folder in INSTALLED_AS for p in (REPO / folder).rglob("*") if p.is_file()]
    return sorted(f for f in files if "__pycache__" not in f and not f.endswith(".pyc"))


def _in_wheel(source: str) -> str:
    folder, _, rest = source.partition("/")
    return f"{INSTALLED_AS[folder]}/{rest}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel that `pip wheel .` makes of this tree, built from a copy (the build writes build/ and egg-info)."""
    work = tmp_path_factory.mktemp("wheel")
    tree = work / "tree"
    for source in _source_files():
        (tree / source).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / source, tree / source)
    for name in BUILD_FILES:
        shutil.copy2(REPO / name, tree / name)
    # The build backend of this environment (the dev extra holds setuptools): no download, no isolated env.
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(work / "dist"), str(tree)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheels = list((work / "dist").glob("trtflow-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as archive:
        yield archive


def test_the_wheel_holds_every_module_and_data_file_of_the_source_tree_and_nothing_else(wheel) -> None:
    expected = {_in_wheel(f) for f in _source_files()}
    shipped = {n for n in wheel.namelist() if not n.split("/", 1)[0].endswith(".dist-info")}
    assert expected, "no source files found"
    missing, extra = sorted(expected - shipped), sorted(shipped - expected)
    assert not missing, ("files of the source tree missing from the wheel (a folder without __init__.py? a data file "
                         f"not in [tool.setuptools.package-data]?): {missing}")
    assert not extra, f"files in the wheel that the source tree does not have: {extra}"
    assert {"trtflow/py.typed", "trtflow/storage/remote/__init__.py", "trtflow_stages/__init__.py"} <= shipped
    assert any(n.startswith("trtflow/report/templates/") and n.endswith(".j2") for n in shipped)


def test_every_entry_point_of_the_wheel_names_a_module_it_holds(wheel) -> None:
    info = next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    targets = re.findall(r"^\s*[\w.-]+\s*=\s*([\w.]+):[\w.]+", wheel.read(info).decode(), re.M)
    assert "trtflow.cli.main" in targets and "trtflow_stages.export" in targets
    shipped = set(wheel.namelist())
    for module in targets:
        path = module.replace(".", "/")
        assert f"{path}.py" in shipped or f"{path}/__init__.py" in shipped, f"entry point {module}: not in the wheel"
