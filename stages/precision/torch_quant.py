"""NVFP4 and MXFP8 through NVIDIA ModelOpt's PyTorch route (``modelopt.torch.quantization``).

ModelOpt 0.47's ONNX quantizer has no NVFP4 or MXFP8 mode. These formats come from fake-quantizing the PyTorch
model (``mtq.quantize`` with ``NVFP4_*_CFG`` / ``MXFP8_DEFAULT_CFG``) and exporting it with ModelOpt's own ONNX
exporter (``modelopt.torch._deploy.utils.get_onnx_bytes_and_metadata``), whose nvfp4/mxfp8 exporters
(``modelopt/onnx/export``) store the weights in FP4 / FP8 with block scales and turn the activation quantizers
into TensorRT-domain dynamic quantizers (``TRT_FP4DynamicQuantize``, ``TRT_MXFP8DynamicQuantize``): the ONNX
model TensorRT builds. ONNX Runtime cannot run those ops.

Both formats need a CUDA GPU in PyTorch: NVFP4's dynamic block quantization asserts a CUDA ``amax`` (a Triton
kernel on compute capability 8.9 and newer) and MXFP8 runs a CUDA extension ModelOpt compiles with nvcc.

What TensorRT accepts, applied as ModelOpt's own TensorRT example (``examples/torch_onnx``) does:
- TensorRT's block dynamic quantizer takes 2D/3D tensors: Conv layers are quantized per tensor in FP8 instead,
  and block quantizers of inputs that are 4D or more (seen in one probe forward pass) are turned off;
- the first convolution of an image model (3 or fewer input channels) keeps its input in high precision: on
  Blackwell TensorRT has no FP8 kernel for that fusion;
- a quantizer whose calibrated range is zero or NaN is turned off (its scale would divide by zero).

This module is cheap to import; torch and ModelOpt are imported by the functions that need them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: Modes of the quantize stage that take the PyTorch route.
TORCH_MODES: tuple[str, ...] = ("nvfp4", "mxfp8")
#: Calibration methods per mode: 'max' calibrates ranges only; the AWQ variants search per-channel weight scales
#: on the calibration data (activation-aware), for NVFP4 weights.
METHODS: dict[str, tuple[str, ...]] = {"nvfp4": ("max", "awq_lite", "awq_clip", "awq_full"), "mxfp8": ("max",)}
#: The ModelOpt config each (mode, method) starts from (modelopt.torch.quantization.config).
CONFIGS: dict[tuple[str, str], str] = {
    ("nvfp4", "max"): "NVFP4_DEFAULT_CFG",
    ("nvfp4", "awq_lite"): "NVFP4_AWQ_LITE_CFG",
    ("nvfp4", "awq_clip"): "NVFP4_AWQ_CLIP_CFG",
    ("nvfp4", "awq_full"): "NVFP4_AWQ_FULL_CFG",
    ("mxfp8", "max"): "MXFP8_DEFAULT_CFG",
}
#: Conv layers in FP8 per tensor, as ModelOpt's TensorRT example does for NVFP4/MXFP8 models.
FP8_CONV: tuple[dict[str, Any], ...] = (
    {"parent_class": "nn.Conv2d", "quantizer_name": "*weight_quantizer", "cfg": {"num_bits": (4, 3), "axis": None}},
    {"parent_class": "nn.Conv2d", "quantizer_name": "*input_quantizer", "cfg": {"num_bits": (4, 3), "axis": None}},
)
#: What needs a GPU, said once for check() and the skip reason.
GPU_NEED = ("a CUDA GPU with a CUDA build of PyTorch (ModelOpt's NVFP4/MXFP8 fake quantization runs only on "
            "CUDA: dynamic block quantization needs a CUDA amax, and the MX extension is compiled with nvcc)")


def config_name(mode: str, method: str) -> str:
    try:
        return CONFIGS[(mode, method)]
    except KeyError:
        raise ValueError(f"calibration_method {method!r} does not apply to mode {mode}; choose one of "
                         f"{list(METHODS.get(mode, ()))}") from None


def quant_config(mode: str, method: str, exclude: Sequence[str] = ()) -> dict[str, Any]:
    """ModelOpt's config for (mode, method), with Conv layers in FP8 per tensor (TensorRT's block quantizers take
    2D/3D tensors only) and the modules named by ``exclude`` (names or wildcards) left unquantized."""
    import copy

    import modelopt.torch.quantization as mtq

    config = copy.deepcopy(getattr(mtq, config_name(mode, method)))
    config["quant_cfg"] = [*config["quant_cfg"], *copy.deepcopy(list(FP8_CONV)),
                           *({"quantizer_name": f"{pattern}.*", "enable": False} for pattern in exclude)]
    if not config.get("algorithm"):  # MXFP8 scales are dynamic, but the FP8 convolutions need calibrated ranges
        config["algorithm"] = "max"
    return config


# -- quantizing -------------------------------------------------------------------------------------------------


def _quantizers(model: Any) -> Iterable[tuple[str, Any]]:
    from modelopt.torch.quantization.nn import TensorQuantizer

    for name, module in model.named_modules():
        if isinstance(module, TensorQuantizer):
            yield name, module


def quantizer_format(quantizer: Any) -> str:
    """A label for what one ModelOpt ``TensorQuantizer`` does: nvfp4, mxfp8, fp8, int8, int4, or num_bits."""
    bits = quantizer.num_bits
    bits = tuple(bits) if isinstance(bits, list) else bits
    blocks = quantizer.block_sizes or {}
    scale = blocks.get("scale_bits")
    scale = tuple(scale) if isinstance(scale, list) else scale
    if bits == (2, 1) and scale == (4, 3):
        return "nvfp4"
    if bits == (4, 3) and scale == (8, 0):
        return "mxfp8"
    if bits == (4, 3):
        return "fp8"
    if bits in (8, 4):
        return f"int{bits}" + ("-block" if blocks else "")
    return str(bits)


def excluded_quantizers(model: Any, patterns: Sequence[str]) -> list[str]:
    """The quantizers of the modules ``patterns`` name (names or fnmatch wildcards), all of them turned off."""
    import fnmatch

    return [name for name, quantizer in _quantizers(model)
            if not quantizer.is_enabled and any(fnmatch.fnmatch(name, f"{p}.*") for p in patterns)]


def disable_high_rank_block_inputs(model: Any, probe: Callable[[Any], Any]) -> list[str]:
    """Turn off block quantizers on inputs of 4 or more dimensions, seen in one forward pass (``probe(model)``):
    TensorRT's dynamic block quantizers take 2D/3D tensors only."""
    import torch

    blocked = {name.removesuffix(".input_quantizer"): quantizer for name, quantizer in _quantizers(model)
               if name.endswith("input_quantizer") and quantizer.is_enabled and quantizer.block_sizes}
    if not blocked:
        return []
    modules = dict(model.named_modules())
    high_rank: set[str] = set()
    handles = []
    for name in blocked:
        def hook(module: Any, inputs: Any, output: Any, _name: str = name) -> None:
            if inputs and getattr(inputs[0], "ndim", 0) > 3:
                high_rank.add(_name)

        handles.append(modules[name].register_forward_hook(hook))
    try:
        with torch.no_grad():
            probe(model)
    finally:
        for handle in handles:
            handle.remove()
    for name in high_rank:
        blocked[name].disable()
    return sorted(f"{name}.input_quantizer" for name in high_rank)


