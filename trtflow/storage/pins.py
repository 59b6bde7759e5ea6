"""Pinned artifacts: the reference a comparison re-measures beside its candidate, kept while it is pinned.

A comparison against figures stored from another run cannot tell a 10% change from the host running slower that
day; re-measuring the reference artifact beside the candidate can. So the artifact itself is kept, by digest, in
this store's objects, and gc keeps every object a pin names:

  pins/accepted/<recipe>/<node>.json   the artifact of a node's last *accepted* result (every primary gate
                                       verdict passed): what previous-run gating compares with. A result that
                                       failed or could not be judged never replaces it (no ratchet).
  pins/pinned/<id>.json                artifacts pinned by `trtflow baseline pin` (``id``: the digest of the
                                       pinned files, so pinning the same artifact twice is one pin)

A `Pin` holds, per input slot of the node, the files of the node that produced it (an ONNX model with its external
weights, an engine with engine.json), the recipe and code files the node read (a ``python:`` model factory), and
a record: the node's params and summary when it was pinned. Everything read back is checked: digests and names
are validated before they become paths, and objects are re-hashed before they are laid out for a stage.
"""

from __future__ import annotations

import re
import secrets
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.fingerprint import hash_text, hash_value
from trtflow.storage import records
from trtflow.storage.confined import kinds
from trtflow.storage.confined.tree import Tree
from trtflow.storage.manifest import is_digest, safe_relative_name
from trtflow.userfiles import read_file

FORMAT = "trtflow-pin/1"
MAX_PIN_BYTES = kinds.PIN.cap
MAX_PINNED_FILE_BYTES = 256 * 1024 * 1024  # a project file a pin keeps (a python: factory, a recipe)


def _object(entry: Any) -> dict[str, Any] | None:
    if isinstance(entry, Mapping) and is_digest(entry.get("digest")) and isinstance(entry.get("size"), int) \
            and entry["size"] >= 0:
        return {"digest": entry["digest"], "size": entry["size"]}
    return None


def _safe_path(text: Any) -> bool:
    """A project-relative POSIX path that stays inside the folder it is laid out in."""
    if not isinstance(text, str) or not text or text.startswith("/") or "\\" in text:
        return False
    return all(part not in ("", ".", "..") for part in text.split("/"))


