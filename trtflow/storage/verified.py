"""Signatures verified once: that a trusted key signed a result's exact bytes, remembered between runs in a form
that whoever may write the store cannot forge.

A run that plans checks the signature of every result it would reuse (`signing.signature_problem`): an ed25519
check per node (0.1 ms) and, first, the import of `cryptography` (20-30 ms), for the same bytes run after run. A
success is remembered as one row of the store's stat cache (the journal, `fingerprint.StatCache`):

    row    "\\0verified:" + ID + ":" + hex sha256(MATERIAL)
    value  hex HMAC-SHA256(SECRET, "trtflow-verified-v1\\0" + MATERIAL)
    MATERIAL = the signer's full public key (32 bytes) + the signature (64) + sha256(the signed statement)

SECRET is 32 random bytes of this user (``keys_dir()/verified.secret``: mode 0600, in the 0700 folder of the
private keys, made on first use; read and made by `keys.private_secret`, the owner of that folder); ID (16
hex digits of an HMAC under it) keeps the rows of users who share a store apart. A row is believed only when its
value is the HMAC this user's SECRET gives for the public key, the signature and the statement at hand (compared
in constant time); otherwise the signature is checked in full.

Why a store's writer cannot forge it: rows are readable and writable by anyone who may write the store (a shared
folder, a cloned ``.trtflow/``), but a value that checks needs SECRET, which lives beside the private keys, outside
the store (the threat model trusts ``~/.config/trtflow``: whoever may write it may add a trusted key anyway). A
changed manifest (any field, its outputs' sha256, its key, its summary) is another statement, so another
MATERIAL: its row is one nobody with SECRET wrote, and a value copied from another row is the HMAC of other
bytes. Only the fact "this public key signed these bytes" is remembered, which nothing later can make false;
trust (trusted, revoked, which key an id names) is decided by the policy on every run before a row is looked at,
so a revocation takes effect at once. Only successes are remembered. A secret file that others may read (group or
other permission bits, another owner) or that is not 32 bytes is not used: the check is then made in full. A
deleted or damaged row costs one full check, never a verdict.

The same secret keys what trtflow records of a value that may itself be a secret (`keyed_digest`): an environment
variable a node's ``python:`` code sees (its node's key and manifest), those a no-op record rests on. Such a value
is never written; its digest is an HMAC under SECRET, which whoever reads the store or the record does not have, so
trying values (a short token, a password) against it is no use. This user's digests agree with each other, run
after run, in every process; another user's differ (a node with such variables is then rebuilt, not reused).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
from pathlib import Path
from typing import Any

from trtflow.fingerprint import StatCache
from trtflow.keys import keys_dir, private_secret

ROW = "\0verified:"
DOMAIN = b"trtflow-verified-v1\0"
KEYED_DOMAIN = b"trtflow-keyed-v1\0"
SECRET_FILE = "verified.secret"
NO_STAT = (0, 0, 0, 0)  # a row of no file: its "signature" never changes

_lock = threading.Lock()
_secrets: dict[str, tuple[bytes, str]] = {}
_unwritable: set[str] = set()
_last: list[Any] = [None, None]  # (XDG_CONFIG_HOME, HOME) -> the secret's path, as last resolved


def verifies(key: Any, signature: bytes, data: bytes, cache: StatCache | None) -> bool:
    """Whether ``signature`` is ``key``'s (`keys.PublicKey`) ed25519 signature of ``data``: a row of ``cache``
    this user wrote says so, else the full check (whose success is remembered in ``cache``)."""
    if cache is None:
        return bool(key.verifies(signature, data))
    material = bytes(key.raw) + signature + hashlib.sha256(data).digest()
    secret = _secret(create=False)
    if secret is not None:
        row, tag = entry(secret, material)
        found = cache.get(row, NO_STAT)
        if found is not None and hmac.compare_digest(found, tag):
            return True
    if not key.verifies(signature, data):
        return False
    secret = secret or _secret(create=True)
    if secret is not None:
        row, tag = entry(secret, material)
        cache.put(row, NO_STAT, tag)
    return True


def remember(cache: StatCache | None, path: str, sig: tuple[int, int, int, int], value: str) -> None:
    """Put the stat cache's entry ``path`` (a file's, with its signature ``sig``) as ``value`` (a digest the caller
    computed from the file's bytes), valued by an HMAC under this user's secret: `remembered` believes only what
    this user put (the sha256 a signed result's bytes are checked by, `signing.object_sha256_matches`)."""
    secret = _secret(create=True) if cache is not None else None
    if cache is not None and secret is not None:
        cache.put(path, sig, _tag(secret, path, sig, value))


def remembered(cache: StatCache | None, path: str, sig: tuple[int, int, int, int], value: str) -> bool:
    """Whether this user put ``path``'s entry as ``value`` for the signature ``sig`` (`remember`)."""
    secret = _secret(create=False) if cache is not None else None
    if cache is None or secret is None:
        return False
    found = cache.get(path, sig)
    return found is not None and hmac.compare_digest(found, _tag(secret, path, sig, value))


def _tag(secret: tuple[bytes, str], path: str, sig: tuple[int, int, int, int], value: str) -> str:
    text = "\0".join((path, *(str(n) for n in sig), value))
    return hmac.new(secret[0], b"trtflow-file-digest-v1\0" + text.encode("utf-8", "surrogatepass"),
                    hashlib.sha256).hexdigest()


def entry(secret: tuple[bytes, str], material: bytes) -> tuple[str, str]:
    """(the row, the value) that remember ``material`` under ``secret`` (its bytes, its id)."""
    key, ident = secret
    row = f"{ROW}{ident}:{hashlib.sha256(material).hexdigest()}"
    return row, hmac.new(key, DOMAIN + material, hashlib.sha256).hexdigest()


def keyed_digest(kind: str, name: str, value: str) -> str | None:
    """The digest of ``value`` (of the ``kind`` called ``name``: ``env``, a variable's name) that may be written
    where others read it: an HMAC under this user's secret (made on first use); None when there is none (a
    configuration folder that cannot be written)."""
    secret = _secret(create=True)
    if secret is None:
        return None
    material = b"\0".join(os.fsencode(part) for part in (kind, name, value))
    return "hmac-sha256:" + hmac.new(secret[0], KEYED_DOMAIN + material, hashlib.sha256).hexdigest()


def secret_path() -> Path:
    return keys_dir() / SECRET_FILE


def _secret(create: bool) -> tuple[bytes, str] | None:
    """This user's secret and its id (read once per process); ``create``: made when there is none."""
    home = (os.environ.get("XDG_CONFIG_HOME"), os.environ.get("HOME"))  # what keys_dir() depends on
    with _lock:
        if home == _last[0] and _last[1] in _secrets:
            return _secrets[_last[1]]
    path = secret_path()
    where = str(path)
    with _lock:
        _last[:] = [home, where]
        if where in _secrets:
            return _secrets[where]
        raw = private_secret(SECRET_FILE, create=create and where not in _unwritable)
        if raw is None and create:
            _unwritable.add(where)
        if raw is None:
            return None
        _secrets[where] = (raw, hmac.new(raw, b"trtflow-verified-id", hashlib.sha256).hexdigest()[:16])
        return _secrets[where]
