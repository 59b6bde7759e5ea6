"""The remote cache against a directory remote and an S3 remote (moto's server on localhost).

Two stores share one remote: what one pushes the other pulls, verified by size and digest; a remote object or
manifest that is partial, corrupt or missing is detected and never enters a store.
"""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path

import pytest

from tests.storage.conftest import commit_node, make_store, manifest_path, node_key, object_path, raw_remote
from trtflow.errors import TrtflowError
from trtflow.fingerprint import hash_file_content, signature
from trtflow.storage.remote import REMOTE_FORMAT, RemoteCache, RemoteCorrupt, RemoteError
from trtflow.storage.store import Store
from trtflow.storage.verify import verify_store


def local_leftovers(store: Store) -> list[Path]:
    return [p for p in store.objects.rglob(".*") if p.is_file()]


def test_a_node_pushed_from_one_store_is_pulled_into_another(remote: RemoteCache, producer: Store,
                                                            consumer: Store, tmp_path: Path) -> None:
    key = node_key("model")
    files = {"engine": bytes(range(256)) * 4000, "metrics": b'{"p50": 1.5}', "copy": b'{"p50": 1.5}'}
    committed = commit_node(producer, key, files, tmp_path)

    assert remote.get_manifest(key) is None
    pushed = remote.push(key, producer)
    assert (pushed.objects, pushed.bytes, pushed.manifest_written) == (2, len(files["engine"]) + 12, True)

    manifest = remote.get_manifest(key)
    assert manifest == committed
    assert remote.pull(manifest, consumer) == committed
    assert consumer.read_manifest(key) == committed
    for name, out in committed["outputs"].items():
        pulled = consumer.object_path(out["digest"])
        assert hash_file_content(pulled) == out["digest"]
        assert pulled.read_bytes() == files[name]
    report = verify_store(consumer)
    assert report.problems == [] and report.objects == 2
    assert local_leftovers(consumer) == []

    again = remote.push(key, producer)
    assert (again.objects, again.present, again.manifest_written) == (0, 2, False)


def test_objects_the_store_already_has_are_not_pulled_again(remote: RemoteCache, producer: Store, consumer: Store,
                                                            tmp_path: Path) -> None:
    shared = b"weights" * 50_000
    first, second = node_key("first"), node_key("second")
    commit_node(producer, first, {"model": shared}, tmp_path)
    commit_node(producer, second, {"model": shared, "extra": b"more"}, tmp_path)
    remote.push(first, producer)
    remote.push(second, producer)

    remote.pull(remote.get_manifest(first), consumer)
    second_manifest = remote.get_manifest(second)
    remote.pull(second_manifest, consumer)
    assert consumer.intact(second_manifest)
    assert verify_store(consumer).problems == []


def test_the_format_file_is_written_on_first_push(remote_url: str, remote: RemoteCache, producer: Store,
                                                  tmp_path: Path) -> None:
    key = node_key("format")
    commit_node(producer, key, {"x": b"x"}, tmp_path)
    remote.push(key, producer)
    info = json.loads(raw_remote(remote_url).read("format.json"))
    assert info == {"format": REMOTE_FORMAT, "hash": "xxh3-128"}


def test_a_remote_of_a_newer_format_is_refused(remote_url: str, remote: RemoteCache) -> None:
    raw_remote(remote_url).write("format.json", json.dumps({"format": REMOTE_FORMAT + 1, "hash": "xxh3-128"}).encode())
    with pytest.raises(RemoteError, match=rf"format {REMOTE_FORMAT + 1}, newer than this trtflow reads") as err:
        remote.get_manifest(node_key("anything"))
    assert "upgrade trtflow" in str(err.value)


def test_a_remote_with_an_unreadable_format_file_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "remote"
    root.mkdir()
    (root / "format.json").write_text("{not json")
    with pytest.raises(RemoteError, match="unreadable format.json: not a trtflow remote cache"):
        RemoteCache(str(root)).check()


