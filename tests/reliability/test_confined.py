"""The confined file layer (trtflow/storage/confined/) is the only code that touches the store and build/.

Two parts:
- a static audit of the sources: no module of trtflow/ but a short list (each with its reason, none of which is
  handed a store or build path) calls a file-system function (open, os.*, shutil.*, pathlib's methods, sqlite3,
  tempfile, filelock), and no call on the list, nor any in stages/, passes an expression that names the store or
  build/;
- the layer's own rules, each tried against what a cloned repository or another writer of a shared store can
  plant: a link at every component, a named pipe, a link to /dev/zero, a huge file, a hard link, someone else's
  file, a name that leaves its folder.
"""

from __future__ import annotations

import ast
import os
import stat
import threading
import time
import unittest.mock
from pathlib import Path

import pytest

from trtflow.storage.confined import kinds
from trtflow.storage.confined.names import Refused, check_name, is_plain_name
from trtflow.storage.confined.tree import Tree

REPO = Path(__file__).resolve().parents[2]

#: The confined layer: every module of this package may call the file system, and its primitives for one file named
#: by its path (trtflow/userfiles.py, which the store's trees use too).
LAYER = ("trtflow/storage/confined/", "trtflow/userfiles.py")
#: Other modules that may call the file system directly, and why: none is given a path under the store or build/.
#: (Reading and writing one file by its path is `trtflow/userfiles.py`, part of the layer; the project's trust file,
#: provenance, -o outputs, recipes and sources go through it.)
ALLOWED = {
    "trtflow/fsutil.py": "the user's project: resolving recipe paths, walking a folder a recipe names",
    "trtflow/fingerprint.py": "hashes the files a recipe names (store objects are hashed through confined's "
                              "descriptors)",
    "trtflow/environment.py": "/proc/cpuinfo",
    "trtflow/execution/scheduler.py": "/proc/meminfo, cgroups, the host's GPU locks (/tmp/trtflow-gpu-locks)",
    "trtflow/execution/diagnosis.py": "/proc and cgroups",
    "trtflow/execution/progress.py": "/proc/<pid>/status",
    "trtflow/readtrace.py": "/proc/<pid>/mem of the observed child, read-only; the paths it names: lstat and "
                            "readlink, never opened",
    "trtflow/execution/forkserver.py": "/proc/self/status, /dev/null",
    "trtflow/testing.py": "a temporary folder of its own for a stage test",
    "trtflow/keys.py": "makes the user's key folder (0700) and lists it; its files are read and written through "
                       "trtflow.userfiles",
    "trtflow/execution/noop.py": "stats and walks the user's code and data (its records, manifests and objects go "
                                 "through the store's confined tree)",
}
OS_CALLS = {"open", "replace", "rename", "renames", "unlink", "remove", "rmdir", "removedirs", "chmod", "lchmod",
            "chown", "lchown", "makedirs", "mkdir", "link", "symlink", "truncate", "mkfifo", "mknod", "utime",
            "listdir", "scandir", "walk", "fwalk"}
SHUTIL_HARMLESS = {"which", "disk_usage", "get_terminal_size"}
TEMPFILE_CALLS = {"mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryDirectory", "TemporaryFile"}
#: pathlib's methods, by the number of positional arguments pathlib takes (the confined Tree's methods of the same
#: name take the path below the tree first, so they never match).
PATH_METHODS = {"write_text": {1}, "write_bytes": {1}, "read_text": {0}, "read_bytes": {0}, "unlink": {0},
                "mkdir": {0}, "touch": {0}, "iterdir": {0}, "rmdir": {0}, "chmod": {1}, "lchmod": {1},
                "rename": {1}, "replace": {1}, "symlink_to": {1}, "hardlink_to": {1}, "glob": {1}, "rglob": {1},
                "open": {0, 1}}
MODULES_WITH_OPEN = {"tarfile", "zipfile", "gzip", "bz2", "lzma", "io", "codecs", "Image", "h5py", "webbrowser",
                     "tokenize", "fs", "self.fs"}
#: What names the store or build/ in an expression (a store's paths, a node's scratch and logs, the outputs).
STORE_WORDS = ("store", "object_path", "manifest_path", "tmp_dir", "db_path", "log_path", "scratch", "output_dir",
               "cache_dir", "'build'", '"build"', ".trtflow", "noop", "refs", "job_file", "result_file", "out_dir")
