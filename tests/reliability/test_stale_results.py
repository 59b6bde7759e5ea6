"""Issue 24, "stale results reused": every way a result was reused although it was no longer right.

Each test builds a small project, makes an ordinary edit (or an attacker's), and checks that the no-op shortcut
steps aside, that `trtflow plan` says the node is stale, and that `trtflow run` rebuilds it with the new result.
  - the shortcut answered where the planner would rebuild: a bare ``$VAR`` in a path, a data file, the ``python:``
    file or an ``extends:`` base that is a link retargeted, ``~`` under another ``HOME``;
  - the modules ``python:`` code imports were guessed from its text: ``import a; import helper``,
    ``try: import helper``, ``from blocks import (\\n head,\\n)``, a dynamic import, a project in ``.venv/src/``;
  - a file rewritten with its size kept and its mtime restored (``cp`` + ``touch -r``, ``rsync --inplace -t``),
    a data file or a store object;
  - a tool version changed in place (a distribution's metadata edited, a ``.pth`` file, ``sitecustomize``);
  - issue 31, through the CLI: what ``python:`` code reads by native code (safetensors), in a worker thread,
    through a folder link retargeted, as a module that is a link retargeted, and from an environment variable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.reliability.freshness import Project, fresh_modules, toy_plugin
from tests.settle import short_racy_window, wait_settled
from trtflow.storage.journal import Journal
from trtflow.storage.store import Store


@pytest.fixture(scope="module")
def toy_stages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    with toy_plugin(tmp_path_factory.mktemp("toyplugin")) as paths:
        yield paths


@pytest.fixture
def root(tmp_path: Path, toy_stages: list[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the inline executor puts the project's folders on it
    for name in ("CALIB", "TRTFLOW_NO_SHORTCUT"):
        monkeypatch.delenv(name, raising=False)
    with fresh_modules(tmp_path):
        yield project


def _stale_everywhere(project: Project, node: str, expected: bytes) -> None:
    assert not project.shortcut(), "the shortcut said 'nothing to do' where the planner rebuilds"
    step = project.plan()[node]
    assert step.status == "stale", step.reason
    assert project.run()[node] == "done"
    assert project.output(node) == expected
    assert set(project.run().values()) == {"fresh"}  # and it settles again


# ------------------------------------------------------------------------------------ paths re-resolved
def _link(link: Path, target: str) -> None:
    if link.is_symlink():
        link.unlink()
    link.symlink_to(target)


def _bare_variable(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, bytes]:
    monkeypatch.setenv("CALIB", "b.txt")
    return "calib", b"B"


def _data_link(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, bytes]:
    _link(root / "data.txt", "data/b.txt")
    return "linked", b"B"


def _home(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, bytes]:
    monkeypatch.setenv("HOME", str(root / "home2"))
    return "home", b"home two"


def _factory_link(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, bytes]:
    _link(root / "model.py", "models/nine.py")
    return "factory", b"9 classes"


def _base_link(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, bytes]:
    _link(root / "base.yaml", "bases/two.yaml")
    return "based", b"two"


@pytest.mark.parametrize("attack", [_bare_variable, _data_link, _home, _factory_link, _base_link],
                         ids=["bare $VAR", "data link", "~ with HOME", "python: file link", "extends link"])
def test_a_path_that_resolves_elsewhere_now_is_never_reused(root: Path, monkeypatch: pytest.MonkeyPatch,
                                                            attack: Callable) -> None:
    (root / "data").mkdir()
    (root / "data" / "a.txt").write_text("A")
    (root / "data" / "b.txt").write_text("B")
    for home, text in (("home1", "home one"), ("home2", "home two")):
        (root / home).mkdir()
        (root / home / "calib.txt").write_text(text)
    (root / "models").mkdir()
    (root / "models" / "four.py").write_text("def make():\n    return '4 classes'\n")
    (root / "models" / "nine.py").write_text("def make():\n    return '9 classes'\n")
    (root / "bases").mkdir()
    for name in ("one", "two"):
        (root / "bases" / f"{name}.yaml").write_text(
            f"nodes:\n  - {{name: based, stage: source, params: {{value: {name}}}}}\n")
    _link(root / "data.txt", "data/a.txt")
    _link(root / "model.py", "models/four.py")
    _link(root / "base.yaml", "bases/one.yaml")
    (root / "recipe.yaml").write_text(
        "name: r\nextends: base.yaml\nnodes:\n"
        "  - {name: calib, stage: reader, params: {path: data/$CALIB}}\n"
        "  - {name: home, stage: reader, params: {path: '~/calib.txt'}}\n"
        "  - {name: linked, stage: reader, params: {path: data.txt}}\n"
        "  - {name: factory, stage: coder, params: {model: 'python:model.py:make'}}\n")
    monkeypatch.setenv("CALIB", "a.txt")
    monkeypatch.setenv("HOME", str(root / "home1"))
    project = Project(root)
    project.settled_with_record()
    node, expected = attack(root, monkeypatch)
    output = "out.txt" if node in ("factory", "based") else "out.bin"
    assert not project.shortcut(), "the shortcut said 'nothing to do' where the planner rebuilds"
    assert project.plan()[node].status == "stale"
    assert project.run()[node] == "done"
    assert project.output(node, output) == expected


# ------------------------------------------------------------------------------------ imports seen
FORMS = {
    "two statements on a line": ({"model.py": "import json; import helper\n\n\ndef make():\n"
                                              "    return json.dumps(helper.VALUE)\n"}, "helper.py"),
    "try: import on one line": ({"model.py": "try: import helper\nexcept ImportError: helper = None\n\n\n"
                                             "def make():\n    return helper.VALUE\n"}, "helper.py"),
    "parenthesised from-import": ({"model.py": "from blocks import (\n    head,\n)\n\n\ndef make():\n"
                                               "    return head.VALUE\n",
                                   "blocks/__init__.py": ""}, "blocks/head.py"),
    "dynamic import": ({"model.py": "import importlib\n\nNAME = 'hel' + 'per'\n\n\ndef make():\n"
                                    "    return importlib.import_module(NAME).VALUE\n"}, "helper.py"),
    "runpy, no import": ({"model.py": "import os\nimport runpy\n\n\ndef make():\n    here = os.path.dirname(__file__)\n"
                                      "    return runpy.run_path(os.path.join(here, 'helper.py'))['VALUE']\n"},
                         "helper.py"),
    "exec of its text": ({"model.py": "import os\n\nHERE = os.path.dirname(__file__)\n\n\ndef make():\n"
                                      "    scope = {}\n    exec(open(os.path.join(HERE, 'helper.py')).read(), scope)\n"
                                      "    return scope['VALUE']\n"}, "helper.py"),
    "a data file it reads": ({"model.py": "import os\n\nHERE = os.path.dirname(__file__)\n\n\ndef make():\n"
                                          "    return open(os.path.join(HERE, 'labels.txt')).read()\n"}, "labels.txt"),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_a_module_the_code_imports_is_seen_in_any_form(root: Path, form: str) -> None:
    files, helper = FORMS[form]
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / helper).write_text("VALUE = 'first'\n")
    _check_helper_edit(root, helper)


def test_a_project_checked_out_in_a_virtual_environment_keys_its_modules(root: Path) -> None:
    """pip puts editable git checkouts in <venv>/src/: the project's own modules count there too."""
    inner = root / ".venv" / "src" / "proj"
    inner.mkdir(parents=True)
    (inner / "pyproject.toml").write_text("[project]\nname = 'proj'\n")
    (inner / "model.py").write_text("from helper import VALUE\n\n\ndef make():\n    return VALUE\n")
    (inner / "helper.py").write_text("VALUE = 'first'\n")
    os.chdir(inner)
    _check_helper_edit(inner, "helper.py")


