"""Gate verdicts: the one record a quality gate returns, the engine acts on and every report reads.

A stage's gate (`trtflow.stage.Stage.gate`) returns `GateVerdict` objects (a plain string is a failure, for gates
written before verdicts had a type). Each verdict says what it judged and how sure it is:

- ``outcome``: ``pass`` (within the threshold with confidence), ``fail`` (beyond it with confidence) or
  ``inconclusive`` (the measurement could not tell, even at its cap);
- ``figure``, ``estimate``, ``interval`` (95% or the verdict's own confidence), ``threshold``, ``unit``;
- ``basis``: how the comparison was made: ``paired A/B`` (the reference re-measured beside the candidate, in
  interleaved windows), ``stored figures`` (against figures recorded earlier: drift between runs is not
  cancelled), ``measured`` (a figure against a fixed limit);
- ``pairs``: the A/B pairs it rests on; ``power``: what it can detect (the smallest change it fails 90% of the
  time at the noise it measured); ``reason``: the sentence users read;
- ``primary``: the verdict decides the node (its objective point, or an explicit limit); the others are reported;
- ``on_inconclusive``: ``fail`` (the default: an undecided gate fails the node, with its own exit code, never a
  silent pass) or ``warn`` (it is reported and fails nothing).

The engine records the verdicts it judged for each node in the run's journal (`with_verdicts`), and the reports
read them back with `recorded`: nothing else reads or writes their shape.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

Outcome = Literal["pass", "fail", "inconclusive"]
OnInconclusive = Literal["fail", "warn"]
OUTCOMES: tuple[str, ...] = ("pass", "fail", "inconclusive")
PAIRED = "paired A/B"
STORED = "stored figures"
MEASURED = "measured"
#: The key under which a node's verdicts are recorded with its summary in the journal.
RECORD_KEY = "verdicts"


@dataclass(frozen=True)
class GateVerdict:
    gate: str
    outcome: Outcome
    reason: str
    where: str = ""
    figure: str = ""
    estimate: float | None = None
    interval: tuple[float, float] | None = None
    threshold: float | None = None
    unit: str = ""
    basis: str = MEASURED
    pairs: int | None = None
    primary: bool = True
    power: str | None = None
    on_inconclusive: OnInconclusive = "fail"

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"gate verdict outcome {self.outcome!r} is none of {OUTCOMES}")

    @classmethod
    def failure(cls, message: str, gate: str = "gate") -> GateVerdict:
        """A failure without figures (what a gate that returns messages means by one)."""
        return cls(gate=gate, outcome="fail", reason=message)

    @property
    def blocking(self) -> bool:
        """Does this verdict fail its node: a primary fail, or a primary inconclusive under on_inconclusive fail."""
        return self.primary and (self.outcome == "fail" or (self.outcome == "inconclusive"
                                                             and self.on_inconclusive == "fail"))

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["interval"] = list(self.interval) if self.interval is not None else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GateVerdict | None:
        """A verdict from its recorded form; None for anything that is not one (a damaged or foreign record)."""
        outcome = data.get("outcome", data.get("verdict"))  # "verdict": the untyped records of trtflow <= 0.x
        if outcome not in OUTCOMES:
            return None
        interval = data.get("interval")
        pairs = data.get("pairs")
        return cls(
            gate=str(data.get("gate") or "gate"), outcome=outcome,
            reason=str(data.get("reason", data.get("message", ""))), where=str(data.get("where") or ""),
            figure=str(data.get("figure") or ""), estimate=_number(data.get("estimate")),
            interval=(float(interval[0]), float(interval[1])) if isinstance(interval, (list, tuple))
            and len(interval) == 2 and all(_number(v) is not None for v in interval) else None,
            threshold=_number(data.get("threshold")), unit=str(data.get("unit") or ""),
            basis=str(data.get("basis") or MEASURED), pairs=pairs if isinstance(pairs, int) else None,
            primary=bool(data.get("primary", True)), power=data.get("power") if isinstance(data.get("power"), str)
            else None, on_inconclusive="warn" if data.get("on_inconclusive") == "warn" else "fail")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value) else None


def as_verdicts(returned: Iterable[GateVerdict | str]) -> list[GateVerdict]:
    """What a gate returned, as verdicts: a string is a failure message."""
    found = []
    for item in returned:
        if isinstance(item, GateVerdict):
            found.append(item)
        elif isinstance(item, str):
            found.append(GateVerdict.failure(item))
        else:
            raise TypeError(f"a gate returned {type(item).__name__}; expected GateVerdict or a failure message")
    return found


def failures(verdicts: Sequence[GateVerdict]) -> list[str]:
    """The messages of the verdicts that fail their node."""
    return [v.reason for v in verdicts if v.blocking]


def only_inconclusive(verdicts: Sequence[GateVerdict]) -> bool:
    """The node fails only because a gate could not decide (no verdict failed outright)."""
    blocking = [v for v in verdicts if v.blocking]
    return bool(blocking) and all(v.outcome == "inconclusive" for v in blocking)


def accepted(verdicts: Sequence[GateVerdict]) -> bool:
    """Every primary verdict passed: the node's result may become the reference later runs are compared with
    (an inconclusive one, even under on_inconclusive warn, never does: a step too small to tell must not become
    the next night's reference)."""
    return all(v.outcome == "pass" for v in verdicts if v.primary)


def with_verdicts(summary: Mapping[str, Any] | None, verdicts: Sequence[GateVerdict]) -> dict[str, Any]:
    """A node's summary as the journal records it: the stage's summary and the engine's verdicts."""
    recorded = dict(summary or {})
    if verdicts:
        recorded[RECORD_KEY] = [v.as_dict() for v in verdicts]
    else:
        recorded.pop(RECORD_KEY, None)
    return recorded


def recorded(summary: Any) -> list[GateVerdict]:
    """The verdicts a recorded summary holds (the reports' one way to read them)."""
    items = summary.get(RECORD_KEY) if isinstance(summary, Mapping) else None
    if not isinstance(items, list):
        return []
    return [v for v in (GateVerdict.from_dict(item) for item in items if isinstance(item, Mapping)) if v is not None]
