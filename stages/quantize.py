"""Post-training quantization of an ONNX model with NVIDIA ModelOpt (``modelopt.onnx.quantization``).

ModelOpt inserts Q/DQ nodes (int8, fp8) or block-quantizes weights (int4) using calibration data; the
result is an ONNX model that TensorRT builds into a quantized engine. Calibration runs on ONNX Runtime
(CPU by default). The summary counts what was quantized, per op type.
"""

from __future__ import annotations

import functools
import json
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trtflow.stage import (
    METRICS,
    ONNX,
    EnvironmentUnavailable,
    Input,
    Output,
    Stage,
    StageContext,
    StageParams,
    StageSkipped,
)

from .data import DataSource
from .formats.torch_source import TORCH_SOURCE
from .precision.modelopt import (
    check_calibration_eps,
    check_node_patterns,
    check_op_types,
    modelopt_environment,
    modelopt_files,
    modelopt_resources,
    private_model_copy,
    quantize_memory,
)
from .precision.torch_route import (
    MODELOPT_CHECKPOINT,
    TORCH_METHODS,
    TORCH_MODES,
    check_torch,
    check_torch_params,
    run_torch,
)

Mode = Literal["int8", "fp8", "int4", "nvfp4", "mxfp8"]
QuantizeOps = Literal["auto", "weighted", "modelopt"]

METHODS: dict[str, tuple[str, ...]] = {
    "int8": ("entropy", "max"),
    "fp8": ("entropy", "max"),
    "int4": ("awq_clip", "awq_lite", "awq_full", "rtn", "rtn_dq"),
    **TORCH_METHODS,
}
# What ModelOpt uses when no method is given (modelopt/onnx/quantization/quantize.py).
DEFAULT_METHOD = {"int8": "entropy", "fp8": "entropy", "int4": "awq_clip", "nvfp4": "max", "mxfp8": "max"}
# int4 methods that read only the weights, so they need no calibration data.
WEIGHT_ONLY_METHODS = ("rtn", "rtn_dq")
# The ops whose inputs "weighted" placement quantizes: those that multiply an activation by a weight.
WEIGHTED_OP_TYPES = ("Conv", "ConvTranspose", "Gemm", "MatMul")
_EPS = r"cpu|trt|NvTensorRtRtx|cuda:\d+|dml:\d+"