def disable_raw_image_conv_inputs(model: Any) -> list[str]:
    """Keep the input of convolutions over 3 or fewer channels (an image's first layer) in high precision: on
    Blackwell TensorRT has no FP8 kernel for that Q -> Conv fusion (ModelOpt's example does the same)."""
    import torch

    disabled = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Conv2d) and module.in_channels <= 3:
            quantizer = getattr(module, "input_quantizer", None)
            if quantizer is not None and quantizer.is_enabled:
                quantizer.disable()
                disabled.append(f"{name}.input_quantizer")
    return disabled


def disable_dead_quantizers(model: Any) -> list[str]:
    """Turn off quantizers whose calibrated amax is not positive or NaN (their scale would divide by zero)."""
    import torch

    disabled = []
    for name, quantizer in _quantizers(model):
        amax = getattr(quantizer, "amax", None)
        if not quantizer.is_enabled or amax is None or not torch.is_tensor(amax) or quantizer.block_sizes:
            continue
        if bool(torch.any(torch.isnan(amax))) or bool(torch.all(amax <= 0)):
            quantizer.disable()
            disabled.append(name)
    return disabled


def quantize_module(model: Any, config: Mapping[str, Any], forward_loop: Callable[[Any], None] | None,
                    probe: Callable[[Any], Any], exclude: Sequence[str] = ()) -> tuple[Any, dict[str, list[str]]]:
    """Fake-quantize ``model`` in place with ModelOpt (``forward_loop`` runs the calibration data through it),
    then turn off what TensorRT cannot take; returns the model and the quantizers turned off, by reason
    (``exclude``: the patterns the config leaves unquantized, for the record)."""
    import modelopt.torch.quantization as mtq

    model = mtq.quantize(model, dict(config), forward_loop=forward_loop)
    disabled = {
        "excluded": excluded_quantizers(model, exclude),
        "input_rank_above_3": disable_high_rank_block_inputs(model, probe),
        "image_input_conv": disable_raw_image_conv_inputs(model),
        "zero_or_nan_range": disable_dead_quantizers(model),
    }
    return model, {reason: names for reason, names in disabled.items() if names}


