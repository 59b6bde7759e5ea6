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

from trtflow.errors import StoreBusy, TrtflowError

SHARED, EXCLUSIVE = "shared", "exclusive"
POLL_S = 0.05


class StoreLock:
    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def path(self) -> Path:
        return self.root / "store.lock"

    @property
    def gate_path(self) -> Path:
        return self.root / "gate.lock"

    @property
    def holders_dir(self) -> Path:
        return self.root / "holders"

    @contextmanager
    def held(self, mode: str, what: str, wait_s: float = float("inf"),
             on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
        """Hold the lock in ``mode`` while the block runs; wait at most ``wait_s`` (then `StoreBusy`)."""
        deadline = time.monotonic() + wait_s
        gate = _open(self.gate_path)
        lock = _open(self.path)
        holder: Path | None = None
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
                holder.unlink(missing_ok=True)
            os.close(lock)
            os.close(gate)

    def holders(self) -> list[dict]:
        """Who holds (or held and died holding) the lock: best effort, for messages."""
        found = []
        if not self.holders_dir.exists():
            return found
        for path in self.holders_dir.glob("*.json"):
            try:
                info = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if info.get("host") == os.uname().nodename and not pid_alive(int(info.get("pid", 0))):
                path.unlink(missing_ok=True)
                continue
            found.append(info)
        return found

    def _register(self, mode: str, what: str) -> Path | None:
        try:
            self.holders_dir.mkdir(exist_ok=True)
            path = self.holders_dir / f"{os.uname().nodename}-{os.getpid()}-{time.time_ns()}.json"
            path.write_text(json.dumps({"mode": mode, "what": what, "pid": os.getpid(),
                                        "host": os.uname().nodename, "since": time.time()}), encoding="utf-8")
            return path
        except OSError:
            return None  # a full or read-only disk must not stop the work; the record is only for messages

    def _busy_message(self, waiting_for: str) -> str:
        others = [h for h in self.holders() if h.get("pid") != os.getpid()]
        if not others:
            return f"the store {self.root} is in use by another trtflow process ({waiting_for})"
        who = ", ".join(f"{h.get('what', '?')} (pid {h.get('pid')} on {h.get('host')})" for h in others[:3])
        return f"the store {self.root} is in use by {who}"


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        try:
            return os.open(path, os.O_RDONLY)  # a read-only store: flock works on a read-only descriptor too
        except OSError as exc:
            raise TrtflowError(f"cannot open the store lock {path}: {exc.strerror or exc}",
                               hint="check the store's permissions (--store / TRTFLOW_STORE)") from None


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
