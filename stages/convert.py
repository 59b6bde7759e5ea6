"""Precision conversion of an ONNX model to fp16 or bf16 with NVIDIA ModelOpt AutoCast.

AutoCast (``modelopt.onnx.autocast.convert_to_mixed_precision``) converts the model to the low precision
but keeps in fp32 the nodes whose values would overflow it: it runs the model once on ONNX Runtime with
reference inputs to measure ranges (``data_max``) and checks initializer magnitudes (``init_max``).
The summary says how many nodes were converted and which stayed in fp32.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from trtflow.stage import (
    METRICS,
    ONNX,
    Input,
    Output,
    Stage,
    StageContext,
    StageFailed,
    StageParams,
    StageSkipped,
)

from .accuracy.model_problems import autocast_repro, modelopt_step
from .data import DataSource
from .precision.modelopt import (
    check_calibration_eps,
    check_node_patterns,
    check_op_types,
    convert_memory,
    modelopt_environment,
    modelopt_files,
    modelopt_resources,
    private_model_copy,
)
from .runtimes.ort import OrtOptions

FP16_MAX = 65504.0
AUTOCAST_DATA_MAX = 512.0  # modelopt.onnx.autocast.convert.DEFAULT_DATA_MAX
_LOW_PRECISION_TYPES = {"fp16": 10, "bf16": 16}  # onnx.TensorProto.FLOAT16 / BFLOAT16
_FLOAT32 = 1
_MAX_NAMES_IN_SUMMARY = 50


class Params(StageParams):
    precision: Literal["fp16", "bf16"] = Field(
        "fp16", description="Low precision to convert to. bf16 raises the model's opset to at least 22."
    )
    keep_io_types: bool = Field(
        True,
        description="Keep the model's inputs and outputs in their original type (fp32), with Cast nodes "
        "inside the graph; false makes float I/O low precision too.",
    )
    op_types_to_exclude: list[str] | None = Field(
        None, description="Keep every node of these op types (exact names, e.g. [Softmax]) in fp32."
    )
    nodes_to_exclude: list[str] | None = Field(
        None, description="Keep nodes whose names match one of these regular expressions (re.match) in fp32."
    )
    op_types_to_include: list[str] | None = Field(
        None, description="Force nodes of these op types to low precision, overriding the range checks."
    )
    nodes_to_include: list[str] | None = Field(
        None,
        description="Force nodes whose names match one of these regular expressions to low precision, "
        "overriding the range checks.",
    )
    data_max: float | None = Field(
        AUTOCAST_DATA_MAX,
        gt=0,
        description="Keep in fp32 the nodes whose input or output magnitudes (measured by running the model "
        "on ONNX Runtime with the reference data) exceed this. AutoCast's default is 512, where fp16's "
        "spacing is 0.5. null skips the reference run and the check.",
    )
    init_max: float = Field(
        FP16_MAX,
        gt=0,
        description="Keep in fp32 the nodes with an initializer (weight) whose magnitude exceeds this. "
        "Default: the largest fp16 value (65504).",
    )
    init_conversion_max_bytes: int | None = Field(
        None,
        ge=0,
        description="Initializers larger than this many bytes are cast at run time instead of converted "
        "in the file. Default: convert all.",
    )
    max_depth_of_reduction: int | None = Field(
        None,
        ge=1,
        description="Keep in fp32 the reductions (ReduceSum, MatMul...) that sum more than this many "
        "elements, where low-precision accumulation loses accuracy. Default: no limit.",
    )
    calibration_data: DataSource | None = Field(
        None,
        description="Reference inputs for the data_max range check (axis 0 = samples). Default: AutoCast "
        "generates random inputs in [-1, 1] (Polygraphy's DataLoader, fixed seed; dynamic dimensions = 1), "
        "which may not reflect real ranges or may not run on models with shape-dependent graphs; the "
        "summary then says reference_data: autocast-random.",
    )
    calibration_batch_size: int | None = Field(
        None,
        ge=1,
        description="Rows of calibration_data per reference-run call. Default: the model's static batch "
        "dimension, or 1 when it is dynamic. The run holds every intermediate tensor of one batch, so memory "
        "grows with this, not with the number of samples.",
    )
    calibration_eps: list[str] = Field(
        default_factory=lambda: ["cpu"],
        description="ONNX Runtime execution providers for the reference run: 'cpu', 'cuda:N', 'trt'. "
        "Anything but 'cpu' needs a GPU.",
    )
    opset: int | None = Field(
        None, ge=13, description="Target opset. Default: the model's own, raised to 22 for bf16."
    )
    check: bool = Field(
        True,
        description="Run the converted model once on ONNX Runtime (CPU) before committing it, on the first "
        "rows of calibration_data (else random inputs), so a model ONNX Runtime cannot run fails here. Skipped "
        "for bf16 and for operators the CPU provider has no kernel for (recorded in the summary).",
    )
    onnxruntime: OrtOptions = Field(
        default_factory=OrtOptions,
        description="ONNX Runtime session options for that check. When ONNX Runtime crashes on the converted "
        "model, settings that run it are searched for in child processes (lower optimisation levels, then the "
        "one optimiser to disable) and recorded as runtime_settings in convert.json, which validate and "
        "benchmark use for this model.",
    )

    @field_validator("calibration_eps")
    @classmethod
    def _known_eps(cls, eps: list[str]) -> list[str]:
        return check_calibration_eps(eps, r"cpu|trt|cuda:\d+", "'cpu', 'cuda:N' or 'trt'")

    @property
    def uses_gpu(self) -> bool:
        return self.data_max is not None and any(ep != "cpu" for ep in self.calibration_eps)

    @property
    def uses_data(self) -> bool:
        return self.data_max is not None and self.calibration_data is not None


def check(params: Params) -> None:
    from trtflow.environment import gpus, module_available

    if not module_available("modelopt"):
        raise StageSkipped("NVIDIA ModelOpt is not installed", needs="pip install 'nvidia-modelopt[onnx]'")
    if params.uses_gpu and not gpus():
        raise StageSkipped(
            f"calibration_eps {[ep for ep in params.calibration_eps if ep != 'cpu']} need an NVIDIA GPU and "
            "this machine has none",
            needs="an NVIDIA GPU, or calibration_eps: [cpu]",
        )


def run(ctx: StageContext, inputs: dict[str, Path], params: Params) -> dict[str, Any]:
    import onnx

    from .precision.autocast import autocast_arguments, convert_model, reference_data

    model_path = private_model_copy(inputs["model"], ctx.scratch / "input")
    check_node_patterns(model_path, {"nodes_to_exclude": params.nodes_to_exclude,
                                     "nodes_to_include": params.nodes_to_include})
    for field in ("op_types_to_exclude", "op_types_to_include"):
        absent = check_op_types(model_path, field, getattr(params, field))
        if absent:
            ctx.log.warning("%s: the model has no node of op type %s (misspelt?)", field, absent)

    reference = reference_data(ctx, model_path, params)
    reference_path = str(reference.path) if reference.path is not None else None
    original_casts = _count_op(model_path, "Cast")
    ctx.progress(0.1, f"converting to {params.precision} with ModelOpt AutoCast")
    repro = autocast_repro(model_path, params.precision, reference.path, autocast_arguments(params))
    converted = convert_model(ctx, model_path, params, reference,
                              modelopt_step(ctx, model_path, f"converting to {params.precision} (AutoCast)", repro))

    dim_names = _clean_dim_names(ctx, converted)
    ctx.progress(0.85, "saving the converted model")
    out = ctx.output("model")
    try:
        onnx.save(converted, str(out))
    except ValueError as error:  # protobuf's 2 GB limit
        raise StageFailed(f"cannot save the converted model as one file: {error}",
                          hint="models over 2 GB need external data, which this stage does not write") from error
    ort_check = _check_on_onnx_runtime(ctx, params, out, reference_path) if params.check else None
    counts = precision_counts(converted, params.precision)
    summary: dict[str, Any] = {
        "precision": params.precision,
        "keep_io_types": params.keep_io_types,
        "reference_data": _reference_kind(params),
        "reference_samples": reference.rows,
        "reference_batch_size": reference.batch_size if reference.dataset is not None else None,
        "data_max": params.data_max,
        "init_max": params.init_max,
        "cast_nodes": {"before": original_casts, "after": counts.pop("cast_nodes")},
        "inputs": _io_types(converted.graph.input, converted),
        "outputs": _io_types(converted.graph.output, converted),
        "size_bytes": {"before": inputs["model"].stat().st_size, "after": out.stat().st_size},
        "dim_names": dim_names,
        "onnxruntime_check": ort_check,
        "runtime_settings": (ort_check or {}).get("runtime_settings"),
        "notes": [ort_check["note"]] if ort_check and "note" in ort_check else [],
        **counts,
    }
    ctx.output("summary").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    ctx.progress(1.0, f"{counts['converted_nodes']} nodes in {params.precision}, "
                      f"{counts['fp32_nodes']} kept in fp32")
    return summary


def _clean_dim_names(ctx: StageContext, model: Any) -> dict[str, Any]:
    """Remove dim names AutoCast left on dims of different sizes (its ``unk``), which break ONNX Runtime."""
    from .accuracy.model_problems import clean_dim_names

    report = clean_dim_names(model)
    if report["removed"]:
        ctx.log.info("removed dim names that label dims of different sizes: %s (%d dims cleared, %d filled "
                     "again by shape inference)", report["removed"], report["cleared_dims"], report["refilled_dims"])
    if report["still_inconsistent"]:
        ctx.log.warning("dim names still label dims of different sizes: %s", report["still_inconsistent"])
    return report


def _check_feed(ctx: StageContext, model_path: Path, reference_path: str | None) -> dict[str, Any]:
    """One batch for the check: the first rows of the reference data, else random inputs (dynamic dims 2)."""
    import numpy as np

    from .data import DataSource, RandomData, load_arrays, onnx_input_specs

    specs = onnx_input_specs(model_path)
    static = {s.shape[0] for s in specs if s.shape and isinstance(s.shape[0], int) and s.shape[0] > 0}
    rows = static.pop() if len(static) == 1 else 2
    if reference_path is not None:
        reference = Path(reference_path)
        if reference.is_dir():  # one .npz per batch
            reference = sorted(reference.glob("*.npz"))[0]
        with np.load(reference) as data:
            return {spec.name: data[spec.name][:rows] for spec in specs}
    shapes = {s.name: [d if isinstance(d, int) and d > 0 else 2 for d in s.shape] for s in specs}
    random = DataSource(random=RandomData(seed=0, num_samples=1, shapes=shapes))
    return load_arrays(random, specs, ctx.resolve)


def _check_on_onnx_runtime(ctx: StageContext, params: Params, path: Path, reference_path: str | None) -> dict:
    """Run the converted model once on ONNX Runtime; a model it cannot run fails the node with the cause."""
    import numpy as np

    from .accuracy.model_problems import hint_text, ort_findings, ort_run_step
    from .accuracy.recovery import recover
    from .runtimes.ort import create_session

    if params.precision == "bf16":
        return {"status": "skipped", "reason": "ONNX Runtime's CPU provider has no bf16 kernels"}
    feed = _check_feed(ctx, path, reference_path)
    shapes = {name: list(value.shape) for name, value in feed.items()}
    ctx.progress(0.9, f"running the {params.precision} model on ONNX Runtime")
    feed_file = ctx.scratch / "check_feed.npz"
    np.savez(feed_file, **feed)
    found = recover(path, params.onnxruntime, feed_file, ctx.log)  # a crash in a child: settings that run
    if found.recovered:
        ctx.log.warning("%s", found.note())
    try:
        with ort_run_step(ctx, path, feed, what=f"checking the {params.precision} model on ONNX Runtime",
                          options=found.options):
            outputs = create_session(path, found.options).run(None, feed)
    except Exception as error:
        text = " ".join(str(error).split())
        if "NOT_IMPLEMENTED" in text:  # a kernel the CPU provider lacks: not a fault of the model
            ctx.log.warning("ONNX Runtime cannot run the %s model here: %s", params.precision, text[:300])
            return {"status": "skipped", "reason": f"unsupported by ONNX Runtime's CPU provider: {text[:300]}"}
        raise StageFailed(
            f"ONNX Runtime cannot run the {params.precision} model on inputs {shapes}: "
            f"{' '.join(str(error).split())[:500]}",
            hint=hint_text(ort_findings(path)) or "set check: false to keep a model that only TensorRT needs to "
            "run; the node's log has AutoCast's messages",
        ) from error
    non_finite = sum(int((~np.isfinite(np.asarray(o, dtype=np.float32))).sum()) for o in outputs
                     if np.issubdtype(np.asarray(o).dtype, np.floating))
    if non_finite:
        ctx.log.warning("the %s model gives %d NaN/Inf values on the check inputs", params.precision, non_finite)
    return {"status": "ok", "input_shapes": shapes, "non_finite_outputs": non_finite,
            "runtime_settings": found.record(), **({"note": found.note()} if found.recovered else {})}


def precision_counts(model: Any, precision: str) -> dict[str, Any]:
    """Nodes computing in low precision vs fp32 (by their float outputs' types), initializer types."""
    import onnx

    try:
        typed = onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference is best effort: value_info of the model itself is used then
        typed = model
    graph = typed.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input, *graph.output]}
    types.update({init.name: init.data_type for init in graph.initializer})
    low = _LOW_PRECISION_TYPES[precision]
    converted: Counter[str] = Counter()
    kept: Counter[str] = Counter()
    kept_names: list[str] = []
    casts = 0
    for node in graph.node:
        if node.op_type == "Cast":
            casts += 1
            continue
        output_types = {types.get(name) for name in node.output if name}
        if low in output_types:
            converted[node.op_type] += 1
        elif _FLOAT32 in output_types:
            kept[node.op_type] += 1
            kept_names.append(node.name)
    initializer_types = Counter(
        onnx.TensorProto.DataType.Name(init.data_type).lower() for init in graph.initializer
    )
    return {
        "converted_nodes": sum(converted.values()),
        "fp32_nodes": sum(kept.values()),
        "converted_by_op_type": dict(sorted(converted.items())),
        "fp32_by_op_type": dict(sorted(kept.items())),
        "fp32_node_names": kept_names[:_MAX_NAMES_IN_SUMMARY],
        "initializers_by_dtype": dict(sorted(initializer_types.items())),
        "cast_nodes": casts,
    }