STAGE_STORE_WORDS = ("store", "object_path", "manifest_path", "db_path", "cache_dir", "'build'", '"build"',
                     ".trtflow")


def _file_calls(tree: ast.AST) -> list[tuple[ast.Call, str]]:
    """Every call of a file-system function in ``tree``, with what it is."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("open", "FileLock", "SoftFileLock"):
            found.append((node, f"{func.id}()"))
            continue
        if not isinstance(func, ast.Attribute):
            continue
        owner = ast.unparse(func.value)
        name = func.attr
        if (owner == "os" and name in OS_CALLS) or (owner == "shutil" and name not in SHUTIL_HARMLESS) \
                or (owner == "sqlite3" and name == "connect") or (owner == "tempfile" and name in TEMPFILE_CALLS) \
                or (owner in ("filelock", "io", "builtins") and name in ("open", "FileLock", "SoftFileLock")):
            found.append((node, f"{owner}.{name}()"))
        elif name in PATH_METHODS and len(node.args) in PATH_METHODS[name] and owner not in MODULES_WITH_OPEN \
                and not (name == "replace" and node.keywords):
            found.append((node, f".{name}()"))
    return found


def _names_store(call: ast.Call, words: tuple[str, ...]) -> bool:
    text = " ".join(ast.unparse(part) for part in [call.func, *call.args, *(k.value for k in call.keywords)])
    return any(word in text for word in words)


def audit(path: Path, rel: str) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    problems = []
    for call, what in _file_calls(tree):
        where = f"{rel}:{call.lineno}"
        if rel.startswith("stages/"):
            if _names_store(call, STAGE_STORE_WORDS):
                problems.append(f"{where}: {what} on a store or build/ path (use trtflow.storage.confined)")
        elif rel.startswith(LAYER):
            continue
        elif rel not in ALLOWED:
            problems.append(f"{where}: {what} outside the confined layer ({LAYER[0]}, {LAYER[1]})")
        elif _names_store(call, STORE_WORDS):
            problems.append(f"{where}: {what} on a store or build/ path (use trtflow.storage.confined)")
    return problems


def test_no_module_but_the_confined_layer_touches_the_store_or_build() -> None:
    files = sorted([*REPO.joinpath("trtflow").rglob("*.py"), *REPO.joinpath("stages").rglob("*.py")])
    assert len(files) > 50
    problems = [p for path in files for p in audit(path, path.relative_to(REPO).as_posix())]
    assert problems == [], "\n".join(problems)
    assert all((REPO / rel).is_file() for rel in ALLOWED), "the allow-list names modules that exist"


@pytest.mark.parametrize(("code", "rel", "expected"), [
    ("open(p, 'w')", "trtflow/execution/x.py", "open()"),
    ("os.replace(a, b)", "trtflow/storage/store.py", "os.replace()"),
    ("shutil.rmtree(d)", "trtflow/execution/run.py", "shutil.rmtree()"),
    ("path.write_text('x')", "trtflow/storage/refs.py", ".write_text()"),
    ("(store.root / 'x').unlink(missing_ok=True)", "trtflow/storage/gc.py", ".unlink()"),
    ("p.chmod(0o644)", "trtflow/storage/verify.py", ".chmod()"),
    ("p.replace(q)", "trtflow/storage/verify.py", ".replace()"),
    ("sqlite3.connect(path)", "trtflow/storage/journal.py", "sqlite3.connect()"),
    ("FileLock(str(p))", "trtflow/execution/lifecycle.py", "FileLock()"),
    ("with open(store.root / 'x') as f: pass", "trtflow/fsutil.py", "open()"),
    ("Path(output_dir / 'x').write_bytes(b'')", "trtflow/cli/console.py", ".write_bytes()"),
    ("(Path('build') / name / 'r.json').write_text(t)", "stages/cli/x.py", ".write_text()"),
    ("shutil.copyfile(src, store.object_path(d))", "stages/x.py", "shutil.copyfile()"),
])
def test_the_audit_catches_a_file_call_around_the_layer(tmp_path: Path, code: str, rel: str, expected: str) -> None:
    problems = _audit_text(tmp_path, code, rel)
    assert len(problems) == 1 and f": {expected} " in problems[0], problems


@pytest.mark.parametrize(("code", "rel"), [
    ("store.tree.write_text(rel, text)", "trtflow/storage/store.py"),
    ("tree.unlink(('nodes', 'ab', 'x.json'))", "trtflow/storage/gc.py"),
    ("self.tree.rename(src, dst)", "trtflow/storage/journal.py"),
    ("text.replace('a', 'b')", "trtflow/storage/refs.py"),
    ("open('/proc/meminfo')", "trtflow/execution/scheduler.py"),
    ("Path(ctx.scratch / 'x').write_bytes(b'')", "stages/x.py"),
    ("shutil.disk_usage(store_root)", "trtflow/execution/diagnosis.py"),
])
def test_the_audit_lets_the_layer_and_other_paths_be(tmp_path: Path, code: str, rel: str) -> None:
    assert _audit_text(tmp_path, code, rel) == []


def _audit_text(folder: Path, code: str, rel: str) -> list[str]:
    path = folder / "m.py"
    path.write_text(code + "\n")
    return audit(path, rel)


# ------------------------------------------------------------------------------------- run and node folders
#: What opens a folder by its path. The folders trtflow makes for a run or a node (``tmp/<run>``, a node's scratch,
#: ``logs/<run>``, a Ray worker's folder) are held as descriptors from their creation (`confined/folders.py`) and
#: never opened by a path again; so outside the confined layer every call of these, and every walk from the store's
#: root to a run's folder by its name (``scratch_rel``, ``log_rel``, the Ray transfer area), is refused unless the
#: function it is in is named here, with why what it opens is not such a folder (or, said so, not held yet).
PATH_OPENERS = {"Tree", "locate", "confined_locate", "tail_of", "as_tree", "private_folder"}
RUN_FOLDER_WALKS = ("scratch_rel(", "log_rel(", "TRANSFER")
BY_PATH = {
    ("trtflow/storage/store.py", "__init__"): "the store's root",
    ("trtflow/storage/store.py", "commit"): "as_tree of the tree it is given (the node's out/, held by the runner)",
    ("trtflow/storage/store.py", "log_path"): "a log's path for messages and the journal, never opened",
    ("trtflow/storage/journal.py", "__init__"): "the journal's folder (the store's root)",
    ("trtflow/storage/outputs.py", "node_folder"): "the output folder the user chose (build/)",
    ("trtflow/storage/remote/directory.py", "__init__"): "a remote cache's root",
    ("trtflow/storage/remote/directory.py", "clear"): "the parent of a remote folder the user named",
    ("trtflow/storage/remote/cache.py", "upload_outputs"): "as_tree of the tree it is given (a worker's held out/)",
    ("trtflow/storage/gc.py", "_collect"): "gc: the Ray transfer folders of runs that ended, walked without links "
                                           "and removed through descriptors (no run holds them)",
    ("trtflow/execution/observers.py", "reap_dead_runs"): "the scratch of runs that died (no process holds it), "
                                                          "walked without links, removed through descriptors",
    ("trtflow/execution/build.py", "build"): "the scratch folder's path for messages (reached by its descriptor)",
    ("trtflow/execution/build.py", "_keep_for_repro"): "the names a crashed node's folder is moved to, from the "
                                                       "held run folder",
    ("trtflow/execution/protocol.py", "scratch_tree"): "a job made by hand: no runner holds its folder",
    ("trtflow/execution/diagnosis.py", "native_step"): "a caller by hand (the local executor hands the held folder)",
    ("trtflow/execution/diagnosis.py", "crash_trace"): "a caller by hand (the local executor hands the held log)",
    ("trtflow/execution/local.py", "start"): "an executor used without a runner: the fork server's log",
    ("trtflow/execution/ray_executor.py", "execute"): "a job made by hand: its log by its path",
    ("trtflow/execution/ray_executor.py", "_run_node"): "a Ray worker's own folder, made by mkdtemp and held at once "
                                                        "(private_folder); its parent, the system's temporary folder",
    ("trtflow/execution/ray_executor.py", "transfer_area"): "NOT held yet: a local Ray cluster's transfer area, "
                                                            "walked without links from the store's root (workers "
                                                            "of other processes open it by its path)",
    ("trtflow/execution/ray_executor.py", "_clear_transfer"): "NOT held yet: see transfer_area",
    ("trtflow/node_keys.py", "module_digest"): "KeyContext.locate: a project file, not a folder",
    ("trtflow/plan.py", "taken_slots"): "KeyContext.locate: a project file, not a folder",
    ("trtflow/plan.py", "_observe_result"): "KeyContext.locate: a project file, not a folder",
    ("trtflow/stage.py", "__init__"): "SharedCache: the store's caches folder, walked without links below the store; "
                                      "a StageContext made by hand (trtflow.testing) without a held folder",
    ("trtflow/stage.py", "progress"): "a StageContext made by hand names a progress file of its own",
    ("trtflow/report/console.py", "_log_tail"): "a result made elsewhere: no log end read through the held log",
    ("stages/cli/debug.py", "_write_json"): "a file the user names under build/",
}


def folder_audit(path: Path, rel: str) -> list[str]:
    """Calls outside the confined layer that open a folder by its path, or walk to a run's folder by its name, in
    a function `BY_PATH` does not name."""
    if rel.startswith(LAYER):
        return []
    text = path.read_text(encoding="utf-8")
    may_walk = any(word in text for word in RUN_FOLDER_WALKS)
    if not may_walk and not any(name in text for name in PATH_OPENERS):
        return []
    problems: list[str] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            walks = may_walk and isinstance(func, ast.Attribute) and name != "shown" and any(
                word in ast.unparse(arg) for arg in [*node.args, *(k.value for k in node.keywords)]
                for word in RUN_FOLDER_WALKS)
            if (name in PATH_OPENERS or walks) and (rel, function) not in BY_PATH:
                problems.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:80]} opens a folder by its path (a run's "
                                "or a node's folder is held from its creation: trtflow/storage/confined/folders.py)")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(text, filename=rel), "<module>")
    return problems


def test_no_module_opens_a_run_or_node_folder_by_its_path() -> None:
    files = sorted([*REPO.joinpath("trtflow").rglob("*.py"), *REPO.joinpath("stages").rglob("*.py")])
    problems = [p for path in files for p in folder_audit(path, path.relative_to(REPO).as_posix())]
    assert problems == [], "\n".join(problems)
    assert all((REPO / rel).is_file() for rel, _ in BY_PATH), "the allow-list names modules that exist"


@pytest.mark.parametrize(("code", "rel"), [
    ("def f(job):\n    return Tree(job.scratch)", "trtflow/execution/worker.py"),
    ("def f(job):\n    tree, rel = locate(job.log_path)", "trtflow/execution/forkserver.py"),
    ("def f(store, run):\n    store.tree.mkdir(store.scratch_rel(run, 'n'))", "trtflow/execution/build.py"),
    ("def f(store, run):\n    store.tree.remove_tree(('ray-remote', run, TRANSFER))", "trtflow/execution/run.py"),
    ("def f(p):\n    return tail_of(p, 10)", "trtflow/execution/progress.py"),
    ("def scratch_tree(self):\n    return Tree(self.scratch)", "trtflow/execution/local.py"),
])
def test_the_folder_audit_catches_a_folder_opened_by_its_path(tmp_path: Path, code: str, rel: str) -> None:
    path = tmp_path / "m.py"
    path.write_text(code + "\n")
    problems = folder_audit(path, rel)
    assert len(problems) == 1 and "opens a folder by its path" in problems[0], problems


# ------------------------------------------------------------------------------------------------ the layer
@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the tree with a file in it, to be left exactly as it is."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("secret")
    (folder / "secret.txt").chmod(0o600)
    return folder


def snapshot(folder: Path) -> dict[str, tuple[int, int, bytes]]:
    found = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        found[str(path.relative_to(folder))] = (st.st_mode, st.st_mtime_ns,
                                                path.read_bytes() if stat.S_ISREG(st.st_mode) else b"")
    return found


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_a_link_at_any_component_stops_every_operation(tmp_path: Path, outside: Path, depth: int) -> None:
    root = tmp_path / "store"
    parts = ["a", "b", "c"]
    real = root.joinpath(*parts[:depth])
    real.mkdir(parents=True)
    (real / parts[depth]).symlink_to(outside, target_is_directory=True)
    rel = (*parts, "secret.txt")
    before = snapshot(outside)
    tree = Tree(root)
    operations = [
        lambda: tree.read_bytes(rel, kinds.NOTE), lambda: tree.write_bytes(rel, b"x"),
        lambda: tree.append(rel, b"x"), lambda: tree.chmod(rel, 0o644), lambda: tree.unlink(rel),
        lambda: tree.remove_tree(rel), lambda: tree.mkdir((*rel[:-1], "new")), lambda: tree.create(rel, b"x"),
        lambda: tree.open_lock(rel), lambda: tree.rename(rel, "moved"), lambda: tree.stat(rel),
        lambda: tree.listdir(rel[:-1]), lambda: tree.subtree(rel[:-1]),
    ]
    for operation in operations:
        with pytest.raises(Refused, match="is a symbolic link"):
            operation()
    assert snapshot(outside) == before
    assert tree.remove_tree(parts[: depth + 1]) and outside.is_dir(), "the link is removed, never what it points to"


def test_a_root_found_by_default_may_not_be_a_link_one_the_user_named_may(tmp_path: Path, outside: Path) -> None:
    (tmp_path / ".trtflow").symlink_to(outside, target_is_directory=True)
    with pytest.raises(Refused, match="is a symbolic link"):
        Tree(tmp_path / ".trtflow", follow_root=False).read_bytes("secret.txt", kinds.NOTE)
    assert Tree(tmp_path / ".trtflow").read_bytes("secret.txt", kinds.NOTE) == b"secret"


KINDS = [kinds.MANIFEST, kinds.REFS, kinds.LEDGER, kinds.NOOP_RECORD, kinds.FORMAT_FILE,
         kinds.INDEX, kinds.NOTE, kinds.JOB, kinds.CACHE]


@pytest.mark.parametrize("file_kind", KINDS, ids=lambda k: k.name)
@pytest.mark.parametrize("kind", ["named pipe", "link to /dev/zero", "huge", "folder"])
def test_only_a_small_regular_file_is_read(tmp_path: Path, kind: str, file_kind: kinds.Kind) -> None:
    """For every kind of file trtflow reads: a pipe is refused without blocking (bounded time, no sleep),
    /dev/zero is never read, a file larger than its kind's cap is refused before it is read (a sparse file)."""
    tree = Tree(tmp_path)
    target = tmp_path / "format.json"
    if kind == "named pipe":
        os.mkfifo(target)
    elif kind == "link to /dev/zero":
        target.symlink_to("/dev/zero")
    elif kind == "folder":
        target.mkdir()
    else:
        with open(target, "wb") as f:
            f.truncate(file_kind.cap + 1)
    done = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        try:
            tree.read_bytes("format.json", file_kind)
        except BaseException as exc:
            errors.append(exc)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(30), "reading blocked"
    assert len(errors) == 1 and isinstance(errors[0], Refused), errors
    expected = {"named pipe": "a named pipe", "link to /dev/zero": "symbolic link",
                "huge": f"more than a {file_kind.name}", "folder": "a folder"}[kind]
    assert expected in str(errors[0])


