"""Canonical hashing of parameters, files and environment facts.

Files are hashed with xxh3-128, streamed in 1 MiB blocks. A file's *signature* (size, mtime, ctime, inode) in the
store's stat cache lets unchanged files skip re-reading entirely. ctime is part of it because it cannot be set
back: a file rewritten with its size kept and its mtime restored (``cp`` + ``touch -r``, ``rsync --inplace -t``)
gets a new ctime. A signature is trusted only once it is *settled*: a file whose mtime or ctime lies within
`RACY_WINDOW_NS` of the moment its content was read could change again within the same timestamp granule, so its
digest is not cached (it is read again next time).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Protocol

import xxhash

from trtflow.userfiles import open_file

CHUNK = 1 << 20
RACY_WINDOW_NS = 2_000_000_000


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace, tuples as lists."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def hash_text(text: str) -> str:
    """The digest of ``text`` as UTF-8; a lone surrogate (a file or link name that was not UTF-8, as os.readlink and
    os.listdir decode it) is hashed as its code point, never an error (the same bytes for every valid string)."""
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))


def hash_value(value: Any) -> str:
    return hash_text(canonical_json(value))


def hash_file_content(path: Path) -> str:
    """The digest of the regular file ``path`` (a file a recipe names: a named pipe or a device is refused, never
    read; `trtflow.userfiles.open_file`)."""
    with open_file(path) as f:
        return hash_stream(f)


def hash_stream(f: IO[bytes]) -> str:
    """Digest of what is left to read in an open file (the store hashes its objects through descriptors opened
    by `trtflow.storage.confined`)."""
    h = xxhash.xxh3_128()
    while chunk := f.read(CHUNK):
        h.update(chunk)
    return h.hexdigest()


def stream_digests(f: IO[bytes], sha256: bool) -> tuple[str, str | None]:
    """(xxh3-128, sha256 or None) of what is left to read in an open file, in one read."""
    import hashlib

    fast = xxhash.xxh3_128()
    strong = hashlib.sha256() if sha256 else None
    while chunk := f.read(CHUNK):
        fast.update(chunk)
        if strong is not None:
            strong.update(chunk)
    return fast.hexdigest(), strong.hexdigest() if strong is not None else None


Sig = tuple[int, int, int, int]  # size, mtime_ns, ctime_ns, inode


def signature(st: os.stat_result) -> Sig:
    """What the stat shortcuts compare: size, mtime, ctime and inode (ctime cannot be set back by a user)."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def settled(sig: Sig | list[int], read_at_ns: int) -> bool:
    """Whether a file's signature identifies its content read at ``read_at_ns``: neither its mtime nor its ctime
    lies within `RACY_WINDOW_NS` before that moment (on a filesystem with coarse timestamps, a change in the same
    granule would keep the signature)."""
    return read_at_ns - max(sig[1], sig[2]) > RACY_WINDOW_NS


class StatCache(Protocol):
    def get(self, path: str, sig: Sig) -> str | None: ...

    def put(self, path: str, sig: Sig, digest: str) -> None: ...


def hash_file(path: Path, cache: StatCache | None = None) -> str:
    """Digest of a file's content, reusing a cached digest while its signature is unchanged."""
    sig = signature(path.stat())
    key = str(path.resolve())
    if cache is not None:
        cached = cache.get(key, sig)
        if cached:
            return cached
    read_at = time.time_ns()
    digest = hash_file_content(path)
    if cache is not None and settled(sig, read_at) and signature(path.stat()) == sig:
        cache.put(key, sig, digest)
    return digest


def hash_path(path: Path, cache: StatCache | None = None) -> str:
    """Digest of a file, or of a directory tree (relative names and file digests)."""
    if path.is_dir():
        entries = []
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                full = Path(root) / name
                entries.append((full.relative_to(path).as_posix(), hash_file(full, cache)))
        return hash_value({"tree": entries})
    return hash_file(path, cache)


def node_key(
    stage: str,
    version: str,
    params: Mapping[str, Any],
    inputs: Mapping[str, str],
    files: Mapping[str, str],
    facts: Mapping[str, str],
) -> str:
    """The node key: what decides whether a stored result can be reused."""
    return hash_value(
        {
            "stage": stage,
            "version": version,
            "params": params,
            "inputs": dict(inputs),
            "files": dict(files),
            "facts": dict(facts),
        }
    )


def diff_values(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Human-readable differences between two JSON-like values ("params.opset changed 17 -> 18")."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            path = f"{prefix}.{k}" if prefix else str(k)
            if k not in old:
                out.append(f"{path} added ({_short(new[k])})")
            elif k not in new:
                out.append(f"{path} removed (was {_short(old[k])})")
            else:
                out.extend(diff_values(old[k], new[k], path))
        return out
    if old != new:
        return [f"{prefix} changed {_short(old)} -> {_short(new)}"]
    return []


def _short(value: Any, limit: int = 40) -> str:
    text = value if isinstance(value, str) else canonical_json(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
