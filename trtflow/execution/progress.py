"""Live progress of running nodes: what each stage last reported, how long it has run, its memory.

`ProgressBoard` is an observer: node threads add a node when its stage starts (``node_started``), the run's
thread removes it when its end is recorded (``node_ended``) and reads the board every tick (``poll``). The board
guards its table with a lock; reading progress files and /proc happens outside it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from trtflow.execution.observers import NodeStart, RunObserver
from trtflow.execution.results import NodeResult, Progress
from trtflow.storage import records
from trtflow.storage.confined.tree import Tree


class ProgressBoard(RunObserver):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, tuple[Tree, float]] = {}  # node -> (its scratch folder: our own descriptor, started)

    def node_started(self, start: NodeStart) -> None:
        if start.folder is None:
            return
        folder = start.folder.subtree()  # a descriptor of our own: the runner closes its own when the node ends
        with self._lock:
            self._running[start.node] = (folder, start.started)

    def node_ended(self, result: NodeResult) -> None:
        with self._lock:
            ended = self._running.pop(result.node, None)
        if ended is not None:
            ended[0].close()

    def poll(self, pid_of: Callable[[str], int | None]) -> list[tuple[str, Progress]]:
        """The latest progress of every running node (``pid_of``: the executor's process of a node, if any)."""
        with self._lock:
            running = list(self._running.items())
        now = time.time()
        found = []
        for node, (scratch, started) in running:
            try:
                if os.fstat(scratch.fd()).st_nlink == 0:  # the stage has ended and its folder is gone
                    continue
            except OSError:
                continue
            fraction, message = last_progress(scratch)
            pid = pid_of(node)
            found.append((node, Progress(fraction, message, now - started, rss(pid) if pid else None)))
        return found


def last_progress(scratch: Tree) -> tuple[float | None, str]:
    """The fraction and message of the last line a stage wrote with `StageContext.progress` (``progress.jsonl`` of
    its scratch folder, held)."""
    try:
        lines = scratch.read_tail("progress.jsonl", 4096).strip().splitlines()
        last = records.parse(records.PROGRESS_LINE, lines[-1], str(scratch.shown("progress.jsonl"))) if lines else {}
    except (OSError, ValueError, IndexError):
        return None, ""
    return last.get("fraction"), str(last.get("message", ""))


def rss(pid: int) -> int | None:
    """Resident memory of a process, in bytes (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None