class Params(StageParams):
    mode: Mode = Field(
        ...,
        description="Quantization mode: int8 and fp8 quantize activations and weights (Q/DQ pairs); int4 "
        "quantizes Gemm/MatMul weights in blocks (weight-only); all three through ModelOpt's ONNX quantizer. "
        "nvfp4 (FP4 in blocks of 16, FP8 scales) and mxfp8 (FP8 in blocks of 32, E8M0 scales) take the PyTorch "
        "route: the export node's PyTorch model (inputs.source) is fake-quantized with modelopt.torch on a CUDA "
        "GPU and exported to ONNX with TensorRT-domain dynamic quantizers (skipped without a GPU).",
    )
    exclude_modules: list[str] | None = Field(
        None, description="nvfp4/mxfp8: PyTorch modules to leave unquantized, by name or wildcard (e.g. "
        "[head, patch_embed, 'blocks.11.*']).",
    )
    calibration_method: str | None = Field(
        None,
        description="ModelOpt calibration algorithm. int8/fp8: 'entropy' (ModelOpt's default) or 'max'. "
        "int4: 'awq_clip' (default), 'awq_lite', 'awq_full' (activation-aware, need calibration data), "
        "nvfp4: 'max' (default) or 'awq_lite', 'awq_clip', 'awq_full' (AWQ for the FP4 weights); mxfp8: 'max', "
        "'rtn' (round-to-nearest, Q/DQ) or 'rtn_dq' (round-to-nearest, DQ only), which need no data.",
    )
    calibration_data: DataSource | None = Field(
        None,
        description="Model inputs to calibrate with (axis 0 = samples). Required except for int4 'rtn' and "
        "'rtn_dq'. Random data only when asked for via 'random:'; the summary then says calibrated: false.",
    )
    calibration_batch_size: int | None = Field(
        None,
        ge=1,
        description="Rows of calibration_data per calibration call. Default: the model's static batch "
        "dimension, or 1 when it is dynamic. Calibration holds the calibrated tensors of one batch, so memory "
        "grows with this, not with the number of samples.",
    )
    quantize_ops: QuantizeOps = Field(
        "auto",
        description="Which nodes get Q/DQ (int8/fp8). 'weighted': only the inputs and weights of Conv, "
        "ConvTranspose, Gemm and MatMul-with-a-weight nodes; MatMuls of two activations (attention scores and "
        "attention-weighted values), residual Adds, LayerNorm, Softmax and GELU stay in high precision. "
        "'modelopt': ModelOpt's own placement, which also quantizes residual Adds, pooling, LayerNorm inputs "
        "and attention MatMuls, for TensorRT's int8 fusions. 'auto' (default): 'weighted' for int8 models with "
        "attention or LayerNormalization (per-tensor int8 on attention probabilities and the residual stream "
        "loses most of a transformer's accuracy), 'modelopt' otherwise (CNNs, fp8). Ignored when "
        "op_types_to_quantize or nodes_to_quantize choose the nodes.",
    )
    calibration_eps: list[str] = Field(
        default_factory=lambda: ["cpu"],
        description="ONNX Runtime execution providers used for calibration, in priority order: 'cpu', "
        "'cuda:N', 'trt', 'dml:N', 'NvTensorRtRtx'. Anything but 'cpu' needs a GPU.",
    )
    op_types_to_quantize: list[str] | None = Field(
        None,
        description="Only quantize nodes of these op types (e.g. [Conv, Gemm]); default: every op type "
        "ModelOpt supports. Exact names, no regular expressions. int8/fp8 only.",
    )
    op_types_to_exclude: list[str] | None = Field(
        None, description="Never quantize nodes of these op types (exact names). int8/fp8 only."
    )
    nodes_to_quantize: list[str] | None = Field(
        None,
        description="Only quantize nodes whose names match one of these regular expressions. int8/fp8 only.",
    )
    nodes_to_exclude: list[str] | None = Field(
        None, description="Never quantize nodes whose names match one of these regular expressions."
    )
    high_precision_dtype: Literal["fp32", "fp16", "bf16"] | None = Field(
        None,
        description="Precision of the parts of an int8/fp8 model that stay unquantized. Default: ModelOpt's "
        "default for int8/fp8, fp16 (the fp32 rest of the model is converted to fp16, I/O types kept). "
        "Not used by int4, which keeps the model's own precision.",
    )
    block_size: int | None = Field(
        None, ge=1, description="int4 only: weights per quantization block (ModelOpt's default: 128)."
    )
    use_external_data_format: bool = Field(
        False,
        description="Store the quantized weights in a separate file (the 'weights' output, model.onnx_data, "
        "which must sit beside model.onnx). ModelOpt also does so by itself for models over 2 GB.",
    )
    simplify: bool = Field(False, description="Let ModelOpt simplify the model (onnxsim) before quantizing.")

    @field_validator("calibration_eps")
    @classmethod
    def _known_eps(cls, eps: list[str]) -> list[str]:
        return check_calibration_eps(eps, _EPS, "'cpu', 'cuda:N', 'trt', 'dml:N' or 'NvTensorRtRtx'")

    @model_validator(mode="after")
    def _consistent(self) -> Params:
        methods = METHODS[self.mode]
        if self.calibration_method is not None and self.calibration_method not in methods:
            raise ValueError(
                f"calibration_method {self.calibration_method!r} does not apply to mode {self.mode}; "
                f"choose one of {list(methods)}"
            )
        if self.calibration_data is None and self.method not in WEIGHT_ONLY_METHODS:
            raise ValueError(
                f"mode {self.mode} with calibration_method {self.method!r} needs calibration_data (path, "
                "callable, or random: for a smoke test); only int4 'rtn'/'rtn_dq' calibrate without data"
            )
        if self.quantize_ops != "auto" and (self.op_types_to_quantize or self.nodes_to_quantize):
            raise ValueError(f"quantize_ops: {self.quantize_ops} and op_types_to_quantize/nodes_to_quantize both "
                             "choose the nodes to quantize; give one of them")
        if self.mode == "int4":
            unused = [name for name in ("op_types_to_quantize", "op_types_to_exclude", "nodes_to_quantize",
                                        "high_precision_dtype") if getattr(self, name) is not None]
            if self.quantize_ops != "auto":
                unused.append("quantize_ops")
            if unused:
                raise ValueError(
                    f"{', '.join(unused)} do not apply to int4 (ModelOpt quantizes every Gemm/MatMul weight "
                    "in int4 mode); use nodes_to_exclude to keep some in full precision"
                )
        elif self.block_size is not None:
            raise ValueError(f"block_size applies to int4 only, not to {self.mode}")
        if self.mode in TORCH_MODES:
            check_torch_params(self)
        elif self.exclude_modules is not None:
            raise ValueError("exclude_modules applies to nvfp4/mxfp8 (PyTorch modules); use nodes_to_exclude")
        return self

    @property
    def method(self) -> str:
        return self.calibration_method or DEFAULT_METHOD[self.mode]

    @property
    def uses_data(self) -> bool:
        return self.calibration_data is not None and self.method not in WEIGHT_ONLY_METHODS

    @property
    def uses_gpu(self) -> bool:
        return self.mode in TORCH_MODES or any(ep != "cpu" for ep in self.calibration_eps)


