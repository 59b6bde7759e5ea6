"""export: a PyTorch model (or an existing ONNX file) -> a checked ONNX model.

The exported model is checked with onnx.checker and run with ONNX Runtime against PyTorch on a sample
input, so a broken export fails here rather than three stages later in a TensorRT build.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trtflow.stage import ONNX, Output, Stage, StageContext, StageFailed, StageParams

DTYPES = Literal["float32", "float16", "bfloat16", "int64", "int32", "bool"]


class InputDef(StageParams):
    shape: list[int] = Field(description="Shape of the sample input used to trace and check the model.")
    dtype: DTYPES = Field(default="float32", description="Element type of the input.")
    dynamic_axes: dict[int, str] = Field(
        default_factory=dict,
        description="Axes that may change at run time, e.g. {0: batch} or {0: batch, 1: seq}.",
    )
    low: float = Field(default=0.0, description="Lower bound of the random sample values (integers: inclusive).")
    high: float = Field(default=1.0, description="Upper bound of the random sample values (integers: exclusive).")


class Params(StageParams):
    model: str = Field(
        description="The model: 'python:path/to/file.py:factory' or 'python:package.module:factory' (a function "
        "returning a torch.nn.Module; this runs that code), or a path to an existing .onnx file.",
    )
    factory_args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the factory.")
    checkpoint: str | None = Field(
        default=None,
        description="Optional state_dict file (.pt/.pth) loaded with torch.load(weights_only=True) into the model.",
    )
    inputs: dict[str, InputDef] = Field(
        default_factory=dict,
        description="Model inputs in forward() order: name -> sample shape, dtype, dynamic axes. Required for "
        "PyTorch models.",
    )
    outputs: list[str] = Field(default_factory=lambda: ["output"], description="Names given to the outputs.")
    opset: int = Field(default=17, ge=9, le=23, description="ONNX opset version to export with.")
    dynamo: bool = Field(default=False, description="Use the torch.export-based exporter instead of TorchScript.")
    check: bool = Field(default=True, description="Check the ONNX file against PyTorch with ONNX Runtime.")
    atol: float = Field(default=1e-4, ge=0, description="Absolute tolerance of the ONNX Runtime check.")
    rtol: float = Field(default=1e-3, ge=0, description="Relative tolerance of the ONNX Runtime check.")
    seed: int = Field(default=0, description="Seed of the sample input.")

    @field_validator("model")
    @classmethod
    def _model_form(cls, value: str) -> str:
        from trtflow.callables import validate_spec

        if value.endswith(".onnx") and not value.startswith("python:"):
            return value
        return validate_spec(value)

    @model_validator(mode="after")
    def _inputs_for_torch(self) -> Params:
        if not self.is_onnx_file and not self.inputs:
            raise ValueError("'inputs' is required to export a PyTorch model (name -> {shape, dtype, dynamic_axes})")
        return self

    @property
    def is_onnx_file(self) -> bool:
        return self.model.endswith(".onnx") and not self.model.startswith("python:")


def _files(params: Params) -> list[str]:
    from trtflow.callables import callable_files

    files = [params.model] if params.is_onnx_file else callable_files(params.model)
    if params.checkpoint:
        files.append(params.checkpoint)
    return files


def _environment(params: Params) -> list[str]:
    facts = ["onnx"]
    if not params.is_onnx_file:
        facts.append("torch")
    if params.check:
        facts.append("onnxruntime")
    return facts


def _sample_inputs(params: Params) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(params.seed)
    samples = {}
    for name, spec in params.inputs.items():
        if spec.dtype in ("int64", "int32"):
            samples[name] = rng.integers(int(spec.low), max(int(spec.high), int(spec.low) + 1), size=spec.shape,
                                         dtype=spec.dtype)
        elif spec.dtype == "bool":
            samples[name] = rng.random(spec.shape) > 0.5
        else:
            samples[name] = rng.uniform(spec.low, spec.high, size=spec.shape).astype("float32")
    return samples


def _build_model(ctx: StageContext, params: Params) -> Any:
    import torch

    factory = ctx.load_callable(params.model, "model factory")
    try:
        model = factory(**params.factory_args)
    except Exception as exc:
        ctx.log.exception("model factory failed")
        raise StageFailed(f"the model factory {params.model!r} raised {type(exc).__name__}: {exc}",
                          hint="fix the factory (the full traceback is in the log)") from exc
    if not isinstance(model, torch.nn.Module):
        raise StageFailed(f"the model factory {params.model!r} returned {type(model).__name__}, not a torch.nn.Module")
    if params.checkpoint:
        path = ctx.resolve(params.checkpoint)
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise StageFailed(f"cannot load checkpoint {params.checkpoint!r} with weights_only=True: {exc}",
                              hint="save a plain state_dict (torch.save(model.state_dict(), path))") from exc
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            raise StageFailed(f"checkpoint {params.checkpoint!r} does not fit the model: {exc}") from exc
    return model.eval()


def _torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
            "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}[name]


def _export_torch(ctx: StageContext, params: Params, target: Path) -> dict[str, Any]:
    import warnings

    import torch

    model = _build_model(ctx, params)
    samples = _sample_inputs(params)
    args = tuple(torch.from_numpy(samples[n]).to(_torch_dtype(spec.dtype)) for n, spec in params.inputs.items())
    dynamic_axes = {n: dict(spec.dynamic_axes) for n, spec in params.inputs.items() if spec.dynamic_axes}
    ctx.progress(0.1, "exporting")
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            if params.dynamo:
                dynamic_shapes = {n: {ax: torch.export.Dim.AUTO for ax in spec.dynamic_axes}
                                  for n, spec in params.inputs.items()} or None
                program = torch.onnx.export(model, args, dynamo=True, input_names=list(params.inputs),
                                            output_names=params.outputs, opset_version=params.opset,
                                            dynamic_shapes=dynamic_shapes)
                program.save(str(target))
            else:
                torch.onnx.export(model, args, str(target), input_names=list(params.inputs),
                                  output_names=params.outputs, opset_version=params.opset,
                                  dynamic_axes=dynamic_axes or None, do_constant_folding=True, dynamo=False)
    except Exception as exc:
        ctx.log.exception("torch.onnx.export failed")
        raise StageFailed(f"torch.onnx.export failed: {type(exc).__name__}: {str(exc)[:500]}",
                          hint="see the log; try another opset, or dynamo: true") from exc
    with torch.no_grad():
        expected = model(*args)
    if isinstance(expected, torch.Tensor):
        expected = (expected,)
    return {"samples": samples, "expected": [t.float().numpy() for t in expected]}


def _check(ctx: StageContext, params: Params, path: Path, reference: dict[str, Any] | None) -> dict[str, Any]:
    import numpy as np
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:
        raise StageFailed(f"the ONNX model does not pass onnx.checker: {str(exc)[:500]}") from exc
    if not params.check:
        return {"checked": False}
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise StageFailed(f"ONNX Runtime cannot load the model: {str(exc)[:500]}") from exc
    if reference is None:
        return {"checked": "loads in ONNX Runtime"}
    actual = session.run(None, reference["samples"])
    worst = 0.0
    for i, (exp, got) in enumerate(zip(reference["expected"], actual, strict=False)):
        got = np.asarray(got, dtype=np.float32)
        if exp.shape != got.shape:
            raise StageFailed(f"output {i}: ONNX Runtime shape {got.shape} differs from PyTorch {exp.shape}")
        diff = float(np.max(np.abs(exp - got))) if exp.size else 0.0
        worst = max(worst, diff)
        if not np.allclose(got, exp, atol=params.atol, rtol=params.rtol):
            raise StageFailed(
                f"output {params.outputs[i] if i < len(params.outputs) else i}: ONNX Runtime differs from PyTorch "
                f"by up to {diff:.3g} (atol {params.atol}, rtol {params.rtol})",
                hint="the export is not faithful; check unsupported ops in the log, or loosen atol/rtol",
            )
    return {"checked": True, "max_abs_diff_vs_torch": worst}


def _describe(path: Path) -> dict[str, Any]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    init = {i.name for i in model.graph.initializer}

    def shape(value: Any) -> list[Any]:
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    return {
        "opset": max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=None),
        "nodes": len(model.graph.node),
        "inputs": {i.name: shape(i) for i in model.graph.input if i.name not in init},
        "outputs": {o.name: shape(o) for o in model.graph.output},
        "size_bytes": path.stat().st_size,
    }


def run(ctx: StageContext, inputs: dict[str, Path], params: Params) -> dict[str, Any]:
    target = ctx.output("model")
    if params.is_onnx_file:
        source = ctx.resolve(params.model)
        if not source.is_file():
            raise StageFailed(f"ONNX file {params.model!r} not found (looked at {source})")
        shutil.copyfile(source, target)
        try:
            import onnx

            onnx.load(str(target), load_external_data=False)
        except Exception as exc:
            raise StageFailed(f"{params.model!r} is not a loadable ONNX file: {str(exc)[:300]}",
                              hint="re-export it; the file may be truncated or not ONNX at all") from exc
        reference = None
    else:
        reference = _export_torch(ctx, params, target)
    ctx.progress(0.7, "checking")
    check = _check(ctx, params, target, reference)
    summary = _describe(target)
    summary.update(check)
    ctx.log.info("exported %s: %s", params.model, summary)
    return summary


stage = Stage(
    name="export",
    version="1",
    description="PyTorch model (or existing ONNX file) to a checked ONNX model.",
    params=Params,
    run=run,
    outputs={"model": Output(ONNX, "model.onnx", "The exported ONNX model.")},
    environment=_environment,
    files=_files,
    preload=("torch", "onnx", "onnxruntime"),
)
