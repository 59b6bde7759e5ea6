"""Signed results: who built a node's result, bound to its key and to the bytes of its outputs.

A result's manifest carries (all plain, typed fields):
  signer          the builder's key id (16 hex digits, `trtflow.keys`)
  signer_name     the name the builder gave its key (shown; trust is by key, never by name)
  trtflow         the trtflow version that built it
  source_commit   the git commit of the project it was built from (null outside git)
  outputs.*.sha256  the sha256 of every output's bytes (objects are named by xxh3, which cannot carry authorship)
  signature       ed25519 over the *statement*: ``trtflow-result-v1\\0`` + the canonical JSON (sorted keys, no
                  spaces, ASCII) of the whole manifest without ``signature``

So the signature binds the node key, the sha256 of every output, the builder, the trtflow version, the recipe
(``recipe_id``, ``node``, ``params``...) and the commit, and also the summary a gate is judged on. Nothing is
signed separately from the manifest: a statement cannot be replayed onto another key or other outputs, and a
manifest whose JSON is re-ordered but not changed still verifies (the statement is canonical).

A result is reused only when `trust_problem` finds nothing: the signature verifies against a key the policy
trusts (not revoked), and every output's bytes hash to the signed sha256 (re-hashed when the object's stat
signature changed, as the store's own check). Dates play no part in trust: a clock set back gains nothing.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trtflow.fingerprint import StatCache, signature, stream_digests
from trtflow.storage import verified
from trtflow.userfiles import read_file

DOMAIN = b"trtflow-result-v1\0"
FIELDS = ("signer", "signer_name", "signature", "trtflow", "source_commit")
SIGNER_ID = re.compile(r"[0-9a-f]{16}")
UNSIGNED = ("unsigned (built by an older trtflow, or written by hand); if these are your own results, "
            "`trtflow keys adopt` signs them with your key")
SHA256_ENTRY = "\0sha256"  # the stat cache's entry of an object's sha256 (beside its xxh3 entry)


def statement(manifest: Mapping[str, Any], *, from_json: bool = False) -> bytes:
    """The bytes a result's signature covers: the canonical manifest without its signature. ``from_json``: the
    manifest was read from JSON (no tuples, no non-string keys), so it is written once instead of normalised."""
    body: Any = {k: v for k, v in manifest.items() if k != "signature"}
    if not from_json:
        body = json.loads(json.dumps(body))
    return DOMAIN + json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def git_commit(project_root: Path | None) -> str | None:
    """The commit HEAD names in the project's git checkout (read from .git, no subprocess); None outside git."""
    if project_root is None:
        return None
    git = Path(project_root) / ".git"
    try:  # a cloned .git may hold a named pipe or a link to /dev/zero: read as bounded regular files only
        if git.is_file():  # a worktree or submodule: "gitdir: PATH"
            text = _git_text(git, 4096).strip()
            if text.startswith("gitdir:"):
                git = (git.parent / text[7:].strip()).resolve()
        head = _git_text(git / "HEAD", 4096).strip()
        if head.startswith("ref:"):
            ref = head[4:].strip()
            common = git
            if (git / "commondir").is_file():
                common = (git / _git_text(git / "commondir", 4096).strip()).resolve()
            for base in (git, common):
                if (base / ref).is_file():
                    return _git_text(base / ref, 4096)[:64].strip() or None
            packed = common / "packed-refs"
            if packed.is_file():
                for line in _git_text(packed, 64 << 20).splitlines():
                    if line.endswith(" " + ref):
                        return line.split()[0]
            return None
        return head if re.fullmatch(r"[0-9a-f]{40,64}", head) else None
    except OSError:
        return None


def _git_text(path: Path, cap: int) -> str:
    return read_file(path, cap).decode("utf-8", "replace")


def sign(manifest: dict[str, Any], signer: Any = None) -> dict[str, Any]:
    """``manifest`` (whose outputs carry their sha256) signed by ``signer`` (default: `keys.current_signer`)."""
    from trtflow import __version__
    from trtflow.keys import current_signer

    signer = signer or current_signer()
    pub = signer.public
    signed = dict(manifest, signer=pub.id, signer_name=pub.name, trtflow=__version__)
    signed.setdefault("source_commit", None)
    signed.pop("signature", None)
    signed["signature"] = base64.b64encode(signer.sign(statement(signed))).decode()
    return signed


def is_signed(manifest: Mapping[str, Any]) -> bool:
    return "signature" in manifest or "signer" in manifest


def signature_problem(manifest: Mapping[str, Any], policy: Any, stat_cache: StatCache | None = None) -> str | None:
    """Why the manifest's signature does not make it reusable under ``policy`` (`keys.Policy`); bytes unchecked.
    With ``stat_cache`` (the store's), a signature this user verified before is not checked again
    (`trtflow.storage.verified`: trust is still decided here, every time)."""
    if not is_signed(manifest):
        return UNSIGNED
    signer, sig = manifest.get("signer"), manifest.get("signature")
    if not isinstance(signer, str) or not SIGNER_ID.fullmatch(signer) or not isinstance(sig, str):
        return "its signature is malformed (not reused)"
    refused = policy.verdict(signer, manifest.get("signer_name"))
    if refused is not None:
        return refused
    try:
        raw = base64.b64decode(sig, validate=True)
    except (binascii.Error, ValueError):
        return "its signature is malformed (not reused)"
    outputs = manifest.get("outputs")
    if not isinstance(outputs, Mapping) or any(not isinstance(o, Mapping) or not o.get("sha256")
                                               for o in outputs.values()):
        return "its signed outputs carry no sha256 (not reused)"
    try:
        data = statement(manifest, from_json=True)  # a dict that is not JSON's own fails to verify: refused
    except (TypeError, ValueError):
        return "its signature does not verify (not reused)"
    if len(raw) != 64 or not verified.verifies(policy.trusted[signer], raw, data, stat_cache):
        return f"its signature does not verify against the key of {signer} ({policy.describe(signer)}): forged " \
               "or altered (not reused)"
    return None


