"""The verified-signature cache (`trtflow.storage.verified`) against the full check it replaces: on every record
(trusted, untrusted, revoked, and each field of a signed manifest tampered with), the verdict with the cache, cold
and warm, equals the verdict of a full ed25519 verification; rows written by someone without this user's secret
(the store's writer forging, copying or replaying them, another user of a shared store) change no verdict; a secret
that others may read is not used. And the cache is used: a warm verdict makes no ed25519 check."""

from __future__ import annotations

import base64
import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.storage.conftest import make_store
from trtflow import keys
from trtflow.storage import signing, verified


def _signer(name: str) -> keys.Signer:
    return keys.Signer(name, Ed25519PrivateKey.generate(), "test")


def _manifest(seed: str, signer: keys.Signer) -> dict[str, Any]:
    body = {"key": f"{seed:0<32}"[:32], "node": seed, "stage": "synth", "params": {"text": seed, "size": 64},
            "outputs": {"out": {"digest": "ab" * 16, "sha256": "cd" * 32, "filename": "out.txt", "size": 64},
                        "log": {"digest": "ef" * 16, "sha256": "01" * 32, "filename": "log.txt", "size": 9}},
            "summary": {"latency_ms": 1.5, "passed": True}, "committed": 1.0, "source_commit": None}
    return json.loads(json.dumps(signing.sign(body, signer)))  # as read back from the store


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value[:-1] + ("0" if value[-1:] != "0" else "1") if value else "x"
    if isinstance(value, dict):
        return {**value, "added": 1}
    return "x"


