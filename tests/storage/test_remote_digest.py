"""A remote that names its objects by sha256 (`--remote-digest sha256`): objects are stored and verified under
their sha256, the store keeps its xxh3 names, and a remote opened without the option follows the remote's
format.json."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.plugins import subprocess_env, write_plugin_distribution
from tests.storage.conftest import commit_node, make_store, node_key, raw_remote
from trtflow.storage.remote import RemoteCache, RemoteCorrupt, RemoteError
from trtflow.storage.store import Store
from trtflow.storage.verify import verify_store


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_objects_are_named_and_verified_by_sha256(remote_url: str, tmp_path: Path) -> None:
    producer, consumer = make_store(tmp_path / "a"), make_store(tmp_path / "b")
    key = node_key("sha256 node")
    files = {"engine": bytes(range(256)) * 300, "metrics": b'{"p50": 1}'}
    committed = commit_node(producer, key, files, tmp_path)
    RemoteCache(remote_url, digest="sha256").push(key, producer)

    raw = raw_remote(remote_url)
    assert json.loads(raw.read("format.json")) == {"format": 1, "hash": "sha256"}
    for content in files.values():
        assert raw.read(f"objects/{sha256(content)[:2]}/{sha256(content)}") == content
    remote_manifest = json.loads(raw.read(f"nodes/{key[:2]}/{key}.json"))
    assert {n: o["sha256"] for n, o in remote_manifest["outputs"].items()} == {n: sha256(c) for n, c in files.items()}
    assert {n: o["digest"] for n, o in remote_manifest["outputs"].items()} == \
        {n: o["digest"] for n, o in committed["outputs"].items()}, "the store's xxh3 names are kept"

    follower = RemoteCache(remote_url)  # no option: the remote's format.json decides
    follower.pull(follower.get_manifest(key), consumer)
    for name, out in committed["outputs"].items():
        assert consumer.object_path(out["digest"]).read_bytes() == files[name]
    assert verify_store(consumer).problems == []


def test_a_corrupt_sha256_object_is_removed_and_a_lying_manifest_rejected(remote_url: str, tmp_path: Path) -> None:
    producer, consumer = make_store(tmp_path / "a"), make_store(tmp_path / "b")
    remote = RemoteCache(remote_url, digest="sha256")
    key, other = node_key("flipped"), node_key("liar")
    payload = b"engine" * 1000
    commit_node(producer, key, {"engine": payload}, tmp_path)
    remote.push(key, producer)
    raw = raw_remote(remote_url)
    name = f"objects/{sha256(payload)[:2]}/{sha256(payload)}"

    # a manifest that names the good object under another node's xxh3 digest: rejected, the object kept
    lie = json.loads(raw.read(f"nodes/{key[:2]}/{key}.json"))
    lie["key"] = other
    lie["outputs"]["engine"]["digest"] = "0" * 32
    raw.write(f"nodes/{other[:2]}/{other}.json", json.dumps(lie).encode())
    with pytest.raises(RemoteCorrupt, match="has xxh3 digest 0{32}; its content has"):
        remote.pull(remote.get_manifest(other), consumer)
    assert raw.exists(name)

    flipped = bytearray(payload)
    flipped[10] ^= 1
    raw.write(name, bytes(flipped))
    with pytest.raises(RemoteCorrupt, match="is corrupt: .* removed from the remote"):
        remote.pull(remote.get_manifest(key), consumer)
    assert not raw.exists(name)
    assert consumer.read_manifest(key) is None


def test_a_remote_keeps_one_kind_of_name(remote_url: str, tmp_path: Path) -> None:
    producer = make_store(tmp_path / "a")
    key = node_key("xxh3 first")
    commit_node(producer, key, {"x": b"x"}, tmp_path)
    RemoteCache(remote_url).push(key, producer)
    with pytest.raises(RemoteError, match="names its objects by xxh3-128, not by the requested sha256"):
        RemoteCache(remote_url, digest="sha256").check()


def test_a_storeless_worker_uploads_sha256_entries(remote_url: str, tmp_path: Path) -> None:
    """The Ray executor's path on a sha256 remote: the entries a worker returns name the remote objects."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "model.engine").write_bytes(b"engine" * 500)
    remote = RemoteCache(remote_url, digest="sha256")
    stored = remote.upload_outputs(out_dir, {"engine": ("model.engine", "engine")})
    assert stored["engine"]["sha256"] == sha256(b"engine" * 500)
    consumer = make_store(tmp_path / "b")
    assert RemoteCache(remote_url).pull_objects(stored, consumer, node="build").objects == 1


def test_run_with_remote_digest_sha256(tmp_path: Path) -> None:
    env = subprocess_env(write_plugin_distribution(tmp_path / "plugins"))
    (tmp_path / "chain.yaml").write_text("name: chain\nnodes:\n  - {name: a, stage: synth, params: {text: a}}\n"
                                         "  - {name: b, stage: synth, params: {text: b}, inputs: {source: a}}\n")
    remote = tmp_path / "remote"
    remote.mkdir()

    def run(store: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trtflow.cli", "run", "chain.yaml", "--store", store,
                               "--output-dir", f"out-{store}", "--remote", str(remote), *extra],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    first = run("a", "--remote-digest", "sha256")
    assert first.returncode == 0, first.stdout + first.stderr
    assert json.loads((remote / "format.json").read_text())["hash"] == "sha256"
    second = run("b")
    assert second.returncode == 0 and "0 built, 2 reused" in second.stdout, second.stdout + second.stderr
    assert verify_store(Store(tmp_path / "b")).problems == []
    bad = run("c", "--remote-digest", "md5")
    assert bad.returncode == 2 and "expected one of xxh3-128, sha256" in bad.stderr, bad.stderr
