"""The fake-quantized PyTorch model of an nvfp4/mxfp8 quantize node, run on the GPU.

ONNX Runtime cannot run the TensorRT-domain ops of such an ONNX model, and the lent datacenter GPUs have no
TensorRT runtime that takes them; the quantize node keeps ModelOpt's checkpoint (modelopt.pth) beside the model, and
this module restores it onto a fresh model from the export's factory: the same quantizers, ranges and weights the
ONNX export came from. `fake_quant_runner` is a Polygraphy runner over it (validate compares it like any candidate);
`fake_quant_module` gives the module itself (benchmark times it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtflow.stage import RecipeError, StageSkipped

CHECKPOINT = "modelopt.pth"
NEEDS = "a CUDA GPU with a CUDA build of PyTorch and NVIDIA ModelOpt"


def checkpoint_of(model_path: Path) -> Path:
    """The checkpoint beside a quantize node's model, or a RecipeError saying where it comes from."""
    checkpoint = Path(model_path).parent / CHECKPOINT
    if not checkpoint.is_file():
        raise RecipeError(f"{Path(model_path).name} has no {CHECKPOINT} beside it: only the quantize stage's nvfp4 "
                          "and mxfp8 modes write the fake-quantized PyTorch model",
                          hint="connect a quantize node of mode nvfp4 or mxfp8, or choose another backend")
    return checkpoint


def unavailable_reason() -> str | None:
    """None when the fake-quantized model can run here, else why not (imports torch)."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return f"this PyTorch ({torch.__version__}) sees no CUDA device; ModelOpt's NVFP4/MXFP8 kernels need one"
    return None


def fake_quant_module(model_path: Path, load_callable: Callable[[str, str], Any]) -> tuple[Any, Any, Any]:
    """(module on the GPU in eval mode, its input binding, the export's `TorchSource`) of the quantize node's
    model."""
    reason = unavailable_reason()
    if reason:
        raise StageSkipped(f"cannot run the fake-quantized PyTorch model: {reason}", needs=NEEDS)
    from ..formats.torch_export import bind_inputs
    from ..formats.torch_source import TorchSource, build_module
    from ..precision.torch_quant import checkpoint_source, restore_checkpoint

    checkpoint = checkpoint_of(model_path)
    source = TorchSource(**checkpoint_source(checkpoint))
    module = restore_checkpoint(build_module(source, load_callable, weights=False), checkpoint)
    return module.cuda().eval(), bind_inputs(module, list(source.inputs)), source


def fake_quant_runner(model_path: Path, load_callable: Callable[[str, str], Any], name: str) -> Any:
    """A Polygraphy runner over the fake-quantized model: numpy batches in, float32 numpy outputs by name out."""
    from polygraphy.backend.base import BaseRunner
    from polygraphy.common import TensorMetadata

    state: dict[str, Any] = {}

    class FakeQuantRunner(BaseRunner):
        def __init__(self) -> None:
            super().__init__(name=name, prefix="trtflow-fake-quant")

        def activate_impl(self) -> None:
            state["module"], state["binding"], state["source"] = fake_quant_module(model_path, load_callable)

        def get_input_metadata_impl(self) -> Any:
            meta = TensorMetadata()
            for input_name, spec in state["source"].inputs.items():
                shape = [None if str(axis) in spec.get("dynamic_axes", {}) else size
                         for axis, size in enumerate(spec["shape"])]
                meta.add(input_name, spec.get("dtype", "float32"), shape)
            return meta

        def infer_impl(self, feed_dict: dict) -> dict:
            import torch

            start = time.perf_counter()
            tensors = {key: torch.from_numpy(value).cuda() for key, value in feed_dict.items()}
            args, kwargs = state["binding"].call_arguments(tensors)
            with torch.inference_mode():
                result = state["module"](*args, **kwargs)
            flat = list(result.values()) if isinstance(result, dict) else \
                list(result) if isinstance(result, (list, tuple)) else [result]
            self.inference_time = time.perf_counter() - start
            return {out: tensor.float().cpu().numpy() for out, tensor in zip(state["source"].outputs, flat,
                                                                              strict=False)}

        def deactivate_impl(self) -> None:
            state.clear()

    return FakeQuantRunner()


def check_available() -> None:
    """Plan-time check (no torch import): a GPU must be listed here."""
    from trtflow.environment import gpus

    if not gpus():
        raise StageSkipped("backend fake-quant runs the fake-quantized PyTorch model on a CUDA GPU, and this machine "
                           "has none", needs=NEEDS)


def refuse_onnxruntime(candidate: Path) -> None:
    """An nvfp4/mxfp8 model (its checkpoint beside it) holds TensorRT-domain ops ONNX Runtime cannot run."""
    if (Path(candidate).parent / CHECKPOINT).is_file():
        raise RecipeError(f"{Path(candidate).name} is an nvfp4/mxfp8 model with TensorRT-domain ops "
                          "(TRT_FP4DynamicQuantize, TRT_MXFP8DynamicQuantize) that ONNX Runtime cannot run",
                          field="backend", hint="set backend: fake-quant to compare the fake-quantized PyTorch "
                          "model on a GPU, or validate the engine built from it where a TensorRT runtime exists")
