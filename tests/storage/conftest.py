"""Fixtures for the remote cache: a directory remote, and an S3 remote on a moto server started on localhost."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from trtflow.storage.remote import RemoteCache
from trtflow.storage.store import Store


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3-protocol server (moto's server mode) in a thread of the test process, on a free port."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """Point the standard AWS variables at the local server; no user AWS configuration leaks in."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    return s3_endpoint


@pytest.fixture
def s3_bucket(s3_env: str) -> str:
    import boto3

    name = f"trtflow-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["directory", "s3"])
def remote_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "directory":
        root = tmp_path / "remote"
        root.mkdir()
        return str(root)
    bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/team/cache"


@pytest.fixture
def remote(remote_url: str) -> RemoteCache:
    return RemoteCache(remote_url)


@pytest.fixture
def producer(tmp_path: Path) -> Store:
    return make_store(tmp_path / "store-a")


@pytest.fixture
def consumer(tmp_path: Path) -> Store:
    return make_store(tmp_path / "store-b")


def object_path(digest: str) -> str:
    return f"objects/{digest[:2]}/{digest}"


def manifest_path(key: str) -> str:
    return f"nodes/{key[:2]}/{key}.json"


def make_store(root: Path) -> Store:
    store = Store(root)
    store.ensure()
    return store


def commit_node(store: Store, key: str, files: dict[str, bytes], scratch: Path) -> dict:
    """Commit a node whose outputs are ``files`` (output name -> content), as the runner does."""
    out = scratch / f"out-{key}-{uuid.uuid4().hex[:6]}"
    out.mkdir(parents=True)
    spec = {}
    for name, content in files.items():
        (out / f"{name}.bin").write_bytes(content)
        spec[name] = (f"{name}.bin", "blob")
    return store.commit(key, {"stage": "synth", "node": "n"}, out, spec)


def node_key(seed: str) -> str:
    import xxhash

    return xxhash.xxh3_128_hexdigest(seed.encode())


def raw_remote(remote_url: str):
    """Direct access to the remote's files, as another (buggy or hostile) writer would have."""
    if remote_url.startswith("s3://"):
        import s3fs

        fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)
        return _RawS3(fs, remote_url[len("s3://"):])
    return _RawDirectory(Path(remote_url))


class _RawDirectory:
    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, path: str) -> bytes:
        return (self.root / path).read_bytes()

    def write(self, path: str, data: bytes) -> None:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            os.chmod(target, 0o644)
        target.write_bytes(data)

    def exists(self, path: str) -> bool:
        return (self.root / path).exists()

    def delete(self, path: str) -> None:
        (self.root / path).unlink()

    def leftovers(self) -> list[Path]:
        """Temporary files a writer left behind."""
        return [p for p in self.root.rglob(".*") if p.is_file()]


class _RawS3:
    def __init__(self, fs, base: str) -> None:
        self.fs = fs
        self.base = base

    def read(self, path: str) -> bytes:
        return self.fs.cat_file(f"{self.base}/{path}")

    def write(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(f"{self.base}/{path}", data)

    def exists(self, path: str) -> bool:
        return self.fs.exists(f"{self.base}/{path}")

    def delete(self, path: str) -> None:
        self.fs.rm_file(f"{self.base}/{path}")
