"""Files older than the racy window, for tests of the stat shortcuts.

A stat signature (size, mtime, ctime, inode) is trusted only when the file's mtime and ctime lie more than
`trtflow.fingerprint.RACY_WINDOW_NS` before the moment its content was read. ctime cannot be set back (that is the
point), so a test that wants the shortcut taken must let the file age. The production window (2 s) covers
filesystems with coarse timestamps (FAT); the filesystems tests run on (tmpfs, ext4, overlayfs) stamp files from a
clock that is at most a few milliseconds coarse, so tests use a 50 ms window and wait, observing the clock, until
the files are older than that.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

TEST_WINDOW_NS = 50_000_000


def short_racy_window(monkeypatch: pytest.MonkeyPatch) -> None:
    from trtflow import fingerprint

    monkeypatch.setattr(fingerprint, "RACY_WINDOW_NS", TEST_WINDOW_NS)


def wait_settled(*paths: Path) -> None:
    """Return once every file under ``paths`` has its mtime and ctime older than the window (as the clock shows)."""
    from trtflow import fingerprint

    newest = 0
    for path in paths:
        for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
            st = os.lstat(p)
            newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
    while time.time_ns() - newest <= fingerprint.RACY_WINDOW_NS:
        time.sleep(fingerprint.RACY_WINDOW_NS / 4e9)
