"""`trtflow run --remote` end to end: one store builds and pushes, a fresh store sharing the remote (a directory, or
S3 on a local moto server) builds nothing and gets identical, verified artifacts; a corrupt remote object is
never used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.reliability.plugins import subprocess_env, write_plugin_distribution
from tests.storage.conftest import raw_remote
from trtflow.storage.store import Store
from trtflow.storage.verify import verify_store

CHAIN = """\
name: chain
nodes:
  - {name: a, stage: synth, params: {text: a, size: 300000}}
  - {name: b, stage: synth, params: {text: b, size: 200000}, inputs: {source: a}}
  - {name: c, stage: synth, params: {text: c, size: 100000}, inputs: {source: b}}
"""


def _run(tmp_path: Path, store: str, remote_url: str, *extra: str) -> subprocess.CompletedProcess:
    env = subprocess_env(write_plugin_distribution(tmp_path / "plugins"))
    recipe = tmp_path / "chain.yaml"
    recipe.write_text(CHAIN)
    return subprocess.run([sys.executable, "-m", "trtflow.cli", "run", str(recipe), "--store", str(tmp_path / store),
                           "--output-dir", str(tmp_path / f"out-{store}"), "--remote", remote_url, *extra],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def _outputs(folder: Path) -> dict[str, bytes]:
    return {n: (folder / n / "data.bin").read_bytes() for n in "abc"}


def test_a_fresh_store_sharing_the_remote_builds_nothing(tmp_path: Path, remote_url: str) -> None:
    first = _run(tmp_path, "a", remote_url)
    assert first.returncode == 0 and "3 built" in first.stdout, first.stdout + first.stderr
    assert f"\nRemote cache {remote_url}: pulled 0, pushed 3 (a, b, c)\n" in first.stdout, first.stdout
    assert f"pushing to the remote cache {remote_url}" in first.stdout, first.stdout  # said as it happens
    second = _run(tmp_path, "b", remote_url)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "0 built, 3 reused" in second.stdout and "pulled from the remote cache" in second.stdout, second.stdout
    assert f"\nRemote cache {remote_url}: pulled 3 (a, b, c), pushed 0\n" in second.stdout, second.stdout
    assert _outputs(tmp_path / "out-b") == _outputs(tmp_path / "out-a")
    assert verify_store(Store(tmp_path / "b")).problems == []
    third = _run(tmp_path, "c", remote_url, "--no-push", "--set", "nodes.c.params.text=c2")
    assert f"\nRemote cache {remote_url}: pulled 2 (a, b), pushed nothing (--no-push)\n" in third.stdout, third.stdout


def test_a_remote_url_is_printed_without_credentials() -> None:
    from trtflow.redact import url_for_display

    assert url_for_display("s3://bucket/team/cache") == "s3://bucket/team/cache"
    assert url_for_display("/shared/cache") == "/shared/cache"
    assert url_for_display("s3://AKIA123:s3cr3t@bucket/cache") == "s3://***@bucket/cache"
    assert url_for_display("https://user:token@host:8443/c?X-Amz-Signature=abc#frag") == "https://***@host:8443/c"


def test_a_corrupt_remote_object_is_never_used(tmp_path: Path, remote_url: str) -> None:
    assert _run(tmp_path, "a", remote_url).returncode == 0
    store_a = Store(tmp_path / "a")
    key_b = store_a.refs.current(str(tmp_path / "chain.yaml"))["b"]
    digest = store_a.read_manifest(key_b)["outputs"]["data"]["digest"]
    _corrupt(remote_url, digest)
    second = _run(tmp_path, "b", remote_url)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "1 built" in second.stdout and "not taken from the remote cache" in second.stdout, second.stdout
    assert _outputs(tmp_path / "out-b") == _outputs(tmp_path / "out-a")
    assert verify_store(Store(tmp_path / "b")).problems == []


def _rewrite_manifest(remote_url: str, key: str, change) -> None:
    """Rewrite a remote manifest as another (buggy or hostile) writer would; signed again with the trusted key (a
    buggy trusted writer: what the remote's own checks catch, beside the signature's)."""
    from trtflow.storage.signing import sign

    raw = raw_remote(remote_url)
    path = f"nodes/{key[:2]}/{key}.json"
    manifest = json.loads(raw.read(path))
    change(manifest)
    manifest = sign(manifest)
    raw.write(path, json.dumps(manifest).encode())


def test_broken_remote_manifests_are_misses_and_lose_no_remote_object(tmp_path: Path, remote_url: str) -> None:
    """A manifest without `key` (was exit 70, an internal error) and one that lies about an object's size (was:
    the object deleted from the remote) are built locally; every remote object survives."""
    assert _run(tmp_path, "a", remote_url).returncode == 0
    store_a = Store(tmp_path / "a")
    keys = store_a.refs.current(str(tmp_path / "chain.yaml"))
    digest_b = store_a.read_manifest(keys["b"])["outputs"]["data"]["digest"]
    _rewrite_manifest(remote_url, keys["b"], lambda m: m.pop("key"))

    def lie(manifest: dict) -> None:
        manifest["outputs"]["data"]["digest"] = digest_b  # c claims b's object, with c's (wrong) size
    _rewrite_manifest(remote_url, keys["c"], lie)
    objects = {o["digest"] for k in keys.values() for o in store_a.read_manifest(k)["outputs"].values()}

    second = _run(tmp_path, "b", remote_url, "--no-push")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "2 built, 1 reused" in second.stdout, second.stdout
    assert "it names no key" in second.stderr, second.stderr
    assert f"says object {digest_b} has" in second.stdout, second.stdout
    assert _outputs(tmp_path / "out-b") == _outputs(tmp_path / "out-a")
    raw = raw_remote(remote_url)
    assert all(raw.exists(f"objects/{d[:2]}/{d}") for d in objects), "a remote object was lost"


def _corrupt(remote_url: str, digest: str) -> None:
    """Flip one byte of a remote object, keeping its size (a cheap size check cannot see it)."""
    key = f"objects/{digest[:2]}/{digest}"
    if not remote_url.startswith("s3://"):
        path = Path(remote_url) / key
        path.chmod(0o644)
        data = bytearray(path.read_bytes())
        data[100] ^= 1
        path.write_bytes(bytes(data))
        return
    import boto3

    bucket, _, prefix = remote_url[len("s3://"):].partition("/")
    client = boto3.client("s3")
    name = f"{prefix}/{key}" if prefix else key
    data = bytearray(client.get_object(Bucket=bucket, Key=name)["Body"].read())
    data[100] ^= 1
    client.put_object(Bucket=bucket, Key=name, Body=bytes(data))
