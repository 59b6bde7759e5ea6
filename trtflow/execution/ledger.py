"""What the nodes of a run produced, as the run knows it: per node, the key of the result it used, its outputs'
digests and sizes, and its gate verdict as judged in this run.

Ownership: the run's thread (the one that runs the scheduling loop) is the only one that records into the
`Ledger` or reads it; recording from another thread is refused with an internal error. A node's thread never sees
the ledger: when the loop hands a node out it gives it an `Upstream`, a frozen copy of its producers' records.
Every producer has finished by then, so the copy is complete and nothing in it changes while the node runs; what
the node produced comes back to the run's thread in its result (`lifecycle.Finished`) and is recorded there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from trtflow.errors import InternalError
from trtflow.recipe.expand import ConcreteNode


@dataclass(frozen=True)
class Produced:
    """One node's result as a consumer needs it."""

    key: str | None
    outputs: Mapping[str, tuple[str, int]]  # output name -> (digest, size in bytes)
    verdict: tuple[str, ...] | None = None  # its gate's failures as judged in this run; None: the stage has no gate

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any], verdict: list[str] | None) -> Produced:
        outputs = {name: (out["digest"], int(out.get("size", 0)))
                   for name, out in (manifest.get("outputs") or {}).items()}
        return cls(manifest.get("key"), MappingProxyType(outputs), None if verdict is None else tuple(verdict))


@dataclass(frozen=True)
class Upstream:
    """A node's producers as the ledger knew them when the node was handed out (read by the node's thread)."""

    produced: Mapping[str, Produced] = field(default_factory=dict)

    @property
    def digests(self) -> dict[tuple[str, str], str]:
        return {(node, out): digest for node, p in self.produced.items() for out, (digest, _) in p.outputs.items()}

    @property
    def verdicts(self) -> dict[str, list[str]]:
        return {node: list(p.verdict) for node, p in self.produced.items() if p.verdict is not None}

    def key(self, node: str) -> str:
        key = self.produced[node].key
        if key is None:
            raise InternalError(f"the result of {node} has no key")
        return key

    def outputs(self, node: str) -> Mapping[str, tuple[str, int]]:
        p = self.produced.get(node)
        return p.outputs if p is not None else {}


class Ledger:
    def __init__(self) -> None:
        self._owner = threading.get_ident()
        self._produced: dict[str, Produced] = {}

    def _check_thread(self) -> None:
        if threading.get_ident() != self._owner:
            raise InternalError("the run's ledger was used from a node's thread; only the run's thread owns it")

    def record(self, node: str, produced: Produced) -> None:
        self._check_thread()
        self._produced[node] = produced

    def has_output(self, node: str, out: str) -> bool:
        self._check_thread()
        p = self._produced.get(node)
        return p is not None and out in p.outputs

    def verdict(self, node: str) -> tuple[str, ...] | None:
        self._check_thread()
        p = self._produced.get(node)
        return p.verdict if p is not None else None

    def input_sizes(self, node: ConcreteNode) -> dict[str, int]:
        """Bytes per input slot of ``node``: an input travels with its producer's other outputs."""
        self._check_thread()
        sizes: dict[str, int] = {}
        for slot, refs in node.upstream.items():
            producers = {src for src, _ in refs}
            sizes[slot] = sum(size for src in producers if src in self._produced
                              for _, size in self._produced[src].outputs.values())
        return sizes

    def upstream(self, nodes: Iterable[str]) -> Upstream:
        self._check_thread()
        return Upstream(MappingProxyType({n: self._produced[n] for n in nodes if n in self._produced}))
