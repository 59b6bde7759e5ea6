"""Every folder trtflow makes for a run or a node is held as a descriptor from its creation (issue 31 item 3,
`trtflow/storage/confined/folders.py`): a co-writer of a shared store that swaps ``tmp/<run>``, the node's scratch
folder and ``logs/<run>`` for links to folders outside, while a node runs, changes nothing outside, and the run
still ends well (its outputs come from the folders trtflow made, read through their descriptors).

The node's ``python:`` code tells the test when it runs and waits until the test has swapped the folders (both
wait on what the other did, never on a time)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trtflow.storage.confined.folders import RunFolders, fd_path
from trtflow.storage.confined.reading import tail_of_fd
from trtflow.storage.confined.tree import Tree

RECIPE = """\
name: race
nodes:
  - {name: w, stage: copy, params: {path: data.txt, make: "python:race.py:wait"}}
  - {name: b, stage: synth, params: {text: b, size: 64}, inputs: {source: w}}
"""

WAIT = """\
import os
import time


def wait():
    sync = {sync!r}
    os.close(os.open(os.path.join(sync, "started"), os.O_CREAT | os.O_WRONLY, 0o644))
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(sync, "swapped")):
        if time.monotonic() > deadline:
            raise RuntimeError("the co-writer never swapped the folders")
        time.sleep(0.005)
    return "made"
"""


def _await(path: Path, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert proc.poll() is None, f"trtflow ended before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.005)


def _swap(folder: Path, outside: Path) -> Path:
    """What a co-writer of the store can do: move the folder away and put a link to ``outside`` in its place."""
    moved = folder.with_name(folder.name + ".moved")
    os.rename(folder, moved)
    os.symlink(outside, folder, target_is_directory=True)
    return moved


def _listing(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("executor", ["fork server", "fresh process", "inline"])
def test_a_co_writer_swapping_the_run_and_node_folders_for_links_changes_nothing_outside(
        tmp_path: Path, plugin_env: dict[str, str], executor: str) -> None:
    """Each way a node runs: forked from the warm server (its folder's descriptor passed over a socket), a fresh
    process (inherited), in trtflow's own process (``--executor inline``)."""
    sync = tmp_path / "sync"
    sync.mkdir()
    (tmp_path / "race.yaml").write_text(RECIPE)
    (tmp_path / "data.txt").write_text("data-")
    (tmp_path / "race.py").write_text(WAIT.format(sync=str(sync)))
    outside = {name: tmp_path / "outside" / name for name in ("tmp-run", "scratch", "logs-run")}
    for name, folder in outside.items():
        folder.mkdir(parents=True)
        (folder / "victim.txt").write_text(f"the victim's {name}")
        for planted in ("job.json", "result.json", "w.log", "b.log", "fork-server.log"):  # names trtflow writes
            (folder / planted).write_text("the victim's own file of that name")
    (outside["scratch"] / "out").mkdir()  # what a path through the links would need to lead a write outside
    (outside["tmp-run"] / "w" / "out").mkdir(parents=True)
    before = _listing(tmp_path / "outside")
    store = tmp_path / "store"
    env = dict(plugin_env, TRTFLOW_NO_FORK_SERVER="1") if executor == "fresh process" else plugin_env
    more = ["--executor", "inline"] if executor == "inline" else []
    proc = subprocess.Popen([sys.executable, "-m", "trtflow.cli", "run", "race.yaml", "--store", str(store), "-j",
                             "1", *more], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        _await(sync / "started", proc, "node w running")
        (run,) = [p for p in (store / "tmp").iterdir()]
        scratch = run / "w"
        assert scratch.is_dir() and (store / "logs" / run.name).is_dir()
        # the node's folder first (inside the run's), then the run's folder and the run's logs
        _swap(scratch, outside["scratch"])
        _swap(run, outside["tmp-run"])
        _swap(store / "logs" / run.name, outside["logs-run"])
        (sync / "swapped").write_text("")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert _listing(tmp_path / "outside") == before, "nothing outside the store changed"
    assert proc.returncode == 0, (out, err)
    w = store.parent / "build" / "race" / "w" / "data.bin"
    assert w.read_bytes() == b"data-made", "the output committed is the one the node wrote in its own folder"
    assert (store.parent / "build" / "race" / "b" / "data.bin").is_file()
    assert os.path.islink(run) and os.path.islink(store / "logs" / run.name), "the planted links are left alone"
    moved_logs = store / "logs" / (run.name + ".moved")
    assert {"w.log", "b.log"} <= {p.name for p in moved_logs.iterdir()}, "the logs went to trtflow's own folder"


def test_a_held_folder_is_made_fresh_private_and_removed_through_its_descriptor(tmp_path: Path) -> None:
    store = Tree(tmp_path / "store")
    store.ensure()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (tmp_path / "store" / "tmp").mkdir()
    (tmp_path / "store" / "tmp" / "r1").symlink_to(outside)  # planted before the run: replaced, never followed
    folders = RunFolders(store, "r1")
    node = folders.node("n")
    assert not os.path.islink(tmp_path / "store" / "tmp" / "r1")
    assert os.stat(tmp_path / "store" / "tmp" / "r1" / "n").st_mode & 0o777 == 0o700
    path = fd_path(node.scratch)
    (path / "made-by-a-library.txt").write_text("x")  # a library writing by path lands in the held folder
    os.rename(tmp_path / "store" / "tmp" / "r1", tmp_path / "store" / "tmp" / "r1.moved")
    (tmp_path / "store" / "tmp" / "r1").symlink_to(outside)
    assert (path / "made-by-a-library.txt").read_text() == "x"
    os.write(node.log_fd, b"line one\nthe end\n")  # the node's output, read back through the same descriptor
    assert tail_of_fd(node.log_fd, 8) == "the end\n"
    assert (tmp_path / "store" / "logs" / "r1" / "n.log").read_text() == "line one\nthe end\n"
    folders.end_node("n", node)
    folders.close()
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert os.path.islink(tmp_path / "store" / "tmp" / "r1")
    assert list((tmp_path / "store" / "tmp" / "r1.moved").iterdir()) == []