def _check_helper_edit(root: Path, helper: str) -> None:
    (root / "recipe.yaml").write_text(
        "name: r\nnodes:\n  - {name: factory, stage: coder, params: {model: 'python:model.py:make'}}\n")
    project = Project(root)
    project.settled_with_record()
    (root / helper).write_text("VALUE = 'second'\n")
    step = project.plan()["factory"]
    assert step.status == "stale", step.reason
    assert not project.shortcut()
    assert project.run()["factory"] == "done"
    assert b"second" in project.output("factory", "out.txt")
    assert f"{helper} changed" in step.reason  # recorded while the code ran, and named
    assert helper in project.plan()["factory"].parts.deps


def test_a_module_created_where_a_failed_import_looked_is_seen(root: Path) -> None:
    (root / "model.py").write_text("try:\n    from extra import BONUS\nexcept ImportError:\n    BONUS = ''\n\n\n"
                                   "def make():\n    return 'm' + BONUS\n")
    (root / "recipe.yaml").write_text(
        "name: r\nnodes:\n  - {name: factory, stage: coder, params: {model: 'python:model.py:make'}}\n")
    project = Project(root)
    project.settled_with_record()
    (root / "extra.py").write_text("BONUS = '+'\n")
    step = project.plan()["factory"]
    assert step.status == "stale" and "module extra now exists" in step.reason, step.reason
    assert not project.shortcut()
    assert project.run()["factory"] == "done"
    assert project.output("factory", "out.txt") == b"m+"


