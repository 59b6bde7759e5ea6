"""Signed results, in-process: every attack on a stored result's signature is refused by the one rule of reuse
(`plan.usable`), with the reason the plan shows; what a trusted key signed is reused (rotation keeps it)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.storage.conftest import commit_node, make_store, node_key
from trtflow import keys
from trtflow.plan import usable
from trtflow.storage import signing
from trtflow.storage.verify import verify_store


def _signer(name: str) -> keys.Signer:
    return keys.Signer(name, Ed25519PrivateKey.generate(), "test")


def _kctx(project: Path) -> SimpleNamespace:
    return SimpleNamespace(project_root=project, memo={}, stat_cache=None, evidence=None)


def _trust(project: Path, trusted: list[keys.Signer], revoked: list[keys.Signer] = ()) -> None:
    tf = keys.TrustFile(keys.project_file(project), [s.public for s in trusted], [s.public.id for s in revoked])
    tf.write()


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A victim (own key in its key store) with a project trusting a teammate; an attacker nobody trusts."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "victim-config"))
    own = keys.create_key("victim")
    mate, attacker = _signer("mate"), _signer("attacker")
    project = tmp_path / "project"
    project.mkdir()
    _trust(project, [mate])
    store = make_store(tmp_path / "store")
    return SimpleNamespace(own=own, mate=mate, attacker=attacker, project=project, store=store, tmp=tmp_path)


def _result(w: SimpleNamespace, seed: str, signer: keys.Signer | None = None) -> tuple[str, dict]:
    key = node_key(seed)
    manifest = commit_node(w.store, key, {"engine": seed.encode() * 500, "log": b"built " + seed.encode()}, w.tmp)
    if signer is not None:  # as if built by ``signer`` on its machine and copied here
        manifest = signing.sign({k: v for k, v in manifest.items() if k not in signing.FIELDS}, signer)
        w.store.write_manifest(key, manifest)
    return key, w.store.read_manifest(key)


def _verdict(w: SimpleNamespace, manifest: dict | None) -> tuple[bool, str | None]:
    if manifest is None:
        return False, "unreadable"
    kctx = _kctx(w.project)
    return usable(w.store, manifest, kctx), signing.trust_problem(w.store, manifest, kctx)


def test_own_and_trusted_results_are_reused_and_every_signature_attack_is_refused(world) -> None:
    w = world
    _, mine = _result(w, "mine")
    _, mates = _result(w, "mate", w.mate)
    assert mine["signer"] == w.own.public.id and mine["outputs"]["engine"]["sha256"]
    assert _verdict(w, mine) == (True, None) and _verdict(w, mates) == (True, None)

    # an untrusted writer's result for the victim's exact key
    key, planted = _result(w, "planted", w.attacker)
    ok, why = _verdict(w, planted)
    assert not ok and why == f"signed by a key this project does not trust: {w.attacker.public.id} (calling itself " \
        "attacker)"

    # a forged signature: the attacker names the trusted key as signer
    forged = dict(planted, signer=w.mate.public.id, signer_name="mate")
    assert _verdict(w, forged)[1].startswith("its signature does not verify")
    forged["signature"] = base64.b64encode(os.urandom(64)).decode()
    assert not _verdict(w, forged)[0]
    assert _verdict(w, dict(mates, signature="not base64!"))[1] == "its signature is malformed (not reused)"

    # a valid signature replayed onto another key, and onto other outputs (swapped: re-ordered outputs)
    other = node_key("another key")
    w.store.write_manifest(other, dict(mates, key=other))
    assert w.store.read_manifest(other) is not None
    assert "does not verify" in _verdict(w, w.store.read_manifest(other))[1]
    engine, log = mates["outputs"]["engine"], mates["outputs"]["log"]
    swapped = dict(mates, outputs={"engine": dict(log, filename=engine["filename"]),
                                   "log": dict(engine, filename=log["filename"])})
    assert "does not verify" in _verdict(w, swapped)[1]
    grafted = dict(mates, outputs={**mates["outputs"], "engine": planted["outputs"]["engine"]})
    assert not _verdict(w, grafted)[0]
    # a changed summary (what a gate judges) breaks the signature too
    assert not _verdict(w, dict(mates, summary={"latency_ms": 0.001}))[0]

    # a manifest whose JSON is only re-ordered is the same statement: still the teammate's
    reordered = json.loads(json.dumps(dict(reversed(list(mates.items())))))
    assert _verdict(w, reordered) == (True, None)
    # a truncated manifest is no manifest
    path = w.store.manifest_path(key)
    os.chmod(path, 0o644)
    path.write_text(json.dumps(planted)[:-40])
    assert w.store.read_manifest(key) is None


def test_a_revoked_key_is_refused_whatever_the_dates_and_rotation_keeps_old_results(world) -> None:
    w = world
    _, old = _result(w, "by the old key", w.mate)
    newer = _signer("mate-2026")
    _trust(w.project, [w.mate, newer])  # rotation: the new key is trusted, the old one still is
    _, new = _result(w, "by the new key", newer)
    assert _verdict(w, old) == (True, None) and _verdict(w, new) == (True, None)

    _trust(w.project, [newer], revoked=[w.mate])
    # the clock set back: a revoked key's result dated long before the revocation is refused all the same
    backdated = signing.sign(dict({k: v for k, v in old.items() if k not in signing.FIELDS},
                                  committed=0.0, started=0.0), w.mate)
    for manifest in (old, backdated):
        ok, why = _verdict(w, manifest)
        assert not ok and why.startswith(f"signed by a revoked key: {w.mate.public.id}")
    assert _verdict(w, new) == (True, None)
    # the victim's own key, once revoked (a stolen laptop), is refused too
    _trust(w.project, [newer], revoked=[w.mate, w.own])
    _, mine = _result(w, "mine after revocation")
    assert _verdict(w, mine)[1].startswith("signed by a revoked key")

    report = verify_store(w.store, policy=keys.load_policy(w.project))
    assert any("REVOKED" in label for label in report.signers) and report.problems


def test_signed_bytes_are_checked_and_unsigned_results_need_adopting(world, monkeypatch) -> None:
    w = world
    key, mine = _result(w, "mine")
    # a trusted builder's manifest naming bytes other than the object's: refused on the bytes
    wrong = dict(mine["outputs"]["engine"], sha256="0" * 64)
    lying = signing.sign(dict({k: v for k, v in mine.items() if k not in signing.FIELDS},
                              outputs={**mine["outputs"], "engine": wrong}), w.own)
    assert _verdict(w, lying)[1] == "stored output engine is not the bytes its signature names (not reused)"
    w.store.write_manifest(key, lying)
    report = verify_store(w.store, policy=keys.load_policy(w.project))
    assert any("outputs ['engine'] missing or damaged" in p for p in report.problems), report.problems

    # a result of an older trtflow (unsigned): not reused until its owner adopts it
    legacy = {k: v for k, v in mine.items() if k not in signing.FIELDS}
    w.store.write_manifest(key, legacy)
    assert _verdict(w, w.store.read_manifest(key)) == (False, signing.UNSIGNED)
    from typer.testing import CliRunner

    from trtflow.keys_cli import app

    out = CliRunner().invoke(app, ["adopt", "--store", str(w.store.root)])
    assert out.exit_code == 0 and "signed 1 unsigned results" in out.output, out.output
    assert _verdict(w, w.store.read_manifest(key)) == (True, None)


def test_keys_are_private_files_and_ci_keys_come_from_the_environment(world, monkeypatch) -> None:
    w = world
    path = keys.keys_dir() / "victim.key"
    assert (path.stat().st_mode & 0o777) == 0o600 and (keys.keys_dir().stat().st_mode & 0o777) == 0o700
    os.chmod(path, 0o644)
    with pytest.raises(keys.TrtflowError, match="may be read by others"):
        keys.load_key("victim")
    os.chmod(path, 0o600)
    ci = _signer("ci-main")
    monkeypatch.setenv(keys.ENV_KEY, ci.secret_text)
    assert keys.current_signer().public == ci.public
    assert keys.load_policy(w.project).verdict(ci.public.id) is None  # one's own key counts as trusted
    assert not any(p.read_bytes().find(ci.secret_text.split(":")[1].encode()) >= 0
                   for p in keys.config_dir().rglob("*") if p.is_file())  # never written anywhere
    monkeypatch.setenv(keys.ENV_KEY, "ci-main:bm90IGEga2V5")
    with pytest.raises(keys.TrtflowError, match="is not a signing key"):
        keys.current_signer()
    (w.project / keys.PROJECT_FILE).write_text("trusted: [nonsense]\n")
    monkeypatch.delenv(keys.ENV_KEY)
    _, mine = _result(w, "mine")
    assert "trust cannot be decided" in _verdict(w, mine)[1]  # a broken trust file refuses, never exit 70


def test_the_first_key_is_made_once_when_two_processes_make_it_at_once(tmp_path, monkeypatch) -> None:
    """A user without a key gets USER@HOST on the first commit; a process that finds it made meanwhile by another
    uses that one (the key file appears whole: written aside, then linked into place)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(keys.ENV_KEY, raising=False)
    name = keys._default_identity(suffix=False)
    other = keys.create_key(name, make_default=False)  # the other process won the race, not yet made it default
    assert keys.default_name() is None
    assert keys.current_signer().public == other.public and keys.default_name() == name
    assert sorted(p.name for p in keys.keys_dir().iterdir()) == sorted([f"{name}.key", "default", "public"])
