"""The ``build`` stage: an ONNX model becomes a serialized TensorRT engine, through Polygraphy's loaders.

One code path serves both flavours (full TensorRT and TensorRT-RTX): ``NetworkFromOnnxPath`` parses the
model, ``CreateConfig`` / ``CreateConfigRTX`` configure the builder with ``Profile`` s, and
``EngineBytesFromNetwork`` builds. Everything that can be checked before the build is checked first, with
messages naming the input, option or flavour at fault: profile shapes against the model's inputs,
builder options against what the flavour offers, precision against what the model carries.

Outputs: the engine and its provenance (engine.json: flavour, version, GPU, builder options, profiles,
ONNX digest, timing cache, build time, engine size), which the TensorRT runtime checks before loading.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trtflow.stage import (
    ENGINE,
    METRICS,
    ONNX,
    Input,
    Output,
    ProfileSpec,
    RecipeError,
    Stage,
    StageContext,
    StageFailed,
    StageParams,
    StageSkipped,
)

from .accuracy.model_problems import hint_text, memory_findings, trt_build_repro
from .formats.generation import check_profiles as check_cache_profiles
from .formats.onnx_model import ModelFacts, inspect_model
from .runtimes.profiles import check_profiles
from .runtimes.tensorrt import (
    FLAVOURS,
    fact_name,
    import_trt,
    installed_version,
    is_strongly_typed_only,
    provenance,
    resolve_backend,
)
from .runtimes.trt_audit import audit_engine
from .runtimes.trt_build import (
    BuiltEngine,
    build_engine,
    config_arguments,
    timing_cache,
)

Precision = Literal["strongly-typed", "fp32", "fp16", "bf16", "int8", "fp8", "best"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i)?(b)?|b)?\s*$", re.IGNORECASE)
_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(value: int | str, what: str) -> int:
    """Bytes from an int or a string: ``"4GiB"``/``"4G"`` (binary), ``"4GB"`` (decimal), ``"512"`` (bytes)."""
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected a size in bytes or a string like '4GiB', got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(value)
        if not match:
            raise ValueError(f"{what}: cannot read {value!r} as a size; write bytes (1073741824) or '1GiB', "
                             "'512MiB', '1GB'")
        number, unit, binary, byte_suffix = match.groups()
        scale = 1
        if unit:
            base = 1000 if byte_suffix and not binary else 1024
            scale = base ** _POWERS[unit.lower()]
        size = int(float(number) * scale)
    if size < 0:
        raise ValueError(f"{what}: a size cannot be negative, got {value!r}")
    return size


class Params(StageParams):
    """Parameters of the build stage."""

    backend: Literal["auto", "tensorrt", "tensorrt-rtx"] = Field(
        "auto",
        description="TensorRT flavour: 'tensorrt' (full TensorRT, builds on a GPU), 'tensorrt-rtx' (TensorRT for "
        "RTX, builds on CPU too) or 'auto' (full TensorRT if installed, else TensorRT-RTX).",
    )
    precision: Precision = Field(
        "strongly-typed",
        description="'strongly-typed': the ONNX model's types decide every layer's precision (run the convert "
        "or quantize stage first for fp16/int8/fp8); the only mode of TensorRT-RTX and TensorRT >= 11. "
        "fp32/fp16/bf16/int8/fp8/best: TensorRT 10 builder precision flags (int8 and fp8 need a model with "
        "Q/DQ nodes). On strongly typed flavours int8/fp8/fp32 only assert what the model carries.",
    )
    profile: ProfileSpec | None = Field(
        None, description="One optimization profile (min/opt/max shape per dynamic input); a recipe-level "
        "profile name is resolved into this form.",
    )
    profiles: list[ProfileSpec] = Field(
        default_factory=list,
        description="Several optimization profiles in one engine (e.g. small and large batch); exclusive with "
        "'profile'.",
    )
    optimization_level: int | None = Field(
        None, ge=0, le=5,
        description="Builder optimization level 0-5 (TensorRT default 3): higher searches longer for faster "
        "kernels.",
    )
    workspace: int | str | None = Field(
        None, description="Workspace memory pool limit: bytes or a string like '4GiB', '512MiB' (M = MiB, "
        "MB = 10^6 bytes).",
    )
    memory_pool_limits: dict[str, int | str] = Field(
        default_factory=dict,
        description="Memory pool limits by pool name (workspace, tactic_dram, tactic_shared_memory, ...): bytes "
        "or strings like '1GiB'.",
    )
    max_aux_streams: int | None = Field(
        None, ge=0, description="Most auxiliary CUDA streams an engine may use (0 = single stream); default: "
        "TensorRT's heuristics.",
    )
    tactic_sources: list[str] | None = Field(
        None, description="Tactic sources to enable by name (full TensorRT: cublas, cublas_lt, cudnn, "
        "edge_mask_convolutions, jit_convolutions; TensorRT-RTX: edge_mask_convolutions, jit_convolutions); "
        "empty list disables all; default: the flavour's defaults.",
    )
    sparsity: bool = Field(False, description="Let the builder use structured-sparsity kernels where weights allow.")
    hardware_compatibility: Literal["none", "ampere+", "same-compute-capability"] | None = Field(
        None, description="Full TensorRT only: build an engine that also runs on other GPU architectures "
        "('ampere+') or other GPUs of the same compute capability. TensorRT-RTX uses compute_capabilities.",
    )
    version_compatible: bool = Field(
        False, description="Full TensorRT only: embed the lean runtime so newer TensorRT versions of the same "
        "major version can load the engine.",
    )
    profiling_verbosity: Literal["layer_names_only", "detailed", "none"] = Field(
        "detailed",
        description="How much layer information the engine keeps for profilers and the engine inspector: "
        "'detailed' (layer parameters and formats, so the precision audit can read each built layer's precision "
        "where a runtime exists; a slightly larger engine), 'layer_names_only' or 'none'.",
    )
    timing_cache: Literal["use", "off"] = Field(
        "use", description="'use': share one tactic timing cache per (TensorRT version, GPU) across builds "
        "(loaded before, merged back after; never part of the cache key). TensorRT-RTX has no timing cache.",
    )
    fail_on_timing_cache_miss: bool = Field(
        False, description="Full TensorRT only: fail the build when a tactic is not in the timing cache "
        "(reproducible CI builds from a prepared cache).",
    )
    compute_capabilities: list[str] | None = Field(
        None, description="TensorRT-RTX only: compute capabilities to compile for ahead of time, e.g. ['8.6', "
        "'8.9', '12.0'], or ['current'] for the GPU of the building machine; default: TensorRT-RTX's portable "
        "set.",
    )

    @field_validator("workspace")
    @classmethod
    def _workspace_bytes(cls, value: int | str | None) -> int | None:
        return None if value is None else parse_size(value, "workspace")

    @field_validator("memory_pool_limits")
    @classmethod
    def _pool_bytes(cls, value: dict[str, int | str]) -> dict[str, int]:
        return {name.lower(): parse_size(size, f"memory_pool_limits.{name}") for name, size in value.items()}

    @field_validator("tactic_sources")
    @classmethod
    def _tactic_names(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [name.lower() for name in value]

    @field_validator("compute_capabilities")
    @classmethod
    def _capabilities(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        normalized = [_normalize_capability(item) for item in value]
        if not normalized:
            raise ValueError("compute_capabilities is empty; leave it out for TensorRT-RTX's default targets")
        if "current" in normalized and len(normalized) > 1:
            raise ValueError("compute_capabilities: 'current' (the building GPU) cannot be combined with others")
        return normalized

    @model_validator(mode="after")
    def _cross_field(self) -> Params:
        if self.profile is not None and self.profiles:
            raise ValueError("give either 'profile' or 'profiles', not both")
        names = [p.name for p in self.all_profiles()]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"profile names must be unique; repeated: {', '.join(duplicates)}")
        if self.workspace is not None and "workspace" in self.memory_pool_limits:
            raise ValueError("the workspace limit is given twice: in 'workspace' and in memory_pool_limits.workspace")
        if self.fail_on_timing_cache_miss and self.timing_cache == "off":
            raise ValueError("fail_on_timing_cache_miss needs timing_cache: use (there is no cache to miss)")
        return self

    def all_profiles(self) -> list[ProfileSpec]:
        return [self.profile] if self.profile is not None else list(self.profiles)

    def pool_limits(self) -> dict[str, int]:
        limits = {name: int(size) for name, size in self.memory_pool_limits.items()}  # sizes: parsed by the validator
        if self.workspace is not None:
            limits["workspace"] = int(self.workspace)
        return limits


def _normalize_capability(value: str) -> str:
    text = str(value).strip().lower()
    if text == "current":
        return "current"
    text = re.sub(r"^sm_?", "", text)
    if re.fullmatch(r"\d+\.\d", text):
        return text
    if re.fullmatch(r"\d{2,3}", text):
        return f"{text[:-1]}.{text[-1]}"
    raise ValueError(f"compute_capabilities: cannot read {value!r}; write '8.6', 'sm86' or 'current'")


# ---------------------------------------------------------------------------------------------------------
# What the model carries (read with onnx, without loading external weights)


# ---------------------------------------------------------------------------------------------------------
# Checks before the build


@dataclass(frozen=True)
class PrecisionPlan:
    """How a precision request is carried out: a strongly typed network, or builder precision flags."""

    strongly_typed: bool
    flags: tuple[str, ...] = ()


def plan_precision(precision: str, backend: str, version: str, facts: ModelFacts | None = None) -> PrecisionPlan:
    """Decide strong typing and builder flags; refuse what the flavour or the model cannot do.

    Without ``facts`` (before the model is known) only flavour-level rules are checked.
    """
    strongly_only = is_strongly_typed_only(backend, version)
    flavour = f"{backend} {version}"
    if precision == "strongly-typed":
        return PrecisionPlan(True)
    if precision in ("int8", "fp8"):
        if facts is not None:
            _require_quantized(precision, facts)
        if strongly_only:
            return PrecisionPlan(True)
        return PrecisionPlan(False, (precision,))
    if precision == "fp32":
        if strongly_only and facts is not None and (facts.reduced_floats or facts.has_qdq):
            carried = sorted(facts.reduced_floats | facts.quantized_types)
            raise StageFailed(
                f"precision: fp32 was asked, but the model carries {', '.join(carried)} tensors, and {flavour} "
                "takes every layer's precision from the model (strongly typed)",
                hint="set precision: strongly-typed to build the model as it is, or build the fp32 model",
            )
        return PrecisionPlan(strongly_only)
    if strongly_only:
        if precision == "best":
            raise RecipeError(
                f"'best' turns on every builder precision flag, but {flavour} builds strongly typed networks "
                "only and has no precision flags",
                field="precision",
                hint="lower the model's precision before build (the convert stage for fp16/bf16, the quantize "
                "stage for int8/fp8) and build with precision: strongly-typed",
            )
        raise RecipeError(
            f"{precision} is a builder flag, but {flavour} builds strongly typed networks only: the ONNX "
            "model's types decide each layer's precision",
            field="precision",
            hint=f"use the convert stage (precision: {precision}) before build, and build with precision: "
            f"strongly-typed (a model that already computes in {precision} only needs precision: strongly-typed)",
        )
    if precision == "best":
        flags = ["fp16", "bf16"]
        if facts is not None and "int8" in facts.quantized_types:
            flags.append("int8")
        if facts is not None and "fp8" in facts.quantized_types:
            flags.append("fp8")
        return PrecisionPlan(False, tuple(flags))
    return PrecisionPlan(False, (precision,))


def _require_quantized(precision: str, facts: ModelFacts) -> None:
    if not facts.has_qdq:
        raise StageFailed(
            f"precision: {precision} needs a quantized model (QuantizeLinear/DequantizeLinear nodes), but this "
            "model has none; trtflow builds explicitly quantized models only (implicit calibration is "
            "deprecated in TensorRT)",
            hint=f"add the quantize stage (mode: {precision}) before build, or build with precision: strongly-typed",
        )
    if precision not in facts.quantized_types:
        raise StageFailed(
            f"precision: {precision} was asked, but the model's Q/DQ nodes quantize to "
            f"{', '.join(sorted(facts.quantized_types))}",
            hint=f"set precision: strongly-typed to build it as quantized, or re-quantize to {precision}",
        )


def check_flavour_options(params: Params, backend: str, version: str) -> None:
    """Options the chosen flavour lacks are errors naming the option and the flavour."""
    flavour = f"{backend} {version}"
    if backend == "tensorrt-rtx":
        if params.hardware_compatibility not in (None, "none"):
            raise RecipeError(
                f"not supported by {flavour} (its builder ignores it)",
                field="hardware_compatibility",
                hint="TensorRT-RTX engines are portable by default; choose target GPUs with compute_capabilities",
            )
        if params.version_compatible:
            raise RecipeError(
                f"not supported by {flavour}: it ships no lean runtime to embed in the engine",
                field="version_compatible",
                hint="leave it out; an engine is rebuilt when the tensorrt_rtx version changes",
            )
        if params.fail_on_timing_cache_miss:
            raise RecipeError(
                f"not supported by {flavour}: TensorRT-RTX has no timing cache (kernels are compiled just in "
                "time)",
                field="fail_on_timing_cache_miss",
                hint="leave it out for tensorrt-rtx builds",
            )
    elif params.compute_capabilities is not None:
        raise RecipeError(
            f"a TensorRT-RTX option, not available in {flavour}, which builds for the GPU it runs on",
            field="compute_capabilities",
            hint="use hardware_compatibility: ampere+ for an engine that runs on several GPU architectures",
        )
    plan_precision(params.precision, backend, version)


def _check(params: Params) -> None:
    backend = resolve_backend(params.backend)
    check_flavour_options(params, backend, installed_version(backend))


def _backend_or_none(params: Params) -> str | None:
    try:
        return resolve_backend(params.backend)
    except StageSkipped:
        return None


def _resources(params: Params) -> frozenset[str]:
    backend = _backend_or_none(params)
    if backend == "tensorrt" or params.compute_capabilities == ["current"]:
        return frozenset({"gpu"})
    return frozenset({"cpu"})


def _environment(params: Params) -> list[str]:
    backend = _backend_or_none(params)
    if backend is None:
        flavours = list(FLAVOURS) if params.backend == "auto" else [params.backend]
    else:
        flavours = [backend]
    facts = ["polygraphy", *(fact_name(f) for f in flavours)]
    # TensorRT-RTX compiles ahead of time for portable targets, so its engine depends on the GPU only when
    # it is asked to compile for the building GPU.
    if "tensorrt" in flavours or params.compute_capabilities == ["current"]:
        facts.append("gpu")
    return facts


def run(ctx: StageContext, inputs: dict[str, Path], params: Params) -> dict[str, Any]:
    from trtflow.fingerprint import hash_file_content

    backend = resolve_backend(params.backend)
    check_flavour_options(params, backend, installed_version(backend))
    model_path = inputs["model"]
    facts = inspect_model(model_path)
    profiles = params.all_profiles()
    check_profiles(profiles, facts.inputs)
    check_cache_profiles(profiles)  # a KV-cache model's: attention_mask as long as past + sequence

    trt = import_trt(backend)
    version = str(trt.__version__)
    plan = plan_precision(params.precision, backend, version, facts)
    config_kwargs, builder_record = config_arguments(params, trt, backend, plan)
    ctx.progress(0.05, f"building with {backend} {version}")
    timing = timing_cache(ctx, backend, version, params.timing_cache, config_kwargs)
    built = build_engine(ctx, trt, backend, model_path, profiles, plan, config_kwargs, params.precision, timing,
                         fail_on_timing_cache_miss=params.fail_on_timing_cache_miss,
                         repro=trt_build_repro(model_path, backend, profiles, plan.strongly_typed, plan.flags),
                         hint=hint_text(memory_findings(model_path, 4.0, f"a {backend} build")))

    engine_path = ctx.output("engine")
    with open(engine_path, "wb") as f:
        f.write(memoryview(built.engine))
    engine_size = engine_path.stat().st_size
    built.engine = None  # the engine's bytes leave memory before the audit deserialises it
    timing.merge_back(trt)

    profiles_record = [spec.model_dump() for spec in profiles]
    record = provenance(backend, trt, {
        "builder": builder_record,
        "profiles": profiles_record,
        "onnx": {"file": model_path.name, "digest": hash_file_content(model_path),
                 "size_bytes": model_path.stat().st_size, "inputs": facts.inputs},
        "network": {"layers": built.layers, "inputs": built.inputs, "outputs": built.outputs},
        "timing_cache": timing.record,
        "parse_seconds": round(built.parse_seconds, 4),
        "build_seconds": round(built.build_seconds, 4),
        "engine_bytes": engine_size,
        "engine_digest": hash_file_content(engine_path),
    }, gpu_index=ctx.gpu)
    ctx.output("provenance").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    engine_audit = audit_engine(ctx, params.precision, backend, engine_path, ctx.output("provenance"))
    record["precision"] = {"requested": params.precision, "network": built.network_audit, "engine": engine_audit}
    ctx.output("provenance").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    ctx.progress(1.0, f"engine {engine_size} bytes in {built.build_seconds:.2f} s")
    ctx.log.info("built %s with %s %s in %.2f s: %d bytes", model_path.name, backend, version, built.build_seconds,
                 engine_size)
    return _summary(params, record, built, plan, profiles, engine_audit)


def _summary(params: Params, record: dict[str, Any], built: BuiltEngine, plan: PrecisionPlan,
             profiles: list[ProfileSpec], engine_audit: dict[str, Any]) -> dict[str, Any]:
    """What the node's manifest keeps of engine.json (``record``): enough for validate, benchmark and the reports."""
    network_audit = built.network_audit
    return {
        "backend": record["backend"],
        "version": record["version"],
        "precision": params.precision,
        "strongly_typed": plan.strongly_typed,
        "precision_flags": list(plan.flags),
        "profiles": [spec.name for spec in profiles],
        "gpu": record["gpu"],
        "engine_bytes": record["engine_bytes"],
        "build_seconds": record["build_seconds"],
        "parse_seconds": record["parse_seconds"],
        "layers": built.layers,
        "timing_cache": record["timing_cache"]["status"],
        "onnx_digest": record["onnx"]["digest"],
        "precision_audit": {
            "network": network_audit["by_precision"],
            "heavy_layers": network_audit["heavy_layers_by_precision"],
            "engine": engine_audit.get("by_precision") if engine_audit.get("inspected") else engine_audit["reason"],
        },
    }

stage = Stage(
    name="build",
    version="2",
    description="Build a TensorRT engine from an ONNX model through Polygraphy (full TensorRT or TensorRT-RTX), "
    "with optimization profiles, builder options and a shared timing cache.",
    params=Params,
    run=run,
    inputs={"model": Input(ONNX, "the ONNX model to build")},
    outputs={
        "engine": Output(ENGINE, "model.engine", "the serialized TensorRT engine"),
        "provenance": Output(METRICS, "engine.json",
                             "how and where the engine was built (flavour, version, GPU, options, profiles)"),
    },
    resources=_resources,
    environment=_environment,
    check=_check,
    preload=("onnx", "numpy"),
)
