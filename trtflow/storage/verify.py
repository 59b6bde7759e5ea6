"""`trtflow verify`: re-hash every object (xxh3 and sha256), check every manifest (its signer against the trust
policy, its outputs' sha256), the refs and the journal.

Without ``fix`` it takes the store lock shared (a concurrent gc cannot make objects vanish mid-check and look
damaged); with ``fix`` exclusively. ``fix`` removes damaged objects and the manifests that use them (leaving a
note so `plan` says why the node is rebuilt), unreadable refs, and resets a damaged journal (moved aside: the
journal is history; objects, manifests and refs are the truth).
"""

from __future__ import annotations

import json
import stat
import time
from dataclasses import dataclass, field
from typing import Any

from trtflow.errors import StoreError
from trtflow.fingerprint import stream_digests
from trtflow.storage import journal as journal_module
from trtflow.storage import records
from trtflow.storage.confined import kinds
from trtflow.storage.confined.names import Refused
from trtflow.storage.lock import EXCLUSIVE, SHARED, StoreLock
from trtflow.storage.store import Store


@dataclass
class VerifyReport:
    objects: int = 0
    manifests: int = 0
    problems: list[str] = field(default_factory=list)
    fixed: list[str] = field(default_factory=list)
    # results by signer: "<id> (<name>): trusted" / "... revoked" / "unsigned"... -> how many (see signing.census)
    signers: dict[str, int] = field(default_factory=dict)


def verify_store(store: Store, fix: bool = False, wait_s: float = 60.0, on_wait: Any = None,
                 policy: Any = None) -> VerifyReport:
    """``policy``: the trust policy (`keys.Policy`) results are listed by signer against; revoked or forged ones
    are problems (``fix`` removes them)."""
    report = VerifyReport()
    if not store.exists():
        return report
    store.check_format()
    store.check_folders()
    mode = EXCLUSIVE if fix else SHARED
    with StoreLock(store.tree).held(mode, "trtflow verify" + (" --fix" if fix else ""), wait_s, on_wait):
        try:
            sha256: dict[str, str] = {}
            damaged = _check_objects(store, fix, report, sha256)
            _check_manifests(store, damaged, fix, report, policy, sha256)
            _check_refs(store, fix, report)
            _check_journal(store, fix, report)
        except OSError as exc:
            raise StoreError(f"verify could not {'repair' if fix else 'read'} the store {store.root}: "
                             f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else ""),
                             hint="check the store's permissions and free space") from None
    return report


def _check_objects(store: Store, fix: bool, report: VerifyReport, sha256: dict[str, str]) -> set[str]:
    """Re-hash every object; ``sha256`` is filled with the sha256 of each intact one."""
    tree = store.tree
    for shard in store.linked_shards():  # never entered: it may lead anywhere
        rel = store.rel(shard)
        report.problems.append(f"folder {'/'.join(rel)} is a symbolic link to {tree.readlink(rel)}")
        if fix:
            tree.unlink(rel)
            report.fixed.append(f"removed the link {'/'.join(rel)}")
    damaged: set[str] = set()
    for obj in store.iter_objects():
        report.objects += 1
        rel = store.rel(obj)
        where = "/".join(rel)
        try:
            st = tree.stat(rel)
        except OSError:
            continue
        if st is None:
            continue
        if stat.S_ISLNK(st.st_mode):  # objects are regular files; a link may point anywhere, outside the store too
            problem = f"object {where} is a symbolic link to {tree.readlink(rel)}"
        elif not stat.S_ISREG(st.st_mode):
            problem = f"object {where} is not a regular file"
        else:
            try:
                with tree.open_read(rel) as f:
                    actual, strong = stream_digests(f, True)  # sha256 too: what signed manifests name
            except OSError as exc:
                actual, strong = f"unreadable ({exc.strerror or exc})", None
            if actual == obj.name:
                sha256[obj.name] = strong or ""
                continue
            problem = f"object {where} has content digest {actual}"
        damaged.add(obj.name)
        report.problems.append(problem)
        if fix:
            tree.unlink(rel)  # the entry itself, never what a link points to (no chmod: a folder is made writable)
            report.fixed.append(f"removed {where}")
    return damaged


