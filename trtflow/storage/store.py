"""Content-addressed artifact store with node manifests, atomic commits and shared caches.

Layout under the store root (``.trtflow`` by default):
  objects/ab/<digest>      artifact files, read-only once committed
  nodes/ab/<key>.json      node manifests (written last: a manifest means the node is complete)
  refs/<recipe>/<node>     the key a node name had when it last ran (to explain what changed)
  caches/                  shared mutable caches (TensorRT timing caches) under file locks
  locks/                   per-node-key build locks (one process builds, others wait and reuse)
  logs/<run>/<node>.log    per-node logs
  tmp/<run>/               scratch space of running nodes; removed after each node
  trtflow.db               SQLite journal of runs and the file-hash stat cache
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.errors import TrtflowError
from trtflow.fingerprint import hash_file_content
from trtflow.fsutil import atomic_write_text, fsync_dir

READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH


@dataclass(frozen=True)
class StoredOutput:
    digest: str
    size: int
    filename: str
    kind: str


class Store:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()

    # ----- paths
    @property
    def objects(self) -> Path:
        return self.root / "objects"

    def object_path(self, digest: str) -> Path:
        return self.objects / digest[:2] / digest

    def manifest_path(self, key: str) -> Path:
        return self.root / "nodes" / key[:2] / f"{key}.json"

    def ref_path(self, recipe: str, node: str) -> Path:
        return self.root / "refs" / recipe / node

    @property
    def cache_dir(self) -> Path:
        return self.root / "caches"

    @property
    def tmp_dir(self) -> Path:
        return self.root / "tmp"

    @property
    def db_path(self) -> Path:
        return self.root / "trtflow.db"

    def log_path(self, run_id: str, node: str) -> Path:
        return self.root / "logs" / run_id / f"{node}.log"

    def lock_path(self, key: str) -> Path:
        return self.root / "locks" / f"{key}.lock"

    def ensure(self) -> None:
        try:
            for sub in ("objects", "nodes", "refs", "caches", "locks", "logs", "tmp"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrtflowError(f"cannot create the store at {self.root}: {exc.strerror or exc}",
                               hint="choose a writable directory with --store or TRTFLOW_STORE") from None
        if not os.access(self.root, os.W_OK):
            raise TrtflowError(f"the store {self.root} is not writable",
                               hint="fix its permissions, or choose another with --store / TRTFLOW_STORE")

    # ----- manifests
    def read_manifest(self, key: str) -> dict[str, Any] | None:
        try:
            with open(self.manifest_path(key), encoding="utf-8") as f:
                return json.load(f)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, ValueError):
            return None  # unreadable manifest: treated as absent, `verify` reports it

    def complete(self, manifest: Mapping[str, Any]) -> bool:
        """True if every output object of the manifest is present with its recorded size."""
        for out in manifest.get("outputs", {}).values():
            try:
                if self.object_path(out["digest"]).stat().st_size != out["size"]:
                    return False
            except (OSError, KeyError, TypeError):
                return False
        return True

    def read_ref(self, recipe: str, node: str) -> str | None:
        try:
            return self.ref_path(recipe, node).read_text(encoding="utf-8").strip() or None
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write_ref(self, recipe: str, node: str, key: str) -> None:
        atomic_write_text(self.ref_path(recipe, node), key + "\n")

    # ----- commit
    def put_file(self, source: Path) -> tuple[str, int]:
        """Move ``source`` into the object store (same filesystem rename); return (digest, size)."""
        digest = hash_file_content(source)
        size = source.stat().st_size
        target = self.object_path(digest)
        if target.exists() and target.stat().st_size == size:
            source.unlink()
            return digest, size
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(source, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(source, READ_ONLY)
        os.replace(source, target)
        fsync_dir(target.parent)
        return digest, size

    def commit(self, key: str, manifest: dict[str, Any], out_dir: Path,
               outputs: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
        """Store each produced output and then the manifest. ``outputs``: name -> (filename, kind)."""
        stored: dict[str, Any] = {}
        for name, (filename, kind) in outputs.items():
            path = out_dir / filename
            if not path.exists():
                continue
            digest, size = self.put_file(path)
            stored[name] = {"digest": digest, "size": size, "filename": filename, "kind": kind}
        manifest = dict(manifest, key=key, outputs=stored, committed=time.time())
        atomic_write_text(self.manifest_path(key), json.dumps(manifest, indent=1, sort_keys=True))
        return manifest

    # ----- user-facing copies
    def materialize(self, manifest: Mapping[str, Any], dest: Path) -> dict[str, Path]:
        """Expose a node's outputs at readable paths (hard links to the read-only objects)."""
        paths: dict[str, Path] = {}
        dest.mkdir(parents=True, exist_ok=True)
        for name, out in manifest.get("outputs", {}).items():
            src = self.object_path(out["digest"])
            target = dest / out["filename"]
            paths[name] = target
            try:
                if target.exists() and os.path.samefile(src, target):
                    continue
            except OSError:
                pass
            target.parent.mkdir(parents=True, exist_ok=True)  # a filename may hold sub-folders (1/model.onnx)
            tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
            try:
                os.link(src, tmp)
            except OSError:
                shutil.copyfile(src, tmp)
            os.replace(tmp, target)
        return paths

    # ----- maintenance
    def iter_manifests(self) -> Iterator[tuple[Path, dict[str, Any] | None]]:
        base = self.root / "nodes"
        if not base.exists():
            return
        for path in sorted(base.glob("*/*.json")):
            try:
                yield path, json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                yield path, None

    def iter_objects(self) -> Iterator[Path]:
        if not self.objects.exists():
            return
        yield from sorted(p for p in self.objects.glob("*/*") if p.is_file() and not p.name.startswith("."))

    def iter_refs(self) -> Iterator[tuple[str, str, str]]:
        base = self.root / "refs"
        if not base.exists():
            return
        for recipe_dir in sorted(p for p in base.iterdir() if p.is_dir()):
            for ref in sorted(p for p in recipe_dir.iterdir() if p.is_file() and not p.name.startswith(".")):
                yield recipe_dir.name, ref.name, ref.read_text(encoding="utf-8").strip()