@functools.lru_cache(maxsize=1)
def supported_modes() -> tuple[str, ...]:
    """Quantization modes the installed ModelOpt's ONNX quantizer accepts, read from its CLI's choices.

    The CLI source is parsed rather than imported: importing ModelOpt takes seconds.
    """
    import ast
    import importlib.util

    spec = importlib.util.find_spec("modelopt")
    if spec is None or not spec.submodule_search_locations:
        return ()
    cli = Path(next(iter(spec.submodule_search_locations))) / "onnx" / "quantization" / "__main__.py"
    try:
        tree = ast.parse(cli.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        from modelopt.onnx.quantization.__main__ import get_parser

        action = next(a for a in get_parser()._actions if a.dest == "quantize_mode")
        return tuple(action.choices or ())
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == "--quantize_mode"):
            for keyword in node.keywords:
                if keyword.arg == "choices":
                    return tuple(ast.literal_eval(keyword.value))
    return ()


def check(params: Params) -> None:
    from trtflow.environment import dist_version, gpus

    if params.mode in TORCH_MODES:
        return check_torch(params)
    modes = supported_modes()
    if not modes:
        raise StageSkipped("NVIDIA ModelOpt is not installed", needs="pip install 'nvidia-modelopt[onnx]'")
    if params.mode not in modes:
        raise EnvironmentUnavailable(
            f"quantize mode {params.mode!r} is not supported by the installed ModelOpt "
            f"{dist_version('nvidia-modelopt')} ONNX quantizer, which supports {list(modes)}",
            hint=f"use one of {list(modes)}, or install a ModelOpt release whose ONNX PTQ supports "
            f"{params.mode}",
        )
    if params.uses_gpu and not gpus():
        gpu_eps = [ep for ep in params.calibration_eps if ep != "cpu"]
        raise StageSkipped(
            f"calibration_eps {gpu_eps} need an NVIDIA GPU and this machine has none",
            needs="an NVIDIA GPU, or calibration_eps: [cpu]",
        )


