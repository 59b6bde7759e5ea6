"""The fork server imports the later nodes' preloads while it is idle (``prefetch``), and still forks nodes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from trtflow.execution.forkserver import ForkServerClient


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the server's memory maps (Linux)")
def test_prefetched_modules_are_imported_by_the_idle_server() -> None:
    pytest.importorskip("curses")  # a C extension: its shared object shows in the server's maps once imported
    client = ForkServerClient()
    try:
        pid = client._proc.pid
        assert "_curses" not in _maps(pid)
        client.prefetch(["curses", "no_such_module_trtflow_prefetch"])  # a missing one is said and skipped
        deadline = time.monotonic() + 60.0
        while "_curses" not in _maps(pid):  # waits on the observed import, not a fixed sleep
            assert client.alive and time.monotonic() < deadline, "the server never imported the prefetched module"
            time.sleep(0.05)
        assert client.alive
    finally:
        client.close()


def _full_pipe() -> tuple[int, int]:
    """A pipe whose buffer is full: a node process given its write end as log blocks at its first message."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        while True:
            os.write(write, b"x" * 65536)
    except BlockingIOError:
        pass
    os.set_blocking(write, True)
    return read, write


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the server's memory maps (Linux)")
def test_nothing_is_imported_ahead_while_a_node_that_runs_alone_is_running(tmp_path: Path) -> None:
    """An exclusive node (a benchmark) runs with nothing of trtflow beside it: the server's imports ahead wait
    until it has ended, then go on."""
    pytest.importorskip("curses")
    client = ForkServerClient()
    read, write = _full_pipe()
    scratch = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        pid = client._proc.pid
        # a node with no job.json fails at once and blocks writing why into its full log: it stays running
        alone = client.spawn(scratch, write, {}, [], None, alone=True)
        client.prefetch(["curses"])
        other = client.spawn(scratch, null, {}, [], None)  # answered after the prefetch request was read
        assert other.exited.wait(60.0) and not alone.exited.is_set()
        assert "_curses" not in _maps(pid)  # not imported beside the node that runs alone
        os.set_blocking(read, False)
        deadline = time.monotonic() + 60.0
        while not alone.exited.is_set():  # drain its log until it has ended
            try:
                os.read(read, 65536)
            except BlockingIOError:
                time.sleep(0.01)
            assert time.monotonic() < deadline, "the node never ended"
        while "_curses" not in _maps(pid):  # then the server imports ahead again
            assert client.alive and time.monotonic() < deadline, "the prefetched module was never imported"
            time.sleep(0.05)
    finally:
        client.close()
        for fd in (read, write, scratch, null):
            os.close(fd)
