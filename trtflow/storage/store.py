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
  crashes/<run>/<node>/    the inputs of a node that crashed, kept for its reproduction command
  noop/<call>.json         no-op records (execution/noop.py); gc removes those of recipes it forgot, and old ones
  ray-remote/              the transfer area of a local Ray cluster (execution/ray_executor.py); gc empties it
  trtflow.db               SQLite journal of runs and the file-hash stat cache
  store.lock, gate.lock    the store lock (see lock.py); holders/ says who holds it

Every file under the root is read and written through `Tree` (links refused at every component, reads
bounded, writes by temp file and rename): a store may come with a cloned repository or be shared with others.

The store never keeps or serves an object whose bytes do not match its name: a commit re-checks an object that
is already there (a same-size object damaged in place is replaced, not kept), and `intact` re-hashes an object
whose signature (size, mtime, ctime, inode) differs from the one recorded when it was last verified: rewriting an
object in place changes its ctime even when its size and mtime are restored.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.errors import StoreError, TrtflowError
from trtflow.fingerprint import StatCache, hash_stream, signature
from trtflow.storage import outputs, records, signing, verified
from trtflow.storage.confined.names import Refused, check_name, check_relative
from trtflow.storage.confined.tree import Tree, as_tree
from trtflow.storage.manifest import FORMAT as MANIFEST_FORMAT
from trtflow.storage.manifest import check_key, is_digest, manifest_problem
from trtflow.storage.refs import RefStore, migrate_legacy_refs

READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
FORMAT = 2  # 1: the first release (no format.json, refs by recipe name)
SUBDIRS = ("objects", "nodes", "refs", "caches", "locks", "logs", "tmp", "pins")
NOOP = "noop"  # no-op records (execution/noop.py)
TRANSFER = "ray-remote"  # the transfer area of a local Ray cluster, a folder per run (execution/ray_executor.py)
#: Folders trtflow deletes and writes in: each must be a real folder (never a link), checked before any work.
REAL_FOLDERS = (*SUBDIRS, "crashes", "holders", TRANSFER)  # noop/ as a link only turns the shortcut off
NOOP_ENVELOPE = 2  # 2: variables by keyed digests; a record of 1 may hold their values (gc removes it)
log = logging.getLogger("trtflow.storage")


@dataclass(frozen=True)
class StoredOutput:
    digest: str
    size: int
    filename: str
    kind: str


Rel = tuple[str, ...]


