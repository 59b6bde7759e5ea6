"""Two small real stages for the many-input tests, registered as a plugin (entry points) so that the runner
starts them in real worker processes: `emit` writes a value and gates on its length; `gather` takes every
emitted value through one many-slot and records what arrived, from where."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field

from trtflow.stage import Input, Output, Stage, StageContext, StageParams


class EmitParams(StageParams):
    value: str = Field("x", description="Text to write.")
    min_length: int | None = Field(None, description="Gate: the value must be at least this long.")


def _emit(ctx: StageContext, inputs: dict[str, Any], params: EmitParams) -> dict[str, Any]:
    ctx.output("text").write_text(params.value)
    return {"length": len(params.value)}


def _emit_gate(params: EmitParams, summary: Any, gate_ctx: Any) -> list[str]:
    if params.min_length is not None and summary["length"] < params.min_length:
        return [f"length {summary['length']} < min_length {params.min_length}"]
    return []


class GatherParams(StageParams):
    note: str = Field("", description="Unused; lets tests change the node key.")


def _gather(ctx: StageContext, inputs: dict[str, Any], params: GatherParams) -> dict[str, Any]:
    items = inputs["items"]
    entries = [{"folder": Path(p).parent.name, "text": Path(p).read_text(), "source": source}
               for p, source in zip(items, ctx.input_sources["items"], strict=True)]
    ctx.output("gathered").write_text(json.dumps(entries))
    return {"count": len(entries)}


emit = Stage("emit", "1", "writes a value", EmitParams, _emit,
             outputs={"text": Output("text", "value.txt"),
                      "extra": Output("text", "extra/never.txt", "never written", optional=True)},
             gate=_emit_gate, gate_params=("min_length",))
gather = Stage("gather", "1", "gathers values", GatherParams, _gather,
               inputs={"items": Input("text", "every value", many=True, accept_gate_failed=True)},
               outputs={"gathered": Output("metrics", "gathered.json")})
