"""`trtflow verify`: re-hash every object, check every manifest, the refs and the journal.

Without ``fix`` it takes the store lock shared (a concurrent gc cannot make objects vanish mid-check and look
damaged); with ``fix`` exclusively. ``fix`` removes damaged objects and the manifests that use them (leaving a
note so `plan` says why the node is rebuilt), unreadable refs, and resets a damaged journal (moved aside: the
journal is history; objects, manifests and refs are the truth).
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass, field
from typing import Any

from trtflow.errors import StoreError
from trtflow.fingerprint import hash_file_content
from trtflow.fsutil import atomic_write_text
from trtflow.storage import journal as journal_module
from trtflow.storage.lock import EXCLUSIVE, SHARED, StoreLock
from trtflow.storage.store import Store


@dataclass
class VerifyReport:
    objects: int = 0
    manifests: int = 0
    problems: list[str] = field(default_factory=list)
    fixed: list[str] = field(default_factory=list)


def verify_store(store: Store, fix: bool = False, wait_s: float = 60.0, on_wait: Any = None) -> VerifyReport:
    report = VerifyReport()
    if not store.root.exists():
        return report
    store.check_format()
    store.check_folders()
    mode = EXCLUSIVE if fix else SHARED
    with StoreLock(store.root).held(mode, "trtflow verify" + (" --fix" if fix else ""), wait_s, on_wait):
        try:
            damaged = _check_objects(store, fix, report)
            _check_manifests(store, damaged, fix, report)
            _check_refs(store, fix, report)
            _check_journal(store, fix, report)
        except OSError as exc:
            raise StoreError(f"verify could not {'repair' if fix else 'read'} the store {store.root}: "
                             f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else ""),
                             hint="check the store's permissions and free space") from None
    return report


def _check_objects(store: Store, fix: bool, report: VerifyReport) -> set[str]:
    for shard in store.linked_shards():  # never entered: it may lead anywhere
        report.problems.append(f"folder {shard.relative_to(store.root)} is a symbolic link to {os.readlink(shard)}")
        if fix:
            shard.unlink()
            report.fixed.append(f"removed the link {shard.relative_to(store.root)}")
    damaged: set[str] = set()
    for obj in store.iter_objects():
        report.objects += 1
        where = obj.relative_to(store.root)
        try:
            st = obj.lstat()
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):  # objects are regular files; a link may point anywhere, outside the store too
            problem = f"object {where} is a symbolic link to {os.readlink(obj)}"
        elif not stat.S_ISREG(st.st_mode):
            problem = f"object {where} is not a regular file"
        else:
            try:
                actual = hash_file_content(obj)
            except OSError as exc:
                actual = f"unreadable ({exc.strerror or exc})"
            if actual == obj.name:
                continue
            problem = f"object {where} has content digest {actual}"
        damaged.add(obj.name)
        report.problems.append(problem)
        if fix:
            try:
                obj.unlink()
            except PermissionError:
                obj.chmod(0o644)
                obj.unlink()
            report.fixed.append(f"removed {where}")
    return damaged


def _check_manifests(store: Store, damaged: set[str], fix: bool, report: VerifyReport) -> None:
    for path, manifest in store.iter_manifests():
        report.manifests += 1
        where = path.relative_to(store.root)
        if manifest is None or not isinstance(manifest.get("outputs"), dict):
            report.problems.append(f"manifest {where} is unreadable")
            if fix:
                path.unlink(missing_ok=True)
                report.fixed.append(f"removed {where}")
            continue
        bad = [name for name, out in manifest["outputs"].items()
               if not isinstance(out, dict) or out.get("digest") in damaged
               or not store.object_path(str(out.get("digest", "x"))).exists()]
        if not bad:
            continue
        who = f"node {manifest.get('node')} of {manifest.get('recipe_id') or manifest.get('recipe')}"
        report.problems.append(f"{who} ({path.stem[:12]}): outputs {bad} missing or damaged")
        if fix:
            note = {"reason": f"outputs {bad} were missing or damaged", "removed_by": "trtflow verify --fix",
                    "time": time.time()}
            atomic_write_text(path.with_suffix(".damaged"), json.dumps(note))
            path.unlink(missing_ok=True)
            report.fixed.append(f"removed {where} (the next run rebuilds {manifest.get('node')})")


def _check_refs(store: Store, fix: bool, report: VerifyReport) -> None:
    base = store.root / "refs"
    if not base.exists():
        return
    for folder in sorted(p for p in base.iterdir() if p.is_dir()):
        current = folder / "current.json"
        try:
            data = json.loads(current.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or not isinstance(data.get("nodes"), dict):
                raise ValueError("not a refs record")
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            report.problems.append(f"refs {current.relative_to(store.root)} are unreadable ({exc})")
            if fix:
                current.unlink(missing_ok=True)
                report.fixed.append(f"removed {current.relative_to(store.root)}")


def _check_journal(store: Store, fix: bool, report: VerifyReport) -> None:
    if not store.db_path.exists():
        return
    journal = journal_module.Journal(store.db_path, readonly=True)
    try:
        problems = journal.check()
    except StoreError as exc:
        problems = [exc.message]
    finally:
        journal.close()
    if not problems:
        return
    report.problems.append(f"journal {store.db_path.name} is damaged: {'; '.join(problems[:3])}")
    if fix:
        aside = journal_module.reset(store.db_path)
        report.fixed.append(f"journal reset (the damaged one is kept as {aside.name if aside else '-'}; run "
                            "history before this point is gone, stored results are kept)")