def run(ctx: StageContext, inputs: dict[str, Path], params: Params) -> dict[str, Any]:
    import onnx

    if params.mode in TORCH_MODES:
        return run_torch(ctx, inputs, params)

    from .accuracy.calibration import quantize_and_check
    from .data import onnx_input_specs
    from .precision.onnx_ptq import Quantizer, calibration_input, high_precision_dtype

    model_path = private_model_copy(inputs["model"], ctx.scratch / "input")
    check_node_patterns(
        model_path, {"nodes_to_quantize": params.nodes_to_quantize, "nodes_to_exclude": params.nodes_to_exclude}
    )
    for field in ("op_types_to_quantize", "op_types_to_exclude"):
        absent = check_op_types(model_path, field, getattr(params, field))
        if absent:
            ctx.log.warning("%s: the model has no node of op type %s (misspelt?)", field, absent)
    calibration = calibration_input(ctx, onnx_input_specs(model_path), params)
    placement = choose_placement(model_path, params)
    ctx.log.info("Q/DQ placement: %s (%s)", placement.name, placement.reason)
    quantize_with = Quantizer(ctx, model_path, params, placement, calibration)
    method, quantized_path, recovery = quantize_and_check(ctx, params, quantize_with, calibration, model_path,
                                                          ctx.scratch / "quantized")
    ctx.progress(0.9, "counting quantized nodes")
    model = onnx.load(str(quantized_path), load_external_data=False)
    counts = count_quantized(model)
    external = quantized_path.with_name("model.onnx_data")
    shutil.move(str(quantized_path), ctx.output("model"))
    if external.exists():
        shutil.move(str(external), ctx.output("weights"))
    data = params.calibration_data
    summary: dict[str, Any] = {
        "mode": params.mode,
        "calibration_method": method,
        **({"calibration_recovery": recovery} if recovery else {}),
        "calibrated": bool(params.uses_data and data is not None and not data.uncalibrated),
        "calibration_data": data.kind if params.uses_data and data is not None else None,
        "calibration_samples": calibration.rows,
        "calibration_batch_size": calibration.batch_size,
        "quantize_ops": placement.name,
        "quantize_ops_reason": placement.reason,
        "unquantized_activation_matmuls": len(placement.unquantized_matmuls),
        "calibration_eps": list(params.calibration_eps),
        "high_precision_dtype": high_precision_dtype(params),
        "opset": _opset(model),
        "external_data": ctx.output("weights").exists(),
        **counts,
    }
    if counts["quantized_nodes"] == 0:
        ctx.log.warning("ModelOpt quantized no node: the model has no op it quantizes in %s mode, or the "
                        "filters excluded all of them", params.mode)
    ctx.output("summary").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    ctx.progress(1.0, f"{counts['quantized_nodes']} nodes quantized")
    return summary


@dataclass(frozen=True)
class Placement:
    """Which nodes get Q/DQ: ``name`` ('weighted', 'modelopt', 'custom', 'int4'), why, and what it leaves out."""

    name: str
    reason: str
    op_types: tuple[str, ...] = ()
    unquantized_matmuls: tuple[str, ...] = ()


def choose_placement(model_path: Path, params: Params) -> Placement:
    """Resolve ``quantize_ops`` for this model (see the param's description)."""
    if params.mode not in ("int8", "fp8"):
        return Placement("int4", "int4 quantizes the weights of every Gemm/MatMul")
    if params.op_types_to_quantize or params.nodes_to_quantize:
        return Placement("custom", "op_types_to_quantize / nodes_to_quantize choose the nodes")
    graph = _graph_facts(model_path)
    if params.quantize_ops == "modelopt":
        return Placement("modelopt", "set in the recipe")
    attention = (f"{len(graph.activation_matmuls)} MatMul(s) of two activations (attention)"
                 if graph.activation_matmuls else "")
    norms = f"{graph.layer_norms} LayerNormalization node(s)" if graph.layer_norms else ""
    transformer_like = " and ".join(part for part in (attention, norms) if part)
    if params.quantize_ops == "weighted":
        reason = "set in the recipe"
    elif params.mode == "int8" and transformer_like:
        reason = (f"the model has {transformer_like}: int8 on attention probabilities and on the residual "
                  "stream loses most of a transformer's accuracy")
    else:
        why = ("fp8 keeps the range of attention and residual tensors" if transformer_like
               else "no attention or LayerNormalization (a CNN-like model)")
        return Placement("modelopt", f"{why}: ModelOpt's placement, which also quantizes residual Adds and "
                         "pooling for TensorRT's int8 fusions")
    if graph.unnamed:
        _name_unnamed_nodes(model_path)
        graph = _graph_facts(model_path)
    present = tuple(op for op in WEIGHTED_OP_TYPES if op in graph.op_types)
    return Placement("weighted", reason, present, tuple(graph.activation_matmuls))


@dataclass
class _GraphFacts:
    op_types: set[str]
    activation_matmuls: list[str]
    layer_norms: int
    unnamed: int


