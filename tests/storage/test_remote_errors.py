"""A remote that cannot be used says what to fix: a TrtflowError with a hint, never a botocore traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from trtflow.errors import EXIT_ENVIRONMENT, UsageError
from trtflow.storage.remote import RemoteCache, RemoteError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # botocore retries the connection before giving up
def test_an_unreachable_endpoint_is_named(s3_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    with pytest.raises(RemoteError) as err:
        RemoteCache("s3://bucket/prefix").get_manifest("0" * 32)
    message = str(err.value)
    assert f"cannot reach the S3 endpoint {endpoint} for s3://bucket/prefix" in message
    assert "check AWS_ENDPOINT_URL" in message
    assert err.value.exit_code == EXIT_ENVIRONMENT


def test_a_missing_bucket_is_named(s3_env: str) -> None:
    with pytest.raises(RemoteError, match="the bucket 'no-such-bucket' of s3://no-such-bucket/x does not exist") \
            as err:
        RemoteCache("s3://no-such-bucket/x").check()
    assert "aws s3 mb" in str(err.value)


def test_bad_credentials_are_reported_with_what_to_set(s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import moto.settings

    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # the server now checks signatures
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY000000")
    with pytest.raises(RemoteError, match=f"access denied to s3://{s3_bucket}/p") as err:
        RemoteCache(f"s3://{s3_bucket}/p").get_manifest("0" * 32)
    assert "AWS_ACCESS_KEY_ID" in str(err.value)


def test_a_missing_remote_directory_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "not-mounted"
    with pytest.raises(RemoteError, match=f"the remote cache directory {missing} does not exist") as err:
        RemoteCache(str(missing)).get_manifest("0" * 32)
    assert f"mkdir -p {missing}" in str(err.value)


def test_a_directory_remote_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    from tests.storage.conftest import commit_node, make_store, node_key

    root = tmp_path / "remote"
    root.mkdir()
    (root / "objects").write_text("a file where the objects folder should be")
    store = make_store(tmp_path / "store")
    key = node_key("x")
    commit_node(store, key, {"x": b"x"}, tmp_path)
    with pytest.raises(RemoteError, match=f"cannot write {root}/objects/"):
        RemoteCache(str(root)).push(key, store)


@pytest.mark.parametrize(("url", "message"), [
    ("gs://bucket/x", "unsupported scheme 'gs'"),
    ("s3:///prefix", "names no bucket"),
    ("file://server/share", "file:// URLs name a local path"),
])
def test_bad_remote_urls_are_usage_errors(url: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        RemoteCache(url)


def test_missing_credentials_are_reported_with_what_to_set(s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to find here
    with pytest.raises(RemoteError, match=f"no usable AWS credentials for s3://{s3_bucket}/p") as err:
        RemoteCache(f"s3://{s3_bucket}/p").get_manifest("0" * 32)
    assert "AWS_PROFILE" in str(err.value)


def test_credentials_come_from_the_shared_credentials_file(s3_bucket: str, monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    credentials = tmp_path / "credentials"
    credentials.write_text("[ci]\naws_access_key_id = fromfile\naws_secret_access_key = fromfile\n")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_PROFILE", "ci")
    assert RemoteCache(f"s3://{s3_bucket}/p").get_manifest("0" * 32) is None
