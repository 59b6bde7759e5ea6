"""The quantize stage's PyTorch route (modes nvfp4 and mxfp8), on a CUDA GPU.

The export node's source.json names the PyTorch model; its factory builds it (with its checkpoint), the node's
calibration data runs through it while ModelOpt fake-quantizes it (`torch_quant`), and ModelOpt's exporter writes
the ONNX model TensorRT builds, with the export's input and output names and float32 I/O. The fake-quantized model
is kept as ModelOpt's checkpoint (modelopt.pth) beside the ONNX model: ONNX Runtime cannot run the TensorRT-domain
ops, so validate and benchmark run that PyTorch model on the GPU instead (`accuracy.fake_quant`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trtflow.stage import RecipeError, StageContext, StageFailed, StageSkipped

from .torch_quant import GPU_NEED, METHODS, TORCH_MODES

if TYPE_CHECKING:
    from ..data import DataSource

TORCH_METHODS = METHODS
__all__ = ["MODELOPT_CHECKPOINT", "TORCH_METHODS", "TORCH_MODES", "check_torch", "check_torch_params", "run_torch"]
#: The artifact kind of modelopt.pth.
MODELOPT_CHECKPOINT = "modelopt_checkpoint"
_ONNX_ONLY = ("op_types_to_quantize", "op_types_to_exclude", "nodes_to_quantize", "nodes_to_exclude", "block_size")


class TorchQuantizeParams(Protocol):
    """What the PyTorch route reads of a quantize node's params (the quantize stage's ``Params``); also the ONNX
    quantizer's fields in ``_ONNX_ONLY``, which it refuses."""

    @property
    def mode(self) -> str: ...

    @property
    def method(self) -> str: ...

    @property
    def exclude_modules(self) -> Sequence[str] | None: ...

    @property
    def calibration_data(self) -> DataSource | None: ...

    @property
    def calibration_batch_size(self) -> int | None: ...

    @property
    def calibration_eps(self) -> Sequence[str]: ...

    @property
    def quantize_ops(self) -> str: ...

    @property
    def high_precision_dtype(self) -> str | None: ...


def check_torch_params(params: TorchQuantizeParams) -> None:
    """Params of the ONNX quantizer that the PyTorch route cannot honour are errors (ValueError, for pydantic)."""
    unused = [name for name in _ONNX_ONLY if getattr(params, name) is not None]
    if params.quantize_ops != "auto":
        unused.append("quantize_ops")
    if list(params.calibration_eps) != ["cpu"]:
        unused.append("calibration_eps")
    if unused:
        raise ValueError(f"{', '.join(unused)} do not apply to {params.mode}, which quantizes the PyTorch model "
                         "(calibration runs on the GPU in PyTorch); use exclude_modules to keep modules unquantized")
    if params.high_precision_dtype == "bf16":
        raise ValueError(f"high_precision_dtype bf16: ModelOpt 0.47 exports {params.mode} models with fp16 or fp32 "
                         "weights only")


def check_torch(params: TorchQuantizeParams) -> None:
    from trtflow.environment import gpus, module_available

    if not module_available("modelopt"):
        raise StageSkipped("NVIDIA ModelOpt is not installed", needs="pip install 'nvidia-modelopt[onnx]'")
    if not gpus():
        raise StageSkipped(f"mode {params.mode} fake-quantizes the PyTorch model with ModelOpt, which runs only on "
                           "a CUDA GPU, and this machine has none", needs=GPU_NEED)