def bytes_problem(store: Any, manifest: Mapping[str, Any], stat_cache: StatCache | None) -> str | None:
    """Why the stored objects of a signed manifest are not the bytes it signed (None: they are)."""
    for name, out in manifest["outputs"].items():
        if not object_sha256_matches(store, out["digest"], out["sha256"], stat_cache):
            return f"stored output {name} is not the bytes its signature names (not reused)"
    return None


def object_sha256_matches(store: Any, digest: str, sha256: str, stat_cache: StatCache | None) -> bool:
    try:
        rel = store.object_rel(digest)
        st = store.tree.stat(rel)
    except OSError:
        return False
    if st is None or not stat.S_ISREG(st.st_mode):
        return False
    path = str(store.shown(rel)) + SHA256_ENTRY
    if verified.remembered(stat_cache, path, signature(st), sha256):  # an entry this user put: unforgeable
        return True
    try:
        with store.tree.open_read(rel) as f:
            opened = os.fstat(f.fileno())
            fast, strong = stream_digests(f, True)
    except OSError:
        return False
    if fast != digest or strong != sha256 or opened.st_ino != st.st_ino:
        return False
    if signature(opened) == signature(st):
        verified.remember(stat_cache, path, signature(st), sha256)
    return True


def policy_for(kctx: Any) -> Any:
    """The trust policy of a plan (read once per plan; its files become evidence of a no-op run)."""
    memo = kctx.memo
    if "trust policy" not in memo:
        from trtflow.keys import load_policy

        policy = load_policy(kctx.project_root)
        memo["trust policy"] = policy
        _observe(kctx, policy)
    return memo["trust policy"]


def _observe(kctx: Any, policy: Any) -> None:
    evidence = getattr(kctx, "evidence", None)
    if evidence is None:
        return
    from trtflow.fingerprint import hash_path

    for path in policy.files:
        if os.path.lexists(path):
            try:
                kctx.observe(Path(path), hash_path(Path(path), kctx.stat_cache))
            except OSError:
                evidence.missing.add(str(path))  # unreadable: the no-op record is not trusted blindly
        else:
            evidence.missing.add(str(path))


def trust_problem(store: Any, manifest: Mapping[str, Any], kctx: Any, *, check_bytes: bool = True) -> str | None:
    """Why a stored (or remote, ``check_bytes=False``) result may not be reused here (None: it may). Never raises:
    a trust file that cannot be read refuses every result, with its error as the reason."""
    from trtflow.errors import TrtflowError

    try:
        policy = policy_for(kctx)
    except TrtflowError as exc:
        return f"trust cannot be decided: {exc.message}"
    problem = signature_problem(manifest, policy, kctx.stat_cache)
    if problem is None and check_bytes:
        problem = bytes_problem(store, manifest, kctx.stat_cache)
    return problem


def sign_stored(store: Any, key: str, manifest: dict[str, Any], signer: Any = None) -> dict[str, Any]:
    """Add the sha256 of each output (read from the store, checked against its xxh3 name) and sign; the caller
    writes the result. Raises OSError/ValueError for an object that is missing or changed."""
    outputs = {}
    for name, out in manifest["outputs"].items():
        if not out.get("sha256"):
            fast, strong = store.hash_object(out["digest"], sha256=True)
            if fast != out["digest"]:
                raise ValueError(f"output {name!r} of {key} changed in the store")
            out = dict(out, sha256=strong)
        outputs[name] = out
    return sign(dict(manifest, outputs=outputs), signer)


def census(manifest: Mapping[str, Any], policy: Any) -> tuple[str, str | None]:
    """(the signer as `trtflow verify` lists it, the problem when the result is revoked or forged: None for a
    trusted, unknown or unsigned one, which are listed, not removed: a shared store holds others' results)."""
    if not is_signed(manifest):
        return "unsigned (older trtflow: `trtflow keys adopt` signs your own)", None
    signer = manifest.get("signer")
    if not isinstance(signer, str) or not SIGNER_ID.fullmatch(signer):
        return "malformed signature", "its signature is malformed"
    name = manifest.get("signer_name") if isinstance(manifest.get("signer_name"), str) else "?"
    label = f"{signer} ({policy.names.get(signer, name)})"
    if signer in policy.revoked:
        return f"{label}: REVOKED", f"signed by a revoked key: {label}"
    if signer not in policy.trusted:
        return f"{label}: UNKNOWN (not trusted here; its results are rebuilt)", None
    problem = signature_problem(manifest, policy)
    if problem is not None:
        return f"{label}: FORGED or altered", problem
    return f"{label}: trusted", None
