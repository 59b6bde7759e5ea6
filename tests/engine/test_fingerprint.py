"""File hashing with the (size, mtime, inode) shortcut."""

from __future__ import annotations

import os

from trtflow.fingerprint import diff_values, hash_file, hash_file_content, hash_path
from trtflow.storage.journal import Journal


class CountingCache:
    def __init__(self, inner):
        self.inner = inner
        self.hits = 0

    def get(self, *args):
        found = self.inner.get(*args)
        self.hits += found is not None
        return found

    def put(self, *args):
        self.inner.put(*args)


def test_unchanged_file_is_not_reread_and_changed_file_is(tmp_path):
    journal = Journal(tmp_path / "db.sqlite")
    cache = CountingCache(journal)
    big = tmp_path / "weights.bin"
    big.write_bytes(os.urandom(3 << 20))
    old = 1_600_000_000_000_000_000
    os.utime(big, ns=(old, old))
    first = hash_file(big, cache)
    assert first == hash_file_content(big) and cache.hits == 0
    assert hash_file(big, cache) == first and cache.hits == 1
    with open(big, "r+b") as f:
        f.write(b"changed")
    os.utime(big, ns=(old + 1, old + 1))
    assert hash_file(big, cache) != first


def test_recently_modified_file_is_always_rehashed(tmp_path):
    cache = CountingCache(Journal(tmp_path / "db.sqlite"))
    fresh = tmp_path / "fresh.bin"
    fresh.write_bytes(b"x")
    hash_file(fresh, cache)
    hash_file(fresh, cache)
    assert cache.hits == 0


def test_directory_digest_covers_names_and_contents(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.npy").write_bytes(b"1")
    first = hash_path(tmp_path / "d")
    (tmp_path / "d" / "b.npy").write_bytes(b"2")
    assert hash_path(tmp_path / "d") != first


def test_diff_values_names_the_changed_path():
    assert diff_values({"a": {"b": 1}, "c": 2}, {"a": {"b": 2}, "d": 3}) == [
        "a.b changed 1 -> 2", "c removed (was 2)", "d added (3)"]
