"""Content-addressed artifact store with node manifests, atomic commits and shared caches.

Layout under the store root (``.trtflow`` by default):
  format.json              the store's format version (a newer trtflow migrates an older store; an older one stops)
  objects/ab/<digest>      artifact files, read-only once committed; a file's name IS its content digest
  nodes/ab/<key>.json      node manifests (written last: a manifest means the node is complete)
  refs/<recipe>/           what each recipe file's latest runs used (see refs.py): gc's roots
  pins/                    reference artifacts comparisons re-measure (see pins.py): gc's roots too
  caches/                  shared mutable caches (TensorRT timing caches) under file locks
  locks/                   per-node-key build locks (one process builds, others wait and reuse)
  logs/<run>/<node>.log    per-node logs
  tmp/<run>/               scratch space of running nodes; removed after each node
  trtflow.db               SQLite journal of runs and the file-hash stat cache
  store.lock, gate.lock    the store lock (see lock.py)

The store never keeps or serves an object whose bytes do not match its name: a commit re-checks an object that
is already there (a same-size object damaged in place is replaced, not kept), and `intact` re-hashes an object
whose signature (size, mtime, ctime, inode) differs from the one recorded when it was last verified: rewriting an
object in place changes its ctime even when its size and mtime are restored.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.errors import StoreError, TrtflowError
from trtflow.fingerprint import StatCache, hash_file_content, signature
from trtflow.fsutil import atomic_write_text, fsync_dir
from trtflow.storage import outputs
from trtflow.storage.manifest import FORMAT as MANIFEST_FORMAT
from trtflow.storage.manifest import check_key, manifest_problem
from trtflow.storage.refs import RefStore, migrate_legacy_refs

READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
FORMAT = 2  # 1: the first release (no format.json, refs by recipe name)
SUBDIRS = ("objects", "nodes", "refs", "caches", "locks", "logs", "tmp", "pins")


@dataclass(frozen=True)
class StoredOutput:
    digest: str
    size: int
    filename: str
    kind: str


class Store:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()
        self.refs = RefStore(self.root / "refs")

    # ----- paths
    @property
    def objects(self) -> Path:
        return self.root / "objects"

    def object_path(self, digest: str) -> Path:
        return self.objects / digest[:2] / digest

    def manifest_path(self, key: str) -> Path:
        check_key(key)  # a key read from a file (refs) becomes a path: never one that leaves nodes/
        return self.root / "nodes" / key[:2] / f"{key}.json"

    @property
    def cache_dir(self) -> Path:
        return self.root / "caches"

    @property
    def tmp_dir(self) -> Path:
        return self.root / "tmp"

    @property
    def db_path(self) -> Path:
        return self.root / "trtflow.db"

    @property
    def format_path(self) -> Path:
        return self.root / "format.json"

    def log_path(self, run_id: str, node: str) -> Path:
        return self.root / "logs" / run_id / f"{node}.log"

    def lock_path(self, key: str) -> Path:
        return self.root / "locks" / f"{key}.lock"

    # ----- opening
    def ensure(self) -> None:
        """Make the store usable for writing: folders, format check, migration of an older store."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the store at {self.root}: {exc.strerror or exc}",
                             hint="choose a writable directory with --store or TRTFLOW_STORE") from None
        found = self.check_format()
        if not os.access(self.root, os.W_OK):
            raise StoreError(f"the store {self.root} is not writable",
                             hint="fix its permissions, or choose another with --store / TRTFLOW_STORE; `plan`, "
                             "`status`, `show` and `report` work on a read-only store")
        try:
            for sub in SUBDIRS:
                (self.root / sub).mkdir(exist_ok=True)
            self.check_folders()
            if found < FORMAT:
                migrate_legacy_refs(self.root / "refs")
                atomic_write_text(self.format_path, json.dumps({"format": FORMAT, "written_by": _version()}))
        except OSError as exc:
            raise StoreError(f"cannot prepare the store at {self.root}: {exc.strerror or exc}",
                             hint="free disk space or fix the store's permissions") from None

    def check_folders(self) -> None:
        """Refuse a store whose folders lead elsewhere: a store may sit in a folder another party controls (the
        default ``.trtflow`` is in the working directory, e.g. a cloned repository), and gc, verify and runs
        delete and write there. The store's root may be a link (the user's choice); its folders may not."""
        for name in (*SUBDIRS, "crashes"):
            path = self.root / name
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode):
                raise StoreError(f"the store's folder {path} is a symbolic link (to {os.readlink(path)}); trtflow "
                                 "deletes and writes there, so it must be a real folder",
                                 hint="remove the link, or point --store / TRTFLOW_STORE at the real store")
            if not stat.S_ISDIR(st.st_mode):
                raise StoreError(f"the store's folder {path} is not a folder", hint="remove it")

    def make_shard(self, path: Path) -> None:
        """Create the shard folder of an object or manifest path (``objects/ab``) as a real folder."""
        shard = path.parent
        shard.mkdir(parents=True, exist_ok=True)  # a worker's scratch store may not have objects/ yet
        if shard.is_symlink():
            raise StoreError(f"the store's folder {shard} is a symbolic link; trtflow writes only into real folders",
                             hint="`trtflow verify --fix` removes it")

    def check_format(self) -> int:
        """The store's format (1 for a store from the first release, FORMAT for a new one); refuses newer ones."""
        try:
            data = json.loads(self.format_path.read_text(encoding="utf-8"))
            found = int(data["format"])
        except FileNotFoundError:
            return 1 if (self.root / "objects").exists() else FORMAT
        except (OSError, ValueError, KeyError, TypeError):
            raise StoreError(f"the store's format file {self.format_path} is unreadable",
                             hint='restore it: {"format": 2}') from None
        if found > FORMAT:
            raise StoreError(
                f"the store {self.root} has format {found} (written by trtflow {data.get('written_by', '?')}); "
                f"this trtflow {_version()} reads format {FORMAT} and older",
                hint="upgrade trtflow (pip install -U trtflow), or use another store (--store / TRTFLOW_STORE)")
        return found

    # ----- manifests
    def read_manifest(self, key: str) -> dict[str, Any] | None:
        """The manifest of ``key``, or None when it is absent, unreadable or unusable (see manifest.py)."""
        try:
            with open(self.manifest_path(key), encoding="utf-8") as f:
                manifest = json.load(f)
        except (OSError, ValueError):
            return None  # absent or unreadable: treated as absent, `verify` reports an unreadable one
        return None if manifest_problem(key, manifest) else manifest

    def intact(self, manifest: Mapping[str, Any], stat_cache: StatCache | None = None) -> bool:
        """True if every output object of the manifest is present with the content its digest names."""
        return not self.damaged_outputs(manifest, stat_cache)

    def damaged_outputs(self, manifest: Mapping[str, Any], stat_cache: StatCache | None = None) -> list[str]:
        """Names of the manifest's outputs whose object is missing or whose bytes changed."""
        bad = []
        for name, out in manifest.get("outputs", {}).items():
            try:
                if not self.object_intact(out["digest"], int(out["size"]), stat_cache):
                    bad.append(name)
            except (KeyError, TypeError, ValueError):
                bad.append(name)
        return bad

    def object_intact(self, digest: str, size: int, stat_cache: StatCache | None = None) -> bool:
        path = self.object_path(digest)
        try:
            st = path.lstat()
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return False
        if stat_cache is not None and stat_cache.get(str(path), signature(st)) == digest:
            return True
        try:
            actual = hash_file_content(path)
        except OSError:
            return False
        if actual != digest:
            return False
        if stat_cache is not None and signature(path.lstat()) == signature(st):
            stat_cache.put(str(path), signature(st), digest)
        return True

    # ----- commit
    def put_file(self, source: Path, stat_cache: StatCache | None = None) -> tuple[str, int]:
        """Move ``source`` into the object store (same filesystem rename); return (digest, size)."""
        digest = hash_file_content(source)
        size = source.stat().st_size
        target = self.object_path(digest)
        if self.object_intact(digest, size, stat_cache):
            source.unlink()
            return digest, size
        self.make_shard(target)
        with open(source, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(source, READ_ONLY)
        os.replace(source, target)  # also replaces a damaged object of the same name
        fsync_dir(target.parent)
        if stat_cache is not None:  # written by us, read-only, renamed into place: trusted at once
            stat_cache.put(str(target), signature(target.stat()), digest)
        return digest, size

    def commit(self, key: str, manifest: dict[str, Any], out_dir: Path, outputs: Mapping[str, tuple[str, str]],
               stat_cache: StatCache | None = None) -> dict[str, Any]:
        """Store each produced output and then the manifest. ``outputs``: name -> (filename, kind)."""
        stored: dict[str, Any] = {}
        for name, (filename, kind) in outputs.items():
            path = out_dir / filename
            if not path.exists():
                continue
            digest, size = self.put_file(path, stat_cache)
            stored[name] = {"digest": digest, "size": size, "filename": filename, "kind": kind}
        manifest = dict(manifest, format=MANIFEST_FORMAT, key=key, outputs=stored, committed=time.time())
        self.write_manifest(key, manifest)
        return manifest

    def write_manifest(self, key: str, manifest: Mapping[str, Any]) -> None:
        self.make_shard(self.manifest_path(key))
        atomic_write_text(self.manifest_path(key), json.dumps(manifest, indent=1, sort_keys=True))

    # ----- user-facing copies (see outputs.py: what trtflow may touch under build/)
    def materialize(self, manifest: Mapping[str, Any], dest: Path) -> dict[str, Path]:
        """Copy a node's outputs to readable paths in ``dest``; raises OSError (UnsafeOutputFolder when ``dest``
        leads elsewhere)."""
        return outputs.materialize(manifest, dest, self.object_path)

    def retract(self, dest: Path, reason: str) -> list[str]:
        """Remove the copies trtflow made in ``dest`` (they no longer match the node); returns their names."""
        return outputs.retract(dest, reason)

    # ----- maintenance
    def iter_manifests(self) -> Iterator[tuple[Path, dict[str, Any] | None]]:
        for path in self._shard_files(self.root / "nodes"):
            if path.suffix != ".json" or path.name.startswith("."):
                continue
            try:
                yield path, json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                yield path, None

    def iter_objects(self) -> Iterator[Path]:
        yield from (p for p in self._shard_files(self.objects) if not p.name.startswith("."))

    def iter_partials(self) -> Iterator[Path]:
        """Temporary files of copies and downloads in the object folders (a killed run leaves them)."""
        yield from (p for p in self._shard_files(self.objects) if p.name.startswith("."))

    def linked_shards(self) -> list[Path]:
        """Shard folders (``objects/ab``, ``nodes/ab``) that are links: never followed, reported by verify."""
        return [Path(e.path) for base in (self.objects, self.root / "nodes") for e in _entries(base) if e.is_symlink()]

    def _shard_files(self, base: Path) -> list[Path]:
        """The entries of the real shard folders of ``base``, sorted; a shard that is a link is not entered."""
        return sorted(Path(f.path) for shard in _entries(base) if shard.is_dir(follow_symlinks=False)
                      for f in _entries(Path(shard.path)))


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            return list(it)
    except OSError:
        return []


def _version() -> str:
    from trtflow import __version__

    return __version__


def materialize_error(node: str, dest: Path, exc: OSError) -> TrtflowError:
    if isinstance(exc, outputs.UnsafeOutputFolder):
        return TrtflowError(f"node {node} is stored, but its outputs were not copied: {exc.message}",
                            hint="the node is not rebuilt: fix the output folder, then run again to copy them")
    return TrtflowError(f"node {node} is stored, but copying its outputs to {dest} failed: {exc.strerror or exc}",
                        hint="free space where the outputs go (--output-dir), then run again: the node is not "
                        "rebuilt, only copied")
