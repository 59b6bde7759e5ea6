"""export: a PyTorch model (or an existing ONNX file) -> an ONNX model checked at more than one shape.

The exported model is checked with onnx.checker and run with ONNX Runtime against PyTorch (eager) at the
sample shape and, for each dynamic dimension, at other sizes: the min and max of the recipe profiles named in
``profiles``, else a size derived from the sample. An exporter that fixed a size the recipe marked dynamic (the
TorchScript tracer does so for sizes that pass through Python) fails here, naming the shape, the cause and the
fix, rather than one stage later in an ONNX Runtime error that does not point back to the export.
"""

from __future__ import annotations

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
    StageParams,
)

from .accuracy.generation import GenerationCheck
from .exporting.confined import export_confined, in_child
from .exporting.onnx_file import checker, copy_onnx
from .exporting.params import profile_ranges
from .exporting.pytorch import build_model, export_pytorch
from .exporting.saved_models import export_saved_torch
from .formats.onnx_model import describe_onnx
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
        "in and out, for generation), text2text-generation, text2text-generation-with-past and "
        "automatic-speech-recognition-with-past (an encoder-decoder for generation: the decoder's KV cache in and "
        "out), "
        "image-classification, object-detection, semantic-segmentation, zero-shot-image-classification, "
        "image-feature-extraction, text-feature-extraction, audio-classification, automatic-speech-recognition, "
        "...; README lists them). Default: the one config.json's architectures name.")
    part: Literal["encoder", "decoder"] | None = Field(
        default=None, description="Hugging Face encoder-decoder models (T5, BART, Whisper): which part to export, "
        "the encoder or the decoder (fed the encoder's hidden states, no KV cache; with a -with-past task the encoder "
        "returns the cross-attention cache and the decoder takes both caches). Default: the encoder.")
    trust_code: bool = Field(
        default=False, description="Trust the model file's own program, as a python: factory is trusted. TorchScript "
        "archives, .pt2 programs, TensorFlow SavedModels and Keras files run code of their own when read or traced "
        "(README: Model files): without this they are converted in a child process the kernel confines (Linux "
        "sandbox: a file system holding only the model and an empty folder, no network), refused where no "
        "confinement is available, and a .pt2 holding pickled objects is refused. true: converted unconfined, as "
        "trtflow did before it confined them. Set it only for a file you would run as a program; `trtflow plan` "
        "shows it. It may be turned on only in a recipe file, not with --set.",
        json_schema_extra={"written_in_recipe": True})
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

        from .formats.hf_tasks import TASKS

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
        from .formats.seq2seq import TASKS as SEQ2SEQ_TASKS

        if self.generation is not None and self.task not in ("text-generation-with-past", *SEQ2SEQ_TASKS):
            raise ValueError("generation (the greedy-generation check) applies to tasks text-generation-with-past, "
                             f"{', '.join(SEQ2SEQ_TASKS)} (part: decoder), not {self.task or 'the default task'}")
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
                if name not in self.inputs:
                    raise ValueError(f"profile {profile.name!r} gives shapes for {name!r}, which is not one of the "
                                     f"inputs {list(self.inputs)}")
                spec = self.inputs[name]
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
        check = copy_onnx(ctx, params, source, target)
    elif fmt.name in ("tensorflow", "keras"):
        from .formats.tensorflow import convert

        assert source is not None and permit is not None
        ctx.progress(0.1, "converting with tf2onnx (in a child process" + (", confined)" if permit.confined else ")"))
        result = convert(source, target, params.opset, fmt.name == "keras", params.atol, params.rtol,
                         ctx.scratch / "confined", confine_child=permit.confined, log=ctx.log,
                         outputs=params.outputs, ranges=profile_ranges(params))
        check = {"exporter": "tf2onnx", "checked": True, "checked_shapes": result["checked_shapes"],
                 "max_abs_diff_vs_tensorflow": max(c["max_abs_diff_vs_tensorflow"] for c in result["checked_shapes"])}
        checker(target)
    elif fmt.name == "python":
        check, used = export_pytorch(ctx, params, target, build_model(ctx, params))
        write_source(ctx, used)
    elif permit is not None and permit.confined:
        assert source is not None
        check = export_confined(ctx, params, fmt.name, source, target, summary_extra, f"{__name__}:export_in_child")
    else:
        assert source is not None
        with confinement.trusting() if permit is not None and permit.mode == "trusted" else nullcontext():
            check = export_saved_torch(ctx, params, fmt.name, source, target, summary_extra)
    summary = describe_onnx(target)
    summary.update(summary_extra)
    summary.update(check)
    ctx.log.info("exported %s (%s): %s", params.model, fmt.label, summary)
    return summary


def export_in_child(request: dict[str, Any]) -> dict[str, Any]:
    """The confined child's entry (`exporting.confined.in_child`, with this stage's params and outputs)."""
    return in_child(request, Params, stage.outputs)


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
