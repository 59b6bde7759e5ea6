"""Namespaces of a remote cache: a pull-request job writes its own, and reads its own and main's.

  <remote>/                         main's namespace (what runs without --remote-namespace read and write)
  <remote>/namespaces/<name>/       a namespace: a remote cache of its own (format.json, objects/, nodes/)

A run with ``--remote-namespace NAME`` pushes only to its namespace, and pulls from it first, then from main's.
A run without one reads and writes main's namespace only: it reads a pull request's namespace only when told to
(``--remote-read-namespace pr-7``), and reuses from it only what a key the project trusts signed. Each
namespace is a whole prefix (its objects included), so a store's access control can give a PR job's credentials
write access to ``namespaces/pr-*`` and read access to the rest. Wherever a result comes from, it is reused only
when a key the project trusts signed it (`storage.signing`): a PR job that writes into main's namespace anyway
(a misconfigured bucket) publishes nothing main reuses unless its key is trusted.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from trtflow.errors import UsageError
from trtflow.storage.remote.cache import RemoteCache

log = logging.getLogger("trtflow.remote")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
FOLDER = "namespaces"


def namespace_url(url: str, namespace: str) -> str:
    if not NAME.fullmatch(namespace):
        raise UsageError(f"remote namespace {namespace!r} is not usable",
                         hint="use letters, digits and . _ - (at most 64), e.g. pr-123")
    return f"{url.rstrip('/')}/{FOLDER}/{namespace}"


class NamespacedRemote:
    """A remote cache seen from a namespace (None: main's): ``layers`` are read in order (own, main's, then each of
    ``also_read``, e.g. the namespace of a pull request whose key main trusts); ``push`` writes to the own namespace
    only. Everything else (transfers of a run's executor) is the own namespace's."""

    def __init__(self, url: str, namespace: str | None, *, digest: str | None = None,
                 also_read: tuple[str, ...] = ()) -> None:
        self.base_url = url
        self.namespace = namespace
        self.main = RemoteCache(url, digest=digest)
        self.own = RemoteCache(namespace_url(url, namespace), digest=digest) if namespace else self.main
        extra = [RemoteCache(namespace_url(url, n), digest=digest) for n in dict.fromkeys(also_read)
                 if n != namespace]
        self.layers = list({id(r): r for r in (self.own, self.main, *extra)}.values())
        self.url = self.own.url

    def __repr__(self) -> str:
        return f"NamespacedRemote({self.base_url!r}, {self.namespace!r})"

    def check(self) -> None:
        self.main.check()
        from trtflow.storage.remote.directory import DirectoryBackend

        backend = self.main._backend
        if isinstance(backend, DirectoryBackend) and self.namespace:  # an S3 prefix needs no folder
            backend.tree.mkdir(FOLDER)
            backend.tree.mkdir((FOLDER, self.namespace))
        self.own.check()
        from trtflow.storage.remote.errors import RemoteError

        for layer in list(self.layers):
            if layer in (self.own, self.main):
                continue
            try:
                layer.check()
            except RemoteError as exc:  # a namespace only read that is not there (yet) holds nothing
                log.warning("not reading %s: %s", layer.url, exc.message)
                self.layers.remove(layer)

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