def _count_op(model_path: Path, op_type: str) -> int:
    """Nodes of ``op_type`` in a model file (the model is not kept: the conversion needs the memory)."""
    import onnx

    return sum(1 for node in onnx.load(str(model_path), load_external_data=False).graph.node
               if node.op_type == op_type)


def _io_types(values: Any, model: Any) -> dict[str, str]:
    import onnx

    initializers = {init.name for init in model.graph.initializer}
    return {
        v.name: onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type).lower()
        for v in values
        if v.name not in initializers
    }


def _reference_kind(params: Params) -> str | None:
    if params.data_max is None:
        return None
    if params.calibration_data is None:
        return "autocast-random"
    return "random" if params.calibration_data.is_random else params.calibration_data.kind


stage = Stage(
    name="convert",
    version="2",
    description="Convert an ONNX model to fp16/bf16 with ModelOpt AutoCast, keeping overflow-prone nodes fp32.",
    params=Params,
    run=run,
    inputs={"model": Input(ONNX, "the fp32 ONNX model to convert")},
    outputs={
        "model": Output(ONNX, "model.onnx", "the mixed-precision ONNX model"),
        "summary": Output(METRICS, "convert.json", "nodes converted / kept in fp32, by op type"),
    },
    resources=modelopt_resources,
    environment=modelopt_environment,
    files=modelopt_files,
    check=check,
    memory=convert_memory,
    preload=("modelopt.onnx.autocast", "polygraphy.backend.onnx.util", "onnxruntime", "numpy"),
)
