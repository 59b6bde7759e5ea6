"""One interface for the places a remote cache lives (after fsspec's: one API, a class per file system).

A backend is blob storage under one root; paths are relative and '/'-separated. Every read is bounded (the reader
says how many bytes it accepts) and every write is atomic; ``create`` is put-if-absent. The directory backend
(``directory.py``) is the standard library working under a directory file descriptor; the S3 backend (``s3.py``)
is s3fs, itself an fsspec file system.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlparse

from trtflow.errors import UsageError


class Backend(Protocol):
    url: str

    def check(self) -> None:
        """Raise RemoteError if the remote cannot be reached or used."""

    def read(self, path: str, limit: int) -> bytes | None:
        """The content of ``path`` (None if absent); raises TooLarge past ``limit`` bytes, Unreadable for an entry
        that is not a regular file inside the root."""

    def size(self, path: str) -> int | None:
        """The size of ``path`` (None if absent); raises Unreadable as ``read``."""

    def download(self, path: str, dest: Path, limit: int) -> None:
        """Copy ``path`` into the local file ``dest``; raises FileNotFoundError, TooLarge past ``limit`` bytes (a part
        may have been written to ``dest``), Unreadable as ``read``."""

    def create(self, path: str, source: Path | bytes) -> bool:
        """Write ``path`` unless it exists (put-if-absent); True if this call wrote it."""

    def replace(self, path: str, source: Path | bytes) -> None:
        """Write ``path`` whether or not it exists (atomically: readers see the old or the new content)."""

    def delete(self, path: str) -> None:
        """Remove ``path`` if it exists."""

    def clear(self) -> None:
        """Remove everything under the root, and the root (a run's own transfer area, when the run ends)."""


def local_path(url: str) -> Path:
    """The folder a directory remote's URL names (a path or file:///path)."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    return Path(url).expanduser().absolute()


def open_backend(url: str, part_size: int) -> Backend:
    """The backend of a remote URL: a directory path, ``file:///path`` or ``s3://bucket/prefix``."""
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise UsageError(f"remote {url!r} names no bucket", hint="write s3://BUCKET/PREFIX")
        from trtflow.storage.remote.s3 import S3Backend

        return S3Backend(parsed.netloc, parsed.path.strip("/"), url, part_size)
    from trtflow.storage.remote.directory import DirectoryBackend

    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise UsageError(f"remote {url!r}: file:// URLs name a local path (file:///path)",
                             hint="mount the share and give its local path")
        return DirectoryBackend(Path(unquote(parsed.path)), url)
    if len(parsed.scheme) > 1:  # one letter: a Windows drive
        raise UsageError(f"remote {url!r}: unsupported scheme {parsed.scheme!r}",
                         hint="use a directory path, file:///path or s3://bucket/prefix")
    return DirectoryBackend(Path(url).expanduser().absolute(), url)
