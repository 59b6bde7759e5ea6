"""File hashing with the stat-signature (size, mtime, ctime, inode) shortcut."""

from __future__ import annotations

import os

import pytest

from tests.settle import short_racy_window, wait_settled
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


def test_unchanged_file_is_not_reread_and_changed_file_is(tmp_path, monkeypatch):
    short_racy_window(monkeypatch)
    journal = Journal(tmp_path / "db.sqlite")
    cache = CountingCache(journal)
    big = tmp_path / "weights.bin"
    big.write_bytes(os.urandom(3 << 20))
    old = 1_600_000_000_000_000_000
    os.utime(big, ns=(old, old))
    wait_settled(big)
    first = hash_file(big, cache)
    assert first == hash_file_content(big) and cache.hits == 0
    assert hash_file(big, cache) == first and cache.hits == 1
    with open(big, "r+b") as f:
        f.write(b"changed")
    os.utime(big, ns=(old + 1, old + 1))
    assert hash_file(big, cache) != first


@pytest.mark.parametrize("how", ["in place (rsync --inplace -t)", "copied over (cp + touch -r)"])
def test_a_rewrite_with_size_and_mtime_restored_is_read_again(tmp_path, monkeypatch, how):
    """ctime cannot be set back: the signature changes although size, mtime and inode are what they were."""
    short_racy_window(monkeypatch)
    cache = CountingCache(Journal(tmp_path / "db.sqlite"))
    data = tmp_path / "calib.bin"
    data.write_bytes(b"a" * 4096)
    wait_settled(data)
    first = hash_file(data, cache)
    assert hash_file(data, cache) == first and cache.hits == 1
    stamp = data.stat()
    if how.startswith("in place"):
        with open(data, "r+b") as f:
            f.write(b"b" * 4096)
    else:
        other = tmp_path / "other.bin"
        other.write_bytes(b"b" * 4096)
        data.write_bytes(other.read_bytes())  # cp writes into the existing file: the inode stays
    os.utime(data, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    after = data.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (stamp.st_size, stamp.st_mtime_ns, stamp.st_ino)
    assert hash_file(data, cache) == hash_file_content(data) != first


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


def test_a_link_whose_target_is_not_utf8_is_keyed_not_an_internal_error(tmp_path) -> None:
    """os.readlink decodes a non-UTF-8 target with surrogates: its digest (a python: node's link, the freshness
    differential's retargets) must be a digest, not a UnicodeEncodeError in the worker."""
    import os

    from trtflow.depfile import LINK, path_digest
    from trtflow.fingerprint import hash_text

    link = tmp_path / "link"
    os.symlink(b"target-\xff\xfe", os.fsencode(link))
    digest = path_digest(link)
    assert digest.startswith(LINK) and digest == LINK + hash_text(os.readlink(link))
    assert hash_text("plain") != hash_text(os.fsdecode(b"plain\xff"))
