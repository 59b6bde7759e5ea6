"""The precision audit of a TensorRT build, in one module: the network and the engine must compute in the
precision the recipe asked for.

`network_precision` and `engine_precision` read what precision each layer of a parsed network (before building) or
of a built engine (its inspector's layer information) computes in; `network_shortfall` and `engine_shortfall` say
where that misses the request. `audit_network` (build fails before building) and `audit_engine` (after building,
through `trt_runtime` where a runtime exists here) apply them for the build stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trtflow.stage import StageContext, StageFailed

_DTYPE_NAMES = {"FLOAT": "fp32", "HALF": "fp16", "BF16": "bf16", "INT8": "int8", "FP8": "fp8", "INT4": "int4",
                "FP4": "fp4", "INT32": "int32", "INT64": "int64", "BOOL": "bool", "UINT8": "uint8", "E8M0": "e8m0"}
FLOAT_PRECISIONS = ("fp32", "fp16", "bf16")
QUANTIZED_PRECISIONS = ("int8", "fp8", "int4", "fp4")
#: Layers that compute nothing themselves (data, shapes, the quantization boundaries).
_NON_COMPUTE = {"CONSTANT", "SHAPE", "QUANTIZE", "DEQUANTIZE", "DYNAMIC_QUANTIZE", "IDENTITY", "ASSERTION"}
#: The layers that carry a model's cost: a reduced-precision engine must run these in that precision.
HEAVY_LAYERS = ("CONVOLUTION", "DECONVOLUTION", "MATRIX_MULTIPLY", "ATTENTION")


def _enum_name(value: Any) -> str:
    return str(getattr(value, "name", value)).rsplit(".", 1)[-1].upper()


def _dtype_name(dtype: Any) -> str:
    name = _enum_name(dtype)
    return _DTYPE_NAMES.get(name, name.lower())


def network_precision(network: Any) -> dict[str, Any]:
    """The precision of every layer of a parsed (strongly typed) network, and counts by precision.

    A layer computes in int8/fp8 when every floating-point input it has is dequantized from that type (TensorRT
    fuses such Q/DQ-surrounded layers into quantized kernels), "int8-mixed" when only some are (weight-only
    quantization); otherwise in the type of its floating-point outputs (or inputs). Layers on integers only
    (shapes, indices) have no precision.
    """
    from collections import Counter

    producers: dict[str, Any] = {}
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        for out in range(layer.num_outputs):
            producers[layer.get_output(out).name] = layer
    layers = []
    by_precision: Counter[str] = Counter()
    heavy: Counter[str] = Counter()
    quantize: Counter[str] = Counter()
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        kind = _enum_name(layer.type)
        inputs = [layer.get_input(i) for i in range(layer.num_inputs)]
        inputs = [t for t in inputs if t is not None]
        in_types = [_dtype_name(t.dtype) for t in inputs]
        out_types = [_dtype_name(layer.get_output(i).dtype) for i in range(layer.num_outputs)]
        precision = None
        if kind == "QUANTIZE":
            precision = out_types[0] if out_types else None
            if precision:
                quantize[precision] += 1
        elif kind not in _NON_COMPUTE:
            float_inputs = [t for t, dtype in zip(inputs, in_types, strict=True) if dtype in FLOAT_PRECISIONS]
            sources = {_dequantized_from(producers.get(t.name), producers) for t in float_inputs}
            quantized = sorted(q for q in sources if q is not None)
            floats = [d for d in out_types + in_types if d in FLOAT_PRECISIONS]
            if quantized and None not in sources:
                precision = quantized[0]
            elif quantized:  # e.g. int8 weights, float activations: the layer reads int8 but computes in float
                precision = f"{quantized[0]}-mixed"
            else:
                precision = floats[0] if floats else None
        if precision and kind not in _NON_COMPUTE:
            by_precision[precision] += 1
            if kind in HEAVY_LAYERS:
                heavy[precision] += 1
        layers.append({"name": layer.name, "type": kind, "precision": precision,
                       "inputs": in_types, "outputs": out_types})
    return {"layers": len(layers), "by_precision": dict(sorted(by_precision.items())),
            "heavy_layers_by_precision": dict(sorted(heavy.items())),
            "quantize_layers": dict(sorted(quantize.items())), "per_layer": layers}


#: Layers that only move data: TensorRT moves a dequantization across them, so a layer behind one still
#: reads quantized data.
_DATA_MOVEMENT = {"SHUFFLE", "SLICE", "SQUEEZE", "UNSQUEEZE", "GATHER", "CONCATENATION"}


def _dequantized_from(layer: Any, producers: Mapping[str, Any], depth: int = 0) -> str | None:
    """The quantized type a DequantizeLayer reads (also through data-movement layers), else None."""
    if layer is None or depth > 4:
        return None
    kind = _enum_name(layer.type)
    if kind in _DATA_MOVEMENT:
        source = layer.get_input(0)
        return _dequantized_from(producers.get(source.name), producers, depth + 1) if source is not None else None
    if kind != "DEQUANTIZE":
        return None
    source = layer.get_input(0)
    name = _dtype_name(source.dtype) if source is not None else None
    return name if name in QUANTIZED_PRECISIONS else None


_ENGINE_FORMATS = (("int8", "int8"), ("fp8", "fp8"), ("int4", "int4"), ("fp4", "fp4"), ("bfloat16", "bf16"),
                   ("bf16", "bf16"), ("half", "fp16"), ("fp16", "fp16"), ("float", "fp32"), ("fp32", "fp32"))


def _format_precision(text: str) -> str | None:
    lowered = text.lower()
    for prefix, precision in _ENGINE_FORMATS:
        if lowered.startswith(prefix):
            return precision
    return None


def engine_precision(information: Mapping[str, Any]) -> dict[str, Any]:
    """Per-layer precisions of a built engine from its engine inspector JSON (``LayerInformationFormat.JSON``).

    A layer's precision is that of its first quantized input format, else of its first floating-point one
    ("Int8 NC/32HW32", "Half(...)"...). Needs an engine built with profiling_verbosity: detailed; with layer
    names only the result says so and holds no precisions.
    """
    from collections import Counter

    entries = information.get("Layers", [])
    if entries and all(isinstance(entry, str) for entry in entries):
        return {"layers": len(entries), "inspected": False,
                "reason": "the engine holds layer names only: build with profiling_verbosity: detailed"}
    by_precision: Counter[str] = Counter()
    layers = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        formats = [str(t.get("Format/Datatype", "")) for t in entry.get("Inputs", []) if isinstance(t, Mapping)]
        formats += [str(t.get("Format/Datatype", "")) for t in entry.get("Outputs", []) if isinstance(t, Mapping)]
        found = [p for p in (_format_precision(f) for f in formats) if p]
        quantized = [p for p in found if p in QUANTIZED_PRECISIONS]
        precision = quantized[0] if quantized else (found[0] if found else None)
        if precision:
            by_precision[precision] += 1
        layers.append({"name": entry.get("Name"), "type": entry.get("LayerType"), "precision": precision})
    return {"layers": len(layers), "inspected": True, "by_precision": dict(sorted(by_precision.items())),
            "per_layer": layers}


def network_shortfall(requested: str, network: Mapping[str, Any]) -> str | None:
    """Why a parsed network does not compute in the requested int8/fp8 (None when it does or none was asked)."""
    by_precision = network.get("by_precision", {})
    if requested not in ("int8", "fp8") or by_precision.get(requested) or by_precision.get(f"{requested}-mixed"):
        return None
    quantized = network.get("quantize_layers", {}).get(requested, 0)
    return (f"precision: {requested} was asked, but no layer of the parsed network computes in {requested}: "
            f"{quantized} tensor(s) are quantized to {requested}, yet no layer reads a tensor dequantized from "
            f"{requested}; the network computes in {_counts(by_precision)}")


def engine_shortfall(requested: str, engine: Mapping[str, Any]) -> str | None:
    """Why an inspected engine has no kernel in the requested reduced precision (None when it has)."""
    if requested not in ("int8", "fp8", "fp16", "bf16") or not engine.get("inspected"):
        return None
    if engine.get("by_precision", {}).get(requested):
        return None
    return (f"precision: {requested} was asked, but TensorRT built no {requested} kernel: the engine's layers run "
            f"in {_counts(engine.get('by_precision', {}))}")


def _counts(by_precision: Mapping[str, int]) -> str:
    return ", ".join(f"{p} ({n} layers)" for p, n in sorted(by_precision.items(), key=lambda kv: -kv[1])) or "nothing"


QUANTIZED_FIX = ("quantize the model's Conv/MatMul/Gemm nodes, inputs and weights both (the quantize stage does by "
                  "default; see quantize.json's quantized_by_op_type: op_types_to_quantize or nodes_to_exclude may "
                  "have left them out), or build with precision: strongly-typed to accept what the model carries")
ENGINE_FIX = ("TensorRT fuses Q/DQ into a quantized kernel only where the pattern allows (the layer's inputs and "
               "weights quantized, nothing unsupported between the Q/DQ pair and the layer); engine.json's "
               "precision.engine.per_layer gives each layer's format")


def audit_network(requested: str, network: Any) -> dict[str, Any]:
    """Precisions of the parsed network's layers; StageFailed (before building) when they miss the request."""
    audit = network_precision(network)
    shortfall = network_shortfall(requested, audit)
    if shortfall:
        raise StageFailed(shortfall, hint=QUANTIZED_FIX)
    return audit


def audit_engine(ctx: StageContext, requested: str, backend: str, engine_path: Path,
                  provenance_path: Path) -> dict[str, Any]:
    """Precisions of the built engine's layers through the engine inspector, where a TensorRT runtime exists."""
    from .trt_runtime import open_engine, runtime_available

    reason = runtime_available(backend, ctx.gpu)
    if reason:
        return {"inspected": False, "reason": f"no {backend} runtime here to inspect the engine: {reason}"}
    try:
        with ctx.native_step(backend, "deserialising the engine for the engine inspector"), \
                open_engine(engine_path, provenance_path, backend, ctx.gpu) as session:
            information = session.layer_information()
    except Exception as error:  # an audit that cannot run must not fail a good build
        ctx.log.warning("engine inspection failed: %s", error)
        return {"inspected": False, "reason": f"the engine inspector failed: {type(error).__name__}: {error}"}
    audit = engine_precision(information)
    shortfall = engine_shortfall(requested, audit)
    if shortfall:
        raise StageFailed(shortfall, hint=ENGINE_FIX)
    return audit