@pytest.mark.parametrize(("content", "problem"), [
    (b'{"key": "k", "outputs": {"x": {"dig', "not valid JSON"),
    (b'{"key": "KEY", "stage": "synth"}', "it has no outputs"),
    (b'["outputs"]', "not a JSON object"),
    (b'{"key": "KEY", "outputs": {"x": {"digest": "00112233445566778899aabbccddeeff", "size": 1, '
     b'"filename": "../../x", "kind": "blob"}}}', "unsafe file name"),
    (b'{"key": "KEY", "outputs": {"x": {"digest": "nothex", "size": 1, "filename": "x", "kind": "blob"}}}',
     "no valid digest"),
    (b'{"outputs": {}}', "it names no key"),
    (b"", "not valid JSON"),
])
def test_an_unusable_remote_manifest_is_treated_as_absent(remote_url: str, remote: RemoteCache, content: bytes,
                                                          problem: str, caplog: pytest.LogCaptureFixture) -> None:
    key = node_key("broken")
    raw_remote(remote_url).write(manifest_path(key), content.replace(b"KEY", key.encode()))
    with caplog.at_level(logging.WARNING, logger="trtflow.remote"):
        assert remote.get_manifest(key) is None
    assert any(key in r.getMessage() and problem in r.getMessage() for r in caplog.records), caplog.text


def test_a_manifest_of_another_key_is_not_used(remote_url: str, remote: RemoteCache, producer: Store,
                                               tmp_path: Path) -> None:
    key, other = node_key("one"), node_key("other")
    commit_node(producer, key, {"x": b"payload"}, tmp_path)
    remote.push(key, producer)
    raw = raw_remote(remote_url)
    raw.write(manifest_path(other), raw.read(manifest_path(key)))
    assert remote.get_manifest(other) is None


