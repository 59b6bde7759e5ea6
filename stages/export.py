"""export: a PyTorch model (or an existing ONNX file) -> an ONNX model checked at more than one shape.

The exported model is checked with onnx.checker and run with ONNX Runtime against PyTorch (eager) at the
sample shape and, for each dynamic dimension, at other sizes: the min and max of the recipe profiles named in
``profiles``, else a size derived from the sample. An exporter that fixed a size the recipe marked dynamic (the
TorchScript tracer does so for sizes that pass through Python) fails here, naming the shape, the cause and the
fix, rather than one stage later in an ONNX Runtime error that does not point back to the export.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trtflow.stage import ONNX, Output, ProfileSpec, Stage, StageContext, StageFailed, StageParams

from .formats.torch_source import TORCH_SOURCE, write_source

DTYPES = Literal["float32", "float16", "bfloat16", "int64", "int32", "bool"]


class InputDef(StageParams):
    shape: list[int] = Field(description="Shape of the sample input used to trace and check the model.")
    dtype: DTYPES = Field(default="float32", description="Element type of the input.")
    dynamic_axes: dict[int, str] = Field(
        default_factory=dict,
        description="Axes that may change at run time, e.g. {0: batch} or {0: batch, 1: seq}. Axes of "
        "several inputs with the same name always have the same size.",
    )
    low: float = Field(default=0.0, description="Lower bound of the random sample values (integers: inclusive).")
    high: float = Field(default=1.0, description="Upper bound of the random sample values (integers: exclusive).")

    @model_validator(mode="after")
    def _axes_in_shape(self) -> InputDef:
        bad = [axis for axis in self.dynamic_axes if not 0 <= axis < len(self.shape)]
        if bad:
            raise ValueError(f"dynamic_axes names axis {bad[0]}, but the sample shape {self.shape} has rank "
                             f"{len(self.shape)} (axes 0..{len(self.shape) - 1})")
        if any(d < 1 for d in self.shape):
            raise ValueError(f"shape {self.shape}: every dimension of the sample must be >= 1")
        return self


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
        description="Model inputs: name -> sample shape, dtype, dynamic axes. Required for PyTorch models. Named "
        "like forward()'s parameters they are passed by name; otherwise by position, in forward() order.",
    )
    outputs: list[str] = Field(default_factory=lambda: ["output"], description="Names given to the outputs.")
    opset: int = Field(default=17, ge=9, le=23, description="ONNX opset version to export with.")
    dynamo: bool = Field(
        default=False,
        description="Use the torch.export-based exporter instead of TorchScript. It traces sizes symbolically, so "
        "code that computes with sizes stays dynamic; each dynamic_axes name becomes a named torch.export.Dim.",
    )
    check: bool = Field(default=True, description="Check the ONNX file against PyTorch with ONNX Runtime.")
    profiles: list[ProfileSpec] = Field(
        default_factory=list,
        description="Recipe profiles (by name) whose min and max sizes of each dynamic dimension the exported "
        "model is also checked at, e.g. [bs1, bs32]; usually those the build stage uses. Without profiles "
        "each dynamic dimension is checked at one other size (half the sample's, or twice a sample below 4).",
    )
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
        sizes: dict[str, tuple[str, int]] = {}
        for name, spec in self.inputs.items():
            for axis, dim in spec.dynamic_axes.items():
                other = sizes.setdefault(dim, (name, spec.shape[axis]))
                if other[1] != spec.shape[axis]:
                    raise ValueError(f"dim name {dim!r} has size {other[1]} in the sample of {other[0]!r} but "
                                     f"{spec.shape[axis]} in {name!r}; axes with one name must have one size")
        for profile in self.profiles:
            for name, shape_range in profile.shapes.items():
                spec = self.inputs.get(name)
                if spec is None:
                    raise ValueError(f"profile {profile.name!r} gives shapes for {name!r}, which is not one of the "
                                     f"inputs {list(self.inputs)}")
                for axis, (low, high) in enumerate(zip(shape_range.min, shape_range.max, strict=True)):
                    if axis < len(spec.shape) and axis not in spec.dynamic_axes and {low, high} != {spec.shape[axis]}:
                        raise ValueError(f"profile {profile.name!r} varies axis {axis} of {name!r} ({low}..{high}) "
                                         f"but inputs.{name}.dynamic_axes does not mark axis {axis} dynamic")
                if len(shape_range.min) != len(spec.shape):
                    raise ValueError(f"profile {profile.name!r}: {name!r} has rank {len(shape_range.min)} but the "
                                     f"sample shape {spec.shape} has rank {len(spec.shape)}")
        return self

    @property
    def is_onnx_file(self) -> bool:
        return self.model.endswith(".onnx") and not self.model.startswith("python:")

    @property
    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        return {n: dict(spec.dynamic_axes) for n, spec in self.inputs.items() if spec.dynamic_axes}

    def dim_sizes(self) -> dict[str, int]:
        """The sample's size of every dynamic dim name."""
        return {dim: spec.shape[axis] for spec in self.inputs.values() for axis, dim in spec.dynamic_axes.items()}

    def dim_ranges(self) -> dict[str, tuple[int, int]]:
        """Smallest and largest size of each dim name over the profiles (dims no profile covers are left out)."""
        ranges: dict[str, tuple[int, int]] = {}
        for profile in self.profiles:
            for name, shape_range in profile.shapes.items():
                for axis, dim in self.inputs[name].dynamic_axes.items():
                    low, high = shape_range.min[axis], shape_range.max[axis]
                    if dim in ranges:
                        low, high = min(low, ranges[dim][0]), max(high, ranges[dim][1])
                    ranges[dim] = (low, high)
        return ranges


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


