"""What a fixed-batch benchmark point times, per backend: an ONNX Runtime session's run (host or device-resident
I/O), an eager PyTorch module's call, an engine's layer profile on a separate execution context."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trtflow.stage import StageSkipped

from ...data import InputSpec


def ort_providers(device: str) -> list[str]:
    if device != "cuda":
        return ["CPUExecutionProvider"]
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise StageSkipped("this ONNX Runtime has no CUDA execution provider",
                           needs="pip install onnxruntime-gpu, or device: cpu")
    return ["CUDAExecutionProvider"]


def onnxruntime_call(session: Any, feed: Mapping[str, Any], device: str,
                     include_host_transfers: bool) -> tuple[Callable[[], Any], str]:
    """The call to time and what it runs on; on CUDA without host transfers, inputs and outputs stay on the device."""
    import onnxruntime as ort

    if device == "cuda" and not include_host_transfers:
        binding = session.io_binding()
        for name, array in feed.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0))
        for output in session.get_outputs():
            binding.bind_output(output.name, "cuda")
        return (lambda: session.run_with_iobinding(binding)), "onnxruntime CUDA EP, device-resident I/O"
    return (lambda: session.run(None, dict(feed))), f"onnxruntime {session.get_providers()[0]}"


def torch_call(module: Any, specs: Sequence[InputSpec], feed: Mapping[str, Any], device: str) -> Callable[[], Any]:
    import torch

    module = module.to(device).eval()
    tensors = [torch.from_numpy(feed[spec.name]).to(device) for spec in specs]

    def call() -> Any:
        with torch.inference_mode():
            return module(*tensors)

    return call


def layer_profile(session: Any, feed: Mapping[str, Any], iterations: int,
                  timer_factory: Callable[[], Any]) -> dict[str, Any]:
    """Layer information and per-layer times on a separate execution context (a profiler slows inference)."""
    from ..statistics.stats import summarize_layer_times

    with session.fork() as profiled, timer_factory() as timer:
        profiled.prepare(feed)
        stream = timer.new_stream()
        information = profiled.layer_information()
        times = profiled.profile_layers(stream, iterations, timer.synchronize)
    return {"layer_information": information, "profile": summarize_layer_times(times)}
