"""export: a PyTorch model (or an existing ONNX file) -> an ONNX model checked at more than one shape.

The exported model is checked with onnx.checker and run with ONNX Runtime against PyTorch (eager) at the
sample shape and, for each dynamic dimension, at other sizes: the min and max of the recipe profiles named in
``profiles``, else a size derived from the sample. An exporter that fixed a size the recipe marked dynamic (the
TorchScript tracer does so for sizes that pass through Python) fails here, naming the shape, the cause and the
fix, rather than one stage later in an ONNX Runtime error that does not point back to the export.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trtflow.stage import (
    ONNX,
    Output,
    ProfileSpec,
    RecipeMismatch,
    Stage,
    StageContext,
    StageFailed,
    StageParams,
)

from .accuracy.generation import GenerationCheck
from .formats.onnx_model import describe_onnx
from .formats.torch_check import (
    CheckShape,
    ShapeResult,
    check_shapes,
    ort_error,
    sample_inputs,
    size_one_warnings,
    tensors,
    torch_outputs,
)
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
        "returning a torch.nn.Module; this runs that code), or a path to an .onnx file, a TorchScript archive "
        "(.pt/.pth/.ts), a torch.export program (.pt2), a Hugging Face model folder (config.json + weights), a "
        "TensorFlow SavedModel folder or a Keras file (.keras/.h5). The format is found from the name or the "
        "folder's files and recorded in the summary.",
    )
    task: str | None = Field(
        default=None, description="Hugging Face folders: the task whose head to export (feature-extraction, "
        "text-classification, fill-mask, question-answering, text-generation, text-generation-with-past (a KV cache "
        "in and out, for generation), text2text-generation, "
        "image-classification, object-detection, semantic-segmentation, zero-shot-image-classification, "
        "image-feature-extraction, text-feature-extraction, audio-classification, automatic-speech-recognition, "
        "...; README lists them). Default: the one config.json's architectures name.")
    part: Literal["encoder", "decoder"] | None = Field(
        default=None, description="Hugging Face encoder-decoder models (T5, BART, Whisper): which part to export, "
        "the encoder or the decoder (fed the encoder's hidden states; no KV cache). Default: the encoder.")
    trust_code: bool = Field(
        default=False, description="Trust the model file's own program, as a python: factory is trusted. TorchScript "
        "archives, .pt2 programs, TensorFlow SavedModels and Keras files run code of their own when read or traced "
        "(README: Model files): without this they are converted in a child process the kernel confines (Linux "
        "Landlock: writes only in the node's scratch folder, no network), refused where no confinement is "
        "available, and a .pt2 holding pickled objects is refused. true: converted unconfined, as trtflow did "
        "before it confined them. Set it only for a file you would run as a program; `trtflow plan` shows it. It "
        "may be turned on only in a recipe file, not with --set.", json_schema_extra={"written_in_recipe": True})
    factory_args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the factory.")
    checkpoint: str | None = Field(
        default=None,
        description="Optional state_dict file (.pt/.pth) loaded with torch.load(weights_only=True) into the model.",
    )
    inputs: dict[str, InputDef] = Field(
        default_factory=dict,
        description="Model inputs: name -> sample shape, dtype, dynamic axes. Required for factories and TorchScript "
        "archives; .pt2 programs, Hugging Face folders and TensorFlow models declare their own (given here, they "
        "replace them). Named like forward()'s parameters they are passed by name; otherwise by position.",
    )
    outputs: list[str] | None = Field(
        default=None, description="Names given to the outputs, one per output tensor. Default: the model's own (a "
        "Hugging Face model's output fields such as logits or last_hidden_state, a TensorFlow signature's keys, "
        "the keys of a dict or the fields of a named tuple forward() returns), else 'output' for one output and "
        "output_0, output_1, ... for several.")
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
    generation: GenerationCheck | None = Field(
        default=None, description="task text-generation-with-past: the greedy-generation check against "
        "transformers' generate (prompts, new_tokens, min_tokens_matched); default: 4 random prompts of 8 token "
        "ids, 8 new tokens, every token equal and the logits within atol/rtol at every step.")

    @field_validator("task")
    @classmethod
    def _known_task(cls, value: str | None) -> str | None:
        from trtflow.errors import did_you_mean

        from .formats.huggingface import TASKS

        if value is not None and value not in TASKS:
            suggestion = did_you_mean(value, list(TASKS))
            raise ValueError(f"task {value!r} is not a task export knows" + (f"; {suggestion}" if suggestion else "")
                             + f" (tasks: {', '.join(TASKS)})")
        return value

    @field_validator("model")
    @classmethod
    def _model_form(cls, value: str) -> str:
        import re

        from trtflow.callables import validate_spec

        if not value.startswith("python:") and not re.fullmatch(r"[\w.]+:\w+", value):
            return value  # a path: its format is found when the stage runs (a folder cannot be told by name)
        return validate_spec(value)

    @model_validator(mode="after")
    def _generation_for_its_task(self) -> Params:
        if self.generation is not None and self.task != "text-generation-with-past":
            raise ValueError("generation (the greedy-generation check) applies to task text-generation-with-past, "
                             f"not {self.task or 'the default task'}")
        return self

    @model_validator(mode="after")
    def _inputs_for_torch(self) -> Params:
        if not self.inputs:
            if self.self_describing:
                return self  # the model declares them; checked again once they are read
            raise ValueError("'inputs' is required to export a PyTorch factory or a TorchScript archive (name -> "
                             "{shape, dtype, dynamic_axes})")
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
                        if low == high:
                            raise ValueError(f"profile {profile.name!r} gives axis {axis} of {name!r} the size {low}, "
                                             f"but inputs.{name}.shape has {spec.shape[axis]} there (a fixed axis)")
                        raise ValueError(f"profile {profile.name!r} varies axis {axis} of {name!r} ({low}..{high}) "
                                         f"but inputs.{name}.dynamic_axes does not mark axis {axis} dynamic")
                if len(shape_range.min) != len(spec.shape):
                    raise ValueError(f"profile {profile.name!r}: {name!r} has rank {len(shape_range.min)} but the "
                                     f"sample shape {spec.shape} has rank {len(spec.shape)}")
        return self

    def notices(self) -> list[str]:
        if not self.trust_code:
            return []
        return [f"trust_code: true: {self.model}'s own code runs unconfined when it is read (like a python: "
                "factory)"]

    @property
    def is_onnx_file(self) -> bool:
        return self.model.endswith(".onnx") and not self.model.startswith("python:")

    @property
    def self_describing(self) -> bool:
        """Whether the model declares its inputs (anything but a factory or a TorchScript archive)."""
        from .formats.detect import detect_by_name

        found = detect_by_name(self.model)
        return found is None or found.self_describing

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

    files = callable_files(params.model) if params.model.startswith("python:") else [params.model]
    if params.checkpoint:
        files.append(params.checkpoint)
    if params.generation is not None:
        files += params.generation.prompts.files()
    return files


def _check_files(params: Params, files: Mapping[str, Path]) -> None:
    """At plan time: the model file or folder holds what its name says (a Hugging Face folder has a config.json,
    a .pt file is a TorchScript archive...), so a wrong path is a recipe error at the node's line, before any work."""
    from .formats.detect import check_content, detect

    path = files.get(params.model)
    if path is None:
        return
    fmt = detect(params.model, path)
    check_content(fmt, path, params.model)
    if (params.task is not None or params.part is not None) and fmt.name != "huggingface":
        raise RecipeMismatch(f"task: and part: are for Hugging Face model folders; {params.model!r} is not one "
                             f"({fmt.label})",
                          hint="leave task and part out")


