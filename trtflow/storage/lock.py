"""The store lock: runs share the store, maintenance (gc, verify --fix) has it to itself.

Two ``flock`` files under the store root:
  ``store.lock``  held shared by every run (and by `verify`) for its whole duration, exclusively by gc;
  ``gate.lock``   taken exclusively for a moment by a run before it takes its shared lock, and held by gc for as
                  long as it waits and works, so a stream of overlapping runs cannot starve a waiting gc.
The kernel releases both when a process dies (kill -9 included), so a crashed run never leaves the store
locked. A small ``holders/`` folder names who holds the lock, for the "store busy" message.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from trtflow.errors import StoreBusy, StoreError, TrtflowError
from trtflow.storage import records
from trtflow.storage.confined.names import Refused, check_name
from trtflow.storage.confined.tree import Tree

SHARED, EXCLUSIVE = "shared", "exclusive"
POLL_S = 0.05
HOLDERS = "holders"


class StoreLock:
    """The lock of the store whose folder is ``tree`` (a `Store`'s ``tree``)."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.root = tree.path

    @property
    def path(self) -> Path:
        return self.root / "store.lock"

    @property
    def gate_path(self) -> Path:
        return self.root / "gate.lock"

    @property
    def holders_dir(self) -> Path:
        return self.root / HOLDERS

    @contextmanager
    def held(self, mode: str, what: str, wait_s: float = float("inf"),
             on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
        """Hold the lock in ``mode`` while the block runs; wait at most ``wait_s`` (then `StoreBusy`)."""
        deadline = time.monotonic() + wait_s
        gate = self._open("gate.lock")
        try:
            lock = self._open("store.lock")
        except BaseException:
            os.close(gate)
            raise
        holder: str | None = None
        try:
            _acquire(gate, fcntl.LOCK_EX, deadline, lambda: self._busy_message("maintenance"), on_wait)
            try:
                flag = fcntl.LOCK_SH if mode == SHARED else fcntl.LOCK_EX
                _acquire(lock, flag, deadline, lambda: self._busy_message("run"), on_wait)
            finally:
                if mode == SHARED:
                    fcntl.flock(gate, fcntl.LOCK_UN)
            holder = self._register(mode, what)
            yield
        finally:
            if holder is not None:
                self.tree.unlink((HOLDERS, holder))
            os.close(lock)
            os.close(gate)

    def _open(self, name: str) -> int:
        try:
            return self.tree.open_lock(name)
        except Refused as exc:
            raise StoreError(f"the store lock {exc.message}", hint=exc.hint or "remove it") from None
        except OSError as exc:
            raise TrtflowError(f"cannot open the store lock {self.root / name}: {exc.strerror or exc}",
                               hint="check the store's permissions (--store / TRTFLOW_STORE)") from None

    def holders(self) -> list[dict]:
        """Who holds (or held and died holding) the lock: best effort, for messages."""
        found: list[dict] = []
        try:
            names = [n for n in self.tree.names(HOLDERS) if n.endswith(".json")]
        except OSError:
            return found
        for name in names:
            try:
                info = records.read(self.tree, (HOLDERS, name), records.LOCK_HOLDER)
                if not isinstance(info, dict):
                    continue
                if info.get("host") == os.uname().nodename and not pid_alive(int(info.get("pid", 0))):
                    self.tree.unlink((HOLDERS, name))
                    continue
            except (OSError, ValueError, TypeError):
                continue
            found.append(info)
        return found

    def _register(self, mode: str, what: str) -> str | None:
        try:
            name = f"{os.uname().nodename}-{os.getpid()}-{time.time_ns()}.json"
            record = {"mode": mode, "what": what, "pid": os.getpid(), "host": os.uname().nodename,
                      "since": time.time()}
            self.tree.create((HOLDERS, check_name(name, "holder")), json.dumps(record).encode("utf-8"))
            return name
        except OSError:
            return None  # a full or read-only disk must not stop the work; the record is only for messages

    def _busy_message(self, waiting_for: str) -> str:
        others = [h for h in self.holders() if h.get("pid") != os.getpid()]
        if not others:
            return f"the store {self.root} is in use by another trtflow process ({waiting_for})"
        who = ", ".join(f"{h.get('what', '?')} (pid {h.get('pid')} on {h.get('host')})" for h in others[:3])
        return f"the store {self.root} is in use by {who}"


def _acquire(fd: int, flag: int, deadline: float, busy: Callable[[], str],
             on_wait: Callable[[str], None] | None) -> None:
    told = False
    while True:
        try:
            fcntl.flock(fd, flag | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if time.monotonic() >= deadline:
            raise StoreBusy(busy())
        if not told:
            told = True
            message = busy() + "; waiting"
            (on_wait or _say)(message)
        time.sleep(POLL_S)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host (one we may not signal counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
