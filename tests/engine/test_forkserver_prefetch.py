"""The fork server imports the later nodes' preloads while it is idle (``prefetch``), and still forks nodes."""

from __future__ import annotations

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
