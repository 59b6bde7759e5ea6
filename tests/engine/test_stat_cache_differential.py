"""Differential test of the stat caches against the full hash they stand for.

Random sequences of what happens to a file (new content, the same size with the mtime put back, a file renamed
over it, touch, chmod, a hard link made and removed, time passing) and to a store object (damaged in place with its
size and mtime kept, replaced, linked as a node input and unlinked): after each step the stat cache's answer
(`fingerprint.hash_file` through the journal, `Store.object_intact`) equals reading the whole file. The racy window
is 50 ms here (tests/settle.py) so that the cache is really trusted between steps.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.settle import short_racy_window, wait_settled
from trtflow.fingerprint import hash_file, hash_file_content
from trtflow.storage.confined.tree import Tree
from trtflow.storage.journal import Journal
from trtflow.storage.store import Store

pytestmark = pytest.mark.slow

CONTENTS = [b"a" * 32, b"b" * 32, b"c" * 32, b"short"]
STEPS = st.lists(st.tuples(st.sampled_from(["write", "same size, mtime back", "renamed over", "touch", "chmod",
                                            "hard link", "age"]), st.integers(0, 3)), min_size=1, max_size=8)


def _apply(path: Path, step: str, value: int) -> None:
    if step == "write":
        path.write_bytes(CONTENTS[value])
    elif step == "same size, mtime back":
        stamp = path.stat()
        same = [c for c in CONTENTS if len(c) == stamp.st_size]
        with open(path, "r+b") as f:
            f.write(same[value % len(same)])
        os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    elif step == "renamed over":
        other = path.with_name("other")
        other.write_bytes(CONTENTS[value])
        os.replace(other, path)
    elif step == "touch":
        os.utime(path)
    elif step == "chmod":
        path.chmod(0o644 if value % 2 else 0o444)
        path.chmod(0o644)
    elif step == "hard link":
        link = path.with_name("link")
        os.link(path, link)
        link.unlink()
    elif step == "age":  # until the file is older than the racy window, observing the clock
        wait_settled(path)


@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS)
def test_the_file_hash_cache_answers_what_reading_the_file_answers(steps: list, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    short_racy_window(monkeypatch)
    folder = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    journal = Journal(folder / "db.sqlite")
    try:
        path = folder / "data.bin"
        path.write_bytes(CONTENTS[0])
        for step, value in steps:
            _apply(path, step, value)
            assert hash_file(path, journal) == hash_file_content(path), (step, value)
            assert hash_file(path, journal) == hash_file_content(path), (step, value)  # from the cache now
    finally:
        journal.close()
        shutil.rmtree(folder)


OBJECT_STEPS = st.lists(st.tuples(st.sampled_from(["damage, size and mtime kept", "restore", "used as an input",
                                                   "age"]), st.integers(0, 3)), min_size=1, max_size=8)


@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=OBJECT_STEPS)
def test_a_store_object_is_intact_exactly_when_its_bytes_match_its_name(steps: list,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    short_racy_window(monkeypatch)
    folder = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    store = Store(folder / "store")
    store.ensure()
    journal = Journal(store.db_path)
    try:
        source = folder / "out.bin"
        source.write_bytes(CONTENTS[0])
        digest, size = store.put_file(Tree(folder), "out.bin", journal)
        path = store.object_path(digest)
        for step, value in steps:
            if step == "damage, size and mtime kept":
                stamp = path.stat()
                path.chmod(0o644)
                with open(path, "r+b") as f:
                    f.write(CONTENTS[value % 3])
                os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
            elif step == "restore":
                source.write_bytes(CONTENTS[0])
                store.put_file(Tree(folder), "out.bin", journal)
            elif step == "used as an input":  # hard-linked into a node's scratch, then the scratch is removed
                link = folder / "scratch-input"
                os.link(path, link)
                link.unlink()
            elif step == "age":
                wait_settled(path)
            truth = hash_file_content(path) == digest
            assert store.object_intact(digest, size, journal) == truth, (step, value)
            assert store.object_intact(digest, size, journal) == truth, (step, value)
    finally:
        journal.close()
        shutil.rmtree(folder, ignore_errors=True)
