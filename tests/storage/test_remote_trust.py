"""A remote cache is written by other machines: a manifest that lies, lacks its key or comes from a newer trtflow,
and a directory remote holding links, pipes or endless files, are never acted on. A manifest is rejected, never an
object deleted because of it: an object leaves the remote only when its own bytes do not hash to its name.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from tests.storage.conftest import commit_node, manifest_path, node_key, object_path, raw_remote
from trtflow.storage.remote import MAX_MANIFEST_BYTES, RemoteCache, RemoteCorrupt
from trtflow.storage.store import Store
from trtflow.storage.verify import verify_store


@pytest.mark.parametrize("delta", [1, -1])
def test_a_manifest_with_a_wrong_size_is_rejected_and_the_object_kept(remote_url: str, remote: RemoteCache,
                                                                      producer: Store, consumer: Store,
                                                                      tmp_path: Path, delta: int) -> None:
    """The review's case: a manifest naming digest D with the wrong size must not delete D, which another node
    that needs D still pulls."""
    shared = bytes(range(256)) * 400
    liar, honest = node_key(f"liar{delta}"), node_key(f"honest{delta}")
    committed = commit_node(producer, liar, {"engine": shared}, tmp_path)
    commit_node(producer, honest, {"engine": shared, "log": b"ok"}, tmp_path)
    remote.push(liar, producer)
    remote.push(honest, producer)
    digest = committed["outputs"]["engine"]["digest"]
    raw = raw_remote(remote_url)
    lie = json.loads(raw.read(manifest_path(liar)))
    lie["outputs"]["engine"]["size"] += delta
    raw.write(manifest_path(liar), json.dumps(lie).encode())

    with pytest.raises(RemoteCorrupt, match=rf"the remote manifest of node {liar} .* says object {digest} has "
                                            rf"{len(shared) + delta} bytes; it has {len(shared)}") as err:
        remote.pull(remote.get_manifest(liar), consumer)
    assert "the object is kept" in str(err.value)
    assert consumer.read_manifest(liar) is None
    assert raw.exists(object_path(digest)), "a manifest's lie deleted a good object"

    remote.pull(remote.get_manifest(honest), consumer)  # the node that needs D still gets it
    assert consumer.object_path(digest).read_bytes() == shared
    assert verify_store(consumer).problems == []

    # the next push of the lying key replaces its manifest with a true one
    assert remote.push(liar, producer).manifest_written
    assert remote.get_manifest(liar) == committed


def test_a_manifest_without_its_key_is_a_miss(remote_url: str, remote: RemoteCache, producer: Store,
                                              consumer: Store, tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    key = node_key("keyless")
    commit_node(producer, key, {"x": b"payload"}, tmp_path)
    remote.push(key, producer)
    raw = raw_remote(remote_url)
    manifest = json.loads(raw.read(manifest_path(key)))
    del manifest["key"]
    raw.write(manifest_path(key), json.dumps(manifest).encode())
    with caplog.at_level(logging.WARNING, logger="trtflow.remote"):
        assert remote.get_manifest(key) is None
    assert any(manifest_path(key) in r.getMessage() and "it names no key" in r.getMessage()
               for r in caplog.records), caplog.text
    with pytest.raises(RemoteCorrupt, match="it names no key"):  # a caller's dict without key: no internal error
        remote.pull(manifest, consumer)


def test_a_manifest_of_a_newer_trtflow_is_neither_used_nor_overwritten(remote_url: str, remote: RemoteCache,
                                                                       producer: Store, tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    key = node_key("from the future")
    commit_node(producer, key, {"x": b"payload"}, tmp_path)
    newer = json.dumps({"format": 99, "key": key, "outputs": {"x": {"future": True}}}).encode()
    raw = raw_remote(remote_url)
    raw.write(manifest_path(key), newer)
    with caplog.at_level(logging.WARNING, logger="trtflow.remote"):
        assert remote.get_manifest(key) is None
        assert not remote.push(key, producer).manifest_written
    assert raw.read(manifest_path(key)) == newer
    assert "written by a newer trtflow (manifest format 99" in caplog.text
    assert "upgrade trtflow" in caplog.text


def test_a_huge_manifest_is_not_read_whole(remote_url: str, remote: RemoteCache,
                                           caplog: pytest.LogCaptureFixture) -> None:
    key = node_key("huge")
    raw_remote(remote_url).write(manifest_path(key), b'{"pad": "' + b"x" * MAX_MANIFEST_BYTES + b'"}')
    with caplog.at_level(logging.WARNING, logger="trtflow.remote"):
        assert remote.get_manifest(key) is None
    assert f"larger than {MAX_MANIFEST_BYTES} bytes" in caplog.text


# ------------------------------------------------------------------------ a directory remote's files
@pytest.fixture
def directory(tmp_path: Path) -> Path:
    root = tmp_path / "remote"
    root.mkdir()
    return root


def _pushed(directory: Path, producer: Store, tmp_path: Path, payload: bytes = b"engine bytes" * 100):
    key = node_key(f"pushed {payload[:8]!r}")
    committed = commit_node(producer, key, {"engine": payload}, tmp_path)
    RemoteCache(str(directory)).push(key, producer)
    return key, committed["outputs"]["engine"]["digest"]


def _replace(path: Path, how: str, target: Path | None = None) -> None:
    os.chmod(path, 0o644)
    path.unlink()
    if how == "link":
        assert target is not None
        path.symlink_to(target)
    else:
        os.mkfifo(path)


@pytest.mark.parametrize("how", ["link to /dev/zero", "named pipe"])
def test_a_directory_remote_object_that_is_not_a_regular_file_is_refused(directory: Path, producer: Store,
                                                                         consumer: Store, tmp_path: Path,
                                                                         how: str) -> None:
    key, digest = _pushed(directory, producer, tmp_path)
    victim = directory / object_path(digest)
    _replace(victim, "link" if how.startswith("link") else "fifo", Path("/dev/zero"))
    remote = RemoteCache(str(directory))
    with pytest.raises(RemoteCorrupt, match=rf"remote object {digest} .* is not a regular file"):
        remote.pull(remote.get_manifest(key), consumer)
    assert consumer.read_manifest(key) is None
    assert os.path.lexists(victim), "only an object proven corrupt by its own bytes is removed"


@pytest.mark.parametrize("how", ["link to /dev/zero", "named pipe"])
def test_a_directory_remote_manifest_that_is_not_a_regular_file_is_a_miss(directory: Path, producer: Store,
                                                                          tmp_path: Path, how: str,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    key, _ = _pushed(directory, producer, tmp_path)
    _replace(directory / manifest_path(key), "link" if how.startswith("link") else "fifo", Path("/dev/zero"))
    with caplog.at_level(logging.WARNING, logger="trtflow.remote"):
        assert RemoteCache(str(directory)).get_manifest(key) is None
    assert "not a regular file" in caplog.text


def test_a_directory_remote_never_follows_a_folder_link_out_of_its_root(directory: Path, producer: Store,
                                                                        consumer: Store, tmp_path: Path) -> None:
    """objects/ab -> a folder elsewhere: nothing is read from there, and a push writes nothing there."""
    key, digest = _pushed(directory, producer, tmp_path)
    shard = directory / "objects" / digest[:2]
    outside = tmp_path / "outside"
    os.rename(shard, outside)
    shard.symlink_to(outside, target_is_directory=True)
    remote = RemoteCache(str(directory))
    with pytest.raises(RemoteCorrupt, match=rf"remote object {digest} .* lies under a symbolic link"):
        remote.pull(remote.get_manifest(key), consumer)

    other = node_key("pushed through the link")
    committed = commit_node(producer, other, {"engine": b"new bytes"}, tmp_path)
    new_digest = committed["outputs"]["engine"]["digest"]
    (directory / "objects" / new_digest[:2]).mkdir(parents=True, exist_ok=True)
    if new_digest[:2] != digest[:2]:  # make the new object's shard a link out of the root as well
        (directory / "objects" / new_digest[:2]).rmdir()
        (directory / "objects" / new_digest[:2]).symlink_to(outside, target_is_directory=True)
    before = sorted(p.name for p in outside.iterdir())
    with pytest.raises(Exception, match="symbolic link"):
        remote.push(other, producer)
    assert sorted(p.name for p in outside.iterdir()) == before


def test_a_directory_remote_whose_root_is_a_link_still_works(tmp_path: Path, producer: Store,
                                                             consumer: Store) -> None:
    """The root itself is the user's choice (a link to a mounted share is common): only links inside it count."""
    real = tmp_path / "share"
    real.mkdir()
    (tmp_path / "cache-link").symlink_to(real, target_is_directory=True)
    key = node_key("through the root link")
    committed = commit_node(producer, key, {"engine": b"bytes"}, tmp_path)
    RemoteCache(str(tmp_path / "cache-link")).push(key, producer)
    remote = RemoteCache(str(tmp_path / "cache-link"))
    assert remote.pull(remote.get_manifest(key), consumer) == committed