def _population(signed: list[dict[str, Any]], others: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each signed manifest, and each of its fields (and each output's fields) changed in turn, its signature
    replaced, bit-flipped, cut short or moved to another manifest, its signer swapped; plus ``others`` as they are."""
    records = list(signed) + list(others)
    for m in signed:
        for field in m:
            if field != "signature":
                records.append(dict(m, **{field: _changed(m[field])}))
        for name, out in m["outputs"].items():
            for field in out:
                records.append(dict(m, outputs={**m["outputs"], name: dict(out, **{field: _changed(out[field])})}))
        raw = base64.b64decode(m["signature"])
        other = signed[1] if m is signed[0] else signed[0]
        flipped = bytes([raw[0] ^ 1]) + raw[1:]
        for sig in (flipped, raw[:63], os.urandom(64), base64.b64decode(other["signature"])):
            records.append(dict(m, signature=base64.b64encode(sig).decode()))
        records.append(dict(m, signer=other["signer"]))
        records.append(json.loads(json.dumps(dict(reversed(list(m.items()))))))  # re-ordered: the same statement
    return [copy.deepcopy(r) for r in records]


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config-a"))
    own = keys.create_key("victim")
    mate, attacker, gone = _signer("mate"), _signer("attacker"), _signer("gone")
    project = tmp_path / "project"
    project.mkdir()
    keys.TrustFile(keys.project_file(project), [mate.public, gone.public], [gone.public.id]).write()
    policy = keys.load_policy(project)
    signed = [_manifest("own", own), _manifest("mate", mate)]
    others = [_manifest("planted", attacker), _manifest("revoked", gone)]
    checks: list[int] = []
    full_check = keys.PublicKey.verifies

    def counted(self: keys.PublicKey, signature: bytes, data: bytes) -> bool:
        checks.append(1)
        return full_check(self, signature, data)

    monkeypatch.setattr(keys.PublicKey, "verifies", counted)
    verified._secrets.clear()
    return {"policy": policy, "records": _population(signed, others), "signed": signed, "checks": checks,
            "journal": make_store(tmp_path / "store").journal(), "tmp": tmp_path}


def _verdicts(w: dict[str, Any], cache: Any) -> list[str | None]:
    return [signing.signature_problem(r, w["policy"], cache) for r in w["records"]]


def test_cached_verdicts_equal_full_verification_on_every_record_and_tampered_one(world) -> None:
    w = world
    full = _verdicts(w, None)
    assert len(full) > 40 and full[:2] == [None, None]
    assert sum(v is None for v in full) == 4  # the two signed ones and their re-ordered JSON; the rest refused
    full_checks = len(w["checks"])
    assert _verdicts(w, w["journal"]) == full  # cold: full checks, successes remembered
    del w["checks"][:]
    assert _verdicts(w, w["journal"]) == full  # warm
    assert len(w["checks"]) == full_checks - 4  # no ed25519 check for a remembered success, every failure checked
    assert os.stat(verified.secret_path()).st_mode & 0o777 == 0o600


def test_rows_forged_by_the_stores_writer_or_another_user_change_no_verdict(world, monkeypatch) -> None:
    w = world
    journal, full = w["journal"], _verdicts(w, None)
    full_checks = len(w["checks"])
    assert _verdicts(w, journal) == full
    secret = verified._secret(create=False)
    assert secret is not None
    rows = journal.conn.execute("SELECT path, digest FROM stat_cache WHERE path LIKE ?", (verified.ROW + "%",))
    genuine = [value for _, value in rows.fetchall()]
    assert genuine
    forger = (os.urandom(32), secret[1])  # knows the id (it is in the store), not the secret
    policy = w["policy"]
    for record, verdict in zip(w["records"], full, strict=True):
        signer = policy.trusted.get(record.get("signer"))
        if verdict is None or signer is None:
            continue
        try:
            raw = base64.b64decode(record["signature"], validate=True)
            data = signing.statement(record, from_json=True)
        except (ValueError, TypeError):
            continue
        material = signer.raw + raw + __import__("hashlib").sha256(data).digest()
        row, _ = verified.entry(secret, material)
        for value in (verified.entry(forger, material)[1], *genuine):  # a forged value, each genuine one replayed
            journal.put(row, verified.NO_STAT, value)
            assert signing.signature_problem(record, policy, journal) == verdict
    assert _verdicts(w, journal) == full

    # another user of the same store: its own secret, so A's rows are not believed (full checks), its own are
    monkeypatch.setenv("XDG_CONFIG_HOME", str(w["tmp"] / "config-b"))
    del w["checks"][:]
    assert _verdicts(w, journal) == full
    assert len(w["checks"]) == full_checks - 2  # A's remembered successes checked again (the re-ordered twins:
    # the same statement, remembered by B's first check of it)
    assert verified._secret(create=False) != secret


def test_a_secret_others_may_read_is_not_used(world) -> None:
    w = world
    full = _verdicts(w, None)
    full_checks = len(w["checks"])
    assert _verdicts(w, w["journal"]) == full
    os.chmod(verified.secret_path(), 0o644)
    verified._secrets.clear()
    del w["checks"][:]
    assert _verdicts(w, w["journal"]) == full
    assert len(w["checks"]) == full_checks  # every signature checked in full


def test_a_signed_results_bytes_swapped_with_forged_stat_cache_rows_are_refused(tmp_path, monkeypatch) -> None:
    """The store's writer replaces a signed output's bytes and writes the stat-cache rows (xxh3 and sha256) that
    match the new file: refused, as a full re-hash refuses it. An honest result is reused without re-hashing."""
    from types import SimpleNamespace

    from tests.storage.conftest import node_key
    from trtflow.fingerprint import signature
    from trtflow.plan import usable

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    verified._secrets.clear()
    keys.create_key("victim")
    store = make_store(tmp_path / "store")
    journal = store.journal()
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "engine.bin").write_bytes(b"engine bytes" * 100)
    (out_dir / "log.bin").write_bytes(b"log")
    manifest = store.commit(node_key("swap"), {"stage": "synth", "node": "n"}, out_dir,
                            {"engine": ("engine.bin", "blob"), "log": ("log.bin", "blob")}, stat_cache=journal)
    hashed: list[int] = []
    full_hash = signing.stream_digests

    def counted(*args: Any) -> Any:
        hashed.append(1)
        return full_hash(*args)

    monkeypatch.setattr(signing, "stream_digests", counted)

    def verdict(cache: Any) -> bool:
        return usable(store, manifest, SimpleNamespace(project_root=tmp_path, memo={}, stat_cache=cache,
                                                       evidence=None))

    assert verdict(journal) and not hashed  # put_object remembered its sha256: reused without re-hashing
    assert verdict(None) and len(hashed) == 2  # the full check (no stat cache) agrees
    out = manifest["outputs"]["engine"]
    path = store.shown(store.object_rel(out["digest"]))
    os.chmod(path, 0o644)
    path.write_bytes(b"X" * len(b"engine bytes" * 100))
    st = os.lstat(path)
    journal.put(str(path), signature(st), out["digest"])  # the forged rows: plain digests for the new stat
    journal.put(str(path) + signing.SHA256_ENTRY, signature(st), out["sha256"])
    assert verdict(None) is False and verdict(journal) is False
