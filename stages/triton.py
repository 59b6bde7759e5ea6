"""The ``triton`` stage: a Triton Inference Server model repository for an engine or an ONNX model.

The node's output folder is the repository: ``model/config.pbtxt`` and ``model/1/model.plan`` (platform
``tensorrt_plan``, with the engine's engine.json beside it) or ``model/1/model.onnx`` (``onnxruntime_onnx``),
so ``tritonserver --model-repository build/<recipe>/<node>`` serves it as model ``model``.

The configuration is derived, never guessed:
- inputs and outputs, with their data types and dims, from the model: an ONNX graph's I/O, or an engine's
  network I/O as its build recorded it in engine.json (no TensorRT runtime is needed);
- ``max_batch_size`` as Triton's TensorRT backend computes it (the largest batch some profile accepts on every
  input), and dims without the batch dimension; the profiles must cover every batch from 1 to it, since the
  dynamic batcher sends any of them. An ONNX model takes its profiles from the recipe;
- ``dynamic_batching`` with the profiles' optimal batch sizes (and the maximum) as preferred sizes;
- one ``instance_group`` per GPU, each listing every optimization profile (Triton uses profile 0 only when
  an instance lists none), so each instance picks the profile that fits a request.
The configuration is built as Triton's own ``ModelConfig`` protobuf (from the ``tritonclient`` package) and
parsed back from its text before the stage finishes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from trtflow.stage import (
    ENGINE,
    ONNX,
    Input,
    Output,
    ProfileSpec,
    RecipeError,
    Stage,
    StageContext,
    StageFailed,
    StageParams,
)

MODEL_FOLDER = "model"

#: ONNX TensorProto type names and TensorRT DataType names (as engine.json records them) -> Triton types.
ONNX_TYPES = {
    "FLOAT": "TYPE_FP32", "FLOAT16": "TYPE_FP16", "BFLOAT16": "TYPE_BF16", "DOUBLE": "TYPE_FP64",
    "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64",
    "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16", "UINT32": "TYPE_UINT32", "UINT64": "TYPE_UINT64",
    "BOOL": "TYPE_BOOL", "STRING": "TYPE_STRING",
}
TENSORRT_TYPES = {
    "float": "TYPE_FP32", "half": "TYPE_FP16", "bf16": "TYPE_BF16", "int8": "TYPE_INT8", "int32": "TYPE_INT32",
    "int64": "TYPE_INT64", "uint8": "TYPE_UINT8", "bool": "TYPE_BOOL",
}


class Params(StageParams):
    profile: ProfileSpec | None = Field(
        None, description="For an ONNX model: the optimization profile (a recipe profile name) whose batch range "
        "sets max_batch_size and the preferred batch sizes. An engine carries its own profiles (engine.json).",
    )
    profiles: list[ProfileSpec] = Field(
        default_factory=list, description="For an ONNX model: several profiles (see `profile`); exclusive with it.")
    max_batch_size: int | None = Field(
        None, ge=0, description="Override the largest batch Triton forms: at most what the profiles accept; 0 "
        "turns batching off (dims then include the batch dimension). Default: the profiles' largest batch.",
    )
    preferred_batch_sizes: list[int] | None = Field(
        None, description="Batch sizes the dynamic batcher aims for. Default: each profile's optimal batch size "
        "and max_batch_size.",
    )
    max_queue_delay_us: int = Field(
        100, ge=0, description="Microseconds a request may wait for the dynamic batcher to fill a batch.")
    dynamic_batching: bool = Field(True, description="Let Triton batch requests together (needs max_batch_size > 0).")
    instance_kind: Literal["gpu", "cpu"] = Field(
        "gpu", description="Where instances run: 'gpu' (one instance group per GPU in `gpus`) or 'cpu' (ONNX "
        "models only; TensorRT engines need a GPU).",
    )
    gpus: list[int] = Field(default_factory=lambda: [0], description="GPU indices that get an instance group.")
    instances: int = Field(1, ge=1, description="Model instances per GPU (or on the CPU).")

    @model_validator(mode="after")
    def _one_profile_form(self) -> Params:
        if self.profile is not None and self.profiles:
            raise ValueError("give either 'profile' or 'profiles', not both")
        if not self.gpus and self.instance_kind == "gpu":
            raise ValueError("gpus is empty: list the GPU indices that get an instance group, e.g. [0]")
        return self

    def all_profiles(self) -> list[ProfileSpec]:
        return [self.profile] if self.profile is not None else list(self.profiles)


@dataclass(frozen=True)
class Tensor:
    """A model input or output: its name, Triton data type and full shape (-1: dynamic)."""

    name: str
    data_type: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelIO:
    platform: str
    filename: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    profiles: tuple[ProfileSpec, ...]


# ---------------------------------------------------------------------------------------------------------
# Reading the model's I/O


def _onnx_tensors(values: Sequence[Any], skip: set[str], type_name: Any) -> tuple[Tensor, ...]:
    tensors = []
    for value in values:
        if value.name in skip:
            continue
        tensor_type = value.type.tensor_type
        onnx_type = type_name(tensor_type.elem_type)
        if onnx_type not in ONNX_TYPES:
            raise StageFailed(f"{value.name!r} has ONNX type {onnx_type}, which Triton has no data type for",
                              hint="cast it to a supported type in the model")
        shape = tuple(int(d.dim_value) if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim)
        tensors.append(Tensor(value.name, ONNX_TYPES[onnx_type], shape))
    return tuple(tensors)


def onnx_io(path: Path, params: Params) -> ModelIO:
    import onnx

    from .formats.onnx_model import inspect_model
    from .runtimes.profiles import check_profiles

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and others for a bad file
        raise StageFailed(f"cannot read the ONNX model {path.name}: {exc}",
                          hint="re-run the node that produced it") from exc
    type_name = onnx.TensorProto.DataType.Name
    initializers = {init.name for init in model.graph.initializer}
    profiles = params.all_profiles()
    if profiles:
        check_profiles(profiles, inspect_model(path).inputs)
    return ModelIO("onnxruntime_onnx", "model.onnx", _onnx_tensors(model.graph.input, initializers, type_name),
                   _onnx_tensors(model.graph.output, set(), type_name), tuple(profiles))


def engine_io(path: Path, params: Params) -> ModelIO:
    from .runtimes.trt_runtime import provenance_for, read_provenance

    manifest = read_provenance(provenance_for(path))
    if manifest is None:
        raise StageFailed(f"the engine {path.name} has no engine.json beside it: its I/O cannot be read without "
                          "a TensorRT runtime", hint="export an engine from the build stage (or a select node that "
                          "chose among engines): both keep engine.json beside the engine")
    if manifest.get("backend") == "tensorrt-rtx":
        raise StageFailed("the engine was built with TensorRT-RTX, which Triton's tensorrt_plan backend cannot load",
                          hint="build it with backend: tensorrt for Triton, or export the ONNX model "
                          "(platform onnxruntime_onnx)")
    if params.all_profiles():
        raise RecipeError("an engine carries its own optimization profiles (engine.json); the profile params "
                          "are for ONNX models", field="profile", hint="leave profile/profiles out")
    network = manifest.get("network") or {}

    def tensors(records: Sequence[Mapping[str, Any]]) -> tuple[Tensor, ...]:
        out = []
        for record in records:
            dtype = str(record.get("dtype", "")).lower()
            if dtype not in TENSORRT_TYPES:
                raise StageFailed(f"engine tensor {record.get('name')!r} has type {dtype}, which Triton has no "
                                  "data type for", hint="keep the model's I/O in a standard type (e.g. fp32/fp16)")
            out.append(Tensor(record["name"], TENSORRT_TYPES[dtype], tuple(int(d) for d in record["shape"])))
        return tuple(out)

    profiles = tuple(ProfileSpec.model_validate(p) for p in manifest.get("profiles") or [])
    return ModelIO("tensorrt_plan", "model.plan", tensors(network.get("inputs") or []),
                   tensors(network.get("outputs") or []), profiles)


# ---------------------------------------------------------------------------------------------------------
# Batching, consistent with the profiles


def profile_batch_range(profile: ProfileSpec, inputs: Sequence[Tensor]) -> tuple[int, int, int]:
    """(min, opt, max) batch a profile accepts on every input: the tightest over the inputs it shapes."""
    names = [t.name for t in inputs if t.name in profile.shapes]
    if not names:
        raise RecipeError(f"profile {profile.name!r} shapes none of the batched inputs "
                          f"({', '.join(t.name for t in inputs)})", field="profile")
    low = max(profile.shapes[n].min[0] for n in names)
    high = min(profile.shapes[n].max[0] for n in names)
    opt = max(profile.shapes[n].opt[0] for n in names)
    return low, min(max(opt, low), high), high


def batching(io: ModelIO, params: Params) -> tuple[int, list[int]]:
    """max_batch_size and the preferred batch sizes; refuses a configuration Triton would reject or fail on."""
    batchable = bool(io.inputs) and all(t.shape and t.shape[0] == -1 for t in (*io.inputs, *io.outputs))
    if not batchable:
        if params.max_batch_size:
            static = [f"{t.name}{list(t.shape)}" for t in (*io.inputs, *io.outputs) if not t.shape or t.shape[0] != -1]
            raise RecipeError(f"max_batch_size {params.max_batch_size} needs a dynamic first dimension on every "
                              f"input and output, but these have a fixed one: {', '.join(static)}",
                              field="max_batch_size", hint="set max_batch_size: 0, or export with a dynamic batch axis")
        return 0, []
    dynamic_inputs = [t for t in io.inputs if t.shape[0] == -1]
    ranges = [profile_batch_range(p, dynamic_inputs) for p in io.profiles]
    if not ranges:
        if params.max_batch_size is None:
            raise RecipeError("the model has a dynamic batch dimension but no optimization profile says how large "
                              "a batch may be", field="profile",
                              hint="set profile: <recipe profile> (or max_batch_size, or 0 to turn batching off)")
        ranges = [(1, params.max_batch_size, params.max_batch_size)]
    largest = max(high for _, _, high in ranges)
    max_batch = largest if params.max_batch_size is None else params.max_batch_size
    if max_batch > largest:
        raise RecipeError(f"max_batch_size {max_batch} but the profiles accept batches up to {largest} "
                          f"(Triton would refuse to load the model)", field="max_batch_size",
                          hint=f"set max_batch_size <= {largest}, or build with a larger profile")
    uncovered = [b for b in range(1, max_batch + 1) if not any(low <= b <= high for low, _, high in ranges)]
    if uncovered:
        covered = ", ".join(f"{low}..{high}" for low, _, high in ranges)
        raise RecipeError(f"Triton's dynamic batcher sends any batch from 1 to {max_batch}, but the profiles cover "
                          f"only {covered} (not {_runs(uncovered)})", field="profile",
                          hint="add a profile whose min batch is 1, or lower max_batch_size")
    if max_batch == 0:
        return 0, []
    preferred = params.preferred_batch_sizes
    if preferred is None:
        preferred = sorted({opt for _, opt, _ in ranges if opt <= max_batch} | {max_batch})
    bad = [b for b in preferred if not 1 <= b <= max_batch]
    if bad:
        raise RecipeError(f"preferred_batch_sizes {bad} are outside 1..max_batch_size {max_batch}",
                          field="preferred_batch_sizes")
    return max_batch, sorted(set(preferred))


def _runs(values: list[int]) -> str:
    return f"{values[0]}..{values[-1]}" if len(values) > 1 else str(values[0])


# ---------------------------------------------------------------------------------------------------------
# The configuration, as Triton's protobuf


def model_config_module() -> Any:
    """Triton's ``model_config_pb2`` from the tritonclient package.

    It is loaded from its file: importing ``tritonclient.grpc`` would pull in grpcio (and its protobuf pin),
    which a configuration check does not need.
    """
    import importlib.util
    import sys
    from importlib import metadata

    name = "trtflow_triton_model_config_pb2"
    if name in sys.modules:
        return sys.modules[name]
    try:
        dist = metadata.distribution("tritonclient")
    except metadata.PackageNotFoundError:
        raise StageFailed("the tritonclient package is not installed; it holds Triton's ModelConfig definition",
                          hint="pip install 'trtflow[triton]' (or tritonclient)") from None
    files = [f for f in dist.files or [] if str(f).replace("\\", "/").endswith("tritonclient/grpc/model_config_pb2.py")]
    if not files:
        raise StageFailed(f"tritonclient {dist.version} ships no grpc/model_config_pb2.py",
                          hint="install a tritonclient release that ships it (2.x)")
    spec = importlib.util.spec_from_file_location(name, Path(str(dist.locate_file(files[0]))))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


def build_config(io: ModelIO, params: Params, name: str = MODEL_FOLDER) -> Any:
    """The ModelConfig message for ``io``."""
    pb = model_config_module()
    max_batch, preferred = batching(io, params)
    config = pb.ModelConfig(name=name, platform=io.platform, max_batch_size=max_batch)
    skip = 1 if max_batch > 0 else 0
    for tensors, add in ((io.inputs, config.input.add), (io.outputs, config.output.add)):
        for tensor in tensors:
            entry = add(name=tensor.name, data_type=pb.DataType.Value(tensor.data_type))
            dims = list(tensor.shape[skip:])
            if dims:
                entry.dims.extend(dims)
            else:  # Triton's dims may not be empty: a per-request scalar is [1] reshaped to []
                entry.dims.append(1)
                entry.reshape.SetInParent()
    if params.dynamic_batching and max_batch > 0:
        config.dynamic_batching.preferred_batch_size.extend(preferred)
        config.dynamic_batching.max_queue_delay_microseconds = params.max_queue_delay_us
    profile_names = [str(i) for i in range(len(io.profiles))] if io.platform == "tensorrt_plan" else []
    if params.instance_kind == "cpu":
        if io.platform == "tensorrt_plan":
            raise RecipeError("TensorRT engines run on GPUs only", field="instance_kind",
                              hint="use instance_kind: gpu, or export the ONNX model for CPU instances")
        config.instance_group.add(name="cpu", kind=pb.ModelInstanceGroup.KIND_CPU, count=params.instances)
    else:
        for gpu in params.gpus:
            group = config.instance_group.add(name=f"gpu{gpu}", kind=pb.ModelInstanceGroup.KIND_GPU,
                                              count=params.instances, gpus=[gpu])
            group.profile.extend(profile_names)
    return config


def config_text(config: Any) -> str:
    """The configuration as config.pbtxt, checked by parsing it back into a ModelConfig."""
    from google.protobuf import text_format

    pb = model_config_module()
    text = text_format.MessageToString(config)
    try:
        parsed = text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as exc:
        raise StageFailed(f"the generated config.pbtxt does not parse as Triton's ModelConfig: {exc}") from exc
    if parsed != config:
        raise StageFailed("config.pbtxt does not read back as the configuration it was written from")
    return text


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def run(ctx: StageContext, inputs: dict[str, Any], params: Params) -> dict[str, Any]:
    from .formats.onnx_model import candidate_kind

    model = Path(inputs["model"])
    kind = candidate_kind(model)
    io = engine_io(model, params) if kind == "engine" else onnx_io(model, params)
    config = build_config(io, params)
    text = config_text(config)
    ctx.output("config").write_text(text, encoding="utf-8")
    files = ["config.pbtxt"]
    if kind == "engine":
        _link_or_copy(model, ctx.output("plan"))
        from .runtimes.trt_runtime import provenance_for

        provenance = provenance_for(model)
        assert provenance is not None  # engine_io refused an engine without one
        _link_or_copy(provenance, ctx.output("provenance"))
        files += ["1/model.plan", "1/engine.json"]
    else:
        _link_or_copy(model, ctx.output("onnx"))
        files.append("1/model.onnx")
        weights = model.with_name(model.name + "_data")
        if weights.is_file():
            _link_or_copy(weights, ctx.output("weights"))
            files.append("1/model.onnx_data")
    ctx.log.info("Triton model repository (model %r, %s):\n%s", MODEL_FOLDER, io.platform, text)
    return {
        "model_name": MODEL_FOLDER,
        "platform": io.platform,
        "max_batch_size": config.max_batch_size,
        "preferred_batch_sizes": list(config.dynamic_batching.preferred_batch_size),
        "instance_groups": [f"{g.name}: {g.count} x {pb_kind(g)}" for g in config.instance_group],
        "profiles": [p.name for p in io.profiles],
        "inputs": {t.name: [t.data_type, list(t.shape)] for t in io.inputs},
        "outputs": {t.name: [t.data_type, list(t.shape)] for t in io.outputs},
        "files": [f"{MODEL_FOLDER}/{f}" for f in files],
    }


def pb_kind(group: Any) -> str:
    return model_config_module().ModelInstanceGroup.Kind.Name(group.kind)


stage = Stage(
    name="triton",
    version="1",
    description="Write a Triton Inference Server model repository for an engine (tensorrt_plan) or an ONNX model "
    "(onnxruntime_onnx): I/O types and dims from the model, max_batch_size and dynamic batching from the "
    "optimization profiles, one instance group per GPU; checked against Triton's ModelConfig.",
    params=Params,
    run=run,
    inputs={"model": Input((ONNX, ENGINE), "the engine (with its engine.json) or ONNX model to serve")},
    outputs={
        "config": Output("triton_config", f"{MODEL_FOLDER}/config.pbtxt", "Triton's model configuration"),
        "onnx": Output(ONNX, f"{MODEL_FOLDER}/1/model.onnx", "the ONNX model (version 1)", optional=True),
        "weights": Output("onnx_data", f"{MODEL_FOLDER}/1/model.onnx_data", "its external weights", optional=True),
        "plan": Output(ENGINE, f"{MODEL_FOLDER}/1/model.plan", "the TensorRT engine (version 1)", optional=True),
        "provenance": Output("metrics", f"{MODEL_FOLDER}/1/engine.json", "how the engine was built", optional=True),
    },
    environment=("onnx",),
    preload=("onnx", "google.protobuf.text_format"),
)