def _graph_facts(model_path: Path) -> _GraphFacts:
    """Op types, MatMuls without a constant operand, LayerNorm count and unnamed nodes, weights not loaded."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    constant = {init.name for init in graph.initializer}
    activation_matmuls = []
    for node in graph.node:
        inputs = [name for name in node.input if name]
        if node.op_type == "Constant" or (inputs and all(name in constant for name in inputs)):
            constant.update(node.output)
        elif node.op_type == "MatMul" and not any(name in constant for name in inputs):
            activation_matmuls.append(node.name)
    return _GraphFacts(
        op_types={node.op_type for node in graph.node},
        activation_matmuls=activation_matmuls,
        layer_norms=sum(node.op_type == "LayerNormalization" for node in graph.node),
        unnamed=sum(not node.name for node in graph.node),
    )


def _name_unnamed_nodes(model_path: Path) -> None:
    """Give every node a name (in our private copy), so that excluded nodes can be named to ModelOpt."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    taken = {node.name for node in model.graph.node}
    for index, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}_{index}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)
    onnx.save(model, str(model_path))


# Consumers of a dequantized tensor that do not compute on its values (Shape reads only its dimensions).
_NOT_COMPUTING_ON_VALUES = ("QuantizeLinear", "DequantizeLinear", "Shape", "Size")


def count_quantized(model: Any) -> dict[str, Any]:
    """Q/DQ counts, the op types that consume dequantized tensors, and the quantized data types."""
    import onnx

    graph = model.graph
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    initializer_types = {init.name: init.data_type for init in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    op_counts = Counter(node.op_type for node in graph.node)
    quantized_nodes: dict[str | int, str] = {}  # by node name, or identity for an unnamed node
    dtypes: Counter[str] = Counter()
    for node in graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        for consumer in consumers.get(node.output[0], []):
            if consumer.op_type not in _NOT_COMPUTING_ON_VALUES:
                quantized_nodes[consumer.name or id(consumer)] = consumer.op_type
        source = node.input[0]
        elem_type = initializer_types.get(source)
        producer = producers.get(source)
        if elem_type is None and producer is not None and producer.op_type == "QuantizeLinear":
            zero_point = producer.input[2] if len(producer.input) > 2 else ""
            elem_type = initializer_types.get(zero_point)
            if elem_type is None:
                output_dtype = next((a.i for a in producer.attribute if a.name == "output_dtype"), 0)
                elem_type = output_dtype or onnx.TensorProto.UINT8
        if elem_type is not None:
            dtypes[onnx.TensorProto.DataType.Name(elem_type).lower()] += 1
    return {
        "quantize_linear": op_counts.get("QuantizeLinear", 0),
        "dequantize_linear": op_counts.get("DequantizeLinear", 0),
        "quantized_nodes": len(quantized_nodes),
        "quantized_by_op_type": dict(sorted(Counter(quantized_nodes.values()).items())),
        "quantized_dtypes": dict(sorted(dtypes.items())),
        "nodes": len(graph.node),
    }


def _opset(model: Any) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


stage = Stage(
    name="quantize",
    version="4",
    description="Post-training quantization with NVIDIA ModelOpt: int8, fp8, int4 of an ONNX model; nvfp4, mxfp8 "
    "of the export node's PyTorch model on a GPU.",
    params=Params,
    run=run,
    inputs={"model": Input(ONNX, "the fp32/fp16 ONNX model to quantize"),
            "source": Input(TORCH_SOURCE, "nvfp4/mxfp8: the export node's source.json (its PyTorch model)",
                            optional=True)},
    outputs={
        "model": Output(ONNX, "model.onnx", "the quantized ONNX model (Q/DQ nodes, int4 weights)"),
        "summary": Output(METRICS, "quantize.json", "mode, method, calibration, quantized nodes by op type"),
        "weights": Output("onnx_data", "model.onnx_data", "external weights of model.onnx, when written",
                          optional=True),
        "checkpoint": Output(MODELOPT_CHECKPOINT, "modelopt.pth", "nvfp4/mxfp8: the fake-quantized PyTorch model "
                             "(ModelOpt state and weights), for validate and benchmark", optional=True),
    },
    resources=modelopt_resources,
    environment=modelopt_environment,
    files=modelopt_files,
    check=check,
    memory=quantize_memory,
    # Not modelopt: importing it initialises CUDA, and a forked node (nvfp4, mxfp8) then sees no CUDA device.
    preload=("modelopt.onnx.quantization", "onnxruntime", "numpy"),
)
