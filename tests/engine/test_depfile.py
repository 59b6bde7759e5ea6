"""The depfile recorder (`trtflow.depfile`): what a run's code really used from the project, and nothing else."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from trtflow import depfile
from trtflow.fingerprint import hash_file_content


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "inner.py").write_text("X = 1\n")
    (root / "helper.py").write_text("import json; import pkg.inner\nY = 2\n")
    (root / "data.txt").write_text("d")
    (root / "store").mkdir()
    (root / "store" / "cached.txt").write_text("c")
    monkeypatch.setattr(sys, "path", [*sys.path, str(root)])
    yield root
    for name in ("helper", "pkg", "pkg.inner", "optional_thing"):
        sys.modules.pop(name, None)


def test_imports_reads_and_failed_lookups_inside_the_project_are_recorded(project: Path) -> None:
    """As the worker records a node: the block runs in an observed child (`readtrace`), its reads keyed here."""
    from trtflow import readtrace

    def run() -> dict:
        with depfile.recording([project], excluded=[project / "store"]) as deps:
            import helper  # noqa: F401

            try:
                import optional_thing  # noqa: F401
            except ImportError:
                pass
            (project / "data.txt").read_text()
            (project / "store" / "cached.txt").read_text()  # the store: trtflow's, never the project's
        return deps.with_places()

    result, reads = readtrace.observed(run, lambda p: True, {})
    deps = depfile.Deps.from_json(result)
    assert deps is not None
    depfile.add_reads(deps, reads, environ={"HOME": "/h", "LANG": "C.UTF-8"})
    files = {f for f in deps.files if not f.startswith(depfile.ENV_LABEL)}
    assert files == {str(project / p) for p in ("helper.py", "pkg/__init__.py", "pkg/inner.py", "data.txt")}
    assert deps.files[str(project / "helper.py")] == hash_file_content(project / "helper.py")
    assert str(project / "optional_thing") in deps.absent
    assert sys.modules["json"].__file__ not in deps.files  # a library: the environment's business
    assert deps.files["env:LANG"] == depfile.env_digest("env:LANG", {"LANG": "C.UTF-8"})
    assert deps.files["env:TZ"] == depfile.MISSING
    assert "env:HOME" not in deps.files and "env:PATH" not in deps.files  # search paths: their files are keyed


def test_a_file_changed_while_the_code_ran_cannot_vouch_for_it(project: Path) -> None:
    with depfile.recording([project]) as deps:
        import helper  # noqa: F401

        (project / "helper.py").write_text("Y = 3\n")
    assert deps.files[str(project / "helper.py")] == depfile.CHANGED


def test_a_module_imported_before_any_recording_is_counted_as_unknown(project: Path) -> None:
    import helper  # noqa: F401  (imported outside a recording: its content then is unknown)

    with depfile.recording([project]) as deps:
        pass
    assert deps.files[str(project / "helper.py")] == depfile.CHANGED


def test_a_module_with_a_made_up_file_name_is_not_a_project_file(project: Path, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    """torch registers module objects whose __file__ is "_ops.py": relative, so it would seem to be in the working
    folder."""
    monkeypatch.chdir(project)
    (project / "_ops.py").write_text("")
    fake = types.ModuleType("torch_like.ops")
    fake.__file__ = "_ops.py"
    monkeypatch.setitem(sys.modules, "torch_like.ops", fake)
    with depfile.recording([project]) as deps:
        pass
    assert deps.files == {}


def test_a_python_environment_inside_the_project_is_not_the_projects_whatever_its_name(project: Path) -> None:
    """`python3 -m venv .v` in the project (README's setup with another name), and a conda environment: what the
    interpreter reads of its own environment is not a file of the project (it was keyed, and then reported as "no
    longer used" on every change: seen in a fresh clone). The import scanner (`codehash`) applies the same rule."""
    import subprocess

    from trtflow import codehash, readtrace

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(project / ".v")], check=True)
    (project / "tools" / "conda-meta").mkdir(parents=True)
    (project / "tools" / "lib.txt").write_text("a file of a conda environment")

    def run() -> dict:
        with depfile.recording([project]) as deps:
            subprocess.run([str(project / ".v" / "bin" / "python"), "-c", "open('data.txt').read()"], cwd=project,
                           check=True)
            (project / "tools" / "lib.txt").read_text()
        return deps.with_places()

    result, reads = readtrace.observed(run, lambda p: True, {})
    assert any(path.startswith(str(project / ".v")) for path in reads.files)  # the interpreter did read them
    deps = depfile.Deps.from_json(result)
    assert deps is not None
    depfile.add_reads(deps, reads, environ={})
    files = {f for f in deps.files if not f.startswith(depfile.ENV_LABEL)}
    assert files == {str(project / "data.txt")}, files
    assert codehash.not_the_projects(str(project), [".v", "lib"]) and codehash.not_the_projects(str(project), ["tools"])
    assert not codehash.not_the_projects(str(project), ["pkg"])
    assert depfile.not_the_projects is codehash.not_the_projects  # one rule for both
