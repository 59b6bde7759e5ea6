"""Small real stages defined in-process for engine tests (no entry points needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from trtflow.stage import CodeReference, Input, Output, Stage, StageContext, StageParams


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


class ReaderParams(StageParams):
    path: str = Field(description="A data file, relative to the recipe.")


class CoderParams(StageParams):
    model: CodeReference = Field(description="A python: callable returning a string.")


def _read(ctx: StageContext, inputs: dict[str, Path], params: ReaderParams) -> dict[str, Any]:
    ctx.output("out").write_bytes(ctx.resolve(params.path).read_bytes())
    return {}


def _code(ctx: StageContext, inputs: dict[str, Path], params: CoderParams) -> dict[str, Any]:
    ctx.output("out").write_text(str(ctx.load_callable(params.model, "model factory")()))
    return {}


SOURCE = Stage("source", "1", "writes a value", SourceParams, _write_source,
               outputs={"out": Output("onnx", "out.txt")}, environment=("python",))
CONSUME = Stage("consume", "1", "appends a suffix", ConsumeParams, _consume,
                inputs={"model": Input("onnx")}, outputs={"out": Output("onnx", "out.txt")})
REPORTER = Stage("reporter", "1", "metrics only", ConsumeParams, _consume,
                 inputs={"model": Input("onnx")}, outputs={"out": Output("metrics", "m.json")})
READER = Stage("reader", "1", "copies a data file", ReaderParams, _read, outputs={"out": Output("onnx", "out.bin")},
               files=lambda p: [p.path])
CODER = Stage("coder", "1", "writes what a python: callable returns", CoderParams, _code,
              outputs={"out": Output("onnx", "out.txt")})
STAGES = {s.name: s for s in (SOURCE, CONSUME, REPORTER, READER, CODER)}


def get_stage(name: str) -> Stage:
    from trtflow.errors import RecipeError, did_you_mean

    if name not in STAGES:
        raise RecipeError(f"unknown stage {name!r}", hint=did_you_mean(name, list(STAGES)))
    return STAGES[name]
