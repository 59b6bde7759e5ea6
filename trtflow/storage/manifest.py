"""What a node manifest must hold before anything acts on it.

A manifest names files by digest and by file name, and both become paths (``objects/ab/<digest>``,
``build/<recipe>/<node>/<file name>``). A manifest may come from a place we do not fully control (a shared store,
a remote cache that other machines write), so every reader checks it completely first: a JSON object of this key,
of a format this trtflow reads, whose outputs each have a well-formed digest, a size, a kind and a file name that
stays inside its folder. A manifest with any problem is not used; one written by a newer trtflow is also left
alone (never overwritten by an older one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from typing_extensions import TypeIs

#: The manifest format this trtflow writes (1: the first release; 2: ``recipe_id`` and ``format`` recorded).
FORMAT = 2
DIGEST = re.compile(r"[0-9a-f]{32}")  # xxh3-128, the store's object names
SHA256 = re.compile(r"[0-9a-f]{64}")  # an output's sha256, recorded for remotes that name objects by it
KEY = re.compile(r"[0-9a-f]{16,128}")


@dataclass(frozen=True)
class Problem:
    """Why a manifest cannot be used; ``newer``: it was written by a newer trtflow (keep it, do not replace it)."""

    text: str
    newer: bool = False

    def __str__(self) -> str:
        return self.text


def is_key(text: object) -> TypeIs[str]:
    return isinstance(text, str) and KEY.fullmatch(text) is not None


def check_key(key: str) -> None:
    """Refuse a string that is not a node key (it becomes part of a path)."""
    if not is_key(key):
        raise ValueError(f"not a node key: {key!r}")


def is_digest(text: object) -> TypeIs[str]:
    return isinstance(text, str) and DIGEST.fullmatch(text) is not None


def safe_relative_name(filename: object) -> TypeIs[str]:
    """A file name that stays inside its folder: relative, POSIX, no '..', '.', empty parts, backslash or NUL."""
    if not isinstance(filename, str) or not filename or filename.startswith("/") or "\\" in filename \
            or "\0" in filename:
        return False
    return all(part not in ("", ".", "..") for part in filename.split("/"))


def manifest_problem(key: str, manifest: Any) -> Problem | None:
    """Why ``manifest`` cannot be used as the manifest of ``key`` (None: it can)."""
    if not isinstance(manifest, dict):
        return Problem("not a JSON object")
    written_as = manifest.get("format", 1)
    if not isinstance(written_as, int) or isinstance(written_as, bool) or written_as < 1:
        return Problem(f"it has no valid format ({written_as!r})")
    if written_as > FORMAT:
        return Problem(f"it was written by a newer trtflow (manifest format {written_as}; this trtflow reads up to "
                       f"{FORMAT})", newer=True)
    if "key" not in manifest:
        return Problem("it names no key")
    if manifest["key"] != key:
        return Problem(f"it belongs to key {manifest['key']!r}")
    return outputs_problem(manifest.get("outputs")) or signed_fields_problem(manifest)


#: The fields a signed result adds (`storage/signing.py`): name -> (pattern, may be null). Absent in results of an
#: older trtflow (unsigned: refused for reuse by the signature check, not here).
SIGNED_FIELDS = {"signer": (re.compile(r"[0-9a-f]{16}"), False),
                 "signer_name": (re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}"), False),
                 "signature": (re.compile(r"[A-Za-z0-9+/]{86}=="), False),
                 "trtflow": (re.compile(r"[A-Za-z0-9.+!_-]{1,64}"), False),
                 "source_commit": (re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}"), True)}


def signed_fields_problem(manifest: Mapping[str, Any]) -> Problem | None:
    """Why the signing fields of a manifest are not well formed (None: they are, or it has none)."""
    for name, (pattern, nullable) in SIGNED_FIELDS.items():
        if name not in manifest or (nullable and manifest[name] is None):
            continue
        value = manifest[name]
        if not isinstance(value, str) or pattern.fullmatch(value) is None:
            return Problem(f"its field {name!r} is not well formed")
    return None


def outputs_problem(outputs: Any) -> Problem | None:
    """Why a manifest's ``outputs`` (name -> {digest, size, filename, kind}) cannot be used (None: they can)."""
    if not isinstance(outputs, Mapping):
        return Problem("it has no outputs")
    names: dict[str, str] = {}
    for name, out in outputs.items():
        if not isinstance(out, Mapping):
            return Problem(f"output {name!r} is not an object")
        digest, size, filename = out.get("digest"), out.get("size"), out.get("filename")
        if not is_digest(digest):
            return Problem(f"output {name!r} has no valid digest")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return Problem(f"output {name!r} has no valid size")
        if not safe_relative_name(filename):
            return Problem(f"output {name!r} has an unsafe file name {filename!r}")
        if not isinstance(out.get("kind"), str):
            return Problem(f"output {name!r} has no kind")
        sha256 = out.get("sha256")
        if sha256 is not None and (not isinstance(sha256, str) or not SHA256.fullmatch(sha256)):
            return Problem(f"output {name!r} has no valid sha256")
        if names.setdefault(filename, digest) != digest:
            return Problem(f"two outputs name the file {filename!r} with different contents")
    sizes: dict[str, int] = {}
    for out in outputs.values():
        if sizes.setdefault(out["digest"], out["size"]) != out["size"]:
            return Problem(f"it gives object {out['digest']} two different sizes")
    return None