@pytest.mark.parametrize("damage", ["truncated", "bit-flipped"])
def test_a_corrupt_remote_object_is_detected_and_never_used(remote_url: str, remote: RemoteCache, producer: Store,
                                                            consumer: Store, tmp_path: Path, damage: str) -> None:
    key = node_key(f"corrupt-{damage}")
    payload = bytes(range(256)) * 2000
    committed = commit_node(producer, key, {"engine": payload, "log": b"ok"}, tmp_path)
    remote.push(key, producer)
    digest = committed["outputs"]["engine"]["digest"]
    raw = raw_remote(remote_url)
    if damage == "truncated":
        raw.write(object_path(digest), payload[: len(payload) // 2])
    else:
        flipped = bytearray(payload)
        flipped[len(flipped) // 3] ^= 0x01
        raw.write(object_path(digest), bytes(flipped))

    manifest = remote.get_manifest(key)
    with pytest.raises(RemoteCorrupt, match=rf"remote object {digest} \(output 'engine' of node {key}\)") as err:
        remote.pull(manifest, consumer)
    assert err.value.digest == digest
    assert "removed from the remote" in str(err.value)
    assert consumer.read_manifest(key) is None
    assert not consumer.object_path(digest).exists()
    assert local_leftovers(consumer) == []
    assert not raw.exists(object_path(digest))

    repaired = remote.push(key, producer)  # the producer (or a rebuild) uploads it again
    assert repaired.objects == 1
    remote.pull(remote.get_manifest(key), consumer)
    assert consumer.object_path(digest).read_bytes() == payload
    assert verify_store(consumer).problems == []


def test_a_manifest_pointing_at_a_missing_object_is_detected(remote_url: str, remote: RemoteCache,
                                                            producer: Store, consumer: Store, tmp_path: Path) -> None:
    key = node_key("missing")
    committed = commit_node(producer, key, {"engine": b"e" * 5000, "metrics": b"{}"}, tmp_path)
    remote.push(key, producer)
    digest = committed["outputs"]["engine"]["digest"]
    raw_remote(remote_url).delete(object_path(digest))

    with pytest.raises(RemoteCorrupt, match=rf"remote object {digest} .* is missing"):
        remote.pull(remote.get_manifest(key), consumer)
    assert consumer.read_manifest(key) is None


def test_a_push_replaces_a_remote_manifest_whose_objects_are_gone(remote_url: str, remote: RemoteCache,
                                                                  producer: Store, consumer: Store,
                                                                  tmp_path: Path) -> None:
    """A rebuild that produced other bytes (engines are not deterministic) heals a key whose objects were lost."""
    key = node_key("rebuilt")
    first = commit_node(producer, key, {"engine": b"first build"}, tmp_path)
    remote.push(key, producer)
    raw_remote(remote_url).delete(object_path(first["outputs"]["engine"]["digest"]))

    rebuilt_store = make_store(tmp_path / "store-c")
    rebuilt = commit_node(rebuilt_store, key, {"engine": b"second build"}, tmp_path)
    assert remote.push(key, rebuilt_store).manifest_written
    assert remote.get_manifest(key) == rebuilt
    remote.pull(remote.get_manifest(key), consumer)
    assert consumer.object_path(rebuilt["outputs"]["engine"]["digest"]).read_bytes() == b"second build"


def test_a_push_keeps_a_usable_remote_manifest(remote_url: str, remote: RemoteCache, producer: Store,
                                               tmp_path: Path) -> None:
    key = node_key("first-wins")
    commit_node(producer, key, {"engine": b"first build"}, tmp_path)
    remote.push(key, producer)
    before = raw_remote(remote_url).read(manifest_path(key))

    other = make_store(tmp_path / "store-c")
    commit_node(other, key, {"engine": b"another build"}, tmp_path)
    result = remote.push(key, other)
    assert (result.objects, result.manifest_written) == (1, False)
    assert raw_remote(remote_url).read(manifest_path(key)) == before


def test_a_push_replaces_an_unreadable_remote_manifest(remote_url: str, remote: RemoteCache, producer: Store,
                                                       tmp_path: Path) -> None:
    key = node_key("garbled")
    committed = commit_node(producer, key, {"engine": b"bytes"}, tmp_path)
    raw_remote(remote_url).write(manifest_path(key), b'{"outputs": ')
    assert remote.push(key, producer).manifest_written
    assert remote.get_manifest(key) == committed


def test_pushing_a_node_the_store_lacks_is_refused(remote: RemoteCache, producer: Store) -> None:
    with pytest.raises(Exception, match="has no readable manifest"):
        remote.push(node_key("never committed"), producer)


def test_a_remote_survives_pickling(remote_url: str, remote: RemoteCache, producer: Store, tmp_path: Path) -> None:
    """Executors (Ray) send the remote to workers: it is reopened there from its URL."""
    key = node_key("pickled")
    commit_node(producer, key, {"x": b"payload"}, tmp_path)
    copy = pickle.loads(pickle.dumps(remote))
    assert copy.url == remote.url
    copy.push(key, producer)
    assert remote.get_manifest(key)["key"] == key


def test_s3_put_if_absent_holds_for_multipart_uploads(s3_bucket: str, tmp_path: Path) -> None:
    """Objects larger than two parts go up in parts; the completion is conditional too (If-None-Match: *)."""
    remote = RemoteCache(f"s3://{s3_bucket}/mp", part_size=5 * 2**20)
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * (11 * 2**12))  # 11 MiB: three parts
    other = tmp_path / "other.bin"
    other.write_bytes(b"\0" * big.stat().st_size)
    backend = remote._backend
    assert backend.create("objects/ab/probe", big) is True
    assert backend.create("objects/ab/probe", other) is False
    assert raw_remote(f"s3://{s3_bucket}/mp").read("objects/ab/probe") == big.read_bytes()


def test_directory_put_if_absent_never_overwrites_nor_leaves_temporary_files(tmp_path: Path) -> None:
    root = tmp_path / "remote"
    root.mkdir()
    backend = RemoteCache(str(root))._backend
    assert backend.create("nodes/ab/k.json", b"first") is True
    assert backend.create("nodes/ab/k.json", b"second") is False
    assert (root / "nodes/ab/k.json").read_bytes() == b"first"
    assert raw_remote(str(root)).leftovers() == []


def test_file_urls_name_directory_remotes(tmp_path: Path, producer: Store, consumer: Store) -> None:
    root = tmp_path / "shared cache"
    root.mkdir()
    key = node_key("file-url")
    committed = commit_node(producer, key, {"x": b"via file://"}, tmp_path)
    RemoteCache(root.as_uri()).push(key, producer)
    remote = RemoteCache(str(root))
    assert remote.pull(remote.get_manifest(key), consumer) == committed


def _look_up_in_child(remote: RemoteCache, key: str, conn) -> None:
    conn.send(remote.get_manifest(key)["key"])


def test_a_remote_opened_before_a_fork_works_in_the_child(remote: RemoteCache, producer: Store,
                                                          tmp_path: Path) -> None:
    """Local workers are forked from a process that may have used the remote already."""
    import multiprocessing

    key = node_key("forked")
    commit_node(producer, key, {"x": b"payload"}, tmp_path)
    remote.push(key, producer)
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_look_up_in_child, args=(remote, key, child))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == 0
    assert parent.recv() == key


def test_a_node_the_store_already_has_is_kept_as_it_is(remote: RemoteCache, producer: Store, consumer: Store,
                                                       tmp_path: Path) -> None:
    key = node_key("built on both")
    commit_node(producer, key, {"engine": b"remote build"}, tmp_path)
    remote.push(key, producer)
    local = commit_node(consumer, key, {"engine": b"local build"}, tmp_path)
    assert remote.pull(remote.get_manifest(key), consumer) == local
    assert consumer.read_manifest(key) == local


def test_a_damaged_local_object_is_never_pushed(remote_url: str, remote: RemoteCache, producer: Store,
                                                tmp_path: Path) -> None:
    key = node_key("rotten")
    committed = commit_node(producer, key, {"engine": b"good bytes"}, tmp_path)
    damaged = producer.object_path(committed["outputs"]["engine"]["digest"])
    damaged.chmod(0o644)
    damaged.write_bytes(b"bad bytes!")  # same size, other content
    with pytest.raises(TrtflowError, match=r"outputs \['engine'\] are missing or damaged"):
        remote.push(key, producer)
    assert remote.get_manifest(key) is None
    assert not raw_remote(remote_url).exists(object_path(committed["outputs"]["engine"]["digest"]))


def test_pulled_objects_are_recorded_in_the_stat_cache(remote: RemoteCache, producer: Store, consumer: Store,
                                                       tmp_path: Path) -> None:
    """The store's stat cache (the journal) then vouches for them: the next run does not re-hash them."""
    from trtflow.storage.journal import Journal

    key = node_key("stat cache")
    committed = commit_node(producer, key, {"engine": b"e" * 10_000}, tmp_path)
    remote.push(key, producer)
    journal = Journal(consumer.db_path)
    try:
        remote.pull(remote.get_manifest(key), consumer, journal)
        out = committed["outputs"]["engine"]
        path = consumer.object_path(out["digest"])
        assert journal.get(str(path), signature(path.stat())) == out["digest"]
    finally:
        journal.close()


def test_outputs_uploaded_by_a_storeless_worker_are_collected_into_a_store(remote: RemoteCache, consumer: Store,
                                                                           tmp_path: Path) -> None:
    """The Ray executor's path: a worker uploads what it wrote; the driver collects the verified objects."""
    out_dir = tmp_path / "worker-scratch" / "out"
    out_dir.mkdir(parents=True)
    (out_dir / "model.engine").write_bytes(b"engine" * 1000)
    (out_dir / "engine.json").write_text('{"provenance": 1}')
    spec = {"engine": ("model.engine", "engine"), "provenance": ("engine.json", "json"),
            "timing": ("timing.cache", "timing_cache")}  # an optional output the stage did not write
    stored = remote.upload_outputs(out_dir, spec)
    assert set(stored) == {"engine", "provenance"}
    assert stored["engine"]["digest"] == hash_file_content(out_dir / "model.engine")

    transfer = remote.pull_objects(stored, consumer, node="build")
    assert (transfer.objects, transfer.present) == (2, 0)
    for name, out in stored.items():
        assert consumer.object_path(out["digest"]).read_bytes() == (out_dir / spec[name][0]).read_bytes()
    assert remote.pull_objects(stored, consumer, node="build").present == 2