def quantizer_counts(model: Any) -> dict[str, Any]:
    """Enabled quantizers by format and role (weight/input/output), and the quantized modules by type."""
    by_format: Counter[str] = Counter()
    modules: dict[str, str] = {}
    off = 0
    parents = dict(model.named_modules())
    for name, quantizer in _quantizers(model):
        if not quantizer.is_enabled:
            off += 1
            continue
        owner, _, role = name.rpartition(".")
        by_format[f"{quantizer_format(quantizer)} {role.removesuffix('_quantizer')}"] += 1
        if role == "weight_quantizer" and owner in parents:
            modules[owner] = type(parents[owner]).__name__
    types = Counter(modules.values())
    return {"quantizers": dict(sorted(by_format.items())), "quantizers_off": off,
            "quantized_modules": len(modules), "quantized_by_module_type": dict(sorted(types.items()))}


# -- the ModelOpt checkpoint --------------------------------------------------------------------------------------


def save_checkpoint(model: Any, path: Path, source: Mapping[str, Any] | None = None) -> None:
    """ModelOpt's checkpoint (as ``mto.save`` writes it: its state, which quantizers and their settings, and the
    weights with the calibrated ranges), plus ``source``: how to build the model it restores onto."""
    import modelopt.torch.opt as mto
    import torch

    torch.save({"modelopt_state": mto.modelopt_state(model), "model_state_dict": model.state_dict(),
                "trtflow_source": dict(source or {})}, str(path))


def checkpoint_source(path: Path) -> dict[str, Any]:
    """The ``source`` a checkpoint was saved with."""
    from modelopt.torch.utils.serialization import safe_load

    return dict(safe_load(str(path), map_location="cpu").get("trtflow_source") or {})


def restore_checkpoint(model: Any, path: Path) -> Any:
    """The fake-quantized model: ``model`` (fresh from its factory) with the checkpoint's quantizers and weights
    (what ``mto.restore`` does)."""
    import modelopt.torch.opt as mto
    from modelopt.torch.utils.serialization import safe_load

    saved = safe_load(str(path), map_location="cpu")
    model = mto.restore_from_modelopt_state(model, saved["modelopt_state"])
    model.load_state_dict(saved["model_state_dict"])
    return model


