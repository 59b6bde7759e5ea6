"""Issue 24's attacks on the files trtflow reads and writes, each run through the real CLI: what a cloned repository
can carry in `.trtflow/` and `build/`, and what another writer of a shared store can plant there.

Every test snapshots a folder outside the store and build/ before and after (nothing in it written, removed or
re-moded), runs the commands with a time limit (a named pipe must never block: no sleep, a bound on the whole
command), and checks the exit code: 0 where ignoring the planted file is safe (it is said so), 4 (store) or 1 (a
node) with a message naming the file where it is not, 2 for a bad recipe, never 70 (an internal error).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from trtflow.storage.confined import kinds
from trtflow.storage.store import Store

CHAIN = """\
name: chain
nodes:
  - {name: a, stage: synth, params: {text: a, size: 5000}}
  - {name: b, stage: synth, params: {text: b}, inputs: {source: a}}
"""
SECRET = b"outside the store: never read into it, never written"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "victim.txt").write_bytes(SECRET)
    (folder / "victim.txt").chmod(0o600)
    (folder / "model.onnx").write_bytes(b"another project's model")
    db = sqlite3.connect(folder / "other.db")
    db.execute("CREATE TABLE notes (text TEXT)")
    db.execute("INSERT INTO notes VALUES ('someone else''s database')")
    db.commit()
    db.close()
    return folder


def snapshot(folder: Path) -> dict[str, tuple[int, int, bytes]]:
    found = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        found[str(path.relative_to(folder))] = (st.st_mode, st.st_mtime_ns,
                                                path.read_bytes() if stat.S_ISREG(st.st_mode) else b"")
    return found


def never_internal(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode != 70 and "internal error" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def store_holds(store: Path, content: bytes) -> list[Path]:
    """Files of the store whose bytes contain ``content`` (what would show an outside file copied in)."""
    return [p for p in store.rglob("*") if p.is_file() and not p.is_symlink() and content in p.read_bytes()]


def build(folder: Path, trtflow) -> None:
    """Build the chain in ``folder`` and run it again (which leaves the no-op record)."""
    (folder / "chain.yaml").write_text(CHAIN)
    for _ in range(2):
        proc = trtflow("run", "chain.yaml", "--store", str(folder / "store"), cwd=folder)
        assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def built_once(tmp_path_factory: pytest.TempPathFactory, plugin_env: dict[str, str]) -> tuple[Path, Path]:
    """The chain built once per module (two `trtflow run`s, most of a test's time were each test to build it) in
    a project folder of the module's, and a copy of that project as it was then (links kept, times kept)."""
    base = tmp_path_factory.mktemp("planted")
    project = base / "project"
    project.mkdir()

    def trtflow(*args: str, cwd: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trtflow.cli", *args], cwd=cwd, env=plugin_env,
                              capture_output=True, text=True, timeout=120)

    build(project, trtflow)
    pristine = base / "pristine"
    shutil.copytree(project, pristine, symlinks=True)
    return project, pristine


@pytest.fixture
def built(built_once: tuple[Path, Path], tmp_path: Path) -> Path:
    """A project whose chain was built and then run again, in the module's project folder (the store names the
    project's paths: it is restored where it was built). The previous test's project, with what it planted, is
    moved into this test's tmp_path; the built project is copied back (new inodes and ctimes: the store's stat
    shortcuts step aside and the content is checked, as after a restore from a backup)."""
    project, pristine = built_once
    if project.exists() or project.is_symlink():
        os.rename(project, tmp_path / "previous-project")
    shutil.copytree(pristine, project, symlinks=True)
    return project


@pytest.fixture
def trtflow_home(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """`trtflow` runs in the built project for the tests given one, else in tmp_path."""
    return request.getfixturevalue("built") if "built" in request.fixturenames else tmp_path


def _plant_target(store: Path, which: str) -> Path:
    refs = next((store / "refs").iterdir())
    return {
        "format.json": store / "format.json",
        ".pending.jsonl": refs / ".pending.jsonl",
        "history.jsonl": refs / "history.jsonl",
        "current.json": refs / "current.json",
        "no-op record": next((store / "noop").iterdir()),
        "manifest": next(p for p in (store / "nodes").rglob("*.json")),
        "output index": store.parent / "build" / "chain" / "a" / ".trtflow.json",
    }[which]


CAPS = {"format.json": kinds.FORMAT_FILE, ".pending.jsonl": kinds.LEDGER, "history.jsonl": kinds.LEDGER,
        "current.json": kinds.REFS, "no-op record": kinds.NOOP_RECORD, "manifest": kinds.MANIFEST,
        "output index": kinds.INDEX}


@pytest.mark.parametrize("kind", ["named pipe", "link to /dev/zero", "huge", "link outside"])
@pytest.mark.parametrize("which", list(CAPS))
def test_a_planted_file_never_hangs_never_reads_outside_never_ends_in_70(built: Path, outside: Path, trtflow,
                                                                         which: str, kind: str) -> None:
    store = built / "store"
    target = _plant_target(store, which)
    if target.exists():
        target.chmod(0o644)
        target.unlink()
    if kind == "named pipe":
        os.mkfifo(target)
    elif kind == "link to /dev/zero":
        target.symlink_to("/dev/zero")
    elif kind == "link outside":
        target.symlink_to(outside / "victim.txt")
    else:
        with open(target, "wb") as f:
            f.truncate(CAPS[which].cap + 1)
    before = snapshot(outside)
    for command in (["plan", "chain.yaml"], ["run", "chain.yaml"], ["run", "chain.yaml", "--set",
                                                                     "nodes.a.params.text=changed"]):
        proc = trtflow(*command, timeout=120)  # a command that blocked on a pipe would be killed: a failure
        never_internal(proc)
        if which == "format.json":  # the store's format cannot be known: nothing is done, the file is named
            assert proc.returncode == 4, proc.stdout + proc.stderr
            assert f"the store's format file {target}" in proc.stderr, proc.stderr
        else:  # a cache entry or a ledger that is not ours: ignored (said so) or set aside, and the run goes on
            assert proc.returncode == 0, (command, proc.stdout + proc.stderr)
    assert snapshot(outside) == before
    assert store_holds(store, SECRET) == [] and store_holds(built / "build", SECRET) == []


def test_a_planted_ledger_link_is_not_appended_to_and_no_line_is_shell_code(tmp_path: Path, outside: Path,
                                                                             trtflow) -> None:
    """The issue's escalation: a recipe file named r$(touch${IFS}PWNED).yaml and .pending.jsonl / history.jsonl
    linked to the user's ~/.bashrc; the next shell ran the command. The links are set aside (never appended to),
    and a ledger line has no `$` or backquote a shell could expand."""
    recipe = tmp_path / "r$(touch${IFS}PWNED).yaml"
    recipe.write_text(CHAIN)
    bashrc = outside / ".bashrc"
    bashrc.write_text("# the user's shell start-up\n")
    assert trtflow("run", recipe.name).returncode == 0
    refs = next((tmp_path / "store" / "refs").iterdir())
    for name in (".pending.jsonl", "history.jsonl"):
        (refs / name).unlink(missing_ok=True)
        (refs / name).symlink_to(bashrc)
    before = snapshot(outside)
    for change in ("x", "y"):  # the first run sets the links aside (and says so), the second appends to its own
        proc = trtflow("run", recipe.name, "--set", f"nodes.a.params.text={change}")
        never_internal(proc)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        if change == "x":
            assert "trtflow appends only to ledgers it made" in proc.stderr, (proc.stdout, proc.stderr)
    assert snapshot(outside) == before
    ledgers = [p for p in refs.iterdir() if p.is_file() and not p.is_symlink() and p.name.endswith(".jsonl")]
    assert ledgers, sorted(p.name for p in refs.iterdir())
    for ledger in ledgers:
        text = ledger.read_bytes()
        assert b"$" not in text and b"`" not in text, text
        assert all(isinstance(json.loads(line), dict) for line in text.splitlines())
        bash = shutil.which("bash")
        if bash:
            subprocess.run([bash, str(ledger)], cwd=tmp_path, capture_output=True, timeout=30)
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("planted", ["link to another database", "another database", "link as -wal",
                                     "hard link"])
def test_a_planted_journal_is_refused_never_written_into(tmp_path: Path, outside: Path, trtflow,
                                                         planted: str) -> None:
    """The journal planted as a link to another SQLite file: trtflow created its tables there and switched it to
    WAL (issue 24). Now: refused with a message naming the file, the other database untouched."""
    (tmp_path / "chain.yaml").write_text(CHAIN)
    store = tmp_path / "store"
    store.mkdir()
    journal = store / "trtflow.db"
    if planted == "link to another database":
        journal.symlink_to(outside / "other.db")
    elif planted == "another database":
        shutil.copyfile(outside / "other.db", journal)
    elif planted == "link as -wal":
        assert trtflow("run", "chain.yaml").returncode == 0
        (store / "trtflow.db-wal").unlink(missing_ok=True)
        (store / "trtflow.db-wal").symlink_to(outside / "victim.txt")
    else:
        os.link(outside / "other.db", journal)
    before = snapshot(outside)
    for command in (["run", "chain.yaml"], ["status"], ["plan", "chain.yaml"], ["gc"]):
        proc = trtflow(*command)
        never_internal(proc)
        if command[0] in ("plan", "gc"):  # they only read the journal, for a cache and for messages: said, not fatal
            assert proc.returncode == 0, (command, proc.stdout + proc.stderr)
        else:
            assert proc.returncode == 4, (command, proc.stdout + proc.stderr)
        assert "journal" in proc.stderr and ("symbolic link" in proc.stderr or "not a trtflow journal" in
                                             proc.stderr or "links" in proc.stderr), (command, proc.stderr)
    assert snapshot(outside) == before
    fixed = trtflow("verify", "--fix")
    never_internal(fixed)
    assert snapshot(outside) == before
    assert trtflow("run", "chain.yaml").returncode == 0, "after verify --fix moved it aside, runs work again"
    assert snapshot(outside) == before


def test_an_old_store_is_migrated_without_reading_through_links(tmp_path: Path, outside: Path, trtflow) -> None:
    """A refs folder without current.json in a store without format.json is "migrated": its files were read through
    links, so an outside file's content was copied into the store (issue 24)."""
    (tmp_path / "chain.yaml").write_text(CHAIN)
    store = tmp_path / "store"
    (store / "objects").mkdir(parents=True)  # a first-release store: objects/ and no format.json
    legacy = store / "refs" / "chain"
    legacy.mkdir(parents=True)
    (legacy / "a").symlink_to(outside / "victim.txt")
    (legacy / "b").write_text("not a key\n")
    (store / "refs" / "linked").symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    for command in (["gc"], ["run", "chain.yaml"]):
        proc = trtflow(*command)
        never_internal(proc)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert snapshot(outside) == before
    assert store_holds(store, SECRET) == []


@pytest.mark.parametrize("where", ["build", "build/chain"])
def test_outputs_are_never_written_through_a_linked_build_folder(tmp_path: Path, outside: Path, trtflow,
                                                                 where: str) -> None:
    """`build/<recipe>` (or `build/` itself) as a link: another folder's model.onnx was overwritten (issue 24)."""
    (tmp_path / "chain.yaml").write_text(CHAIN)
    link = tmp_path / where
    link.parent.mkdir(parents=True, exist_ok=True)
    planted = outside / "elsewhere"
    (planted / "a").mkdir(parents=True)
    (planted / "a" / "data.bin").write_bytes(b"precious")
    (planted / "chain" / "a").mkdir(parents=True)
    (planted / "chain" / "a" / "data.bin").write_bytes(b"precious")
    link.symlink_to(planted, target_is_directory=True)
    before = snapshot(outside)
    proc = trtflow("run", "chain.yaml")
    never_internal(proc)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{link} is a symbolic link" in proc.stdout and "remove the link" in proc.stdout, proc.stdout
    assert snapshot(outside) == before
    explicit = trtflow("run", "chain.yaml", "--output-dir", str(link))  # a folder the user names may be a link
    assert explicit.returncode == 0, explicit.stdout + explicit.stderr
    assert (planted / "a" / "data.bin").read_bytes() != b"precious"


@pytest.mark.parametrize("command", [["gc"], ["verify", "--fix"]])
def test_gc_and_verify_never_chmod_through_a_link_in_objects(built: Path, outside: Path, trtflow,
                                                             command: list[str]) -> None:
    """`gc` and `verify --fix` made a 0600 file outside 0644 through a link in objects/ (issue 24)."""
    store = Store(built / "store")
    shard = store.objects / "ff"
    shard.mkdir()
    (shard / ("f" * 32)).symlink_to(outside / "victim.txt")
    shard.chmod(0o555)  # removing the entry fails at first: what made trtflow chmod the link's target
    before = snapshot(outside)
    proc = trtflow(*command)
    never_internal(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert snapshot(outside) == before
    assert stat.S_IMODE((outside / "victim.txt").stat().st_mode) == 0o600
    assert not (shard / ("f" * 32)).is_symlink(), "the link itself is removed"


def test_a_noop_record_naming_a_node_outside_build_is_not_used(tmp_path: Path, outside: Path, trtflow) -> None:
    """A no-op record naming node `../elsewhere` overwrote an outside model.onnx (issue 24). Built here, not
    restored (``built``): the record must hold but for what the attack changed, stat signatures included."""
    build(tmp_path, trtflow)
    built = tmp_path
    record_file = next((built / "store" / "noop").iterdir())
    envelope = json.loads(record_file.read_text())
    escape = os.path.relpath(outside, built / "build" / "chain")
    envelope["record"]["nodes"][0]["name"] = escape
    envelope["record"]["recipe"]["name"] = "../../outside"
    record_file.write_text(json.dumps(envelope))
    (outside / "data.bin").write_bytes(b"precious")
    before = snapshot(outside)
    proc = trtflow("run", "chain.yaml")
    never_internal(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert snapshot(outside) == before


@pytest.mark.parametrize("folder", ["ray-remote", "holders"])
def test_a_planted_store_folder_link_stops_the_run_before_any_work(built: Path, outside: Path, trtflow,
                                                                   folder: str) -> None:
    """The Ray transfer folder (and the lock holders' folder) among the folders that must be real: a planted link
    made objects and manifests land outside the store (issue 24)."""
    planted = built / "store" / folder
    shutil.rmtree(planted, ignore_errors=True)
    planted.symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    for command in (["run", "chain.yaml", "--set", "nodes.a.params.text=z"], ["gc"], ["verify", "--fix"]):
        proc = trtflow(*command)
        never_internal(proc)
        assert proc.returncode == 4, (command, proc.stdout + proc.stderr)
        assert f"the store's folder {planted} is a symbolic link" in proc.stderr, proc.stderr
    assert snapshot(outside) == before


def test_a_default_store_that_is_a_link_is_refused_one_named_is_used(tmp_path: Path, outside: Path, trtflow,
                                                                     plugin_env: dict[str, str]) -> None:
    """.trtflow in the working folder comes with a cloned repository; a store the user names may be a link."""
    (tmp_path / "chain.yaml").write_text(CHAIN)
    (tmp_path / ".trtflow").symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    for command in (["run", "chain.yaml"], ["plan", "chain.yaml"], ["gc"]):
        proc = subprocess.run([sys.executable, "-m", "trtflow.cli", *command], cwd=tmp_path, env=plugin_env,
                              capture_output=True, text=True, timeout=120)  # no --store: the default
        never_internal(proc)
        assert proc.returncode == 4, (command, proc.stdout + proc.stderr)
        assert "is a symbolic link" in proc.stderr and "--store" in proc.stderr, proc.stderr
    assert snapshot(outside) == before
    named = trtflow("run", "chain.yaml", "--store", ".trtflow")
    assert named.returncode == 0, named.stdout + named.stderr


@pytest.mark.parametrize("lock", ["refs", "locks"])
def test_a_planted_lock_file_link_is_never_truncated(built: Path, outside: Path, trtflow, lock: str) -> None:
    """filelock opens its file with O_TRUNC through links: a planted lock emptied the file it pointed to."""
    store = Store(built / "store")
    if lock == "refs":
        path = next((store.root / "refs").iterdir()) / ".lock"
    else:
        key = next(p for p in (store.root / "nodes").rglob("*.json")).stem
        path = store.lock_path(key)
        (store.root / "nodes" / key[:2] / f"{key}.json").unlink()  # rebuilt: its lock is taken
    path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(outside / "victim.txt")
    before = snapshot(outside)
    proc = trtflow("run", "chain.yaml", *(["--set", "nodes.b.params.text=other"] if lock == "refs" else []))
    never_internal(proc)
    assert proc.returncode in (1, 4), proc.stdout + proc.stderr
    assert str(path) in proc.stdout + proc.stderr and "symbolic link" in proc.stdout + proc.stderr
    assert snapshot(outside) == before


@pytest.mark.parametrize("value", [".nan", "-.inf", ".inf", "null", "1.5", "[]", "{}", "true"])
def test_a_hostile_matrix_value_is_a_recipe_error(tmp_path: Path, trtflow, value: str) -> None:
    """A matrix value `.nan` ended in exit 70 ('float' object has no attribute 'partition'); every odd YAML scalar
    where a value becomes a node name is a clear recipe error."""
    (tmp_path / "r.yaml").write_text(f"""\
name: r
nodes:
  - {{name: a, stage: synth, params: {{text: a}}}}
  - {{name: b, stage: synth, matrix: {{src: [{value}]}}, params: {{text: b}},
     inputs: {{source: '${{{{ matrix.src }}}}'}}}}
""")
    for command in ("plan", "run"):
        proc = trtflow(command, "r.yaml")
        never_internal(proc)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "error: r.yaml:" in proc.stderr and "matrix" in proc.stderr, proc.stderr

