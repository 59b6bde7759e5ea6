"""The checkout is read-only to the suite: a test that changes one of its files (even only its time, put back after)
changes what every other test process sees while it runs.

Seen in CI: a test touched the time of a test stage's module in the source tree and put it back; the other worker's
tests, which rely on that module's signature (the no-op shortcut), failed while it was touched. `tests/conftest.py`
takes the signature of every file of the checkout when a test process starts and compares it after each test file
(a changed status time included: a time put back changes it too); a change fails the test file that was running.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

Signature = tuple[int, int, int, int] | None  # size, mtime, ctime (ns), inode; None: the file is gone

#: Folders of a checkout that is not a git one (an unpacked source archive) that are not its files.
_NOT_SOURCE = {".git", ".venv", "venv", "build", "dist", "__pycache__", ".trtflow", ".hypothesis", ".pytest_cache",
               ".mypy_cache", ".ruff_cache", ".import_linter_cache"}


def checkout_files(root: Path) -> list[Path]:
    """The files git tracks below ``root``; in a checkout without git, every file outside build and cache folders."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        found = []
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in _NOT_SOURCE and not d.endswith(".egg-info")]
            found += [Path(folder) / name for name in files]
        return sorted(found)
    return [root / os.fsdecode(name) for name in listed.split(b"\0") if name]


def _signature(path: Path) -> Signature:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


class CheckoutGuard:
    """The signatures of a checkout's files, and which of them changed since they were last taken."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = checkout_files(root)
        self._taken = {path: _signature(path) for path in self.files}

    def changed(self) -> list[str]:
        """The files (relative to the checkout) whose signature changed since the last call; taken again."""
        now = {path: _signature(path) for path in self.files}
        changed = [str(path.relative_to(self.root)) for path in self.files if now[path] != self._taken[path]]
        self._taken = now
        return changed


def failure(changed: list[str], test_file: str) -> str:
    shown = ", ".join(changed[:10]) + (f" and {len(changed) - 10} more" if len(changed) > 10 else "")
    return (f"files of the checkout changed while {test_file} ran: {shown}. Tests write only below their tmp_path: "
            "copy a file of the checkout before changing it, even only its time (tests/checkout_guard.py). "
            "With -n, the change may come from a test of the other process running at the same time.")