# ---------------------------------------------------------------------------------------------------------
# The shapes the model is checked at


@dataclass(frozen=True)
class CheckShape:
    """One set of input shapes to check, and which dim it changes (None: the sample itself)."""

    shapes: dict[str, list[int]]
    dim: str | None = None
    size: int | None = None
    origin: str = "sample"

    @property
    def label(self) -> str:
        shapes = ", ".join(f"{n} {s}" for n, s in self.shapes.items())
        if self.dim is None:
            return f"the sample shape ({shapes})"
        return f"{self.dim} = {self.size} ({self.origin}): {shapes}"


def _other_size(sample: int) -> int:
    return sample // 2 if sample >= 4 else sample * 2


def check_shapes(params: Params) -> list[CheckShape]:
    """The sample shape, then each dynamic dim name at its other sizes (profile min/max, else derived)."""
    sample = {n: list(spec.shape) for n, spec in params.inputs.items()}
    checks = [CheckShape(sample)]
    ranges = params.dim_ranges()
    for dim, size in params.dim_sizes().items():
        if dim in ranges:
            others = [(ranges[dim][0], "profile min"), (ranges[dim][1], "profile max")]
        else:
            others = [(_other_size(size), "derived from the sample")]
        for other, origin in others:
            if other == size or any(c.dim == dim and c.size == other for c in checks):
                continue
            shapes = {n: [other if spec.dynamic_axes.get(axis) == dim else d for axis, d in enumerate(spec.shape)]
                      for n, spec in params.inputs.items()}
            checks.append(CheckShape(shapes, dim, other, origin))
    return checks


def size_one_warnings(params: Params) -> list[str]:
    warnings = []
    for name, spec in params.inputs.items():
        for axis, dim in spec.dynamic_axes.items():
            if spec.shape[axis] == 1:
                warnings.append(
                    f"input {name!r}: axis {axis} ({dim!r}) is dynamic but its sample size is 1: torch.export "
                    "specialises sizes 0 and 1 (the axis may come out fixed), and a size-1 sample hides "
                    "broadcasting mistakes from the TorchScript tracer; use a sample size of 2 or more")
    return warnings


def _sample_inputs(params: Params, shapes: dict[str, list[int]]) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(params.seed)
    samples = {}
    for name, spec in params.inputs.items():
        shape = shapes[name]
        if spec.dtype in ("int64", "int32"):
            samples[name] = rng.integers(int(spec.low), max(int(spec.high), int(spec.low) + 1), size=shape,
                                         dtype=spec.dtype)
        elif spec.dtype == "bool":
            samples[name] = rng.random(shape) > 0.5
        else:
            samples[name] = rng.uniform(spec.low, spec.high, size=shape).astype("float32")
    return samples


