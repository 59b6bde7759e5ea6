"""Small real stages defined in-process for engine tests (no entry points needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from trtflow.stage import Input, Output, Stage, StageContext, StageParams


class SourceParams(StageParams):
    value: str = Field(default="x", description="Content to write.")
    precision: str = Field(default="fp32", description="A parameter matrices can fan out over.")
    profile: dict | None = Field(default=None, description="A resolved profile.")


class ConsumeParams(StageParams):
    suffix: str = Field(default="", description="Appended to the input.")
    precision: str = Field(default="fp32", description="Matrix parameter.")


def _write_source(ctx: StageContext, inputs: dict[str, Path], params: SourceParams) -> dict[str, Any]:
    ctx.output("out").write_text(params.value)
    return {"len": len(params.value)}


def _consume(ctx: StageContext, inputs: dict[str, Path], params: ConsumeParams) -> dict[str, Any]:
    ctx.output("out").write_text(inputs["model"].read_text() + params.suffix)
    return {}


SOURCE = Stage("source", "1", "writes a value", SourceParams, _write_source,
               outputs={"out": Output("onnx", "out.txt")}, environment=("python",))
CONSUME = Stage("consume", "1", "appends a suffix", ConsumeParams, _consume,
                inputs={"model": Input("onnx")}, outputs={"out": Output("onnx", "out.txt")})
REPORTER = Stage("reporter", "1", "metrics only", ConsumeParams, _consume,
                 inputs={"model": Input("onnx")}, outputs={"out": Output("metrics", "m.json")})
STAGES = {s.name: s for s in (SOURCE, CONSUME, REPORTER)}


def get_stage(name: str) -> Stage:
    from trtflow.errors import RecipeError, did_you_mean

    if name not in STAGES:
        raise RecipeError(f"unknown stage {name!r}", hint=did_you_mean(name, list(STAGES)))
    return STAGES[name]