# ------------------------------------------------------------------------------------ same size, mtime restored
def _rewrite(path: Path, content: bytes, how: str) -> None:
    """Rewrite ``path`` keeping its size and putting its mtime back: ``cp`` + ``touch -r``, or an in-place write
    with the mtime restored as ``rsync --inplace -t`` does."""
    stamp = path.stat()
    assert len(content) == stamp.st_size
    if how == "cp + touch -r":
        other = path.with_name(path.name + ".new")
        other.write_bytes(content)
        with open(path, "wb") as f:  # cp writes into the existing file: the inode stays
            f.write(other.read_bytes())
        other.unlink()
    else:
        with open(path, "r+b") as f:
            f.write(content)
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (stamp.st_size, stamp.st_mtime_ns, stamp.st_ino)


@pytest.mark.parametrize("how", ["cp + touch -r", "rsync --inplace -t"])
def test_a_data_file_rewritten_with_its_size_and_mtime_kept_is_seen(root: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    how: str) -> None:
    short_racy_window(monkeypatch)
    data = root / "calib.bin"
    data.write_bytes(b"a" * 64)
    old = data.stat().st_mtime_ns - 10_000_000_000  # edited a while ago: the stat cache trusts it
    os.utime(data, ns=(old, old))
    (root / "recipe.yaml").write_text("name: r\nnodes:\n  - {name: read, stage: reader, params: {path: calib.bin}}\n")
    wait_settled(root)
    project = Project(root)
    project.settled_with_record()
    _rewrite(data, b"b" * 64, how)
    _stale_everywhere(project, "read", b"b" * 64)


