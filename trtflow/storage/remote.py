"""Remote cache: node results shared between stores through a directory or S3-compatible object storage.

A remote has the layout of a store's shareable part, so a directory remote is just another store's objects and
manifests:
  format.json              {"format": 1, "hash": "xxh3-128"}: refused when newer than this code
  objects/ab/<digest>      artifact files, named by the xxh3-128 digest of their content
  nodes/ab/<key>.json      node manifests, uploaded after their objects (a manifest means the node is complete)

Every write is put-if-absent (S3 ``If-None-Match: *``; a directory: a temporary file hard-linked to its name,
which fails if the name exists), so concurrent pushes of one key are safe: an object's name fixes its content,
and the first complete manifest of a key wins. Reads trust nothing: a manifest that is not valid JSON or does
not describe its outputs is ignored, and every pulled object is checked for size and digest before it enters
the local store. An object found corrupt is removed from the remote (its name proves it wrong), so the next
push of a node that produces it uploads it again.

Directory remotes (a path or file://, e.g. NFS or a CI cache folder) use the standard library only; s3://
remotes use s3fs, which takes the endpoint, region and credentials from the standard AWS variables and files
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws/config and credentials,
instance roles).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

from trtflow.errors import EXIT_ENVIRONMENT, TrtflowError, UsageError
from trtflow.fingerprint import StatCache, hash_file_content
from trtflow.fsutil import fsync_dir
from trtflow.storage.store import FORMAT as STORE_FORMAT
from trtflow.storage.store import READ_ONLY, Store

log = logging.getLogger("trtflow.remote")

REMOTE_FORMAT = 1
HASH_NAME = "xxh3-128"
FORMAT_FILE = "format.json"
DEFAULT_PART_SIZE = 32 * 2**20
UPLOAD_CONCURRENCY = 4  # parts in flight: bounds an upload's buffers to about 4 x part size
_DIGEST = re.compile(r"[0-9a-f]{32}")
_KEY = re.compile(r"[0-9a-f]{16,128}")

_CREDENTIALS_HINT = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE with ~/.aws/credentials), "
                     "and check that they may read and write this bucket")
_ENDPOINT_HINT = ("check AWS_ENDPOINT_URL (for MinIO or another S3-compatible server) and the network, "
                  "or run without --remote / TRTFLOW_REMOTE")


class RemoteError(TrtflowError):
    """The remote cache cannot be used as configured (unreachable, no access, no bucket, newer format)."""

    exit_code = EXIT_ENVIRONMENT


class RemoteCorrupt(RemoteError):
    """A remote object or manifest does not match what its name promises; it was not used."""

    def __init__(self, message: str, digest: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.digest = digest


@dataclass(frozen=True)
class Transfer:
    """What one pull or push moved: objects copied, their bytes, objects already there."""

    objects: int = 0
    bytes: int = 0
    present: int = 0
    manifest_written: bool = False


# ---------------------------------------------------------------------------------------------- backends
class _Backend(Protocol):
    """Blob storage under one root; paths are relative, '/'-separated."""

    url: str

    def check(self) -> None: ...

    def read(self, path: str) -> bytes | None: ...

    def size(self, path: str) -> int | None: ...

    def download(self, path: str, dest: Path) -> None: ...

    def create(self, path: str, source: Path | bytes) -> bool: ...

    def replace(self, path: str, source: Path | bytes) -> None: ...

    def delete(self, path: str) -> None: ...


class _DirectoryBackend:
    """A folder on a local or network filesystem (NFS, a CI cache folder)."""

    def __init__(self, root: Path, url: str) -> None:
        self.root = root
        self.url = url

    def check(self) -> None:
        if not self.root.is_dir():
            what = "is not a directory" if self.root.exists() else "does not exist"
            raise RemoteError(f"the remote cache directory {self.root} {what}",
                              hint=f"create it (mkdir -p {self.root}), or fix --remote / TRTFLOW_REMOTE")

    @contextlib.contextmanager
    def _errors(self, what: str, path: str) -> Iterator[None]:
        try:
            yield
        except (FileNotFoundError, FileExistsError):
            raise
        except OSError as exc:
            hint = ("make the remote directory writable for this user, or use it read-only by not pushing"
                    if isinstance(exc, PermissionError) else None)
            raise RemoteError(f"cannot {what} {self.root / path}: {exc.strerror or exc}", hint=hint) from None

    def read(self, path: str) -> bytes | None:
        with self._errors("read", path):
            try:
                return (self.root / path).read_bytes()
            except (FileNotFoundError, NotADirectoryError):
                return None

    def size(self, path: str) -> int | None:
        with self._errors("read", path):
            try:
                return (self.root / path).stat().st_size
            except (FileNotFoundError, NotADirectoryError):
                return None

    def download(self, path: str, dest: Path) -> None:
        with self._errors("read", path):
            shutil.copyfile(self.root / path, dest)

    def _stage(self, target: Path, source: Path | bytes) -> Path:
        """A complete, synced, read-only copy of ``source`` beside ``target`` under a temporary name."""
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{target.name}.{uuid.uuid4().hex}.part"
        if isinstance(source, bytes):
            tmp.write_bytes(source)
        else:
            shutil.copyfile(source, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, READ_ONLY)
        return tmp

    def create(self, path: str, source: Path | bytes) -> bool:
        target = self.root / path
        with self._errors("write", path):
            tmp = self._stage(target, source)
            try:
                try:
                    os.link(tmp, target)  # fails if the name exists: no reader ever sees a partial file
                except FileExistsError:
                    return False
                except OSError:
                    # A filesystem without hard links: check, then rename. Losing that race overwrites the
                    # name with content of the same digest (objects) or an equally valid manifest of the key.
                    if target.exists():
                        return False
                    os.replace(tmp, target)
                fsync_dir(target.parent)
                return True
            finally:
                tmp.unlink(missing_ok=True)

    def replace(self, path: str, source: Path | bytes) -> None:
        target = self.root / path
        with self._errors("write", path):
            tmp = self._stage(target, source)
            try:
                os.replace(tmp, target)
                fsync_dir(target.parent)
            finally:
                tmp.unlink(missing_ok=True)

    def delete(self, path: str) -> None:
        with self._errors("remove", path):
            (self.root / path).unlink(missing_ok=True)


class _S3Backend:
    """A prefix in an S3 bucket, through s3fs (botocore's credential chain and endpoint configuration)."""

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

    def read(self, path: str) -> bytes | None:
        with self._errors(f"reading {path}"):
            try:
                return self.fs.cat_file(self._path(path), max_concurrency=1)  # one GET, no HEAD first
            except FileNotFoundError:
                return None

    def size(self, path: str) -> int | None:
        with self._errors(f"looking up {path}"):
            try:
                head = self.fs.call_s3("head_object", Bucket=self.bucket, Key=self._key(path))
            except FileNotFoundError:
                return None
            return int(head["ContentLength"])

    def download(self, path: str, dest: Path) -> None:
        with self._errors(f"downloading {path}"):
            # One streamed GET: ranged parallel reads cost S3-compatible servers more than they gain here
            # (bench/remote_cache.py: 5x slower against moto).
            self.fs.get_file(self._path(path), str(dest), max_concurrency=1)

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

    def delete(self, path: str) -> None:
        with self._errors(f"removing {path}"):
            try:
                self.fs.rm_file(self._path(path))
            except FileNotFoundError:
                pass


def _open_backend(url: str, part_size: int) -> _Backend:
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise UsageError(f"remote {url!r} names no bucket", hint="write s3://BUCKET/PREFIX")
        return _S3Backend(parsed.netloc, parsed.path.strip("/"), url, part_size)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise UsageError(f"remote {url!r}: file:// URLs name a local path (file:///path)",
                             hint="mount the share and give its local path")
        return _DirectoryBackend(Path(unquote(parsed.path)), url)
    if len(parsed.scheme) > 1:  # one letter: a Windows drive
        raise UsageError(f"remote {url!r}: unsupported scheme {parsed.scheme!r}",
                         hint="use a directory path, file:///path or s3://bucket/prefix")
    return _DirectoryBackend(Path(url).expanduser().absolute(), url)


def _reopen(url: str, part_size: int) -> RemoteCache:
    return RemoteCache(url, part_size=part_size)


# ---------------------------------------------------------------------------------------------- manifests
def _object_path(digest: str) -> str:
    return f"objects/{digest[:2]}/{digest}"


def _manifest_path(key: str) -> str:
    return f"nodes/{key[:2]}/{key}.json"


def _manifest_problem(key: str | None, manifest: Any) -> str | None:
    """Why a manifest cannot be used for ``key`` (None: it can; key None: only its outputs are checked)."""
    if not isinstance(manifest, dict):
        return "not a JSON object"
    if key is not None and manifest.get("key", key) != key:
        return f"it belongs to key {manifest.get('key')!r}"
    written_as = manifest.get("format", 1)
    if not isinstance(written_as, int) or isinstance(written_as, bool) or written_as > STORE_FORMAT:
        return f"it has manifest format {written_as!r}, newer than this trtflow's stores ({STORE_FORMAT})"
    outputs = manifest.get("outputs")
    if not isinstance(outputs, dict):
        return "it has no outputs"
    for name, out in outputs.items():
        if not isinstance(out, dict):
            return f"output {name!r} is not an object"
        digest, size, filename = out.get("digest"), out.get("size"), out.get("filename")
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            return f"output {name!r} has no valid digest"
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return f"output {name!r} has no valid size"
        if not _safe_relative_name(filename):
            return f"output {name!r} has an unsafe file name {filename!r}"
        if not isinstance(out.get("kind"), str):
            return f"output {name!r} has no kind"
    return None


def _safe_relative_name(filename: object) -> bool:
    """A file name that stays inside its folder: relative, POSIX, no '..', '.', empty parts, backslash or NUL."""
    if not isinstance(filename, str) or not filename or filename.startswith("/") or "\\" in filename \
            or "\0" in filename:
        return False
    return all(part not in ("", ".", "..") for part in filename.split("/"))


def _check_key(key: str) -> None:
    if not _KEY.fullmatch(key):
        raise ValueError(f"not a node key: {key!r}")


# ---------------------------------------------------------------------------------------------- the cache
class RemoteCache:
    """A remote content-addressed cache shared by many stores.

    ``url``: a directory path, ``file:///path``, or ``s3://bucket/prefix``. Opening one contacts nothing;
    the first operation (or ``check()``) verifies that the remote is reachable and of a known format.
    """

    def __init__(self, url: str, *, part_size: int = DEFAULT_PART_SIZE) -> None:
        self.url = url
        self.part_size = part_size
        self._backend = _open_backend(url, part_size)
        self._lock = threading.Lock()
        self._checked = False
        self._format_written = False

    def __repr__(self) -> str:
        return f"RemoteCache({self.url!r})"

    def __reduce__(self) -> tuple[Any, ...]:  # e.g. sent to Ray workers: reopened there from the URL
        return _reopen, (self.url, self.part_size)

    # ----- format
    def check(self) -> None:
        """Verify the remote is reachable, accessible and in a format this code reads; raise RemoteError if not."""
        with self._lock:
            if self._checked:
                return
            self._backend.check()
            raw = self._backend.read(FORMAT_FILE)
            if raw is not None:
                self._check_format(raw)
                self._format_written = True
            self._checked = True

    def _check_format(self, raw: bytes) -> None:
        try:
            info = json.loads(raw)
            version, hash_name = info["format"], info["hash"]
            if not isinstance(version, int) or isinstance(version, bool):
                raise TypeError(version)
        except (ValueError, TypeError, KeyError):
            raise RemoteError(f"{self.url} has an unreadable {FORMAT_FILE}: not a trtflow remote cache",
                              hint="point --remote / TRTFLOW_REMOTE at a trtflow cache or at an empty "
                                   "location") from None
        if version > REMOTE_FORMAT:
            raise RemoteError(f"{self.url} is a trtflow remote cache of format {version}, newer than this "
                              f"trtflow reads (up to {REMOTE_FORMAT})",
                              hint="upgrade trtflow on this machine, or use another remote")
        if hash_name != HASH_NAME:
            raise RemoteError(f"{self.url} names its objects by {hash_name!r}; this trtflow uses {HASH_NAME}",
                              hint="use another remote for this trtflow version")

    def _ensure_format_written(self) -> None:
        self.check()
        with self._lock:
            if self._format_written:
                return
            data = json.dumps({"format": REMOTE_FORMAT, "hash": HASH_NAME}, indent=1).encode() + b"\n"
            if not self._backend.create(FORMAT_FILE, data):
                # Another writer created it meanwhile: read theirs, it may be newer.
                raw = self._backend.read(FORMAT_FILE)
                if raw is not None:
                    self._check_format(raw)
            self._format_written = True

    # ----- lookup
    def get_manifest(self, key: str) -> dict[str, Any] | None:
        """The remote manifest of ``key``; None if absent, or unusable (logged as a warning)."""
        _check_key(key)
        self.check()
        raw = self._backend.read(_manifest_path(key))
        if raw is None:
            return None
        try:
            manifest = json.loads(raw)
        except ValueError:
            manifest = None
            problem = "it is not valid JSON (truncated?)"
        else:
            problem = _manifest_problem(key, manifest)
        if problem:
            log.warning("ignoring the remote manifest of %s at %s: %s", key, self.url, problem)
            return None
        return manifest

    # ----- pull
    def pull(self, manifest: Mapping[str, Any], store: Store, stat_cache: StatCache | None = None) -> dict[str, Any]:
        """Copy a node's outputs into ``store``, each verified by size and digest, then its manifest; return the
        manifest now in the store.

        A node the store already has intact is left as it is (its manifest is returned); objects the store already
        has intact are not copied (``stat_cache``: the store's, to skip re-hashing unchanged objects; pulled objects
        are recorded in it). Call it while holding the store lock shared, as a run does, so gc cannot collect the
        objects before the manifest names them. Raises
        RemoteCorrupt, naming the object, if one is missing or does not match; the store is left without
        the node's manifest then, and a corrupt object is removed from the remote.
        """
        key = manifest.get("key")
        if not isinstance(key, str):
            raise ValueError("pull needs a manifest read by get_manifest (it has no key)")
        _check_key(key)
        problem = _manifest_problem(key, manifest)
        if problem:
            raise RemoteCorrupt(f"the remote manifest of node {key} at {self.url} is unusable: {problem}")
        local = store.read_manifest(key)
        if local is not None and not _manifest_problem(key, local) and store.intact(local, stat_cache):
            return local  # built or pulled here meanwhile: keep what the store's refs may already point at
        transfer = self.pull_objects(manifest["outputs"], store, stat_cache, node=key)
        store.write_manifest(key, manifest)
        log.info("pulled node %s from %s: %d objects (%d bytes), %d already here", key, self.url, transfer.objects,
                 transfer.bytes, transfer.present)
        return dict(manifest)

    def pull_objects(self, outputs: Mapping[str, Any], store: Store, stat_cache: StatCache | None = None, *,
                     node: str = "?") -> Transfer:
        """Copy the objects of ``outputs`` (name -> {digest, size, filename, kind}) into ``store``, verified; no
        manifest. For an executor whose workers fetch their inputs, or whose driver collects outputs that a worker
        uploaded with ``upload_outputs``. ``node`` names the node in errors. Raises RemoteCorrupt as ``pull``."""
        problem = _manifest_problem(None, {"outputs": outputs})
        if problem:
            raise RemoteCorrupt(f"the outputs of node {node} are unusable: {problem}")
        self.check()
        copied = nbytes = present = 0
        for name, out in _unique_outputs(outputs):
            if store.object_intact(out["digest"], out["size"], stat_cache):
                present += 1
                continue
            target = store.object_path(out["digest"])
            self._pull_object(node, name, out, target)
            if stat_cache is not None:
                st = target.stat()
                stat_cache.put(str(target), st.st_size, st.st_mtime_ns, st.st_ino, out["digest"])
            copied += 1
            nbytes += out["size"]
        return Transfer(objects=copied, bytes=nbytes, present=present)

    def _pull_object(self, key: str, name: str, out: Mapping[str, Any], target: Path) -> None:
        digest, size = out["digest"], out["size"]
        path = _object_path(digest)
        where = f"remote object {digest} (output {name!r} of node {key}) at {self.url}"
        remote_size = self._backend.size(path)
        if remote_size is None:
            raise RemoteCorrupt(f"{where} is missing", digest,
                                hint="the node will be rebuilt; its next push uploads the object again")
        if remote_size != size:
            self._discard(path)
            raise RemoteCorrupt(f"{where} has {remote_size} bytes instead of {size} (partial upload?); "
                                "it was not used and was removed from the remote", digest,
                                hint="the node will be rebuilt; its next push uploads the object again")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{digest}.{uuid.uuid4().hex}.pull"
        try:
            try:
                self._backend.download(path, tmp)
            except FileNotFoundError:
                raise RemoteCorrupt(f"{where} is missing (removed while downloading)", digest) from None
            got_size = tmp.stat().st_size
            got_digest = hash_file_content(tmp) if got_size == size else None
            if got_digest != digest:
                self._discard(path)
                found = f"{got_size} bytes" if got_digest is None else f"content with digest {got_digest}"
                raise RemoteCorrupt(f"{where} is corrupt: downloaded {found}; it was not used and was removed "
                                    "from the remote", digest,
                                    hint="the node will be rebuilt; its next push uploads the object again")
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.chmod(tmp, READ_ONLY)
            os.replace(tmp, target)
            fsync_dir(target.parent)
        finally:
            tmp.unlink(missing_ok=True)

    def _discard(self, path: str) -> None:
        """Remove a remote object whose content contradicts its name; best effort (the remote may be read-only)."""
        try:
            self._backend.delete(path)
        except RemoteError as exc:
            log.warning("could not remove the corrupt object %s from %s: %s", path, self.url, exc)

    # ----- push
    def push(self, key: str, store: Store, stat_cache: StatCache | None = None) -> Transfer:
        """Upload a committed node: its objects (put-if-absent), then its manifest (put-if-absent).

        The local objects are checked first (``stat_cache`` as for ``pull``): a damaged store never spreads.

        A remote object of the wrong size is replaced. A remote manifest already there is kept if it is usable
        and its objects are all present; otherwise ours replaces it.
        """
        _check_key(key)
        manifest_file = store.manifest_path(key)
        try:
            raw = manifest_file.read_bytes()
            manifest = json.loads(raw)
        except (OSError, ValueError):
            raise TrtflowError(f"cannot push node {key}: the local store {store.root} has no readable manifest "
                               "for it", hint="push only committed nodes; `trtflow verify` checks the store") from None
        problem = _manifest_problem(key, manifest)
        damaged = [] if problem else store.damaged_outputs(manifest, stat_cache)
        if problem or damaged:
            raise TrtflowError(f"cannot push node {key}: " + (f"its local manifest is unusable: {problem}" if problem
                               else f"its outputs {damaged} are missing or damaged in {store.root}"),
                               hint="`trtflow verify --fix` repairs the store; the next run rebuilds the node")
        self._ensure_format_written()
        uploaded = nbytes = present = 0
        for _, out in _unique_outputs(manifest["outputs"]):
            if self._upload_object(out["digest"], out["size"], store.object_path(out["digest"])):
                uploaded += 1
                nbytes += out["size"]
            else:
                present += 1
        written = self._backend.create(_manifest_path(key), raw)
        if not written and not self._remote_node_usable(key):
            log.warning("replacing the unusable remote manifest of %s at %s", key, self.url)
            self._backend.replace(_manifest_path(key), raw)
            written = True
        log.info("pushed node %s to %s: %d objects (%d bytes), %d already there", key, self.url, uploaded, nbytes,
                 present)
        return Transfer(objects=uploaded, bytes=nbytes, present=present, manifest_written=written)

    def upload_outputs(self, out_dir: Path, outputs: Mapping[str, tuple[str, str]]) -> dict[str, dict[str, Any]]:
        """Upload the files a node wrote (``outputs``: name -> (filename, kind), as for ``Store.commit``) as objects,
        put-if-absent; return their manifest entries (name -> {digest, size, filename, kind}). Outputs whose file
        is absent (optional ones) are left out. For an executor whose workers keep no store: the driver then pulls
        the objects (``pull_objects``) and commits the manifest."""
        self._ensure_format_written()
        stored: dict[str, dict[str, Any]] = {}
        for name, (filename, kind) in outputs.items():
            path = out_dir / filename
            if not path.exists():
                continue
            digest, size = hash_file_content(path), path.stat().st_size
            self._upload_object(digest, size, path)
            stored[name] = {"digest": digest, "size": size, "filename": filename, "kind": kind}
        return stored

    def _upload_object(self, digest: str, size: int, local: Path) -> bool:
        """Put one object if the remote lacks it (or has it with another size); True if this call uploaded it."""
        path = _object_path(digest)
        remote_size = self._backend.size(path)
        if remote_size == size:
            return False
        if remote_size is None:
            return self._backend.create(path, local)  # False: pushed by someone else meanwhile, same content
        log.warning("replacing remote object %s at %s: %d bytes instead of %d", digest, self.url, remote_size, size)
        self._backend.replace(path, local)
        return True

    def _remote_node_usable(self, key: str) -> bool:
        manifest = self.get_manifest(key)
        if manifest is None:
            return False
        return all(self._backend.size(_object_path(out["digest"])) == out["size"]
                   for _, out in _unique_outputs(manifest["outputs"]))


def _unique_outputs(outputs: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(name, output) per distinct digest: two outputs with one content are one object."""
    seen: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for name, out in outputs.items():
        seen.setdefault(out["digest"], (name, out))
    return list(seen.values())
