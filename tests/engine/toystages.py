"""Small real stages defined in-process for engine tests (no entry points needed; `register` makes them a plugin
distribution, for tests of the no-op shortcut, which takes only stages from entry points)."""

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


class MixParams(StageParams):
    path: str = Field(description="A data file, relative to the recipe.")
    make: CodeReference = Field(description="A python: callable returning a string.")
    text: str = Field(default="", description="Text appended.")


def _mix(ctx: StageContext, inputs: dict[str, Path], params: MixParams) -> dict[str, Any]:
    data = ctx.resolve(params.path).read_bytes()
    made = str(ctx.load_callable(params.make, "model factory")()).encode()
    upstream = inputs["model"].read_bytes() if "model" in inputs else b""
    ctx.output("out").write_bytes(b"|".join([data, made, params.text.encode(), upstream]))
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
MIXER = Stage("mixer", "1", "a data file, a python: callable, a text and an optional input, joined",
              MixParams, _mix, inputs={"model": Input("onnx", optional=True)},
              outputs={"out": Output("onnx", "out.bin")}, files=lambda p: [p.path], environment=("numpy",))
STAGES = {s.name: s for s in (SOURCE, CONSUME, REPORTER, READER, CODER, MIXER)}
_VARIABLES = {"source": "SOURCE", "consume": "CONSUME", "reporter": "REPORTER", "reader": "READER", "coder": "CODER",
              "mixer": "MIXER"}


def register(directory: Path) -> list[str]:
    """Write a distribution registering these stages as ``trtflow.stages`` entry points into ``directory``; return
    the folders to put on the module path (``directory`` and the repository, where ``tests`` is found)."""
    info = directory / "trtflow_toy_stages-0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trtflow-toy-stages\nVersion: 0.0\n")
    lines = ["[trtflow.stages]", *(f"{name} = tests.engine.toystages:{var}" for name, var in _VARIABLES.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return [str(directory), str(Path(__file__).resolve().parents[2])]


def get_stage(name: str) -> Stage:
    from trtflow.errors import RecipeError, did_you_mean

    if name not in STAGES:
        raise RecipeError(f"unknown stage {name!r}", hint=did_you_mean(name, list(STAGES)))
    return STAGES[name]
