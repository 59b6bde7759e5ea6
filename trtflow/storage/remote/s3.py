"""A remote cache under a prefix of an S3 bucket, through s3fs (botocore's credential chain and endpoint
configuration: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws/config and
credentials, instance roles).

Put-if-absent is S3's conditional write (``If-None-Match: *`` on a PUT and on a multipart completion). Reads are
bounded: a small file is one ranged GET of at most the allowed bytes plus one; a download stops as soon as the
object says (or proves) it is larger than allowed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trtflow.storage.remote.errors import RemoteError, TooLarge

UPLOAD_CONCURRENCY = 4  # parts in flight: bounds an upload's buffers to about 4 x part size

_CREDENTIALS_HINT = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE with ~/.aws/credentials), "
                     "and check that they may read and write this bucket")
_ENDPOINT_HINT = ("check AWS_ENDPOINT_URL (for MinIO or another S3-compatible server) and the network, "
                  "or run without --remote / TRTFLOW_REMOTE")


class S3Backend:
    def __init__(self, bucket: str, prefix: str, url: str, part_size: int) -> None:
        try:
            import botocore.exceptions
            import s3fs
        except ImportError:
            raise RemoteError(f"{url}: s3:// remotes need s3fs, which is not installed",
                              hint="pip install 'trtflow[remote]'") from None
        self.url = url
        self.bucket = bucket
        self.prefix = prefix
        self.part_size = part_size
        self._botocore = botocore.exceptions
        self._s3fs = s3fs
        self._fs: Any = None
        self._fs_pid = 0

    @property
    def fs(self) -> Any:
        """The s3fs filesystem of this process (s3fs refuses use across a fork: a forked worker opens its own)."""
        if self._fs is None or self._fs_pid != os.getpid():
            # No instance cache (credentials and endpoint are read when the remote is opened) and no listings
            # cache (another machine may have pushed since); a few retries, then a clear error.
            fs = self._s3fs.S3FileSystem(
                skip_instance_cache=True, use_listings_cache=False, max_concurrency=UPLOAD_CONCURRENCY,
                config_kwargs={"connect_timeout": 10, "read_timeout": 60,
                               "retries": {"max_attempts": 3, "mode": "standard"}},
            )
            fs.retries = 3
            self._fs, self._fs_pid = fs, os.getpid()
        return self._fs

    def _key(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path

    def _path(self, path: str) -> str:
        return f"{self.bucket}/{self._key(path)}"

    def _endpoint(self) -> str:
        client = getattr(self._fs, "_s3", None)
        endpoint = getattr(getattr(client, "meta", None), "endpoint_url", None)
        return endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") \
            or "the default AWS endpoint"

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        errors = self._botocore
        try:
            yield
        except (FileNotFoundError, FileExistsError):
            raise
        except PermissionError as exc:
            raise RemoteError(f"access denied to {self.url} while {what}: {exc}", hint=_CREDENTIALS_HINT) from None
        except (errors.NoCredentialsError, errors.PartialCredentialsError, errors.ProfileNotFound) as exc:
            raise RemoteError(f"no usable AWS credentials for {self.url}: {exc}", hint=_CREDENTIALS_HINT) from None
        except (errors.EndpointConnectionError, errors.ConnectTimeoutError, errors.SSLError) as exc:
            raise RemoteError(f"cannot reach the S3 endpoint {self._endpoint()} for {self.url}: {exc}",
                              hint=_ENDPOINT_HINT) from None
        except (errors.BotoCoreError, errors.ClientError, OSError, ValueError) as exc:
            raise RemoteError(f"{what} on {self.url} (endpoint {self._endpoint()}) failed: "
                              f"{type(exc).__name__}: {exc}", hint=_ENDPOINT_HINT) from None

    def check(self) -> None:
        try:
            with self._errors("opening the bucket"):
                self.fs.call_s3("head_bucket", Bucket=self.bucket)
        except FileNotFoundError:
            raise RemoteError(f"the bucket {self.bucket!r} of {self.url} does not exist at {self._endpoint()}",
                              hint="create it (aws s3 mb s3://BUCKET), or fix --remote / TRTFLOW_REMOTE and "
                                   "AWS_ENDPOINT_URL") from None

    def read(self, path: str, limit: int) -> bytes | None:
        with self._errors(f"reading {path}"):
            try:
                # one ranged GET of at most limit + 1 bytes (no HEAD first)
                data = self.fs.cat_file(self._path(path), start=0, end=limit + 1)
            except FileNotFoundError:
                return None
            except OSError:
                if self._empty(path):  # an empty object has no byte 0: S3 refuses the range
                    return b""
                raise
        if len(data) > limit:
            raise TooLarge(f"is larger than {limit} bytes")
        return data

    def _empty(self, path: str) -> bool:
        try:
            return self.size(path) == 0
        except RemoteError:
            return False

    def size(self, path: str) -> int | None:
        with self._errors(f"looking up {path}"):
            try:
                head = self.fs.call_s3("head_object", Bucket=self.bucket, Key=self._key(path))
            except FileNotFoundError:
                return None
            return int(head["ContentLength"])

    def download(self, path: str, dest: Path, limit: int) -> None:
        with self._errors(f"downloading {path}"):
            # One streamed GET: ranged parallel reads cost S3-compatible servers more than they gain here
            # (bench/remote_cache.py: 5x slower against moto). The callback stops it past ``limit`` bytes.
            self.fs.get_file(self._path(path), str(dest), max_concurrency=1, callback=_bounded(limit))

    def _put(self, path: str, source: Path | bytes, mode: str) -> None:
        if isinstance(source, bytes):
            self.fs.pipe_file(self._path(path), source, mode=mode)
        else:
            self.fs.put_file(str(source), self._path(path), mode=mode, chunksize=self.part_size)

    def create(self, path: str, source: Path | bytes) -> bool:
        with self._errors(f"uploading {path}"):
            try:
                self._put(path, source, "create")  # If-None-Match: * on PUT and on multipart completion
            except FileExistsError:
                return False
            return True

    def replace(self, path: str, source: Path | bytes) -> None:
        with self._errors(f"uploading {path}"):
            self._put(path, source, "overwrite")

    def clear(self) -> None:
        if not self.prefix:
            raise RemoteError(f"refusing to empty the whole bucket {self.url}", hint="give the transfer area a prefix")
        with self._errors(f"removing {self.prefix}/"):
            try:
                self.fs.rm(f"{self.bucket}/{self.prefix}/", recursive=True)
            except FileNotFoundError:
                pass

    def delete(self, path: str) -> None:
        with self._errors(f"removing {path}"):
            try:
                self.fs.rm_file(self._path(path))
            except FileNotFoundError:
                pass


def _bounded(limit: int) -> Any:
    """An fsspec transfer callback that stops a download whose announced or received size passes ``limit``."""
    from fsspec.callbacks import Callback

    class Bounded(Callback):
        def set_size(self, size: int | None) -> None:
            if size is not None and size > limit:
                raise TooLarge(f"has {size} bytes, more than {limit}")
            super().set_size(size)

        def relative_update(self, inc: int = 1) -> None:
            super().relative_update(inc)
            if self.value > limit:
                raise TooLarge(f"has more than {limit} bytes")

    return Bounded()