# -- ONNX ----------------------------------------------------------------------------------------------------------


def export_onnx(model: Any, args: Sequence[Any], kwargs: Mapping[str, Any], names: Sequence[str],
                outputs: Sequence[str], dynamic_axes: Mapping[str, Mapping[int, str]], opset: int,
                weights_dtype: str, target: Path, workdir: Path) -> None:
    """Export the fake-quantized model with ModelOpt's exporter (real low-precision weights, TensorRT-domain
    dynamic quantizers), then give its inputs and outputs the names and float32 types of the fp32 export:
    ``names`` are the recipe's input names in the order of ``args`` then ``kwargs``.

    ModelOpt 0.47 converts an NVFP4 graph to fp16 through its AutoCast, which parses the graph with TensorRT's
    Python module to type the custom ops (a NameError without TensorRT); so the graph is exported with fp32
    weights and converted here with the steps ModelOpt applies to its FP8/MXFP8/INT8 graphs (`to_float16`)."""
    import inspect

    import onnx
    from modelopt.torch._deploy.utils import OnnxBytes, get_onnx_bytes_and_metadata

    positional = [p.name for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    modelopt_names = [*positional[:len(args)], *kwargs]
    renamed = dict(zip(names, modelopt_names, strict=True))
    dummy: tuple[Any, ...] = (*args, dict(kwargs)) if kwargs else tuple(args)
    onnx_bytes, _ = get_onnx_bytes_and_metadata(
        model, dummy, model_name="model", onnx_opset=opset, weights_dtype="fp32",
        dynamic_axes={renamed[name]: dict(axes) for name, axes in dynamic_axes.items()},
    )
    workdir.mkdir(parents=True, exist_ok=True)
    OnnxBytes.from_bytes(onnx_bytes).write_to_disk(str(workdir), clean_dir=False)
    proto = onnx.load(str(workdir / "model.onnx"), load_external_data=True)
    graph_inputs = [value.name for value in proto.graph.input]
    rename_io(proto, {modelopt_names[i]: name for i, name in enumerate(names) if modelopt_names[i] in graph_inputs},
              dict(zip([value.name for value in proto.graph.output], outputs, strict=False)))
    if weights_dtype == "fp16":
        proto = to_float16(proto)
    keep_float32_io(proto)
    save_model(proto, target)


def to_float16(proto: Any) -> Any:
    """The float tensors of a quantized graph in fp16, Q/DQ scales kept in fp32: the conversion ModelOpt's exporter
    applies to FP8, MXFP8 and INT8 graphs (``get_onnx_bytes_and_metadata``), applied to any of them."""
    from modelopt.onnx.quantization.qdq_utils import replace_zero_scale_with_smallest_nonzero
    from modelopt.onnx.utils import (
        change_casts_to_fp16,
        fold_dq_fp32_to_fp16_casts,
        fold_qdq_scale_fp16_to_fp32_casts,
        remove_redundant_casts,
    )
    from onnxconverter_common import convert_float_to_float16

    proto = convert_float_to_float16(proto, keep_io_types=False, disable_shape_infer=True, check_fp16_ready=False,
                                     op_block_list=["QuantizeLinear", "DequantizeLinear", "Div"])
    proto = change_casts_to_fp16(proto, ["Concat", "Add", "Sqrt", "LayerNormalization", "Clip", "Mul", "Exp"])
    proto = fold_dq_fp32_to_fp16_casts(proto)
    proto = fold_qdq_scale_fp16_to_fp32_casts(proto)
    proto = remove_redundant_casts(proto)
    proto = replace_zero_scale_with_smallest_nonzero(proto)
    proto.ir_version = 10  # what ModelOpt sets: ONNX Runtime and TensorRT read IR 10
    return proto


def rename_io(proto: Any, inputs: Mapping[str, str], outputs: Mapping[str, str]) -> None:
    """Rename graph inputs and outputs (and every use of them) in place."""
    mapping = {old: new for old, new in {**inputs, **outputs}.items() if old != new}
    if not mapping:
        return
    graph = proto.graph
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name in mapping:
                node.input[index] = mapping[name]
        for index, name in enumerate(node.output):
            if name in mapping:
                node.output[index] = mapping[name]
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.name in mapping:
            value.name = mapping[value.name]


def keep_float32_io(proto: Any) -> list[str]:
    """Float16 graph inputs and outputs become float32 with a Cast beside them, so the quantized model takes and
    gives what the fp32 export does (data and comparisons stay float32); returns the tensors changed."""
    from onnx import TensorProto, helper

    graph = proto.graph
    changed = []
    casts_in, casts_out = [], []
    initializers = {init.name for init in graph.initializer}
    for value in graph.input:
        if value.type.tensor_type.elem_type != TensorProto.FLOAT16 or value.name in initializers:
            continue
        inner = f"{value.name}_fp16"
        for node in graph.node:
            for index, name in enumerate(node.input):
                if name == value.name:
                    node.input[index] = inner
        casts_in.append(helper.make_node("Cast", [value.name], [inner], to=TensorProto.FLOAT16,
                                         name=f"{value.name}_to_fp16"))
        value.type.tensor_type.elem_type = TensorProto.FLOAT
        changed.append(value.name)
    for value in graph.output:
        if value.type.tensor_type.elem_type != TensorProto.FLOAT16:
            continue
        inner = f"{value.name}_fp16"
        for node in graph.node:
            for index, name in enumerate(node.output):
                if name == value.name:
                    node.output[index] = inner
            for index, name in enumerate(node.input):
                if name == value.name:
                    node.input[index] = inner
        casts_out.append(helper.make_node("Cast", [inner], [value.name], to=TensorProto.FLOAT,
                                          name=f"{value.name}_to_fp32"))
        value.type.tensor_type.elem_type = TensorProto.FLOAT
        changed.append(value.name)
    nodes = [*casts_in, *graph.node, *casts_out]
    del graph.node[:]
    graph.node.extend(nodes)
    return changed


def save_model(proto: Any, target: Path) -> None:
    """Save in one file, or with the weights in ``<name>_data`` beside it when the model passes protobuf's 2 GB."""
    import onnx

    large = proto.ByteSize() > (1 << 31) - (1 << 26)
    onnx.save_model(proto, str(target), save_as_external_data=large, all_tensors_to_one_file=True,
                    location=f"{target.name}_data", size_threshold=1024)


def onnx_facts(path: Path) -> dict[str, Any]:
    """What TensorRT must accept in a quantized ONNX model: opsets, custom-domain ops, block-quantized
    DequantizeLinear nodes and the low-precision weight types (weights not loaded)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    custom: Counter[str] = Counter()
    blocked = 0
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            custom[f"{node.domain}::{node.op_type}"] += 1
        if node.op_type == "DequantizeLinear" and any(a.name == "block_size" and a.i for a in node.attribute):
            blocked += 1
    weight_types: Counter[str] = Counter()
    for init in graph.initializer:
        kind = onnx.TensorProto.DataType.Name(init.data_type).lower()
        if kind not in ("float", "float16", "bfloat16", "int64", "int32", "bool", "double"):
            weight_types[kind] += 1
    return {
        "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
        "opsets": {o.domain or "ai.onnx": o.version for o in model.opset_import},
        "custom_ops": dict(sorted(custom.items())),
        "block_dequantize_linear": blocked,
        "low_precision_initializers": dict(sorted(weight_types.items())),
        "nodes": len(graph.node),
    }