def test_a_store_object_damaged_with_its_size_and_mtime_kept_is_rebuilt(root: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    short_racy_window(monkeypatch)
    (root / "calib.bin").write_bytes(b"a" * 64)
    (root / "recipe.yaml").write_text("name: r\nnodes:\n  - {name: read, stage: reader, params: {path: calib.bin}}\n")
    wait_settled(root)
    project = Project(root)
    project.settled_with_record()
    store = Store(project.store)
    manifest = store.read_manifest(store.refs.current("recipe.yaml")["read"])
    victim = store.object_path(manifest["outputs"]["out"]["digest"])
    victim.chmod(0o644)
    _rewrite(victim, b"x" * 64, "rsync --inplace -t")
    assert not project.shortcut()
    step = project.plan()["read"]
    assert step.status == "stale" and "missing or damaged" in step.reason, step.reason
    assert project.run()["read"] == "done"
    assert project.output("read") == b"a" * 64
    assert store.intact(store.read_manifest(store.refs.current("recipe.yaml")["read"]))


# ------------------------------------------------------------------------------------ tool versions in place
def _fake_numpy(folder: Path, version: str) -> Path:
    """A distribution's metadata, as a develop-mode install keeps it: found before the real one."""
    info = folder / "numpy-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    metadata = info / "METADATA"
    metadata.write_text(f"Metadata-Version: 2.1\nName: numpy\nVersion: {version}\n")
    return metadata


def _mixer_project(root: Path) -> Project:
    (root / "calib.bin").write_bytes(b"c")
    (root / "model.py").write_text("def make():\n    return 'm'\n")
    (root / "recipe.yaml").write_text(
        "name: r\nnodes:\n  - {name: mix, stage: mixer, params: {path: calib.bin, make: 'python:model.py:make'}}\n")
    return Project(root)


def test_a_distribution_whose_metadata_is_edited_in_place_is_judged_by_its_version(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dists = tmp_path / "dists"
    metadata = _fake_numpy(dists, "1.0")
    monkeypatch.setattr(sys, "path", [str(dists), *sys.path])
    project = _mixer_project(root)
    project.settled_with_record()
    folder_mtimes = [os.stat(p).st_mtime_ns for p in (dists, metadata.parent)]
    with open(metadata, "r+") as f:  # edited in place: no folder on the module path changes
        f.write(metadata.read_text().replace("1.0", "2.0"))
    assert [os.stat(p).st_mtime_ns for p in (dists, metadata.parent)] == folder_mtimes
    assert not project.shortcut()
    step = project.plan()["mix"]
    assert step.status == "stale" and "numpy 1.0 -> 2.0" in step.reason, step.reason
    assert project.run()["mix"] == "done"


VERSION_FINDER = '''\
import sys
from importlib.metadata import Distribution, DistributionFinder


class _Numpy(Distribution):
    def __init__(self, version):
        self.version_text = version

    def read_text(self, filename):
        if filename == "METADATA":
            return f"Metadata-Version: 2.1\\nName: numpy\\nVersion: {self.version_text}\\n"
        return None

    def locate_file(self, path):
        return None


class _Finder(DistributionFinder):
    def __init__(self, version):
        self.version_text = version

    def find_spec(self, *args, **kwargs):
        return None

    def find_distributions(self, context=DistributionFinder.Context()):
        if context.name in (None, "numpy"):
            yield _Numpy(self.version_text)


def install(version):
    sys.meta_path.insert(0, _Finder(version))
'''


@pytest.mark.parametrize("where", [".pth file", "sitecustomize"])
def test_a_tool_version_changed_by_startup_code_is_judged_by_its_version(tmp_path: Path, toy_stages: list[str],
                                                                         where: str) -> None:
    """A .pth file or sitecustomize edited in place changes what the tool's version reads as, and nothing on the
    module path: the shortcut computes the facts as the planner does."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    _mixer_project(project)
    startup = tmp_path / "startup"
    site_dir = tmp_path / "site"
    for folder in (startup, site_dir):
        folder.mkdir()
    (site_dir / "_toolversion.py").write_text(VERSION_FINDER)
    if where == ".pth file":
        (startup / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(site_dir)!r})\n")
        edited = site_dir / "tool.pth"
        edited.write_text("import _toolversion; _toolversion.install('1.0')\n")
    else:
        edited = startup / "sitecustomize.py"
        edited.write_text(f"import sys\nsys.path.append({str(site_dir)!r})\n"
                          "import _toolversion\n_toolversion.install('1.0')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(startup), *toy_stages]), COLUMNS="200")
    env.pop("TRTFLOW_STORE", None)

    def run() -> str:
        proc = subprocess.run([sys.executable, "-m", "trtflow.cli", "run", "recipe.yaml", "--store", "store"],
                              cwd=project, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    assert "1 built" in run()
    assert "Nothing to do" in run()  # planned: it leaves the no-op record
    (record,) = (project / "store" / "noop").iterdir()
    inode = record.stat().st_ino
    assert "Nothing to do" in run()
    assert record.stat().st_ino == inode, "the shortcut answered (the planner would have rewritten the record)"
    with open(edited, "r+") as f:
        f.write(edited.read_text().replace("'1.0'", "'2.0'"))
    plan = subprocess.run([sys.executable, "-m", "trtflow.cli", "plan", "recipe.yaml", "--store", "store"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert "numpy 1.0 -> 2.0" in plan.stdout, plan.stdout + plan.stderr
    assert "1 built" in run()


def test_the_record_keeps_paths_as_spelled(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the shortcut replays is the planner's own resolution of the recipe's spelling, not a resolved target."""
    (root / "data").mkdir()
    (root / "data" / "a.txt").write_text("A")
    monkeypatch.setenv("CALIB", "a.txt")
    (root / "recipe.yaml").write_text(
        "name: r\nnodes:\n  - {name: calib, stage: reader, params: {path: data/$CALIB}}\n")
    project = Project(root)
    project.settled_with_record()
    (record,) = (project.store / "noop").iterdir()
    paths = json.loads(record.read_text())["record"]["paths"]  # the record in the store's envelope
    assert paths == {"data/$CALIB": str((root / "data" / "a.txt").resolve())}


# ------------------------------------------------------------------------------------ records are data
@pytest.mark.timeout(120)
def test_a_planted_index_entry_reads_nothing_outside_and_opens_no_pipe(root: Path, tmp_path: Path) -> None:
    """The journal's index of module sets may come with a cloned repository: a label that climbs out of the
    project, or names a named pipe, is treated as a file that is not there (never opened)."""
    (root / "model.py").write_text("def make():\n    return 'm'\n")
    (root / "recipe.yaml").write_text(
        "name: r\nnodes:\n  - {name: factory, stage: coder, params: {model: 'python:model.py:make'}}\n")
    project = Project(root)
    project.settled_with_record()
    (tmp_path / "outside.txt").write_text("secret")
    os.mkfifo(root / "pipe.py")
    pre = project.plan()["factory"].parts.pre_key
    journal = Journal(Store(project.store).db_path)
    try:
        for planted in (("../outside.txt", "model.py"), ("model.py", "pipe.py"), (str(tmp_path / "outside.txt"),)):
            journal.note_dep_set(pre, (tuple(sorted(planted)), ()))
    finally:
        journal.close()
    step = project.plan()["factory"]
    assert step.status == "fresh" and {d for d in step.parts.deps if not d.startswith("env:")} == {"model.py"}
    assert project.run()["factory"] == "fresh"


@pytest.mark.timeout(120)
def test_a_planted_noop_record_naming_a_pipe_steps_aside(root: Path) -> None:
    """A no-op record is read from the store: what it names is checked as a regular file before it is read."""
    (root / "calib.bin").write_bytes(b"c")
    (root / "recipe.yaml").write_text("name: r\nnodes:\n  - {name: read, stage: reader, params: {path: calib.bin}}\n")
    project = Project(root)
    project.settled_with_record()
    pipe = root / "pipe"
    os.mkfifo(pipe)
    (record_file,) = (project.store / "noop").iterdir()
    envelope = json.loads(record_file.read_text())
    st = pipe.stat()
    sig = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    for field in ("texts", "files"):
        planted = dict(envelope["record"])
        planted[field] = ({str(pipe): "0" * 32} if field == "texts"
                          else {str(pipe): {"sig": sig, "digest": "0" * 32, "racy": True}})
        record_file.write_text(json.dumps(dict(envelope, record=planted)))
        assert not project.shortcut()
    assert set(project.run().values()) == {"fresh"}


# ------------------------------------------------------------------- issue 31: reads seen by system call
READERS = {  # node -> (factory source, what it returns before the edit, after)
    "weights": ("from safetensors.numpy import load_file\n"
                "def make():\n    return float(load_file('w.safetensors')['w'][0])\n"),
    "threaded": ("import threading\n"
                 "def make():\n    box = []\n"
                 "    t = threading.Thread(target=lambda: box.append(open('t.txt').read()))\n"
                 "    t.start(); t.join()\n    return box[0]\n"),
    "linked": "def make():\n    return open('data/cur/v.txt').read()\n",
    "helper": "import helper\ndef make():\n    return helper.VALUE\n",
    "env": "import os\ndef make():\n    return os.environ.get('SCALE', 'hidden') + os.environ.get('OTHER', '-')\n",
}


def _save_weight(path: Path, value: float) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"w": np.array([value], dtype=np.float32)}, str(path))