class Store:
    """The store under ``root``. ``follow_root``: whether ``root`` itself may be a symbolic link (True when the user
    named it: --store, TRTFLOW_STORE; a store found by default in the working folder may not be one). Every file
    under it is read and written through ``tree`` (`trtflow.storage.confined`)."""

    def __init__(self, root: Path, *, follow_root: bool = True) -> None:
        self.root = Path(root).absolute()
        self.tree = Tree(self.root, follow_root=follow_root)
        self.refs = RefStore(self.tree)

    # ----- paths (shown in messages, handed to stage processes) and their parts below the root
    def shown(self, rel: Rel | str) -> Path:
        return self.tree.shown(rel)

    def rel(self, path: Path) -> Rel:
        """The parts below the root of a path this store made (``shown``, ``object_path``...)."""
        return Path(path).relative_to(self.root).parts

    @property
    def objects(self) -> Path:
        return self.root / "objects"

    @staticmethod
    def object_rel(digest: str) -> Rel:
        if not is_digest(digest):  # a digest read from a record becomes a path: never one that leaves objects/
            raise Refused(repr(digest)[:100], "is not an object digest")
        return "objects", digest[:2], digest

    def object_path(self, digest: str) -> Path:
        return self.shown(self.object_rel(digest))

    @staticmethod
    def manifest_rel(key: str) -> Rel:
        check_key(key)  # a key read from a file (refs) becomes a path: never one that leaves nodes/
        return "nodes", key[:2], f"{key}.json"

    def manifest_path(self, key: str) -> Path:
        return self.shown(self.manifest_rel(key))

    @property
    def cache_dir(self) -> Path:
        return self.root / "caches"

    @property
    def tmp_dir(self) -> Path:
        return self.root / "tmp"

    @property
    def db_path(self) -> Path:
        return self.root / "trtflow.db"

    def journal(self, readonly: bool = False) -> Any:
        """The store's journal (`trtflow.storage.journal.Journal`), opened on first use."""
        from trtflow.storage.journal import Journal

        return Journal(self.db_path, readonly=readonly, tree=self.tree)

    def has_journal(self) -> bool:
        """Whether the store has a journal file (of whatever kind: opening it checks it)."""
        try:
            return self.tree.stat("trtflow.db") is not None
        except OSError:
            return False

    @property
    def format_path(self) -> Path:
        return self.root / "format.json"

    @staticmethod
    def log_rel(run_id: str, node: str) -> Rel:
        return "logs", check_name(run_id, "run id"), check_name(f"{node}.log", "node name")

    def log_path(self, run_id: str, node: str) -> Path:
        return self.shown(self.log_rel(run_id, node))

    @staticmethod
    def lock_rel(key: str) -> Rel:
        check_key(key)
        return "locks", f"{key}.lock"

    def lock_path(self, key: str) -> Path:
        return self.shown(self.lock_rel(key))

    @staticmethod
    def scratch_rel(run_id: str, node: str | None = None) -> Rel:
        run = ("tmp", check_name(run_id, "run id"))
        return run if node is None else (*run, check_name(node, "node name"))

    # ----- opening
    def exists(self) -> bool:
        """Whether the store's folder exists (a default store that is a link: StoreError)."""
        try:
            return self.tree.exists()
        except Refused as exc:
            raise self._refused(exc) from None

    def ensure(self) -> None:
        """Make the store usable for writing: folders, format check, migration of an older store."""
        try:
            self.tree.ensure()
        except Refused as exc:
            raise self._refused(exc) from None
        except OSError as exc:
            raise StoreError(f"cannot create the store at {self.root}: {exc.strerror or exc}",
                             hint="choose a writable directory with --store or TRTFLOW_STORE") from None
        found = self.check_format()
        if not os.access(".", os.W_OK, dir_fd=self.tree.fd()):
            raise StoreError(f"the store {self.root} is not writable",
                             hint="fix its permissions, or choose another with --store / TRTFLOW_STORE; `plan`, "
                             "`status`, `show` and `report` work on a read-only store")
        self.check_folders()
        try:
            for sub in SUBDIRS:
                self.tree.mkdir(sub)
            if found < FORMAT:
                migrate_legacy_refs(self.tree)
                self.tree.write_text("format.json", json.dumps({"format": FORMAT, "written_by": _version()}))
        except Refused as exc:
            raise self._refused(exc) from None
        except OSError as exc:
            raise StoreError(f"cannot prepare the store at {self.root}: {exc.strerror or exc}",
                             hint="free disk space or fix the store's permissions") from None

    def _refused(self, exc: Refused) -> StoreError:
        if exc.path == self.root:
            return StoreError(f"the store {exc.message}",
                              hint="a store found in the working folder (.trtflow) must be a real folder: remove the "
                              "link, or name the store with --store / TRTFLOW_STORE if you mean to use it")
        return StoreError(f"the store's entry {exc.message}", hint=exc.hint or "remove it")

    def check_folders(self) -> None:
        """Refuse a store whose folders lead elsewhere: a store may sit in a folder another party controls (the
        default ``.trtflow`` is in the working directory, e.g. a cloned repository), and gc, verify and runs
        delete and write there. The store's root may be a link when the user named it; its folders may not."""
        for name in REAL_FOLDERS:
            try:
                st = self.tree.stat(name)
            except FileNotFoundError:
                return  # no store yet
            except Refused as exc:
                raise self._refused(exc) from None
            if st is None:
                continue
            path = self.root / name
            if stat.S_ISLNK(st.st_mode):
                try:
                    target = os.readlink(name, dir_fd=self.tree.fd())
                except OSError:
                    target = "?"
                raise StoreError(f"the store's folder {path} is a symbolic link (to {target}); trtflow "
                                 "deletes and writes there, so it must be a real folder",
                                 hint="remove the link, or point --store / TRTFLOW_STORE at the real store")
            if not stat.S_ISDIR(st.st_mode):
                raise StoreError(f"the store's folder {path} is not a folder", hint="remove it")

    def check_format(self) -> int:
        """The store's format (1 for a store from the first release, FORMAT for a new one); refuses newer ones."""
        try:
            data = records.read(self.tree, "format.json", records.FORMAT_FILE)
            found = int(data["format"])
        except FileNotFoundError:
            try:
                return 1 if self.tree.is_dir("objects") else FORMAT
            except FileNotFoundError:
                return FORMAT
            except Refused as exc:
                raise self._refused(exc) from None
        except Refused as exc:
            if exc.path == self.root:
                raise self._refused(exc) from None
            raise StoreError(f"the store's format file {exc.message}",
                             hint='replace it with a regular file holding {"format": 2}') from None
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
            manifest = records.read(self.tree, self.manifest_rel(key), records.MANIFEST)
        except Refused as exc:
            log.warning("ignoring the manifest %s", exc.message)
            return None
        except (OSError, ValueError):
            return None  # absent or unreadable: treated as absent, `verify` reports an unreadable one
        return None if manifest_problem(key, manifest) else manifest

    def write_manifest(self, key: str, manifest: Mapping[str, Any]) -> None:
        self.tree.write_text(self.manifest_rel(key), json.dumps(manifest, indent=1, sort_keys=True))

    def damaged_note(self, key: str) -> dict[str, Any] | None:
        """What `trtflow verify --fix` noted when it removed the manifest of ``key`` (None: nothing)."""
        rel = self.manifest_rel(key)
        try:
            note = records.read(self.tree, (*rel[:-1], f"{key}.damaged"), records.DAMAGED_NOTE)
        except (OSError, ValueError):
            return None
        return note if isinstance(note, dict) else None

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

    def object_stat(self, digest: str) -> os.stat_result | None:
        """The object's own status (None if absent or not reachable through real folders)."""
        try:
            return self.tree.stat(self.object_rel(digest))
        except OSError:
            return None

    def object_intact(self, digest: str, size: int, stat_cache: StatCache | None = None) -> bool:
        try:
            rel = self.object_rel(digest)
            st = self.tree.stat(rel)
        except OSError:
            return False
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return False
        path = str(self.shown(rel))
        if stat_cache is not None and stat_cache.get(path, signature(st)) == digest:
            return True
        try:
            with self.tree.open_read(rel) as f:
                opened = os.fstat(f.fileno())
                actual = hash_stream(f)
        except OSError:
            return False
        if actual != digest or opened.st_ino != st.st_ino:
            return False
        if stat_cache is not None and signature(opened) == signature(st):  # not changed while it was hashed
            stat_cache.put(path, signature(st), digest)
        return True

    def open_object(self, digest: str) -> Any:
        """A context manager giving the object open for reading (a regular file reached through real folders)."""
        return self.tree.open_read(self.object_rel(digest))

    def hash_object(self, digest: str, *, sha256: bool = False) -> tuple[str, str | None]:
        """(xxh3-128, sha256 or None) of the stored object's content."""
        from trtflow.fingerprint import stream_digests

        with self.open_object(digest) as f:
            return stream_digests(f, sha256)

    # ----- commit
    def put_file(self, source: Tree, rel: Rel | str, stat_cache: StatCache | None = None) -> tuple[str, int]:
        """Move the regular file ``rel`` of ``source`` (a node's scratch space, on this file system) into the object
        store; return (digest, size). A link or anything but a regular file is refused (a stage writes files)."""
        digest, size, _ = self.put_object(source, rel, stat_cache)
        return digest, size

    def put_object(self, source: Tree, rel: Rel | str, stat_cache: StatCache | None = None,
                   sha256: bool = False) -> tuple[str, int, str | None]:
        """`put_file`, also giving the sha256 of the bytes (read once) when asked: (digest, size, sha256)."""
        from trtflow.fingerprint import stream_digests

        with source.open_read(rel) as f:
            st = os.fstat(f.fileno())
            digest, strong = stream_digests(f, sha256)
            size = st.st_size
            if not self.object_intact(digest, size, stat_cache):
                os.fsync(f.fileno())
                os.fchmod(f.fileno(), READ_ONLY)
                fresh = True
            else:
                fresh = False
        if not fresh:
            source.unlink(rel)
            return digest, size, strong
        target = self.object_rel(digest)
        source.move_to(rel, self.tree, target)  # also replaces a damaged object of the same name
        self.tree.fsync_folder(target[:-1])
        if stat_cache is not None:  # written by us, read-only, renamed into place: trusted at once
            placed = self.tree.stat(target)
            if placed is not None:
                stat_cache.put(str(self.shown(target)), signature(placed), digest)
                if strong is not None:  # its sha256 too (signing.py checks a signed result's bytes by it)
                    verified.remember(stat_cache, str(self.shown(target)) + signing.SHA256_ENTRY, signature(placed),
                                      strong)
        return digest, size, strong

    def commit(self, key: str, manifest: dict[str, Any], out_dir: Tree | Path,
               outputs: Mapping[str, tuple[str, str]], stat_cache: StatCache | None = None) -> dict[str, Any]:
        """Store each produced output of the folder ``out_dir`` and then the manifest, signed by this builder with the
        sha256 of every output (`signing`). ``outputs``: name -> (filename, kind)."""
        out_dir = as_tree(out_dir)
        stored: dict[str, Any] = {}
        for name, (filename, kind) in outputs.items():
            rel = check_relative(filename, "output file name")
            if out_dir.stat(rel) is None:
                continue
            digest, size, sha256 = self.put_object(out_dir, rel, stat_cache, sha256=True)
            stored[name] = {"digest": digest, "size": size, "filename": filename, "kind": kind, "sha256": sha256}
        manifest = dict(manifest, format=MANIFEST_FORMAT, key=key, outputs=stored, committed=time.time())
        manifest = signing.sign(manifest)  # by this builder's key (`trtflow.keys`): see signing.py
        self.write_manifest(key, manifest)
        return manifest

    # ----- no-op records: the shortcut's record (its content is execution/noop.py's) in an envelope gc reads
    @staticmethod
    def noop_rel(name: str) -> Rel:
        return NOOP, check_name(f"{name}.json", "no-op record name")

    def read_noop_record(self, name: str) -> dict[str, Any] | None:
        """The no-op record ``name``; None if absent or unusable (a link, a pipe, too large: said so)."""
        try:
            envelope = records.read(self.tree, self.noop_rel(name), records.NOOP_RECORD)
        except Refused as exc:
            log.warning("ignoring the no-op record %s", exc.message)
            return None
        except (OSError, ValueError):
            return None
        if not isinstance(envelope, dict) or envelope.get("envelope") != NOOP_ENVELOPE:
            return None
        record = envelope.get("record")
        return record if isinstance(record, dict) else None

    def write_noop_record(self, name: str, record: Mapping[str, Any], keys: list[str]) -> None:
        """Write the no-op record ``name``, resting on the stored results ``keys`` (gc removes the record once one
        of them is gone)."""
        for key in keys:
            check_key(key)
        self.tree.write_text(self.noop_rel(name), json.dumps({"envelope": NOOP_ENVELOPE, "keys": list(keys),
                                                              "record": record}))

    def remove_noop_record(self, name: str) -> None:
        self.tree.unlink(self.noop_rel(name))

    def noop_record_keys(self, file_name: str) -> list[str] | None:
        """The keys the no-op record file ``file_name`` (in ``noop/``) rests on; None if it is unusable."""
        try:
            envelope = records.read(self.tree, (NOOP, check_name(file_name)), records.NOOP_RECORD)
        except (OSError, ValueError):
            return None
        if not isinstance(envelope, dict) or envelope.get("envelope") != NOOP_ENVELOPE:
            return None  # an older trtflow's (unused, and gc removes it: it may hold variables' values)
        keys = envelope.get("keys")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            return None
        return keys

    # ----- user-facing copies (see outputs.py: what trtflow may touch under build/)
    def materialize(self, manifest: Mapping[str, Any], dest: Path, base: Path | None = None) -> dict[str, Path]:
        """Copy a node's outputs to readable paths in ``dest`` (links are refused below ``base``, the folder the
        user chose: the working folder for the default build/<recipe>; ``dest``'s parent by default); raises
        OSError (Refused when ``dest`` leads elsewhere)."""
        return outputs.materialize(manifest, dest, base, self.open_object)

    def retract(self, dest: Path, reason: str, base: Path | None = None) -> list[str]:
        """Remove the copies trtflow made in ``dest`` (they no longer match the node); returns their names."""
        return outputs.retract(dest, reason, base)

    # ----- maintenance
    def iter_manifests(self) -> Iterator[tuple[Path, dict[str, Any] | None]]:
        for rel in self._shard_files("nodes"):
            if not rel[-1].endswith(".json") or rel[-1].startswith("."):
                continue
            try:
                yield self.shown(rel), records.read(self.tree, rel, records.MANIFEST)
            except (OSError, ValueError):
                yield self.shown(rel), None

    def iter_objects(self) -> Iterator[Path]:
        yield from (self.shown(r) for r in self._shard_files("objects") if not r[-1].startswith("."))

    def iter_partials(self) -> Iterator[Path]:
        """Temporary files of copies and downloads in the object folders (a killed run leaves them)."""
        yield from (self.shown(r) for r in self._shard_files("objects") if r[-1].startswith("."))

    def linked_shards(self) -> list[Path]:
        """Shard folders (``objects/ab``, ``nodes/ab``) that are links: never followed, reported by verify."""
        return [self.root / base / name for base in ("objects", "nodes") for name, st in self._entries(base)
                if stat.S_ISLNK(st.st_mode)]

    def _shard_files(self, base: str) -> list[Rel]:
        """The entries of the real shard folders of ``base``, sorted; a shard that is a link is not entered."""
        return sorted((base, shard, name) for shard, st in self._entries(base) if stat.S_ISDIR(st.st_mode)
                      for name, _ in self._entries((base, shard)))

    def _entries(self, rel: str | Rel) -> list[tuple[str, os.stat_result]]:
        try:
            return self.tree.listdir(rel)
        except OSError:
            return []


def _version() -> str:
    from trtflow import __version__

    return __version__


def materialize_error(node: str, dest: Path, exc: OSError) -> TrtflowError:
    if isinstance(exc, Refused):
        return TrtflowError(f"node {node} is stored, but its outputs were not copied: {exc.message}",
                            hint="the node is not rebuilt: fix the output folder, then run again to copy them")
    return TrtflowError(f"node {node} is stored, but copying its outputs to {dest} failed: {exc.strerror or exc}",
                        hint="free space where the outputs go (--output-dir), then run again: the node is not "
                        "rebuilt, only copied")
