"""The remote cache: node results shared between stores, pulled verified and pushed put-if-absent.

A remote has the layout of a store's shareable part:
  format.json              {"format": 1, "hash": "xxh3-128" | "sha256"}: refused when newer than this code
  objects/ab/<name>        artifact files, named by the digest of their content (the remote's hash)
  nodes/ab/<key>.json      node manifests, uploaded after their objects (a manifest means the node is complete)

What is verified, and what is not. Every pulled object is checked before it enters the store: its size against
the manifest, its bytes against its name (and against the manifest's xxh3 digest on a sha256 remote). A
manifest is checked completely before anything acts on it (manifest.py); one that is unusable is a miss (the
node is built here) and one that disagrees with an object is rejected, never the object: an object is removed
from the remote only when its own bytes do not hash to its name. The remote itself gives integrity, not authorship:
anyone who may write to it may publish a manifest for a key. Authorship is the reader's check: a run reuses a
result only when a key its project trusts signed it (`trtflow.storage.signing`: the signature binds the key to the
sha256 of every output), and its push replaces a remote manifest its project would not reuse (``replace_if``).
A sha256 remote also names objects by a cryptographic digest.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.errors import TrtflowError
from trtflow.fingerprint import StatCache, signature, stream_digests
from trtflow.storage import records, verified
from trtflow.storage.confined import kinds
from trtflow.storage.confined.names import check_relative
from trtflow.storage.confined.tree import Tree, as_tree
from trtflow.storage.manifest import Problem, check_key, is_key, manifest_problem, outputs_problem
from trtflow.storage.remote.backend import open_backend
from trtflow.storage.remote.errors import RemoteCorrupt, RemoteError, TooLarge, Unreadable
from trtflow.storage.signing import SHA256_ENTRY
from trtflow.storage.store import READ_ONLY, Store

log = logging.getLogger("trtflow.remote")

REMOTE_FORMAT = 1
XXH3, SHA256 = "xxh3-128", "sha256"
HASHES = (XXH3, SHA256)
HASH_NAME = XXH3  # what a new remote uses unless asked for another
FORMAT_FILE = "format.json"
DEFAULT_PART_SIZE = 32 * 2**20
MAX_MANIFEST_BYTES = 16 * 2**20  # a manifest or format file larger than this is not read
_REBUILD_HINT = "the node will be rebuilt; its next push uploads the object again"


@dataclass(frozen=True)
class Transfer:
    """What one pull or push moved: objects copied, their bytes, objects already there."""

    objects: int = 0
    bytes: int = 0
    present: int = 0
    manifest_written: bool = False


def object_path(name: str) -> str:
    return f"objects/{name[:2]}/{name}"


def manifest_path(key: str) -> str:
    return f"nodes/{key[:2]}/{key}.json"


def file_digests(tree: Tree, rel: str | tuple[str, ...], sha256: bool) -> tuple[str, str | None]:
    """(xxh3-128, sha256 or None) of the content of the regular file ``rel`` of ``tree``, in one read."""
    with tree.open_read(rel) as f:
        return stream_digests(f, sha256)


class RemoteCache:
    """A remote content-addressed cache shared by many stores.

    ``url``: a directory path, ``file:///path``, or ``s3://bucket/prefix``. ``digest``: the hash the remote must
    name its objects by (``xxh3-128`` or ``sha256``); None follows the remote's ``format.json`` (``xxh3-128`` for a
    new remote). Opening one contacts nothing; the first operation (or ``check()``) verifies that the remote is
    reachable and of a known format, and writes the format of a new remote when ``digest`` was asked for.
    """

    def __init__(self, url: str, *, part_size: int = DEFAULT_PART_SIZE, digest: str | None = None) -> None:
        if digest is not None and digest not in HASHES:
            from trtflow.errors import UsageError

            raise UsageError(f"unknown remote digest {digest!r}", hint=f"choose one of {', '.join(HASHES)}")
        self.url = url
        self.part_size = part_size
        self.requested = digest
        self.hash_name = digest or HASH_NAME
        self._backend = open_backend(url, part_size)
        self._lock = threading.Lock()
        self._checked = False
        self._format_written = False

    def __repr__(self) -> str:
        return f"RemoteCache({self.url!r})"

    def __reduce__(self) -> tuple[Any, ...]:  # e.g. sent to Ray workers: reopened there from the URL
        return _reopen, (self.url, self.part_size, self.requested)

    @property
    def sha256(self) -> bool:
        return self.hash_name == SHA256

    # ----- format
    def check(self) -> None:
        """Verify the remote is reachable, accessible and in a format this code reads; raise RemoteError if not."""
        with self._lock:
            if self._checked:
                return
            self._backend.check()
            raw = self._read_format()
            if raw is not None:
                self._check_format(raw)
                self._format_written = True
            self._checked = True
        if self.requested is not None and not self._format_written:
            try:
                self._ensure_format_written()  # workers that open the remote by URL alone then follow it
            except RemoteError as exc:
                log.warning("could not record the digest %s in %s: %s", self.requested, self.url, exc.message)

    def _read_format(self) -> bytes | None:
        try:
            return self._backend.read(FORMAT_FILE, MAX_MANIFEST_BYTES)
        except (Unreadable, TooLarge) as exc:
            raise RemoteError(f"{self.url} has an unusable {FORMAT_FILE}: it {exc.message}",
                              hint="point --remote / TRTFLOW_REMOTE at a trtflow cache or at an empty location") \
                from None

    def _check_format(self, raw: bytes) -> None:
        try:
            info = records.parse(records.REMOTE_FORMAT, raw, f"{self.url}/{FORMAT_FILE}")
            version, hash_name = info["format"], info["hash"]
        except ValueError:
            raise RemoteError(f"{self.url} has an unreadable {FORMAT_FILE}: not a trtflow remote cache",
                              hint="point --remote / TRTFLOW_REMOTE at a trtflow cache or at an empty "
                                   "location") from None
        if version > REMOTE_FORMAT:
            raise RemoteError(f"{self.url} is a trtflow remote cache of format {version}, newer than this "
                              f"trtflow reads (up to {REMOTE_FORMAT})",
                              hint="upgrade trtflow on this machine, or use another remote")
        if hash_name not in HASHES:
            raise RemoteError(f"{self.url} names its objects by {hash_name!r}; this trtflow knows "
                              f"{' and '.join(HASHES)}", hint="upgrade trtflow on this machine, or use another remote")
        if self.requested is not None and hash_name != self.requested:
            raise RemoteError(f"{self.url} names its objects by {hash_name}, not by the requested {self.requested}",
                              hint="the objects of one remote have one kind of name: use a new remote location "
                                   f"for {self.requested}, or drop --remote-digest / TRTFLOW_REMOTE_DIGEST")
        self.hash_name = hash_name

    def _ensure_format_written(self) -> None:
        self.check()
        with self._lock:
            if self._format_written:
                return
            data = json.dumps({"format": REMOTE_FORMAT, "hash": self.hash_name}, indent=1).encode() + b"\n"
            if not self._backend.create(FORMAT_FILE, data):
                # Another writer created it meanwhile: read theirs, it may be newer.
                raw = self._read_format()
                if raw is not None:
                    self._check_format(raw)
            self._format_written = True

    # ----- lookup
    def get_manifest(self, key: str) -> dict[str, Any] | None:
        """The remote manifest of ``key``; None if absent, or unusable (logged as a warning naming it)."""
        manifest, problem = self._read_manifest(key)
        if problem is not None:
            advice = "; upgrade trtflow to use it" if problem.newer else "; the node is built here instead"
            log.warning("ignoring the remote manifest of node %s at %s (%s): %s%s", key, self.url,
                        manifest_path(key), problem, advice)
            return None
        return manifest

    def _read_manifest(self, key: str) -> tuple[dict[str, Any] | None, Problem | None]:
        check_key(key)
        self.check()
        try:
            raw = self._backend.read(manifest_path(key), MAX_MANIFEST_BYTES)
        except (Unreadable, TooLarge) as exc:
            return None, Problem(f"it {exc.message}")
        if raw is None:
            return None, None
        try:
            manifest = records.parse(records.REMOTE_MANIFEST, raw, f"{self.url}/{manifest_path(key)}")
        except records.Damaged as exc:  # what manifest.py says of it, if anything, else what broke its type
            return None, (manifest_problem(key, exc.value) if exc.typed else None) or Problem(exc.reason)
        problem = manifest_problem(key, manifest) or self._names_problem(manifest.get("outputs", {}))
        return (None, problem) if problem else (manifest, None)

    def _names_problem(self, outputs: Mapping[str, Any]) -> Problem | None:
        if self.sha256:
            missing = [name for name, out in outputs.items() if not out.get("sha256")]
            if missing:
                return Problem(f"outputs {missing} have no sha256 (this remote names objects by sha256)")
        return None

    def _name(self, out: Mapping[str, Any]) -> str:
        """The remote name of an output's object: its digest in the remote's hash."""
        return str(out["sha256"] if self.sha256 else out["digest"])

    # ----- pull
    def pull(self, manifest: Mapping[str, Any], store: Store, stat_cache: StatCache | None = None,
             replace_if: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
        """Copy a node's outputs into ``store``, each verified, then its manifest; return the manifest now in the
        store.

        A node the store already has intact is left as it is (its manifest is returned); objects the store already
        has intact are not copied (``stat_cache``: the store's, to skip re-hashing unchanged objects; pulled objects
        are recorded in it). Call it while holding the store lock shared, as a run does, so gc cannot collect the
        objects before the manifest names them. Raises RemoteCorrupt (a RemoteError) if the manifest is unusable
        or an object is missing or does not match; the store is left without the node's manifest then.
        """
        self.check()  # the remote's hash decides which names its objects have
        key = manifest.get("key") if isinstance(manifest, Mapping) else None
        if not isinstance(manifest, Mapping):
            problem: Problem | None = Problem("not a JSON object")
        elif "key" not in manifest:
            problem = Problem("it names no key")
        elif not is_key(key):
            problem = Problem(f"its key {key!r} is not a node key")
        else:
            problem = manifest_problem(key, manifest) or self._names_problem(manifest["outputs"])
        if problem or not isinstance(key, str):
            raise RemoteCorrupt(f"the remote manifest of node {key} at {self.url} is unusable: {problem}")
        local = store.read_manifest(key)
        if local is not None and store.intact(local, stat_cache) and not (replace_if is not None and replace_if(local)):
            return local  # built or pulled here meanwhile: keep what the store's refs may already point at
        transfer = self.pull_objects(manifest["outputs"], store, stat_cache, node=key)
        store.write_manifest(key, manifest)
        log.info("pulled node %s from %s: %d objects (%d bytes), %d already here", key, self.url, transfer.objects,
                 transfer.bytes, transfer.present)
        return dict(manifest)

    def pull_objects(self, outputs: Mapping[str, Any], store: Store, stat_cache: StatCache | None = None, *,
                     node: str = "?") -> Transfer:
        """Copy the objects of ``outputs`` (name -> {digest, size, filename, kind[, sha256]}) into ``store``,
        verified; no manifest. For an executor whose workers fetch their inputs, or whose driver collects outputs
        that a worker uploaded with ``upload_outputs``. ``node`` names the node in errors. Raises RemoteCorrupt
        as ``pull``."""
        problem = outputs_problem(outputs) or self._names_problem(outputs)
        if problem:
            raise RemoteCorrupt(f"the outputs of node {node} are unusable: {problem}")
        self.check()
        store.tree.ensure()  # a worker's scratch store may not exist yet
        copied = nbytes = present = 0
        for name, out in _unique_outputs(outputs):
            if store.object_intact(out["digest"], out["size"], stat_cache):
                present += 1
                continue
            target = store.object_rel(out["digest"])
            self._pull_object(node, name, out, store, target)
            st = store.tree.stat(target)
            if stat_cache is not None and st is not None:
                stat_cache.put(str(store.shown(target)), signature(st), out["digest"])
                if out.get("sha256"):  # checked while pulling: the reuse that follows need not read it again
                    verified.remember(stat_cache, str(store.shown(target)) + SHA256_ENTRY, signature(st),
                                      out["sha256"])
            copied += 1
            nbytes += out["size"]
        return Transfer(objects=copied, bytes=nbytes, present=present)

    def _pull_object(self, key: str, name: str, out: Mapping[str, Any], store: Store,
                     target: tuple[str, ...]) -> None:
        digest, size, remote_name = out["digest"], out["size"], self._name(out)
        path = object_path(remote_name)
        where = f"remote object {remote_name} (output {name!r} of node {key}) at {self.url}"
        lie = f"the remote manifest of node {key} at {self.url} says object {remote_name}"
        kept = "the manifest is not used (the object is kept)"
        try:
            remote_size = self._backend.size(path)
        except Unreadable as exc:
            raise RemoteCorrupt(f"{where} {exc.message}; it was not used", remote_name) from None
        if remote_size is None:
            raise RemoteCorrupt(f"{where} is missing", remote_name, hint=_REBUILD_HINT)
        if remote_size > size:  # reading more than the manifest promises is not done to find out who is wrong
            raise RemoteCorrupt(f"{lie} has {size} bytes; it has {remote_size}: {kept}", remote_name,
                                hint="the node is built here; its next push replaces the manifest")
        shard = target[:-1]
        # a new file (O_EXCL) in the object's real shard folder; the backend writes it by name, then it is read back
        # through the confined tree, verified, and renamed to its digest
        with store.tree.staged(shard, f"{digest}.pull") as (tmp, _fd):  # staged closes the descriptor (never here:
            staged = (*shard, tmp)                                        # a second close hits a reused number)
            try:
                self._backend.download(path, store.shown(staged), size)
            except FileNotFoundError:
                raise RemoteCorrupt(f"{where} is missing (removed while downloading)", remote_name) from None
            except (Unreadable, TooLarge) as exc:
                raise RemoteCorrupt(f"{where} {exc.message} (it changed while downloading?); it was not used",
                                    remote_name) from None
            got = store.tree.stat(staged)
            got_size = got.st_size if got is not None else -1
            signed = out.get("sha256")  # a signed result's: checked in the same read (signing.py)
            fast, strong = file_digests(store.tree, staged, self.sha256 or bool(signed))
            own = strong if self.sha256 else fast
            if own != remote_name:
                if got_size != remote_size:
                    raise RemoteCorrupt(f"{where}: {got_size} of its {remote_size} bytes arrived (it changed while "
                                        "downloading?); it was not used", remote_name)
                # the whole object, read: its own bytes contradict its name, whatever any manifest says
                self._discard(path)
                raise RemoteCorrupt(f"{where} is corrupt: downloaded {got_size} bytes with digest {own}; it was not "
                                    "used and was removed from the remote", remote_name, hint=_REBUILD_HINT)
            if got_size != size:
                raise RemoteCorrupt(f"{lie} has {size} bytes; it has {got_size}: {kept}", remote_name,
                                    hint="the node is built here; its next push replaces the manifest")
            if fast != digest:
                raise RemoteCorrupt(f"{lie} has xxh3 digest {digest}; its content has {fast}: {kept}", remote_name,
                                    hint="the node is built here; its next push replaces the manifest")
            if signed and strong != signed:
                raise RemoteCorrupt(f"{lie} has sha256 {signed}; its content has {strong}: {kept}", remote_name,
                                    hint="the node is built here; its next push replaces the manifest")
            store.tree.seal(staged, READ_ONLY)
            store.tree.rename(staged, target, durable=True)

    def _discard(self, path: str) -> None:
        """Remove a remote object whose content contradicts its name; best effort (the remote may be read-only)."""
        try:
            self._backend.delete(path)
        except RemoteError as exc:
            log.warning("could not remove the corrupt object %s from %s: %s", path, self.url, exc)

    def clear(self) -> None:
        """Remove everything under the remote's root: only for a run's own transfer area, never a cache."""
        self._backend.clear()

    # ----- push
    def push(self, key: str, store: Store, stat_cache: StatCache | None = None,
             replace_if: Callable[[dict[str, Any]], bool] | None = None) -> Transfer:
        """Upload a committed node: its objects (put-if-absent), then its manifest (put-if-absent).

        The local objects are checked first (``stat_cache`` as for ``pull``): a damaged store never spreads.
        A remote object of the wrong size is replaced (the local object, verified, proves the size of its
        content). A remote manifest already there is kept if it is usable and its objects are all present, or if a
        newer trtflow wrote it; otherwise ours replaces it, as it does one that ``replace_if`` (the caller's trust
        policy) says must be (a result of a key the project does not trust must not shadow ours).
        """
        check_key(key)
        try:
            raw = store.tree.read_bytes(store.manifest_rel(key), kinds.MANIFEST)
            manifest = records.parse(records.MANIFEST, raw, str(store.shown(store.manifest_rel(key))))
        except (OSError, ValueError):
            raise TrtflowError(f"cannot push node {key}: the local store {store.root} has no readable manifest "
                               "for it", hint="push only committed nodes; `trtflow verify` checks the store") from None
        problem = manifest_problem(key, manifest)
        damaged = [] if problem else store.damaged_outputs(manifest, stat_cache)
        if problem or damaged:
            raise TrtflowError(f"cannot push node {key}: " + (f"its local manifest is unusable: {problem}" if problem
                               else f"its outputs {damaged} are missing or damaged in {store.root}"),
                               hint="`trtflow verify --fix` repairs the store; the next run rebuilds the node")
        self._ensure_format_written()
        if self.sha256 and any(not out.get("sha256") for out in manifest["outputs"].values()):
            manifest = self._add_sha256(store, key, manifest)
            raw = json.dumps(manifest, indent=1, sort_keys=True).encode()
        uploaded = nbytes = present = 0
        for _, out in _unique_outputs(manifest["outputs"]):
            if self._upload_object(self._name(out), out["size"], store.object_path(out["digest"])):  # checked above
                uploaded += 1
                nbytes += out["size"]
            else:
                present += 1
        written = self._backend.create(manifest_path(key), raw)
        if not written:
            there, there_problem = self._read_manifest(key)
            if there_problem is not None and there_problem.newer:
                log.warning("kept the remote manifest of node %s at %s (%s): %s; this trtflow does not replace it",
                            key, self.url, manifest_path(key), there_problem)
            elif there is None or not self._objects_present(there) or (replace_if is not None and replace_if(there)):
                log.warning("replacing the unusable remote manifest of node %s at %s (%s)%s", key, self.url,
                            manifest_path(key), f": {there_problem}" if there_problem else "")
                self._backend.replace(manifest_path(key), raw)
                written = True
        log.info("pushed node %s to %s: %d objects (%d bytes), %d already there", key, self.url, uploaded, nbytes,
                 present)
        return Transfer(objects=uploaded, bytes=nbytes, present=present, manifest_written=written)

    def _add_sha256(self, store: Store, key: str, manifest: dict[str, Any]) -> dict[str, Any]:
        """The manifest with each output's sha256 (hashed from the verified local objects), recorded in the store
        too, so that later readers of the local manifest (remote inputs of workers) name the remote objects."""
        outputs = {}
        for name, out in manifest["outputs"].items():
            if not out.get("sha256"):
                fast, strong = store.hash_object(out["digest"], sha256=True)
                if fast != out["digest"]:
                    raise TrtflowError(f"cannot push node {key}: its output {name!r} changed in {store.root}",
                                       hint="`trtflow verify --fix` repairs the store")
                out = dict(out, sha256=strong)
            outputs[name] = out
        manifest = dict(manifest, outputs=outputs)
        store.write_manifest(key, manifest)
        return manifest

    def upload_outputs(self, out_dir: Tree | Path, outputs: Mapping[str, tuple[str, str]]
                       ) -> dict[str, dict[str, Any]]:
        """Upload the files a node wrote (``outputs``: name -> (filename, kind), as for ``Store.commit``) as objects,
        put-if-absent; return their manifest entries (name -> {digest, size, filename, kind[, sha256]}). Outputs
        whose file is absent (optional ones) are left out. For an executor whose workers keep no store: the driver
        then pulls the objects (``pull_objects``) and commits the manifest."""
        self._ensure_format_written()
        out_dir = as_tree(out_dir)
        stored: dict[str, dict[str, Any]] = {}
        for name, (filename, kind) in outputs.items():
            rel = check_relative(filename, "output file name")
            st = out_dir.stat(rel)
            if st is None:
                continue
            fast, strong = file_digests(out_dir, rel, self.sha256)
            entry: dict[str, Any] = {"digest": fast, "size": st.st_size, "filename": filename, "kind": kind}
            if strong is not None:
                entry["sha256"] = strong
            self._upload_object(self._name(entry), entry["size"], out_dir.shown(rel))  # read just above
            stored[name] = entry
        return stored

    def _upload_object(self, name: str, size: int, local: Path) -> bool:
        """Put one object if the remote lacks it (or has it with another size); True if this call uploaded it."""
        path = object_path(name)
        try:
            remote_size = self._backend.size(path)
        except Unreadable as exc:
            raise RemoteError(f"cannot push object {name} to {self.url}: {path} {exc.message}",
                              hint="remove that entry from the remote") from None
        if remote_size == size:
            return False
        if remote_size is None:
            return self._backend.create(path, local)  # False: pushed by someone else meanwhile, same content
        log.warning("replacing remote object %s at %s: %d bytes instead of %d", name, self.url, remote_size, size)
        self._backend.replace(path, local)
        return True

    def _objects_present(self, manifest: Mapping[str, Any]) -> bool:
        try:
            return all(self._backend.size(object_path(self._name(out))) == out["size"]
                       for _, out in _unique_outputs(manifest["outputs"]))
        except Unreadable:
            return False


def _reopen(url: str, part_size: int, digest: str | None = None) -> RemoteCache:
    return RemoteCache(url, part_size=part_size, digest=digest)


def _unique_outputs(outputs: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(name, output) per distinct digest: two outputs with one content are one object."""
    seen: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for name, out in outputs.items():
        seen.setdefault(out["digest"], (name, out))
    return list(seen.values())