def _environment(params: Params) -> list[str]:
    from .formats.detect import detect_by_name

    facts = ["onnx"]
    found = detect_by_name(params.model)
    if found is None or found.is_torch:  # a folder: Hugging Face (torch, transformers) or TensorFlow
        facts.append("torch")
    if found is None:
        facts += ["transformers", "tensorflow", "tf2onnx"]
    elif found.name == "keras":
        facts += ["tensorflow", "tf2onnx"]
    if params.check:
        facts.append("onnxruntime")
    return facts


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


def _export(ctx: StageContext, params: Params, model: Any, binding: Any, dynamo: bool, target: Path,
            program: Any = None) -> None:
    """Run one exporter (on ``program``, a torch.export program, when given); StageFailed with the known cause and
    fix when it raises."""
    import warnings

    import torch

    from .formats.torch_export import explain_export_error, export_dynamo, export_torchscript

    sample = tensors(params, sample_inputs(params, {n: s.shape for n, s in params.inputs.items()}))
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            if dynamo:
                export_dynamo(program if program is not None else model, binding, sample, target,
                              params.dynamic_axes, params.outputs, params.opset, params.dim_ranges())
            else:
                export_torchscript(model, binding, sample, target, params.dynamic_axes, params.outputs,
                                   params.opset)
    except Exception as exc:
        ctx.log.exception("torch.onnx.export failed")
        what, fix = explain_export_error(exc, dynamo)
        raise StageFailed(what, hint=fix) from exc