# ---------------------------------------------------------------------------------------------------------
# The PyTorch model


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


def _tensors(params: Params, arrays: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {n: torch.from_numpy(arrays[n]).to(_torch_dtype(params.inputs[n].dtype)) for n in params.inputs}


def _flatten(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _flatten(item)]
    return []


def _torch_outputs(model: Any, binding: Any, params: Params, arrays: dict[str, Any]) -> list[Any]:
    import torch

    args, kwargs = binding.call_arguments(_tensors(params, arrays))
    with torch.no_grad():
        result = model(*args, **kwargs)
    return [t.float().numpy() if not t.is_nested else t.to_padded_tensor(0.0).float().numpy()
            for t in _flatten(result)]


def _export(ctx: StageContext, params: Params, model: Any, binding: Any, dynamo: bool, target: Path) -> None:
    """Run one exporter; StageFailed with the known cause and fix when it raises."""
    import warnings

    import torch

    from .formats.torch_export import explain_export_error, export_dynamo, export_torchscript

    sample = _tensors(params, _sample_inputs(params, {n: s.shape for n, s in params.inputs.items()}))
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            if dynamo:
                export_dynamo(model, binding, sample, target, params.dynamic_axes, params.outputs, params.opset,
                              params.dim_ranges())
            else:
                export_torchscript(model, binding, sample, target, params.dynamic_axes, params.outputs,
                                   params.opset)
    except Exception as exc:
        ctx.log.exception("torch.onnx.export failed")
        what, fix = explain_export_error(exc, dynamo)
        raise StageFailed(what, hint=fix) from exc


# ---------------------------------------------------------------------------------------------------------
# Checking the ONNX model at several shapes


@dataclass
class ShapeResult:
    check: CheckShape
    status: Literal["ok", "skipped", "failed", "deviates"]
    detail: str = ""
    max_abs_diff: float | None = None
    node: str | None = None

    def record(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"shapes": self.check.shapes, "status": self.status}
        if self.check.dim is not None:
            entry.update(dim=self.check.dim, size=self.check.size, origin=self.check.origin)
        if self.max_abs_diff is not None:
            entry["max_abs_diff_vs_torch"] = self.max_abs_diff
        if self.detail:
            entry["detail"] = self.detail
        return entry


def _ort_error(error: Exception) -> tuple[str, str | None]:
    """ONNX Runtime's message without its source locations, and the node it names."""
    import re

    text = " ".join(str(error).split())
    node = re.search(r"running (\w+) node\. Name:'([^']*)'", text)
    detail = re.sub(r"/onnxruntime_src/\S+ onnxruntime::.*?\) ", "", text)
    detail = re.sub(r"\S+ [=!<>]=? \S+ was false\. ", "", detail)
    detail = re.sub(r"\[ONNXRuntimeError\] : \d+ : \w+ : ", "", detail)
    return detail[:400], (f"{node.group(1)} node {node.group(2)!r}" if node else None)


def _check_shape(ctx: StageContext, params: Params, session: Any, path: Path, model: Any, binding: Any,
                 check: CheckShape) -> ShapeResult:
    import numpy as np

    from .accuracy.diagnosis import ort_run_step

    arrays = _sample_inputs(params, check.shapes)
    try:
        expected = _torch_outputs(model, binding, params, arrays)
    except Exception as error:
        return ShapeResult(check, "skipped", f"PyTorch itself fails at this shape: {type(error).__name__}: "
                           f"{' '.join(str(error).split())[:300]}")
    feed = {i.name: arrays[i.name] for i in session.get_inputs()}
    try:
        with ort_run_step(ctx, path, feed, what=f"checking the exported model at {check.label}"):
            actual = session.run(None, feed)
    except Exception as error:
        detail, node = _ort_error(error)
        return ShapeResult(check, "failed", f"ONNX Runtime: {detail}", node=node)
    worst = 0.0
    for index, (exp, got) in enumerate(zip(expected, actual, strict=False)):
        got = np.asarray(got, dtype=np.float32)
        name = params.outputs[index] if index < len(params.outputs) else f"#{index}"
        if exp.shape != got.shape:
            return ShapeResult(check, "deviates", f"output {name}: ONNX Runtime shape {list(got.shape)}, PyTorch "
                               f"{list(exp.shape)}")
        diff = float(np.max(np.abs(exp - got))) if exp.size else 0.0
        worst = max(worst, diff)
        if not np.allclose(got, exp, atol=params.atol, rtol=params.rtol, equal_nan=True):
            return ShapeResult(check, "deviates", f"output {name}: ONNX Runtime differs from PyTorch by up to "
                               f"{diff:.3g} (atol {params.atol}, rtol {params.rtol})", max_abs_diff=diff)
    return ShapeResult(check, "ok", max_abs_diff=worst)


def _check_model(ctx: StageContext, params: Params, path: Path, model: Any, binding: Any,
                 checks: list[CheckShape]) -> list[ShapeResult]:
    """Run every check (stops at the first failure); a session that cannot even load is a failure too."""
    from .accuracy.diagnosis import ort_session_step
    from .runtimes.ort import create_session

    try:
        with ort_session_step(ctx, path):
            session = create_session(path)
    except Exception as error:
        detail, node = _ort_error(error)
        return [ShapeResult(checks[0], "failed", f"ONNX Runtime cannot load the model: {detail}", node=node)]
    results = []
    for index, check in enumerate(checks):
        ctx.progress(0.6 + 0.3 * index / len(checks), f"checking at {check.label}")
        result = _check_shape(ctx, params, session, path, model, binding, check)
        results.append(result)
        if result.status in ("failed", "deviates"):
            break
    return results


def _dynamo_probe(ctx: StageContext, params: Params, model: Any, binding: Any, checks: list[CheckShape]) -> str:
    """Whether `dynamo: true` would do better, found by trying it (a sentence for the hint)."""
    probe = ctx.scratch / "dynamo-probe" / "model.onnx"
    probe.parent.mkdir(parents=True, exist_ok=True)
    ctx.progress(0.8, "trying the torch.export-based exporter (dynamo: true)")
    try:
        _export(ctx, params, model, binding, True, probe)
    except StageFailed as failed:
        return f"dynamo: true does not help here (tried: {failed.message})"
    fixed = _specialised(params, probe)
    if fixed:
        return f"dynamo: true does not help here (tried: {fixed})"
    results = _check_model(ctx, params, probe, model, binding, checks)
    bad = [r for r in results if r.status in ("failed", "deviates")]
    if bad:
        return f"dynamo: true does not help here (tried: at {bad[0].check.label}: {bad[0].detail})"
    return ("set `dynamo: true`: tried here, the torch.export-based exporter gives a model that matches PyTorch at "
            "every checked shape")


def _specialised(params: Params, path: Path) -> str | None:
    from .formats.torch_export import specialised_axes

    fixed = specialised_axes(path, params.dynamic_axes)
    if not fixed:
        return None
    shown = "; ".join(f"axis {axis} ({dim!r}) of input {name!r} came out fixed at {size}"
                      for name, axis, dim, size in fixed)
    return f"torch.export made dims fixed that dynamic_axes marks dynamic: {shown}"


def _fail_at(ctx: StageContext, params: Params, model: Any, binding: Any, path: Path, result: ShapeResult,
             checks: list[CheckShape]) -> StageFailed:
    """The failure of the export node at a shape other than the sample: what, where, why, what to do."""
    from .formats.torch_export import baked_sizes

    check = result.check
    sizes = params.dim_sizes()
    what = (f"the exported model {'fails' if result.status == 'failed' else 'deviates from PyTorch'} at "
            f"{check.label}: {result.detail}")
    if check.dim is None:
        return StageFailed(what, hint="the export is not faithful even at the sample shape; check the "
                           "operators named in the log, or loosen atol/rtol")
    baked = baked_sizes(path, [sizes[check.dim]])
    nodes = [result.node] if result.node else []
    nodes += [b for b in baked if not (result.node and b.split(" ", 1)[1] in result.node)]
    exporter = "torch.export-based exporter" if params.dynamo else "TorchScript exporter"
    cause = (f"cause: the {exporter} recorded the sample's size of {check.dim!r} ({sizes[check.dim]}) as a "
             "constant" + (f" (in {', '.join(nodes[:3])})" if nodes else ""))
    if not params.dynamo:
        cause += ("; the tracer records sizes that pass through Python (int(), size arithmetic, loops over a "
                  "dimension, nn.MultiheadAttention) as fixed numbers")
    fixes = []
    if not params.dynamo:
        fixes.append(_dynamo_probe(ctx, params, model, binding, checks))
    fixes.append("or keep sizes symbolic in the model's code (x.shape[i] without int(), -1 in view/reshape)")
    fixes.append(f"or remove {check.dim!r} from dynamic_axes if that size never changes")
    return StageFailed(f"{what}; {cause}", hint="; ".join(fixes))


def _export_pytorch(ctx: StageContext, params: Params, target: Path) -> dict[str, Any]:
    from .formats.torch_export import bind_inputs

    model = _build_model(ctx, params)
    binding = bind_inputs(model, list(params.inputs))
    for note in binding.notes:
        ctx.log.info("%s", note)
    warnings = size_one_warnings(params)
    for warning in warnings:
        ctx.log.warning("%s", warning)
    ctx.progress(0.1, f"exporting with {'torch.export (dynamo)' if params.dynamo else 'TorchScript'}")
    try:
        _export(ctx, params, model, binding, params.dynamo, target)
    except StageFailed as failed:
        if params.dynamo:
            raise
        probe = _dynamo_probe(ctx, params, model, binding, check_shapes(params))
        raise StageFailed(failed.message, hint=f"{probe}; {failed.hint}") from failed.__cause__
    if params.dynamo:
        fixed = _specialised(params, target)
        if fixed:
            raise StageFailed(
                f"{fixed}; the ONNX model would only accept those sizes",
                hint="the model's code turns that size into a constant (int() on a size, a Python branch or loop "
                "on it, .item()): keep it symbolic, use a sample size of 2 or more, or remove the name from "
                "dynamic_axes if the size never changes")
    checks = check_shapes(params)
    summary: dict[str, Any] = {"exporter": "dynamo" if params.dynamo else "torchscript",
                               "inputs_bound_by": binding.by}
    if warnings:
        summary["warnings"] = warnings
    _checker(target)
    if not params.check:
        summary["checked"] = False
        return summary
    results = _check_model(ctx, params, target, model, binding, checks)
    summary["checked_shapes"] = [r.record() for r in results]
    for result in results:
        if result.status == "skipped":
            ctx.log.warning("not checked at %s: %s", result.check.label, result.detail)
        if result.status in ("failed", "deviates"):
            raise _fail_at(ctx, params, model, binding, target, result, checks)
    summary["checked"] = True
    summary["max_abs_diff_vs_torch"] = max((r.max_abs_diff or 0.0 for r in results), default=0.0)
    return summary


def _checker(path: Path) -> None:
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:
        raise StageFailed(f"the ONNX model does not pass onnx.checker: {str(exc)[:500]}") from exc


def _check_onnx_file(ctx: StageContext, params: Params, path: Path) -> dict[str, Any]:
    _checker(path)
    if not params.check:
        return {"checked": False}
    from .accuracy.diagnosis import ort_session_step
    from .runtimes.ort import create_session

    try:
        with ort_session_step(ctx, path):
            create_session(path)
    except Exception as exc:
        raise StageFailed(f"ONNX Runtime cannot load the model: {str(exc)[:500]}") from exc
    return {"checked": "loads in ONNX Runtime"}


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
        check = _check_onnx_file(ctx, params, target)
    else:
        check = _export_pytorch(ctx, params, target)
        write_source(ctx, params)
    summary = _describe(target)
    summary.update(check)
    ctx.log.info("exported %s: %s", params.model, summary)
    return summary


stage = Stage(
    name="export",
    version="2",
    description="PyTorch model (or existing ONNX file) to an ONNX model, checked against PyTorch at the sample "
    "shape and at other sizes of every dynamic dimension.",
    params=Params,
    run=run,
    outputs={"model": Output(ONNX, "model.onnx", "The exported ONNX model."),
             "source": Output(TORCH_SOURCE, "source.json", "the PyTorch model (for quantize's nvfp4/mxfp8)",
                              optional=True)},
    environment=_environment,
    files=_files,
    preload=("torch", "onnx", "onnxruntime"),
)