def _check_manifests(store: Store, damaged: set[str], fix: bool, report: VerifyReport, policy: Any,
                     sha256: dict[str, str]) -> None:
    tree = store.tree
    for path, manifest in store.iter_manifests():
        report.manifests += 1
        rel = store.rel(path)
        where = "/".join(rel)
        if manifest is None or not isinstance(manifest, dict) or not isinstance(manifest.get("outputs"), dict):
            report.problems.append(f"manifest {where} is unreadable")
            if fix:
                tree.unlink(rel)
                report.fixed.append(f"removed {where}")
            continue
        who = f"node {manifest.get('node')} of {manifest.get('recipe_id') or manifest.get('recipe')}"
        if policy is not None and _untrusted(store, path, manifest, who, policy, fix, report):
            continue
        bad = [name for name, out in manifest["outputs"].items()
               if not isinstance(out, dict) or out.get("digest") in damaged
               or _missing(store, out.get("digest"))
               or out.get("sha256") not in (None, sha256.get(str(out.get("digest")), out.get("sha256")))]
        if not bad:
            continue
        report.problems.append(f"{who} ({path.stem[:12]}): outputs {bad} missing or damaged")
        if fix:
            note = {"reason": f"outputs {bad} were missing or damaged", "removed_by": "trtflow verify --fix",
                    "time": time.time()}
            tree.write_text((*rel[:-1], f"{path.stem}.damaged"), json.dumps(note))
            tree.unlink(rel)
            report.fixed.append(f"removed {where} (the next run rebuilds {manifest.get('node')})")


def _untrusted(store: Store, path: Any, manifest: dict[str, Any], who: str, policy: Any, fix: bool,
               report: VerifyReport) -> bool:
    """Count the result under its signer; a revoked or forged one is a problem (removed by ``fix``): True then."""
    from trtflow.storage.signing import census

    label, bad = census(manifest, policy)
    report.signers[label] = report.signers.get(label, 0) + 1
    if not bad:
        return False
    rel = store.rel(path)
    report.problems.append(f"{who} ({path.stem[:12]}): {bad}")
    if fix:
        note = {"reason": bad, "removed_by": "trtflow verify --fix", "time": time.time()}
        store.tree.write_text((*rel[:-1], f"{path.stem}.damaged"), json.dumps(note))
        store.tree.unlink(rel)
        report.fixed.append(f"removed {'/'.join(rel)} (the next run rebuilds {manifest.get('node')})")
    return True


def _missing(store: Store, digest: object) -> bool:
    st = store.object_stat(digest) if isinstance(digest, str) else None
    return st is None or not stat.S_ISREG(st.st_mode)


def _check_refs(store: Store, fix: bool, report: VerifyReport) -> None:
    tree = store.tree
    for folder, st in tree.listdir("refs"):
        rel = ("refs", folder)
        if stat.S_ISLNK(st.st_mode):
            report.problems.append(f"refs folder {'/'.join(rel)} is a symbolic link to {tree.readlink(rel)}")
            if fix:
                tree.unlink(rel)
                report.fixed.append(f"removed the link {'/'.join(rel)}")
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue
        for name, kind in (("current.json", kinds.REFS), (".pending.jsonl", kinds.LEDGER),
                           ("history.jsonl", kinds.LEDGER)):
            where = "/".join((*rel, name))
            try:
                data = tree.read_bytes((*rel, name), kind)
                if name == "current.json":
                    records.parse(records.REFS, data, where)
            except FileNotFoundError:
                continue
            except Refused as exc:
                report.problems.append(f"refs {where}: {exc.why}")
                if fix:
                    tree.unlink((*rel, name))
                    report.fixed.append(f"removed {where}")
            except (OSError, ValueError) as exc:
                report.problems.append(f"refs {where} are unreadable ({exc})")
                if fix:
                    tree.unlink((*rel, name))
                    report.fixed.append(f"removed {where}")


def _check_journal(store: Store, fix: bool, report: VerifyReport) -> None:
    if not store.has_journal():
        return
    journal = store.journal(readonly=True)
    try:
        problems = journal.check() or journal.damaged_rows()  # SQLite's own check, then each row as its record
    except StoreError as exc:
        problems = [exc.message]
    finally:
        journal.close()
    if not problems:
        return
    report.problems.append(f"journal {store.db_path.name} is damaged: {'; '.join(problems[:3])}")
    if fix:
        aside = journal_module.reset(store.tree)
        report.fixed.append(f"journal reset (the damaged one is kept as {aside.name if aside else '-'}; run "
                            "history before this point is gone, stored results are kept)")
