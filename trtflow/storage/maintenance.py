"""Store maintenance: garbage collection and integrity verification."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

from trtflow.fingerprint import hash_file_content
from trtflow.storage.store import Store


@dataclass
class GcResult:
    manifests: int = 0
    objects: int = 0
    bytes: int = 0
    tmp_dirs: int = 0
    kept_manifests: int = 0


def collect_garbage(store: Store, dry_run: bool = False) -> GcResult:
    """Keep the manifests that refs point to (each recipe node's latest build) and their objects."""
    result = GcResult()
    if not store.root.exists():
        return result
    live_keys = {key for _, _, key in store.iter_refs()}
    live_digests: set[str] = set()
    for path, manifest in store.iter_manifests():
        key = path.stem
        if key in live_keys and manifest is not None:
            result.kept_manifests += 1
            live_digests.update(o["digest"] for o in manifest.get("outputs", {}).values())
            continue
        result.manifests += 1
        if not dry_run:
            path.unlink(missing_ok=True)
    for obj in store.iter_objects():
        if obj.name not in live_digests:
            result.objects += 1
            result.bytes += obj.stat().st_size
            if not dry_run:
                obj.unlink(missing_ok=True)
    running = _running_run_ids(store)
    if store.tmp_dir.exists():
        for run_dir in store.tmp_dir.iterdir():
            if run_dir.name not in running:
                result.tmp_dirs += 1
                if not dry_run:
                    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def _running_run_ids(store: Store) -> set[str]:
    if not store.db_path.exists():
        return set()
    from trtflow.storage.journal import Journal

    journal = Journal(store.db_path)
    try:
        return {r[0] for r in journal.conn.execute("SELECT id FROM runs WHERE status = 'running'").fetchall()}
    finally:
        journal.close()


@dataclass
class VerifyReport:
    objects: int = 0
    manifests: int = 0
    problems: list[str] = field(default_factory=list)


def verify_store(store: Store, fix: bool = False) -> VerifyReport:
    """Re-hash every object; check every manifest is readable and its outputs exist intact."""
    report = VerifyReport()
    damaged: set[str] = set()
    for obj in store.iter_objects():
        report.objects += 1
        if obj.is_symlink():  # objects are regular files; a link may point anywhere, outside the store too
            damaged.add(obj.name)
            report.problems.append(f"object {obj.relative_to(store.root)} is a symbolic link to {os.readlink(obj)}")
            if fix:
                obj.unlink()
            continue
        try:
            actual = hash_file_content(obj)
        except OSError as exc:
            actual = f"unreadable ({exc})"
        if actual != obj.name:
            damaged.add(obj.name)
            report.problems.append(f"object {obj.relative_to(store.root)} has content digest {actual}")
            if fix:
                obj.chmod(0o644)
                obj.unlink()
    for path, manifest in store.iter_manifests():
        report.manifests += 1
        if manifest is None:
            report.problems.append(f"manifest {path.relative_to(store.root)} is unreadable")
            if fix:
                path.unlink(missing_ok=True)
            continue
        bad = [name for name, out in manifest.get("outputs", {}).items()
               if out.get("digest") in damaged or not store.object_path(out.get("digest", "x")).exists()]
        if bad:
            report.problems.append(f"node {manifest.get('node')} ({path.stem[:12]}): outputs {bad} missing or damaged")
            if fix:
                path.unlink(missing_ok=True)
    return report