def run_torch(ctx: StageContext, inputs: dict[str, Path], params: TorchQuantizeParams) -> dict[str, Any]:
    import torch

    from ..data import batch_rows, onnx_input_specs, open_dataset
    from ..formats.torch_export import bind_inputs
    from ..formats.torch_source import FILENAME, build_module, read_source
    from . import torch_quant

    if not torch.cuda.is_available():
        raise StageSkipped(f"mode {params.mode} needs CUDA, and this PyTorch ({torch.__version__}) sees no CUDA "
                           "device", needs=GPU_NEED)
    source_path = inputs.get("source") or inputs["model"].parent / FILENAME
    if not Path(source_path).is_file():
        raise RecipeError(f"mode {params.mode} quantizes the export node's PyTorch model, but no source.json came "
                          "with the inputs", field="inputs.source",
                          hint="add `source: <export node>` to the node's inputs (an export of a python: model)")
    source = read_source(Path(source_path))
    model = build_module(source, ctx.load_callable, ctx.resolve).cuda()
    binding = bind_inputs(model, list(source.inputs))
    specs = onnx_input_specs(inputs["model"])
    assert params.calibration_data is not None
    dataset = open_dataset(params.calibration_data, specs, ctx.resolve, ctx.log)
    try:
        batch_size, _ = batch_rows(specs, params.calibration_batch_size)
    except ValueError as error:
        raise RecipeError(str(error), field="calibration_batch_size") from None
    total = dataset.num_batches(batch_size)

    def call(module: Any, batch: dict[str, Any]) -> Any:
        tensors = {name: torch.from_numpy(array).cuda() for name, array in batch.items()}
        args, kwargs = binding.call_arguments(tensors)
        return module(*args, **kwargs)

    def forward_loop(module: Any) -> None:
        for index, batch in enumerate(dataset.batches(batch_size), 1):
            call(module, batch)
            ctx.progress(0.1 + 0.6 * index / total, f"calibrating: batch {index}/{total}")

    first = next(dataset.batches(batch_size))
    config = torch_quant.quant_config(params.mode, params.method, params.exclude_modules or ())
    started = time.perf_counter()
    try:
        with ctx.native_step("modelopt", f"fake-quantizing the PyTorch model to {params.mode} on the GPU"):
            model, turned_off = torch_quant.quantize_module(model, config, forward_loop, lambda m: call(m, first),
                                                            params.exclude_modules or ())
        torch.cuda.synchronize()
        quantize_seconds = time.perf_counter() - started
        ctx.progress(0.75, "exporting to ONNX with ModelOpt's exporter")
        sample = {name: torch.from_numpy(array[:2]).cuda() for name, array in first.items()}
        args, kwargs = binding.call_arguments(sample)
        started = time.perf_counter()
        torch_quant.export_onnx(model, args, kwargs, binding.order, source.outputs, source.dynamic_axes,
                                source.opset, params.high_precision_dtype or "fp16", ctx.output("model"),
                                ctx.scratch / "export")
        export_seconds = time.perf_counter() - started
    except (StageFailed, RecipeError, StageSkipped):
        raise
    except Exception as error:
        ctx.log.exception("ModelOpt's PyTorch route failed")
        raise StageFailed(f"ModelOpt {params.mode} quantization of {source.model} failed: {type(error).__name__}: "
                          f"{error}", hint="the node's log has the traceback; exclude_modules keeps modules that "
                          "fail unquantized") from error
    external = ctx.output("model").with_name("model.onnx_data")
    if external.exists():
        external.replace(ctx.output("weights"))
    torch_quant.save_checkpoint(model, ctx.output("checkpoint"), source.__dict__)
    data = params.calibration_data
    summary: dict[str, Any] = {
        "mode": params.mode, "route": "pytorch", "calibration_method": params.method,
        "modelopt_config": torch_quant.config_name(params.mode, params.method),
        "calibrated": not data.uncalibrated, "calibration_data": data.kind, "calibration_samples": dataset.rows,
        "calibration_batch_size": batch_size, "exclude_modules": list(params.exclude_modules or []),
        "high_precision_dtype": params.high_precision_dtype or "fp16", "gpu": torch.cuda.get_device_name(),
        **torch_quant.quantizer_counts(model),
        "turned_off": {reason: len(names) for reason, names in turned_off.items()},
        "quantize_seconds": round(quantize_seconds, 3), "export_seconds": round(export_seconds, 3),
        "external_data": ctx.output("weights").exists(), "onnx_bytes": ctx.output("model").stat().st_size,
        **torch_quant.onnx_facts(ctx.output("model")),
    }
    for reason, names in turned_off.items():
        ctx.log.info("quantizers turned off (%s): %s", reason, ", ".join(names))
    ctx.output("summary").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    ctx.progress(1.0, f"{summary['quantized_modules']} modules quantized to {params.mode}")
    return summary