def test_a_write_replaces_a_planted_link_and_never_writes_through_it(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "current.json").symlink_to(outside / "secret.txt")
    before = snapshot(outside)
    Tree(tmp_path).write_text("current.json", "{}")
    assert snapshot(outside) == before
    assert (tmp_path / "current.json").read_text() == "{}" and not (tmp_path / "current.json").is_symlink()


@pytest.mark.parametrize("planted", ["link", "named pipe", "hard link", "folder"])
def test_a_ledger_is_appended_to_only_when_trtflow_made_it(tmp_path: Path, outside: Path, planted: str,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    ledger = tmp_path / ".pending.jsonl"
    if planted == "link":
        ledger.symlink_to(outside / "secret.txt")
    elif planted == "named pipe":
        os.mkfifo(ledger)
    elif planted == "hard link":
        os.link(outside / "secret.txt", ledger)
    else:
        ledger.mkdir()
    before = snapshot(outside)
    Tree(tmp_path).append(".pending.jsonl", b'{"keys": {}}\n')
    assert snapshot(outside) == before
    assert ledger.is_file() and not ledger.is_symlink() and ledger.stat().st_nlink == 1
    assert ledger.read_bytes() == b'{"keys": {}}\n'
    assert "trtflow appends only to ledgers it made: moved it aside" in caplog.text
    assert len(list(tmp_path.glob(".pending.jsonl.refused-*"))) == 1


def test_a_ledger_trtflow_made_is_appended_to(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.append("history.jsonl", b"one\n")
    inode = (tmp_path / "history.jsonl").stat().st_ino
    tree.append("history.jsonl", b"two\n")
    assert (tmp_path / "history.jsonl").read_bytes() == b"one\ntwo\n"
    assert (tmp_path / "history.jsonl").stat().st_ino == inode


def test_chmod_never_follows_a_link(tmp_path: Path, outside: Path) -> None:
    """`verify --fix` and gc made a 0600 file outside 0644 through a link in objects/ (issue 24)."""
    (tmp_path / "objects" / "ab").mkdir(parents=True)
    (tmp_path / "objects" / "ab" / "abcd").symlink_to(outside / "secret.txt")
    with pytest.raises(Refused):
        Tree(tmp_path).chmod(("objects", "ab", "abcd"), 0o644)
    assert stat.S_IMODE((outside / "secret.txt").stat().st_mode) == 0o600


def test_a_read_only_folder_is_made_writable_to_remove_an_entry_never_a_file_outside(tmp_path: Path,
                                                                                      outside: Path) -> None:
    shard = tmp_path / "objects" / "ab"
    shard.mkdir(parents=True)
    (shard / "abcd").symlink_to(outside / "secret.txt")
    shard.chmod(0o555)
    assert Tree(tmp_path).unlink(("objects", "ab", "abcd"))
    assert not (shard / "abcd").exists() and not (shard / "abcd").is_symlink()
    assert stat.S_IMODE((outside / "secret.txt").stat().st_mode) == 0o600


@pytest.mark.parametrize("name", ["../elsewhere", "a/b", "", ".", "..", "x\0y", "x" * 256, 7, None])
def test_a_name_from_a_record_is_plain_or_refused(name: object) -> None:
    assert not is_plain_name(name)
    with pytest.raises(Refused):
        check_name(name)


def test_a_lock_file_planted_as_a_link_is_neither_truncated_nor_locked(tmp_path: Path, outside: Path) -> None:
    """filelock opens its file with O_TRUNC, following links: a planted refs/<recipe>/.lock emptied ~/.bashrc."""
    (tmp_path / ".lock").symlink_to(outside / "secret.txt")
    with pytest.raises(Refused):
        Tree(tmp_path).open_lock(".lock")
    assert (outside / "secret.txt").read_text() == "secret"


def test_a_lock_times_out_instead_of_hanging(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    with tree.lock("x.lock"):
        started = time.monotonic()
        with pytest.raises(TimeoutError), Tree(tmp_path).lock("x.lock", timeout=0.2):
            pass
        assert time.monotonic() - started < 30


def _closed_staged_descriptors(source: str, label: str) -> list[str]:
    """``os.close(fd)`` of a descriptor that `Tree.staged` yielded, inside its with-block."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.With):
            continue
        for item in node.items:
            call, target = item.context_expr, item.optional_vars
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "staged"
                    and isinstance(target, ast.Tuple) and len(target.elts) == 2
                    and isinstance(target.elts[1], ast.Name)):
                continue
            fd = target.elts[1].id
            for inner in (n for statement in node.body for n in ast.walk(statement)):
                if (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "close"
                        and isinstance(inner.func.value, ast.Name) and inner.func.value.id == "os"
                        and [a.id for a in inner.args if isinstance(a, ast.Name)] == [fd]):
                    found.append(f"{label}:{inner.lineno}: os.close({fd}) of a descriptor Tree.staged closes itself")
    return found


def test_no_caller_closes_the_descriptor_staged_closes() -> None:
    """A descriptor closed twice closes, the second time, whatever file the process opened meanwhile under that
    number (a pull from S3 lost the store's manifest write to 'Bad file descriptor' that way)."""
    files = sorted([*REPO.joinpath("trtflow").rglob("*.py"), *REPO.joinpath("stages").rglob("*.py")])
    problems = [p for path in files
                for p in _closed_staged_descriptors(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))]
    assert problems == []
    planted = "with tree.staged(('a',), 'x') as (name, fd):\n    os.close(fd)\n"
    assert _closed_staged_descriptors(planted, "t.py") == [
        "t.py:2: os.close(fd) of a descriptor Tree.staged closes itself"]


def test_a_tree_closed_by_two_threads_closes_its_descriptor_once(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    fd = tree.fd()
    closes: list[int] = []
    real_close = os.close

    def counting_close(number: int) -> None:
        closes.append(number)
        real_close(number)

    with unittest.mock.patch.object(os, "close", counting_close):
        threads = [threading.Thread(target=tree.close) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert closes.count(fd) == 1