def _check_shape(ctx: StageContext, params: Params, session: Any, path: Path, model: Any, binding: Any,
                 check: CheckShape) -> ShapeResult:
    import numpy as np

    from .accuracy.model_problems import ort_run_step

    arrays = sample_inputs(params, check.shapes)
    try:
        expected = torch_outputs(model, binding, params, arrays)
    except Exception as error:  # the model's own code: any exception type
        detail = f"PyTorch itself fails at this shape: {_first_line(error)}"
        if check.origin == "derived from the sample":  # a size we chose, not one the recipe promises
            return ShapeResult(check, "skipped", detail)
        return ShapeResult(check, "failed", detail, cause="framework")
    shapes = [list(e.shape) for e in expected]
    feed = {i.name: arrays[i.name] for i in session.get_inputs()}
    try:
        with ort_run_step(ctx, path, feed, what=f"checking the exported model at {check.label}"):
            actual = session.run(None, feed)
    except Exception as error:
        detail, node = ort_error(error)
        return ShapeResult(check, "failed", f"ONNX Runtime: {detail}", node=node, output_shapes=shapes)
    worst = 0.0
    for index, (exp, got) in enumerate(zip(expected, actual, strict=False)):
        got = np.asarray(got, dtype=np.float32)
        name = params.outputs[index] if index < len(params.outputs) else f"#{index}"
        if exp.shape != got.shape:
            return ShapeResult(check, "deviates", f"output {name}: ONNX Runtime shape {list(got.shape)}, PyTorch "
                               f"{list(exp.shape)}", output_shapes=shapes)
        diff = float(np.max(np.abs(exp - got))) if exp.size else 0.0
        worst = max(worst, diff)
        if not np.allclose(got, exp, atol=params.atol, rtol=params.rtol, equal_nan=True):
            return ShapeResult(check, "deviates", f"output {name}: ONNX Runtime differs from PyTorch by up to "
                               f"{diff:.3g} (atol {params.atol}, rtol {params.rtol})", max_abs_diff=diff,
                               output_shapes=shapes)
    return ShapeResult(check, "ok", max_abs_diff=worst, output_shapes=shapes)


def _first_line(error: BaseException) -> str:
    """An exception as one line: TorchScript's interpreter traceback cut off (its cause is the last line)."""
    text = str(error)
    if "Traceback of TorchScript" in text or "The following operation failed" in text:
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        text = lines[-1] if lines else text
    return f"{type(error).__name__}: {' '.join(text.split())[:300]}"