@dataclass(frozen=True)
class Pin:
    """An artifact by the digests of its files, and what was recorded with it."""

    inputs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # slot -> {file, objects: {name: obj}}
    files: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # project-relative path -> obj
    record: Mapping[str, Any] = field(default_factory=dict)

    @property
    def identity(self) -> str:
        """The digest of what the pin keeps (its files, not its record)."""
        return hash_value({"inputs": self.inputs, "files": self.files})[:32]

    def describe(self) -> dict[str, Any]:
        """The pin as a baseline file records it (its files; `from_dict` reads it back)."""
        return {"format": FORMAT, "inputs": {k: dict(v) for k, v in self.inputs.items()},
                "files": {k: dict(v) for k, v in self.files.items()}}

    def as_dict(self) -> dict[str, Any]:
        return dict(self.describe(), record=dict(self.record))

    def digests(self) -> set[str]:
        found = {o["digest"] for slot in self.inputs.values() for o in slot["objects"].values()}
        return found | {o["digest"] for o in self.files.values()}

    @classmethod
    def from_dict(cls, data: Any) -> Pin | None:
        """A pin from its recorded form, or None when anything in it is malformed (it is never half-trusted)."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            return None
        inputs: dict[str, dict[str, Any]] = {}
        for slot, entry in (data.get("inputs") or {}).items():
            if not isinstance(entry, Mapping) or not safe_relative_name(slot) or "/" in slot:
                return None
            objects = {}
            for name, obj in (entry.get("objects") or {}).items():
                checked = _object(obj)
                if checked is None or not safe_relative_name(name):
                    return None
                objects[name] = checked
            if entry.get("file") not in objects:
                return None
            inputs[slot] = {"file": entry["file"], "objects": objects}
        files = {}
        for path, obj in (data.get("files") or {}).items():
            checked = _object(obj)
            if checked is None or not _safe_path(path):
                return None
            files[path] = checked
        record = data.get("record")
        return cls(inputs, files, dict(record) if isinstance(record, Mapping) else {})


@dataclass(frozen=True)
class LaidOut:
    """A pin's files linked into a folder: ``inputs`` slot -> the slot's file, ``files`` path -> its copy;
    ``missing``: why it could not be (then nothing is laid out)."""

    inputs: dict[str, Path] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    missing: str | None = None


def _slug(text: str) -> str:
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_.")[:60] or "x"
    return f"{readable}-{hash_text(text)[:10]}"


class PinStore:
    """The pins of one store (``store`` gives object paths and checks; this class owns ``pins/``). Every file is
    read and written through the store's confined tree (`Tree`): a ``pins/`` folder or a pin file that is
    a link, a pipe or larger than `kinds.PIN` is never followed or read."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.tree = store.tree
        self.root = store.root / "pins"

    # ----- paths (relative to the store)
    def accepted_rel(self, recipe_id: str, node: str) -> tuple[str, ...]:
        return ("pins", "accepted", _slug(recipe_id), f"{_slug(node)}.json")

    def pinned_rel(self, identity: str) -> tuple[str, ...]:
        if not re.fullmatch(r"[0-9a-f]{16,64}", identity):
            raise ValueError(f"not a pin identity: {identity!r}")
        return ("pins", "pinned", f"{identity}.json")

    # ----- reading and writing
    def _read(self, rel: tuple[str, ...]) -> Pin | None:
        try:
            return Pin.from_dict(records.read(self.tree, rel, records.PIN))
        except (OSError, ValueError):
            return None

    def _write(self, rel: tuple[str, ...], pin: Pin) -> None:
        self.tree.write_json(rel, pin.as_dict())

    def read_accepted(self, recipe_id: str, node: str) -> Pin | None:
        return self._read(self.accepted_rel(recipe_id, node))

    def write_accepted(self, recipe_id: str, node: str, pin: Pin) -> None:
        self._write(self.accepted_rel(recipe_id, node), pin)

    def write_pinned(self, pin: Pin) -> str:
        identity = pin.identity
        self._write(self.pinned_rel(identity), pin)
        return identity

    def remove_pinned(self, identity: str) -> bool:
        """Remove a `trtflow baseline pin` pin (its objects go at the next gc, unless something else keeps them);
        False when this store has no such pin."""
        rel = self.pinned_rel(identity)
        try:
            st = self.tree.stat(rel)
        except OSError:
            return False
        if st is None or not stat.S_ISREG(st.st_mode):
            return False
        return self.tree.unlink(rel)

    def all(self) -> list[tuple[Path, Pin | None]]:
        """Every pin file with its pin (None: unreadable), walked without following links."""
        found: list[tuple[Path, Pin | None]] = []
        pending: list[tuple[str, ...]] = [("pins",)]
        while pending:
            folder = pending.pop()
            try:
                entries = self.tree.listdir(folder)
            except OSError:
                continue
            for name, st in entries:
                rel = (*folder, name)
                if stat.S_ISDIR(st.st_mode):
                    pending.append(rel)
                elif stat.S_ISREG(st.st_mode) and name.endswith(".json"):
                    found.append((self.store.shown(rel), self._read(rel)))
        return sorted(found, key=lambda item: str(item[0]))

    def digests(self) -> set[str]:
        """Every object some pin keeps (gc's roots besides the refs)."""
        return {digest for _, pin in self.all() if pin is not None for digest in pin.digests()}

    # ----- making pins
    def keep_files(self, files: Mapping[str, Path]) -> dict[str, dict[str, Any]]:
        """Copy files (project-relative path -> where it is now: the user's files, read only if regular) into the
        store's objects; their entries."""
        kept = {}
        for relative, source in files.items():
            if not _safe_path(relative):
                raise ValueError(f"not a project-relative path: {relative!r}")
            staged = ("tmp", f".pin-{secrets.token_hex(8)}")
            try:
                self.tree.write_bytes(staged, read_file(source, MAX_PINNED_FILE_BYTES))
                digest, size = self.store.put_file(self.tree, staged)
            finally:
                self.tree.unlink(staged)
            kept[relative] = {"digest": digest, "size": size}
        return kept

    # ----- laying out for a stage
    def lay_out(self, pin: Pin, into: Tree, folder: tuple[str, ...]) -> LaidOut:
        """Link the pin's objects into the folder ``folder`` of the held tree ``into`` (a node's scratch folder;
        ``inputs/<slot>/<file>``, ``files/<path>``), each checked against its digest first."""
        wanted = [(obj, (*folder, "inputs", slot, *name.split("/"))) for slot, entry in pin.inputs.items()
                  for name, obj in entry["objects"].items()]
        wanted += [(obj, (*folder, "files", *path.split("/"))) for path, obj in pin.files.items()]
        for obj, _ in wanted:
            if not self.store.object_intact(obj["digest"], obj["size"]):
                return LaidOut(missing=f"its file {obj['digest'][:12]} is not in this store ({self.store.root})")
        for obj, target in wanted:
            source = self.store.object_rel(obj["digest"])
            try:
                self.tree.link_into(source, into, target)
            except OSError:
                with self.store.open_object(obj["digest"]) as f:
                    into.copy_in(target, f, durable=False)
        shown = into.shown
        return LaidOut({slot: shown((*folder, "inputs", slot, *entry["file"].split("/")))
                        for slot, entry in pin.inputs.items()},
                       {path: shown((*folder, "files", *path.split("/"))) for path in pin.files})


def pin_record(node: str, recipe_id: str | None, params: Mapping[str, Any], summary: Mapping[str, Any],
               key: str | None, **extra: Any) -> dict[str, Any]:
    """What a pin records besides its files."""
    return {"node": node, "recipe_id": recipe_id, "params": dict(params), "summary": dict(summary), "key": key,
            "pinned": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra}
