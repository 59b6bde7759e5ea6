"""What a gated benchmark measures beside its candidate: the reference artifact, opened like the candidate.

The engine lays the reference out for the stage (`trtflow.stage.Reference`: a pinned baseline's artifact, or the
node's last accepted result): its model file with what it needs beside it, the recipe and code files the node read,
and what was recorded with it (params, figures). The benchmark opens it with the candidate's own runtime and *the
reference's recorded settings* (`PINNED_SETTINGS`, `pinned_params`: a regression from settings, such as ONNX
Runtime's graph optimisations switched off, fails like one from the model) and times it in pairs with the
candidate at the gate point (`measure.timing.ab`). When it cannot (nothing laid
out, another backend, a model that does not open here), the reason is kept and the gate compares stored figures,
saying so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from trtflow.stage import Pin, Reference

from ..settings import GateFields
from ..statistics.paired import ALPHA_PASS, Budget, family_alpha
from ..timing.ab import COST_BUDGET, PairPlan, block_length, look_marks
from .baseline import baseline_reference
from .gates import allowed_ratio

DEFAULT_PERCENT = 10.0
#: The settings of how a model runs that the reference keeps as it was pinned (the rest, such as shapes and the
#: timing plan, are the point's and the candidate's).
PINNED_SETTINGS = ("onnxruntime", "include_host_transfers", "use_cuda_graph", "spin_wait")
#: The benchmark's parameters (any pydantic model holding `PINNED_SETTINGS`).
P = TypeVar("P", bound=BaseModel)


def pinned_params(params: P, record_params: Mapping[str, Any]) -> tuple[P, list[str]]:
    """``params`` with the reference's recorded `PINNED_SETTINGS` (the reference is measured as it was pinned),
    and what differs from the candidate's, said as ``name: reference -> candidate``."""
    changed: dict[str, Any] = {}
    said = []
    current = params.model_dump(mode="json")
    for name in PINNED_SETTINGS:
        if name in record_params and name in current and record_params[name] != current[name]:
            changed[name] = record_params[name]
            said.append(f"{name}: {record_params[name]} -> {current[name]}")
    if not changed:
        return params, []
    return type(params).model_validate({**current, **changed}), said


def reference_request(params: GateFields, resolve: Any, node: str) -> str | Mapping[str, Any] | None:
    """`Stage.reference` of a benchmark: the artifact a pinned baseline file pins for the node, or the node's last
    accepted result when it gates on regressions without a baseline, or nothing."""
    if params.baseline is not None:
        return baseline_reference(params.baseline, params.baseline_node, resolve, node)
    if params.max_regression_percent is not None:
        return "accepted"
    return None


def compares(params: GateFields) -> bool:
    """`Stage.compares`: the node makes a regression comparison (its false alarms count in the recipe's)."""
    return params.baseline is not None or params.max_regression_percent is not None


@dataclass
class Planned:
    """The reference of one benchmark run: what it is, and why it is not re-measured (``why``) if it is not."""

    name: str
    identity: str | None = None
    record: Mapping[str, Any] = field(default_factory=dict)
    why: str | None = None
    settings: list[str] = field(default_factory=list)  # pinned settings that differ from the candidate's

    @property
    def points(self) -> list[dict[str, Any]]:
        """The reference's stored figures (a baseline entry's points, or the accepted result's summary's)."""
        points = self.record.get("points")
        if points is None:
            points = (self.record.get("summary") or {}).get("points")
        return [dict(p) for p in points or [] if isinstance(p, Mapping)]

    @property
    def generation(self) -> list[dict[str, Any]]:
        """The reference's stored generation levels (a baseline entry's, or the accepted result's summary's)."""
        levels = self.record.get("generation")
        if levels is None:
            levels = (self.record.get("summary") or {}).get("generation")
        return [dict(level) for level in levels or [] if isinstance(level, Mapping)]

    @property
    def params(self) -> Mapping[str, Any]:
        return self.record.get("params") or {}

    def summary(self, paired: Mapping[str, Any] | None) -> dict[str, Any]:
        """What the node's summary records of its reference (the gate reads it back)."""
        return {"name": self.name, "identity": self.identity, "basis": "paired A/B" if paired else "stored figures",
                "why": None if paired else self.why, "paired": dict(paired) if paired else None,
                "points": self.points, **({"generation": self.generation} if self.generation else {}),
                "facts": dict(self.record.get("facts") or
                                                     (self.record.get("summary") or {}).get("hardware") or {}),
                "key": self.record.get("key"), "settings": list(self.settings)}


def planned(params: GateFields, reference: Reference | None, resolve: Any, node: str) -> Planned | None:
    """The reference this run measures against (None: the node makes no comparison, or has nothing to compare
    with yet)."""
    if not compares(params) or reference is None:
        return None
    identity = None
    if params.baseline is not None:
        wanted = baseline_reference(params.baseline, params.baseline_node, resolve, node)
        pin = Pin.from_dict(wanted) if wanted is not None else None
        identity = pin.identity if pin is not None else None
    return Planned(reference.name, identity, reference.record,
                   None if reference.missing is None else f"the reference could not be laid out: {reference.missing}")


def torch_factory(spec: str, reference: Reference, resolve: Any, project_root: Path) -> str | None:
    """The reference's copy of a ``python:path/file.py:factory`` model factory, as a reference to load (None: the
    factory is not a file the reference pinned)."""
    body, _, attr = spec[len("python:"):].rpartition(":")
    if not body.endswith(".py"):
        return None
    try:
        relative = resolve(body).resolve().relative_to(project_root.resolve()).as_posix()
    except (ValueError, OSError):
        return None
    copy = reference.files.get(relative)
    return f"python:{copy}:{attr}" if copy is not None else None


def gate_batch(params: GateFields, batch_sizes: Sequence[int]) -> int | None:
    """The batch size of the gate point among those this run measures (`measure.judging.gates.gate_point`)."""
    if not batch_sizes:
        return None
    if params.gate_batch_size is not None:
        return params.gate_batch_size if params.gate_batch_size in batch_sizes else None
    return max(batch_sizes)


def pair_plan(params: GateFields, window_s: float, min_seconds: float, family: int, batch: int, streams: int = 1,
              seed: int | None = None, cost_budget: float = COST_BUDGET) -> PairPlan:
    """How the gate point is paired: the figure and threshold its stopping rule watches, the recipe's share of the
    error budget, each side's block in a round (`measure.timing.ab.block_length` of the point's window) and the
    looks (`measure.timing.ab.look_marks`) within the cost budget: both sides timed at most ``cost_budget``
    times what the point times ungated at least (``min_seconds``, at least one window)."""
    percent = params.max_regression_percent or DEFAULT_PERCENT
    budget = Budget(family_alpha(family), ALPHA_PASS)
    block = block_length(window_s)
    ungated = max(min_seconds, window_s)
    return PairPlan(batch, streams, params.gate_figure, math.log(allowed_ratio(percent, params.gate_figure)), budget,
                    look_marks(cost_budget), seed, block, window_s, ungated, cost_budget)
