"""Namespaces of a remote cache: a pull-request job writes its own, and reads its own and main's.

  <remote>/                         main's namespace (what runs without --remote-namespace read and write)
  <remote>/namespaces/<name>/       a namespace: a remote cache of its own (format.json, objects/, nodes/)

A run with ``--remote-namespace NAME`` pushes only to its namespace, and pulls from it first, then from main's.
A run without one reads and writes main's namespace only: it never reads a pull request's namespace. Each
namespace is a whole prefix (its objects included), so a store's access control can give a PR job's credentials
write access to ``namespaces/pr-*`` and read access to the rest. Wherever a result comes from, it is reused only
when a key the project trusts signed it (`storage.signing`): a PR job that writes into main's namespace anyway
(a misconfigured bucket) publishes nothing main reuses unless its key is trusted.
"""

from __future__ import annotations

import re
from typing import Any

from trtflow.errors import UsageError
from trtflow.storage.remote.cache import RemoteCache

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
FOLDER = "namespaces"


def namespace_url(url: str, namespace: str) -> str:
    if not NAME.fullmatch(namespace):
        raise UsageError(f"remote namespace {namespace!r} is not usable",
                         hint="use letters, digits and . _ - (at most 64), e.g. pr-123")
    return f"{url.rstrip('/')}/{FOLDER}/{namespace}"


class NamespacedRemote:
    """A remote cache seen from a namespace: ``layers`` are read in order (own, then main's); ``push`` writes to
    the own namespace only. Everything else (transfers of a run's executor) is the own namespace's."""

    def __init__(self, url: str, namespace: str, *, digest: str | None = None) -> None:
        self.base_url = url
        self.namespace = namespace
        self.own = RemoteCache(namespace_url(url, namespace), digest=digest)
        self.main = RemoteCache(url, digest=digest)
        self.layers = [self.own, self.main]
        self.url = self.own.url

    def __repr__(self) -> str:
        return f"NamespacedRemote({self.base_url!r}, {self.namespace!r})"

    def check(self) -> None:
        self.main.check()
        from trtflow.storage.remote.directory import DirectoryBackend

        backend = self.main._backend
        if isinstance(backend, DirectoryBackend):  # a folder of the directory remote; an S3 prefix needs none
            backend.tree.mkdir(FOLDER)
            backend.tree.mkdir((FOLDER, self.namespace))
        self.own.check()

    def get_manifest(self, key: str) -> dict[str, Any] | None:
        for layer in self.layers:
            manifest = layer.get_manifest(key)
            if manifest is not None:
                return manifest
        return None

    def __getattr__(self, name: str) -> Any:  # push, pull_objects, upload_outputs...: the own namespace's
        if name.startswith("__") or name in ("own", "main", "layers"):
            raise AttributeError(name)
        return getattr(self.own, name)
