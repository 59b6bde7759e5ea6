"""Files under build/ that a cloned repository may carry: a planted output index (`.trtflow.json`) or a link in
place of an output folder must never make `trtflow run` delete, overwrite or read anything outside
build/<recipe>/<node>/.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trtflow.storage.outputs import INDEX
from trtflow.storage.store import Store

CHAIN = """\
name: chain
nodes:
  - {name: a, stage: synth, params: {text: a, size: 5000}}
  - {name: b, stage: synth, params: {text: b}, inputs: {source: a}}
"""


def _victims(root: Path) -> dict[Path, bytes]:
    """Files a planted index names: outside build/ (absolute and relative) and a user's file beside build/."""
    files = {root / "outside" / "abs.txt": b"absolute", root / "outside" / "rel.txt": b"relative",
             root / "outside" / "data.bin": b"a file named like an output", root / "notes.txt": b"user notes"}
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return files


def _plant_index(folder: Path, names: list[str], **extra: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    record = {"digest": "0" * 32, "size": 1, "mtime_ns": 1, "ino": 1}
    (folder / INDEX).write_text(json.dumps({"key": "f" * 32, "node": folder.name, "status": "current",
                                            "files": {name: record for name in names}, **extra}))


def _assert_intact(files: dict[Path, bytes]) -> None:
    for path, content in files.items():
        assert path.is_file(), f"{path} was deleted"
        assert path.read_bytes() == content, f"{path} was overwritten"


def test_a_planted_index_deletes_nothing_outside_build(tmp_path: Path, trtflow) -> None:
    """The review's reproduction: an index naming an absolute path and one naming ../../../outside/rel.txt; a
    first run and a re-run after a parameter change leave both files (and every other file outside) alone."""
    victims = _victims(tmp_path)
    (tmp_path / "chain.yaml").write_text(CHAIN)
    build = tmp_path / "build" / "chain"
    _plant_index(build / "a", [str(tmp_path / "outside" / "abs.txt"), "../../../outside/rel.txt",
                               "../../../notes.txt"])
    _plant_index(build / "b", ["../../../outside/rel.txt", str(tmp_path / "outside" / "data.bin"),
                               "../../../outside/data.bin"], key=None)

    first = trtflow("run", "chain.yaml")
    assert first.returncode == 0, first.stdout + first.stderr
    _assert_intact(victims)
    assert (build / "a" / "data.bin").is_file() and (build / "b" / "data.bin").is_file()

    # a parameter change: `a` and `b` are stale, their outdated copies are retracted (by the index trtflow
    # wrote, now planted again), then rebuilt
    _plant_index(build / "a", [str(tmp_path / "outside" / "abs.txt"), "../../../outside/rel.txt"])
    changed = trtflow("run", "chain.yaml", "--set", "nodes.a.params.text=a2")
    assert changed.returncode == 0, changed.stdout + changed.stderr
    _assert_intact(victims)
    index = json.loads((build / "a" / INDEX).read_text())
    assert set(index["files"]) == {"data.bin"}, "the new index lists only what trtflow put there"


def test_outdated_copies_are_still_removed(tmp_path: Path, trtflow) -> None:
    """Confining the index keeps its job: a node that must run again loses its previous copies first, so a failure
    never leaves the previous result looking current."""
    (tmp_path / "chain.yaml").write_text(CHAIN)
    assert trtflow("run", "chain.yaml").returncode == 0
    copy = tmp_path / "build" / "chain" / "a" / "data.bin"
    assert copy.is_file()
    again = trtflow("run", "chain.yaml", "--set", "nodes.a.params.fail=true")
    assert again.returncode == 1, again.stdout + again.stderr
    assert not copy.exists()
    assert json.loads((copy.parent / INDEX).read_text())["status"] == "stale"


def test_an_edited_copy_is_left_alone_when_outdated(tmp_path: Path) -> None:
    """`retract` removes only the copies trtflow made (same size, mtime and inode as its index records)."""
    store = Store(tmp_path / "store")
    store.ensure()
    out = tmp_path / "scratch"
    out.mkdir()
    (out / "data.bin").write_bytes(b"payload")
    (out / "log.txt").write_bytes(b"log")
    manifest = store.commit("ab" * 16, {"node": "n"}, out, {"data": ("data.bin", "blob"), "log": ("log.txt", "t")})
    dest = tmp_path / "build" / "n"
    store.materialize(manifest, dest)
    (dest / "log.txt").write_bytes(b"edited by the user")
    assert store.retract(dest, "outdated: test") == ["data.bin"]
    assert not (dest / "data.bin").exists()
    assert (dest / "log.txt").read_bytes() == b"edited by the user"
    assert json.loads((dest / INDEX).read_text())["status"] == "stale"


@pytest.mark.parametrize("through", ["node folder", "sub-folder"])
def test_a_linked_output_folder_is_neither_written_nor_emptied(tmp_path: Path, trtflow, through: str) -> None:
    """build/<recipe>/<node> (or a folder inside it) replaced by a link to another place: trtflow refuses to put
    outputs there and deletes nothing there, even with a planted index naming the files it holds."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "data.bin").write_bytes(b"precious")
    (elsewhere / "model.onnx").write_bytes(b"precious too")
    build = tmp_path / "build" / "chain"
    build.mkdir(parents=True)
    (tmp_path / "chain.yaml").write_text(CHAIN)
    if through == "node folder":
        (build / "a").symlink_to(elsewhere, target_is_directory=True)
        st = (elsewhere / "data.bin").stat()
        record = {"size": 8, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino,
                  "digest": "0" * 32}
        (elsewhere / INDEX).write_text(json.dumps({"key": "f" * 32, "files": {"data.bin": record,
                                                                               "model.onnx": record}}))
    else:
        (build / "a").mkdir()
        (build / "a" / "sub").symlink_to(elsewhere, target_is_directory=True)
        _plant_index(build / "a", ["sub/data.bin", "sub/model.onnx"])
    proc = trtflow("run", "chain.yaml")
    assert (elsewhere / "data.bin").read_bytes() == b"precious"
    assert (elsewhere / "model.onnx").read_bytes() == b"precious too"
    if through == "node folder":
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "is a symbolic link" in proc.stdout and "remove the link" in proc.stdout, proc.stdout
        assert sorted(p.name for p in elsewhere.iterdir()) == [INDEX, "data.bin", "model.onnx"]
    else:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (build / "a" / "data.bin").is_file()


@pytest.mark.parametrize("kind", ["link to /dev/zero", "named pipe", "huge"])
def test_an_index_that_is_not_a_small_regular_file_is_ignored(tmp_path: Path, kind: str) -> None:
    """Reading a planted index never blocks (a FIFO), never reads without end (/dev/zero), never follows a link."""
    store = Store(tmp_path / "store")
    store.ensure()
    out = tmp_path / "scratch"
    out.mkdir()
    (out / "data.bin").write_bytes(b"payload")
    manifest = store.commit("cd" * 16, {"node": "n"}, out, {"data": ("data.bin", "blob")})
    dest = tmp_path / "build" / "n"
    dest.mkdir(parents=True)
    if kind == "link to /dev/zero":
        (dest / INDEX).symlink_to("/dev/zero")
    elif kind == "named pipe":
        os.mkfifo(dest / INDEX)
    else:
        with open(dest / INDEX, "wb") as f:
            f.write(b'{"files": {"data.bin": {}}, "pad": "')
            f.truncate(64 * 2**20)
    assert store.retract(dest, "outdated") == []
    paths = store.materialize(manifest, dest)
    assert paths["data"].read_bytes() == b"payload"
    assert (dest / INDEX).is_file() and not (dest / INDEX).is_symlink()


@pytest.mark.parametrize("folder", ["logs", "tmp", "locks", "objects", "crashes"])
def test_a_planted_store_folder_link_never_leads_gc_or_a_run_out_of_the_store(tmp_path: Path, trtflow,
                                                                              folder: str) -> None:
    """The default store `.trtflow/` sits in the working directory, which a cloned repository controls: a store
    folder that is a link to another place is refused before gc (or a run) deletes or writes anything there."""
    (tmp_path / "chain.yaml").write_text(CHAIN)
    assert trtflow("run", "chain.yaml", "--store", ".trtflow").returncode == 0
    victim = tmp_path / "victim"
    (victim / "20200101-000000-abcdef").mkdir(parents=True)
    (victim / "20200101-000000-abcdef" / "thesis.tex").write_text("years of work")
    (victim / "notes.txt").write_text("notes")
    (victim / ".hidden").write_text("dot file")
    store = tmp_path / ".trtflow"
    planted = store / folder
    import shutil

    shutil.rmtree(planted, ignore_errors=True)
    planted.symlink_to(victim, target_is_directory=True)
    for command in (["gc"], ["verify", "--fix"], ["run", "chain.yaml", "--set", "nodes.a.params.text=z"]):
        proc = trtflow(*command, "--store", ".trtflow")
        assert proc.returncode == 4, (command, proc.stdout, proc.stderr)
        assert f"the store's folder {planted} is a symbolic link" in proc.stderr, proc.stderr
        assert sorted(p.name for p in victim.iterdir()) == [".hidden", "20200101-000000-abcdef", "notes.txt"]
        assert (victim / "20200101-000000-abcdef" / "thesis.tex").read_text() == "years of work"


def test_a_planted_shard_link_is_neither_followed_nor_emptied(tmp_path: Path, trtflow) -> None:
    """objects/ab or nodes/ab replaced by a link: gc and verify --fix delete nothing through it; verify names it."""
    (tmp_path / "chain.yaml").write_text(CHAIN)
    assert trtflow("run", "chain.yaml").returncode == 0
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "0123456789abcdef0123456789abcdef").write_text("named like an object")
    (victim / "0123456789abcdef0123456789abcdef.json").write_text("named like a manifest")
    (victim / ".partial").write_text("named like a partial download")
    store = Store(tmp_path / "store")
    for base in ("objects", "nodes"):
        (store.root / base / "zz").symlink_to(victim, target_is_directory=True)
    verify = trtflow("verify")
    assert verify.returncode == 1 and "folder objects/zz is a symbolic link" in verify.stdout, verify.stdout
    assert trtflow("gc").returncode == 0
    assert trtflow("verify", "--fix").returncode == 0
    assert sorted(p.name for p in victim.iterdir()) == [".partial", "0123456789abcdef0123456789abcdef",
                                                       "0123456789abcdef0123456789abcdef.json"]
    assert not (store.root / "objects" / "zz").exists(), "verify --fix removes the link itself"


def test_a_planted_journal_row_never_leads_the_scratch_cleanup_out_of_the_store(tmp_path: Path, trtflow) -> None:
    """A run removes the scratch space of runs the journal says died on this host; a run id from the journal
    becomes a path, so one that is not a plain name (`../../victim`) is ignored."""
    import sqlite3
    import subprocess

    (tmp_path / "chain.yaml").write_text(CHAIN)
    assert trtflow("run", "chain.yaml").returncode == 0
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    dead = subprocess.Popen(["true"])
    dead.wait()
    with sqlite3.connect(tmp_path / "store" / "trtflow.db") as db:
        db.execute("INSERT INTO runs (id, status, pid, host) VALUES (?, 'running', ?, ?)",
                   ("../../victim", dead.pid, os.uname().nodename))
    proc = trtflow("run", "chain.yaml", "--set", "nodes.a.params.text=other")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (victim / "keep.txt").read_text() == "keep"
