"""The benchmark stage's parameters: what to run and how (backend, device, shapes, batch sizes, streams, the
engine harness's switches, data, profiles, generation), composed with the field groups of `measure.settings`
(timing windows, serving load, gates), and the checks that keep them consistent."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from trtflow.stage import CodeReference, ProfileSpec

from ..data import DataSource
from ..runtimes.ort import OrtOptions
from ..runtimes.tensorrt import FLAVOURS as TRT_FLAVOURS
from .serving.generation import GenerationBench
from .settings import GateFields, LoadFields, TimingFields

Backend = Literal["auto", "tensorrt", "tensorrt-rtx", "onnxruntime", "torch"]


class Params(TimingFields, LoadFields, GateFields):
    backend: Backend = Field(
        "auto", description="What runs the model: 'tensorrt'/'tensorrt-rtx' (an engine, on the GPU), "
        "'onnxruntime' (an ONNX model), 'torch' (eager PyTorch from torch_model), or 'auto': an engine with "
        "the flavour that built it (engine.json), an ONNX model with ONNX Runtime.",
    )
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="Device for onnxruntime (CPU or CUDA execution provider) and torch backends."
    )
    torch_model: CodeReference | None = Field(
        None, description="For backend torch: a factory returning a torch.nn.Module, "
        "'python:package.module:factory' or 'python:path/to/file.py:factory'. THIS RUNS YOUR CODE."
    )
    torch_cuda_graphs: bool | None = Field(
        None, description="For backend torch on CUDA: replay the model as CUDA graphs instead of launching every "
        "kernel from Python. Under serving load, each instance replays its forward as one CUDA graph per batch size "
        "(captured while it warms up); eager launches make a small model's latency tail depend on the host (see "
        "bench/serving_load.md). With generation, each decode step is replayed as a CUDA graph (a model whose step "
        "cannot be captured runs eagerly and the metrics say why). Not given (null): trtflow decides: on for "
        "generation, off under serving load; true or false decides it for both."
    )
    hf_model: str | None = Field(
        None, description="For backend torch with generation: a Hugging Face folder of a decoder-only causal LM "
        "(relative to the recipe; config.json and weights as save_pretrained writes them, nothing downloaded, no "
        "code of its own run), run by PyTorch with a static KV cache (`runtimes.torch_generation`). Or "
        "torch_model: a factory returning such a model."
    )
    torch_dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32", description="For backend torch with generation: the dtype the model's weights and activations "
        "run in (the fp32/fp16/bf16 candidates of one model)."
    )
    onnxruntime: OrtOptions = Field(
        default_factory=OrtOptions, description="ONNX Runtime session options (optimisation level, disabled "
        "optimisers, threads) for backend onnxruntime.",
    )
    shapes: dict[str, list[int]] = Field(
        default_factory=dict, description="Per input name, the concrete shape to run (batch included). "
        "Needed for dynamic dimensions unless a profile or the data fixes them."
    )
    input_dtypes: dict[str, str] = Field(
        default_factory=dict, description="For backend torch without an ONNX model: per input, its numpy "
        "dtype (default float32)."
    )
    profile: ProfileSpec | None = Field(
        None, description="An optimization profile (a name from the recipe's profiles: or an inline spec); "
        "its opt shapes are run, and its batch limits bound dynamic batching."
    )
    batch_sizes: list[int] = Field(
        default_factory=list, description="A batch sweep: run each batch size in turn (dimension 0 of every "
        "input replaced). Empty: the shapes as given."
    )
    streams: int | list[int] = Field(
        1, description="Model instances running concurrently: execution contexts on their own CUDA streams "
        "for engines (also in the fixed-batch points, as trtexec --streams), ONNX Runtime sessions or PyTorch "
        "CUDA streams under load. A list makes it a load dimension: every load level runs at each count."
    )
    use_cuda_graph: bool = Field(
        True, description="Capture the enqueue into a CUDA graph (tensorrt); falls back to plain enqueues "
        "when the engine cannot be captured, and says so."
    )
    spin_wait: bool = Field(True, description="Wait for the GPU by spinning (stabler) instead of blocking "
                            "(tensorrt).")
    include_host_transfers: bool = Field(
        False, description="Time host-to-device and device-to-host copies (pinned buffers) with each query "
        "(tensorrt; for onnxruntime on cuda, false binds inputs and outputs on the device)."
    )
    data: DataSource | None = Field(
        None, description="Input values; default random (seed 0) in the shapes above. Values rarely change "
        "timings, except for data-dependent models."
    )
    unstable_cv_percent: float = Field(
        2.5, gt=0, description="Flag a result 'unstable' above this coefficient of variation (trtexec: 2.5%)."
    )
    # -- per-layer profiles ----------------------------------------------------------------------------------
    profile_layers: bool = Field(
        False, description="Engines: record the engine inspector's layer information and per-layer times "
        "(like trtexec --exportLayerInfo / --exportProfile) in layers.json, on a separate execution context. "
        "Layer names need the engine built with profiling_verbosity 'layer_names_only' or 'detailed'.",
    )
    profile_iterations: int = Field(50, ge=1, description="Inferences profiled per layer profile.")
    profile_kernels: bool = Field(
        False, description="Record the CUDA kernels of the timed work (the first batch size), like Nsight Systems' "
        "kernel summary: name, instances, total/average/median/min/max time, share of GPU time, in kernels.json "
        "(PyTorch profiler, CUPTI; engines and device cuda). The summary keeps the top 5.",
    )
    kernel_iterations: int = Field(20, ge=1, description="Inferences whose kernels profile_kernels records.")
    # -- generation -------------------------------------------------------------------------------------------
    generation: GenerationBench | None = Field(
        None, description="Time greedy generation of a causal LM exported with its KV cache (task "
        "text-generation-with-past) instead of fixed batches: time to first token and time per output token per "
        "request, at context_length prompt tokens and each concurrency, timed in windows like any point (repeats, "
        "min_iterations requests, min_duration_s, precision_percent, max_duration_s): backend onnxruntime (the model "
        "input, exported with task text-generation-with-past), or backend torch (hf_model or torch_model on PyTorch, "
        "device cpu or cuda, in torch_dtype, decode steps as CUDA graphs on cuda).",
    )

    @field_validator("batch_sizes")
    @classmethod
    def _positive_batches(cls, sizes: list[int]) -> list[int]:
        if any(b < 1 for b in sizes):
            raise ValueError(f"values must be >= 1, got {sizes}")
        return sizes

    @field_validator("streams")
    @classmethod
    def _streams(cls, streams: int | list[int]) -> int | list[int]:
        counts = [streams] if isinstance(streams, int) else streams
        if not counts or any(not 1 <= count <= 16 for count in counts):
            raise ValueError(f"streams must be between 1 and 16, got {streams}")
        return streams

    @property
    def stream_counts(self) -> list[int]:
        return [self.streams] if isinstance(self.streams, int) else list(self.streams)

    @model_validator(mode="after")
    def _consistent(self) -> Params:
        if self.torch_model and self.backend != "torch":
            raise ValueError(f"torch_model is only used by backend torch, not {self.backend}")
        engine = self.backend in (*TRT_FLAVOURS, "auto")
        if self.torch_cuda_graphs and not (self.backend == "torch" and self.device == "cuda" and
                                           (self.has_load or self.generation is not None)):
            raise ValueError("torch_cuda_graphs applies to backend torch on device cuda under serving load "
                             "(concurrency, arrival_rate_qps or scenarios) or with generation")
        if max(self.stream_counts) > 1 and not engine and not self.has_load:
            raise ValueError(f"streams > 1 for backend {self.backend} applies to serving load only: give "
                             "concurrency or arrival_rate_qps")
        if self.gpus != 1 and not (engine or self.device == "cuda"):
            raise ValueError("gpus applies to GPU backends: a tensorrt backend, or device cuda")
        if self.gpus != 1 and not self.has_load:
            raise ValueError("gpus applies to serving load: give concurrency or arrival_rate_qps")
        if (self.dynamic_batching or self.latency_budget_ms) and not self.has_load:
            raise ValueError("dynamic_batching and latency_budget_ms apply to serving load: give concurrency "
                             "or arrival_rate_qps")
        if self.rate_search_probes and not (self.latency_budget_ms and self.arrival_rate_qps):
            raise ValueError("rate_search_probes needs latency_budget_ms and at least one arrival_rate_qps to "
                             "start from")
        if self.dynamic_batching and self.request_size and self.request_size > self.dynamic_batching.max_batch_size:
            raise ValueError(f"request_size {self.request_size} exceeds dynamic_batching.max_batch_size "
                             f"{self.dynamic_batching.max_batch_size}")
        if self.profile_layers and self.backend not in (*TRT_FLAVOURS, "auto"):
            raise ValueError("profile_layers needs an engine (a tensorrt backend)")
        if self.profile_kernels and self.backend not in (*TRT_FLAVOURS, "auto") and self.device != "cuda":
            raise ValueError("profile_kernels records CUDA kernels: an engine, or device cuda")
        if self.scenarios and self.load_generator == "trtflow":
            raise ValueError(f"scenarios {self.scenarios} are run by MLPerf LoadGen: set load_generator to auto "
                             "or loadgen")
        if self.generation is not None and (self.backend not in ("auto", "onnxruntime", "torch") or self.has_load or
                                            self.batch_sizes or self.profile_layers or self.profile_kernels):
            raise ValueError("generation times an ONNX model with its KV cache on ONNX Runtime, or a Hugging Face "
                             "causal LM on PyTorch (backend torch); other backends, serving load, batch_sizes and "
                             "profiles do not apply (generation.concurrency sets the load)")
        self._torch_generation_fields()
        if self.max_duration_s is not None and self.max_duration_s < self.min_duration_s:
            raise ValueError(f"max_duration_s {self.max_duration_s:g} is below min_duration_s {self.min_duration_s:g}")
        return self

    def _torch_generation_fields(self) -> None:
        torch_generation = self.backend == "torch" and self.generation is not None
        if (self.hf_model or self.torch_dtype != "float32") and not torch_generation:
            raise ValueError("hf_model and torch_dtype apply to backend torch with generation")
        if torch_generation and (self.hf_model is None) == (self.torch_model is None):
            raise ValueError("backend torch with generation needs the causal LM: hf_model (a Hugging Face folder) or "
                             "torch_model (a factory returning one), not both" if self.hf_model else
                             "backend torch with generation needs the causal LM: hf_model (a Hugging Face folder) "
                             "or torch_model (a factory returning one)")

    @property
    def generation_cuda_graphs(self) -> bool:
        """Generation on PyTorch replays its decode steps as CUDA graphs unless torch_cuda_graphs is false."""
        return self.torch_cuda_graphs is not False

    @property
    def serving_cuda_graphs(self) -> bool:
        """Serving load on PyTorch replays its forward as CUDA graphs when torch_cuda_graphs is true."""
        return self.torch_cuda_graphs is True


GATE_PARAMS = tuple(GateFields.model_fields)  # judged on the summary, left out of the node key