def _check_model(ctx: StageContext, params: Params, path: Path, model: Any, binding: Any,
                 checks: list[CheckShape]) -> list[ShapeResult]:
    """Run every check (stops at the first failure); a session that cannot even load is a failure too."""
    from .accuracy.model_problems import ort_session_step
    from .accuracy.recovery import recover
    from .runtimes.ort import create_session

    options = recover(path, log=ctx.log).options  # a crash in a child: settings that run (accuracy.recovery)
    try:
        with ort_session_step(ctx, path, options=options):
            session = create_session(path, options)
    except Exception as error:
        detail, node = ort_error(error)
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
    if result.cause == "framework":
        return RecipeMismatch(f"the model cannot run at {check.label}, which the recipe declares: {result.detail}",
                           hint=f"lower the {check.origin.split()[-1]} of {check.dim!r} in the profiles "
                           f"({', '.join(p.name for p in params.profiles)}) to sizes the model takes"
                           if check.dim else "give a sample shape the model takes (inputs: shape)")
    what = (f"the exported model {'fails' if result.status == 'failed' else 'deviates from PyTorch'} at "
            f"{check.label}: {result.detail}")
    if check.dim is None:
        return StageFailed(what, hint=f"the export is not faithful at the {check.origin} shape; check the "
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


def _sample_fits(ctx: StageContext, params: Params, model: Any, binding: Any) -> list[str]:
    """Run the model once on the sample: inputs it cannot take (the wrong dtype, range, rank or size) fail here,
    naming what to set, before any exporter runs. Returns names for its outputs (`torch_check.output_names`)."""
    from .formats.torch_check import explain_input_error, output_names, torch_result

    shapes = {n: s.shape for n, s in params.inputs.items()}
    try:
        result = torch_result(model, binding, params, sample_inputs(params, shapes))
    except Exception as error:  # the model's own code: any exception type
        ctx.log.info("the model fails on the sample inputs", exc_info=True)
        explained = explain_input_error(error, params, model)
        if explained is not None:
            raise RecipeMismatch(*explained) from None
        given = ", ".join(f"{n}: {s.dtype}{list(s.shape)}" for n, s in params.inputs.items())
        hint = ("give inputs: with the names, ranks, sizes and dtypes forward() takes (the node's log holds the "
                "model's traceback)") if params.task is None else (
                "the inputs and profiles come from the Hugging Face folder's config.json: write them again with "
                "`trtflow init` (or set task: to what the weights are for); the node's log holds the traceback")
        raise StageFailed(f"the model fails on the sample inputs ({given}): {_first_line(error)}", hint=hint) from None
    return output_names(result)


def _named_outputs(params: Params, found: list[str]) -> Params:
    """``params`` with output names: the recipe's (one per output tensor), else the model's own."""
    if params.outputs is None:
        return params.model_copy(update={"outputs": found})
    if len(params.outputs) != len(found):
        raise RecipeMismatch(f"outputs: names {len(params.outputs)} output(s) {params.outputs}, but the model returns "
                          f"{len(found)} tensor(s) (its own names: {found})",
                          hint="give one name per output tensor, or leave outputs out to use the model's own names")
    return params


def _bind(params: Params, model: Any, by_name: list[str] | None) -> Any:
    """How the recipe's inputs reach forward(): by name where forward()'s names are known (a TorchScript module's
    schema, a program's inputs), else `bind_inputs`."""
    from trtflow.errors import did_you_mean

    from .formats.torch_export import Binding, bind_inputs

    names = list(params.inputs)
    if not by_name:
        return bind_inputs(model, names)
    if set(names) <= set(by_name):
        return Binding(tuple(n for n in by_name if n in names), by="name")
    unknown = [n for n in names if n not in by_name]
    suggestions = [s for s in (did_you_mean(n, by_name) for n in unknown) if s]
    raise RecipeMismatch(f"input {unknown[0]!r} is not an argument of the model's forward({', '.join(by_name)})"
                      + (f"; {suggestions[0]}" if suggestions else ""),
                      hint=f"name the inputs like forward()'s arguments: {', '.join(by_name)}")


def _export_pytorch(ctx: StageContext, params: Params, target: Path, model: Any, program: Any = None,
                    by_name: list[str] | None = None, dim_names: dict[str, str] | None = None,
                    limits: dict[str, Any] | None = None,
                    checks: list[CheckShape] | None = None) -> tuple[dict[str, Any], Params]:
    """Export a PyTorch model (``program``: its torch.export program, exported as is; ``by_name``: forward()'s
    argument names where Python cannot see them, as in a TorchScript module; ``limits``: how far each dynamic dim
    may go) and check it at several shapes (``checks``, default `check_shapes`). Returns the summary and the params
    it used (output names resolved)."""
    binding = _bind(params, model, by_name)
    for note in binding.notes:
        ctx.log.info("%s", note)
    _within_limits(params, limits or {})
    warnings = size_one_warnings(params)
    for warning in warnings:
        ctx.log.warning("%s", warning)
    params = _named_outputs(params, _sample_fits(ctx, params, model, binding))
    ctx.progress(0.1, f"exporting with {'torch.export (dynamo)' if params.dynamo else 'TorchScript'}")
    try:
        _export(ctx, params, model, binding, params.dynamo, target, program)
        if dim_names and any(symbol != name for symbol, name in dim_names.items()):
            from .formats.torch_export import rename_dims

            rename_dims(target, dim_names)
    except StageFailed as failed:
        if params.dynamo or by_name:
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
    checks = checks or check_shapes(params)
    summary: dict[str, Any] = {"exporter": "dynamo" if params.dynamo else "torchscript",
                               "inputs_bound_by": binding.by}
    if warnings:
        summary["warnings"] = warnings
    _checker(target)
    if not params.check:
        summary["checked"] = False
        return summary, params
    results = _check_model(ctx, params, target, model, binding, checks)
    summary["checked_shapes"] = [r.record() for r in results]
    for result in results:
        if result.status == "skipped":
            ctx.log.warning("not checked at %s: %s", result.check.label, result.detail)
            summary.setdefault("warnings", []).append(f"not checked at {result.check.label}: {result.detail}")
        if result.status in ("failed", "deviates"):
            raise _fail_at(ctx, params, model, binding, target, result, checks)
    compared = [r for r in results if r.status == "ok"]  # the sample at least: it ran in PyTorch (_sample_fits)
    _name_output_dims(ctx, params, target, compared)
    summary["checked"] = True
    summary["checked_at"] = [r.check.label for r in compared]
    summary["max_abs_diff_vs_torch"] = max(r.max_abs_diff or 0.0 for r in compared)
    return summary, params


def _within_limits(params: Params, limits: dict[str, Any]) -> None:
    """Refuse a profile that asks a dim to go beyond what the model takes (RoBERTa's 128 tokens), before exporting."""
    for profile in params.profiles:
        for name, shape_range in profile.shapes.items():
            spec = params.inputs.get(name)
            if spec is None:
                continue
            for axis, dim in spec.dynamic_axes.items():
                limit = limits.get(dim)
                if limit is None or axis >= len(shape_range.max):
                    continue
                low, high = shape_range.min[axis], shape_range.max[axis]
                if limit.high is not None and high > limit.high:
                    raise RecipeMismatch(f"profile {profile.name!r} asks {dim!r} up to {high} (input {name!r}, axis "
                                      f"{axis}), but the model takes at most {limit.high}: {limit.why}",
                                      hint=f"set the profile's max {dim} to {limit.high} or less")
                if low < limit.low:
                    raise RecipeMismatch(f"profile {profile.name!r} asks {dim!r} down to {low} (input {name!r}, axis "
                                      f"{axis}), but the model needs at least {limit.low}: {limit.why}",
                                      hint=f"set the profile's min {dim} to {limit.low} or more")


def _name_output_dims(ctx: StageContext, params: Params, target: Path, compared: list[ShapeResult]) -> None:
    """Give the outputs' dynamic dims the names of the input dims they follow (`formats.dim_names`)."""
    from .formats.dim_names import Observation, dynamic_output_axes, output_dim_names, rename_output_dims

    sample = params.dim_sizes()
    observations = []
    for result in compared:
        if result.output_shapes is None or len(result.output_shapes) != len(params.outputs or []):
            continue
        dims = dict(sample)
        if result.check.dim is not None and result.check.size is not None:
            dims[result.check.dim] = result.check.size
        observations.append(Observation(dims, dict(zip(params.outputs or [], result.output_shapes, strict=True))))
    names = output_dim_names(observations, dynamic_output_axes(target))
    renamed = rename_output_dims(target, names)
    if renamed:
        ctx.log.info("output dims named after the input dims they follow: %s", renamed)


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
    from .accuracy.model_problems import ort_session_step
    from .accuracy.recovery import recover
    from .runtimes.ort import create_session

    found = recover(path, log=ctx.log)  # a crash in a child: settings that run (accuracy.recovery)
    try:
        with ort_session_step(ctx, path, options=found.options):
            session = create_session(path, found.options)
    except Exception as exc:
        raise StageFailed(f"ONNX Runtime cannot load the model: {str(exc)[:500]}") from exc
    summary: dict[str, Any] = {"checked": "loads in ONNX Runtime"}
    if params.profiles:
        summary["checked"] = "loads and runs in ONNX Runtime at the profiles' min and max"
        summary["checked_shapes"] = _run_at_profiles(ctx, params, path, session)
    if found.recovered:
        summary.update(runtime_settings=found.record(), notes=[found.note()])
    return summary


def _run_at_profiles(ctx: StageContext, params: Params, path: Path, session: Any) -> list[dict[str, Any]]:
    """Run an ONNX file at each profile's min and max (random values; integers 0 or 1): a profile the model cannot
    run fails here, not in a build or a Triton server."""
    import numpy as np

    from .accuracy.model_problems import ort_run_step
    from .formats.onnx_model import inspect_model
    from .runtimes.profiles import check_profiles

    check_profiles(params.profiles, inspect_model(path).inputs)
    types = {i.name: i.type for i in session.get_inputs()}
    rng = np.random.default_rng(params.seed)
    checked = []
    for profile in params.profiles:
        for pick in ("min", "max"):
            shapes = {name: list(getattr(shape, pick)) for name, shape in profile.shapes.items()}
            feed = {}
            for name, kind in types.items():
                shape = shapes.get(name)
                if shape is None:
                    continue
                if "int" in kind:
                    feed[name] = rng.integers(0, 2, size=shape).astype("int32" if "int32" in kind else "int64")
                elif "bool" in kind:
                    feed[name] = rng.random(shape) > 0.5
                else:
                    feed[name] = rng.random(shape).astype("float16" if "float16" in kind else "float32")
            label = f"profile {profile.name!r} {pick} ({', '.join(f'{n} {s}' for n, s in shapes.items())})"
            try:
                with ort_run_step(ctx, path, feed, what=f"running the model at {label}"):
                    session.run(None, feed)
            except Exception as error:  # ONNX Runtime raises its own types
                detail, _ = ort_error(error)
                raise RecipeMismatch(f"the model cannot run at {label}, which the recipe declares: {detail}",
                                     hint=f"give profile {profile.name!r} sizes the model takes") from None
            checked.append({"profile": profile.name, "at": pick, "shapes": shapes, "status": "ok"})
    return checked


def _copy_onnx(ctx: StageContext, params: Params, source: Path, target: Path) -> dict[str, Any]:
    shutil.copyfile(source, target)
    try:
        import onnx

        onnx.load(str(target), load_external_data=False)
    except Exception as exc:
        raise StageFailed(f"{params.model!r} is not a loadable ONNX file: {str(exc)[:300]}",
                          hint="re-export it; the file may be truncated or not ONNX at all") from exc
    return _check_onnx_file(ctx, params, target)


def _declared(params: Params, inputs: dict[str, dict[str, Any]], outputs: list[str] | None = None) -> Params:
    """``params`` with the inputs (and output names) the model declares, unless the recipe gave its own."""
    update: dict[str, Any] = {}
    if not params.inputs:
        update["inputs"] = inputs
    if params.outputs is None and outputs:
        update["outputs"] = outputs
    if not update:
        return params
    try:
        return Params.model_validate({**params.model_dump(exclude_unset=True), **update})
    except ValueError as error:
        raise StageFailed(f"the inputs the model declares do not fit the recipe: {error}",
                          hint=f"the model's inputs: {inputs}") from error


def run(ctx: StageContext, inputs: dict[str, Path], params: Params) -> dict[str, Any]:
    from .formats import confinement
    from .formats.detect import check_content, detect
    from .formats.trust import decide

    target = ctx.output("model")
    source = None if params.model.startswith("python:") else ctx.resolve(params.model)
    fmt = detect(params.model, source)
    if source is not None:
        check_content(fmt, source, params.model)
    if (params.task is not None or params.part is not None) and fmt.name != "huggingface":
        raise RecipeMismatch(f"task: and part: are for Hugging Face model folders; {params.model!r} is not one "
                             f"({fmt.label})",
                          hint="leave task and part out")
    summary_extra: dict[str, Any] = {"format": fmt.name}
    permit = decide(fmt, source, params.model, params.trust_code) if source is not None else None
    if permit is not None:
        summary_extra.update(permit.record())
    ctx.progress(0.02, f"reading the {fmt.label}")
    if fmt.name == "onnx":
        assert source is not None
        check = _copy_onnx(ctx, params, source, target)
    elif fmt.name in ("tensorflow", "keras"):
        from .formats.tensorflow import convert

        assert source is not None and permit is not None
        ctx.progress(0.1, "converting with tf2onnx (in a child process" + (", confined)" if permit.confined else ")"))
        result = convert(source, target, params.opset, fmt.name == "keras", params.atol, params.rtol,
                         ctx.scratch / "confined", confine_child=permit.confined, log=ctx.log,
                         outputs=params.outputs, ranges=_profile_ranges(params))
        check = {"exporter": "tf2onnx", "checked": True, "checked_shapes": result["checked_shapes"],
                 "max_abs_diff_vs_tensorflow": max(c["max_abs_diff_vs_tensorflow"] for c in result["checked_shapes"])}
        _checker(target)
    elif fmt.name == "python":
        check, used = _export_pytorch(ctx, params, target, _build_model(ctx, params))
        write_source(ctx, used)
    elif permit is not None and permit.confined:
        assert source is not None
        check = _export_confined(ctx, params, fmt.name, source, target, summary_extra)
    else:
        assert source is not None
        with confinement.trusting() if permit is not None and permit.mode == "trusted" else nullcontext():
            check = _export_saved_torch(ctx, params, fmt.name, source, target, summary_extra)
    summary = describe_onnx(target)
    summary.update(summary_extra)
    summary.update(check)
    ctx.log.info("exported %s (%s): %s", params.model, fmt.label, summary)
    return summary


#: What the confined child may add to the summary, with its type (it runs the model's code, so nothing else is
#: taken from it, and nothing of another type).
_CHILD_SUMMARY: dict[str, type | tuple[type, ...]] = {
    "exporter": str, "inputs_bound_by": str, "warnings": list, "checked": (bool, str), "checked_at": list,
    "checked_shapes": list, "max_abs_diff_vs_torch": (int, float), "not_checked_because": str,
    "task": str, "model_type": str, "part": str}
_CHILD_EXTRA = ("task", "model_type", "part")


def _export_confined(ctx: StageContext, params: Params, fmt: str, source: Path, target: Path,
                     extra: dict[str, Any]) -> dict[str, Any]:
    """`_export_saved_torch` in a child process the kernel confines (formats.confinement): this process never
    loads the model; it takes the ONNX file and the summary the child made."""
    from .formats import confinement

    box = ctx.scratch / "confined"
    ctx.progress(0.05, "exporting in a confined child process")
    # (only the fields the recipe set: which were set decides what the model's own declarations replace)
    request = {"node": ctx.node, "params": params.model_dump(mode="json", exclude_unset=True), "format": fmt,
               "source": str(source.absolute())}
    answer = confinement.run(f"{__name__}:export_in_child", request, box, [source], log=ctx.log,
                             what=f"exporting {params.model} (in a confined child process)")
    confinement.take_file(box / _CHILD_MODEL, target)
    _checker(target)
    answer = confinement.checked(answer, {"check": dict, "extra": dict}, f"exporting {params.model}")
    parts = {**answer["extra"], **answer["check"]}
    taken = {k: v for k, v in parts.items() if k in _CHILD_SUMMARY and isinstance(v, _CHILD_SUMMARY[k])}
    if "checked" not in taken:
        raise StageFailed(f"exporting {params.model}: the confined child answered without saying what it checked",
                          hint="the model's code may have tampered with the conversion; see the node's log")
    extra.update({k: v for k, v in taken.items() if k in _CHILD_EXTRA})
    return {k: v for k, v in taken.items() if k not in _CHILD_EXTRA}


_CHILD_MODEL = "work/out/model.onnx"


def export_in_child(request: dict[str, Any]) -> dict[str, Any]:
    """In the confined child (formats.confinement.child_main): load, export and check the saved model in the
    working folder, as the node's process does for a trusted one; the summary parts."""
    import logging
    import sys

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    box = Path.cwd()
    ctx = StageContext(node=request["node"], scratch=box / "work", recipe_dir=box, outputs=stage.outputs,
                       cache_dir=box / "cache", logger=logging.getLogger(f"trtflow.node.{request['node']}"))
    params = Params.model_validate(request["params"])
    extra: dict[str, Any] = {}
    target = ctx.output("model")
    assert target == box / _CHILD_MODEL
    check = _export_saved_torch(ctx, params, request["format"], Path(request["source"]), target, extra)
    return {"check": check, "extra": extra}


def _profile_ranges(params: Params) -> dict[str, dict[int, tuple[int, int, int]]]:
    """input -> axis -> (min, opt, max) over the profiles, for a model whose inputs export does not know yet."""
    ranges: dict[str, dict[int, tuple[int, int, int]]] = {}
    for profile in params.profiles:
        for name, shape in profile.shapes.items():
            for axis, (low, opt, high) in enumerate(zip(shape.min, shape.opt, shape.max, strict=True)):
                if low == high:
                    continue
                old = ranges.setdefault(name, {}).get(axis)
                ranges[name][axis] = (min(low, old[0]), old[1], max(high, old[2])) if old else (low, opt, high)
    return ranges


def _export_saved_torch(ctx: StageContext, params: Params, fmt: str, source: Path, target: Path,
                        extra: dict[str, Any]) -> dict[str, Any]:
    """A TorchScript archive, a .pt2 program or a Hugging Face folder through the PyTorch exporters."""
    if fmt == "torchscript":
        from .formats.torch_archives import load_torchscript, script_input_names

        module = load_torchscript(source, params.model)
        forced = params.model_copy(update={"dynamo": False})  # a scripted module needs the TorchScript exporter
        return _export_pytorch(ctx, forced, target, module, by_name=script_input_names(module))[0]
    if fmt == "exported_program":
        from .formats.torch_archives import load_program

        program = load_program(source, params.model)
        # outputs: named from what the program's module returns (a dict's keys), not its graph's node names
        declared = _declared(params, program.inputs).model_copy(update={"dynamo": True})
        return _export_pytorch(ctx, declared, target, program.module, program=program.program,
                               by_name=list(program.inputs), dim_names=program.dim_names)[0]
    from .formats.huggingface import load_model

    hf = load_model(source, params.task, params.model, params.part)
    extra.update(task=hf.task, model_type=hf.model_type, **({"part": hf.part} if hf.part else {}))
    params = params.model_copy(update={"task": hf.task})  # the task resolved: messages speak of a Hugging Face folder
    if hf.generation is not None:
        return _export_generation(ctx, params, hf.generation, target)
    return _export_pytorch(ctx, _declared(params, hf.inputs, hf.outputs), target, hf.module, limits=hf.limits)[0]


def _export_generation(ctx: StageContext, params: Params, generation: Any, target: Path) -> dict[str, Any]:
    """A causal LM with its KV cache as inputs and outputs (`formats.generation`), checked at the corners of each
    profile and by greedy generation against transformers' generate (`accuracy.generation`)."""
    from .accuracy.generation import check_against_torch
    from .formats.generation import check_profiles, export_checks, name_output_dims

    # the layout's names (Optimum's) are what every consumer of the model reads: they are not the recipe's to rename
    declared = _declared(params, generation.inputs, generation.outputs).model_copy(
        update={"outputs": list(generation.outputs)})
    if declared.dynamo:
        raise StageFailed("task text-generation-with-past exports with the TorchScript exporter: the attention "
                          "mask's length is the past's plus the sequence's, a relation torch.export's named dims "
                          "cannot state", hint="remove dynamo: true")
    layout = generation.layout
    check_profiles(declared.profiles, layout)
    checks = export_checks({n: s.shape for n, s in declared.inputs.items()}, declared.profiles, layout)
    summary = _export_pytorch(ctx, declared, target, generation.module, checks=checks)[0]
    name_output_dims(target, layout)
    summary["kv_cache"] = {"layers": layout.layers, "kv_heads": layout.kv_heads, "head_dim": layout.head_dim,
                           "vocab_size": layout.vocab_size, "context_length": layout.context_length,
                           "position_ids": layout.position_ids}
    if not params.check:
        return summary
    ctx.progress(0.92, "greedy generation: ONNX Runtime against transformers' generate")
    check = params.generation or GenerationCheck()
    record, failures = check_against_torch(target, generation.model, check, params.atol, params.rtol, ctx.resolve)
    summary["generation_check"] = record
    ctx.log.info("greedy generation vs transformers: tokens matched per prompt %s of %d; largest logit error %.3g",
                 record["tokens_matched"], record["new_tokens"], record["max_abs_logit_error"])
    if failures:
        raise StageFailed("the exported model does not generate what PyTorch generates: " + "; ".join(failures[:3]),
                          hint="see generation_check in the node's log; a near tie may flip on a tiny error: "
                          "set generation: {allow_near_ties: true} if that is all it is")
    return summary


stage = Stage(
    name="export",
    version="4",
    description="A model (PyTorch factory, TorchScript, .pt2, Hugging Face folder, TensorFlow SavedModel or Keras "
    "file, or an ONNX file) to an ONNX model, checked against its framework at the sample shape and at other "
    "sizes of every dynamic dimension.",
    params=Params,
    run=run,
    outputs={"model": Output(ONNX, "model.onnx", "The exported ONNX model."),
             "source": Output(TORCH_SOURCE, "source.json", "the PyTorch model (for quantize's nvfp4/mxfp8)",
                              optional=True)},
    environment=_environment,
    files=_files,
    check_files=_check_files,
    preload=("torch", "onnx", "onnxruntime"),
)