def test_what_python_code_reads_by_any_means_is_keyed_through_the_cli(tmp_path: Path, toy_stages: list[str]
                                                                       ) -> None:
    """Issue 31 (a)-(e), each a node of one project run by the CLI (fork server, worker, observed child): weights
    read by native code (safetensors), a file read in a worker thread, a data file through a folder link that is
    retargeted, a helper module that is a link retargeted, an environment variable (hidden unless
    TRTFLOW_PASS_ENV names it, and then keyed). Each edit touches one node's reads only: each node must be rebuilt
    with what its factory makes now."""
    root = tmp_path / "project"
    (root / "data" / "one").mkdir(parents=True)
    (root / "data" / "two").mkdir()
    (root / "helpers").mkdir()
    (root / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    _save_weight(root / "w.safetensors", 1.0)
    (root / "t.txt").write_text("t1")
    (root / "data" / "one" / "v.txt").write_text("one")
    (root / "data" / "two" / "v.txt").write_text("two")
    (root / "data" / "cur").symlink_to("one")
    (root / "helpers" / "a.py").write_text("VALUE = 'helper a'\n")
    (root / "helpers" / "b.py").write_text("VALUE = 'helper b'\n")
    (root / "helper.py").symlink_to("helpers/a.py")
    nodes = []
    for node, source in READERS.items():
        (root / f"f_{node}.py").write_text(source)
        nodes.append(f"  - {{name: {node}, stage: coder, params: {{model: 'python:f_{node}.py:make'}}}}")
    (root / "recipe.yaml").write_text("name: r\nnodes:\n" + "\n".join(nodes) + "\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(toy_stages), COLUMNS="200", SCALE="s1", OTHER="o1",
               TRTFLOW_PASS_ENV="SCALE")
    for name in ("TRTFLOW_STORE", "TRTFLOW_NO_SHORTCUT"):
        env.pop(name, None)

    def cli(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "trtflow.cli", *args, "recipe.yaml", "--store", "store"],
                              cwd=root, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    def outputs() -> dict[str, str]:
        return {n: (root / "build" / "r" / n / "out.txt").read_text() for n in READERS}

    assert "5 built" in cli("run")
    assert outputs() == {"weights": "1.0", "threaded": "t1", "linked": "one", "helper": "helper a", "env": "s1-"}
    assert "Nothing to do" in cli("run")
    _save_weight(root / "w.safetensors", 210.0)
    (root / "t.txt").write_text("t2")
    (root / "data" / "cur").unlink()
    (root / "data" / "cur").symlink_to("two")
    (root / "helper.py").unlink()
    (root / "helper.py").symlink_to("helpers/b.py")
    env["OTHER"] = "o2"  # hidden from the code: changes nothing
    plan = cli("plan")
    assert plan.count("stale") >= 4 and "env" in plan, plan
    assert "4 built" in cli("run")
    assert outputs() == {"weights": "210.0", "threaded": "t2", "linked": "two", "helper": "helper b", "env": "s1-"}
    env["SCALE"] = "s2"  # passed to the code: keyed (every python: node sees it, so every one is rebuilt)
    assert "5 built" in cli("run")
    assert outputs()["env"] == "s2-"
    assert "Nothing to do" in cli("run")
