"""What the build stage does around TensorRT's builder, through Polygraphy: builder options from the recipe's names
(checked against the flavour's enums), Polygraphy's log relayed to the node's log with TensorRT's errors kept for the
failure message, a progress monitor that cancels, the shared timing cache, and the precision audit of the parsed
network and of the built engine (where a runtime exists).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from trtflow.stage import RecipeError, StageContext, StageFailed

from .tensorrt import engine_precision, engine_shortfall, network_precision, network_shortfall

# ---------------------------------------------------------------------------------------------------------
# Builder options: our names -> Polygraphy's arguments, checked against the flavour's enums


def enum_member(enum: Any, name: str, option: str, flavour: str) -> Any:
    from trtflow.errors import did_you_mean

    members = {key.lower(): value for key, value in enum.__members__.items()}
    if name not in members:
        suggestion = did_you_mean(name, list(members))
        raise RecipeError(
            f"{name!r} is not available in {flavour}; available: {', '.join(sorted(members))}",
            field=option,
            hint=suggestion,
        )
    return members[name]


class BuilderParams(Protocol):
    """What `config_arguments` reads of a build node's params (the build stage's ``Params``)."""

    @property
    def precision(self) -> str: ...

    @property
    def optimization_level(self) -> int | None: ...

    @property
    def max_aux_streams(self) -> int | None: ...

    @property
    def tactic_sources(self) -> list[str] | None: ...

    @property
    def sparsity(self) -> bool: ...

    @property
    def hardware_compatibility(self) -> str | None: ...

    @property
    def version_compatible(self) -> bool: ...

    @property
    def profiling_verbosity(self) -> str: ...

    @property
    def fail_on_timing_cache_miss(self) -> bool: ...

    @property
    def compute_capabilities(self) -> list[str] | None: ...

    def pool_limits(self) -> dict[str, int]: ...


def config_arguments(params: BuilderParams, trt: Any, backend: str, plan: Any) -> tuple[dict, dict]:
    """Keyword arguments for Polygraphy's CreateConfig(RTX), and the JSON record of what was applied (``params``: the
    build stage's, ``plan``: its `PrecisionPlan`)."""
    flavour = f"{backend} {trt.__version__}"
    kwargs: dict[str, Any] = {}
    record: dict[str, Any] = {"precision": params.precision, "strongly_typed": plan.strongly_typed,
                              "precision_flags": list(plan.flags)}
    if params.optimization_level is not None:
        kwargs["builder_optimization_level"] = params.optimization_level
        record["optimization_level"] = params.optimization_level
    limits = params.pool_limits()
    if limits:
        kwargs["memory_pool_limits"] = {
            enum_member(trt.MemoryPoolType, name, "memory_pool_limits", flavour): size for name, size in limits.items()
        }
        record["memory_pool_limits"] = limits
    if params.max_aux_streams is not None:
        kwargs["max_aux_streams"] = params.max_aux_streams
        record["max_aux_streams"] = params.max_aux_streams
    if params.tactic_sources is not None:
        kwargs["tactic_sources"] = [
            enum_member(trt.TacticSource, name, "tactic_sources", flavour) for name in params.tactic_sources
        ]
        record["tactic_sources"] = params.tactic_sources
    if params.sparsity:
        kwargs["sparse_weights"] = True
        record["sparsity"] = True
    if params.hardware_compatibility not in (None, "none"):
        level = {"ampere+": "AMPERE_PLUS", "same-compute-capability": "SAME_COMPUTE_CAPABILITY"}
        kwargs["hardware_compatibility_level"] = getattr(
            trt.HardwareCompatibilityLevel, level[params.hardware_compatibility])
        record["hardware_compatibility"] = params.hardware_compatibility
    if params.version_compatible:
        kwargs["version_compatible"] = True
        record["version_compatible"] = True
    kwargs["profiling_verbosity"] = getattr(trt.ProfilingVerbosity, params.profiling_verbosity.upper())
    record["profiling_verbosity"] = params.profiling_verbosity
    if params.fail_on_timing_cache_miss:
        kwargs["error_on_timing_cache_miss"] = True
        record["fail_on_timing_cache_miss"] = True
    if backend == "tensorrt-rtx":
        if params.compute_capabilities == ["current"]:
            kwargs["use_gpu"] = True
        elif params.compute_capabilities:
            targets = []
            for capability in params.compute_capabilities:
                major, minor = capability.split(".")
                if not hasattr(trt.ComputeCapability, f"SM{major}{minor}"):
                    known = [m[2:-1] + "." + m[-1] for m in trt.ComputeCapability.__members__ if m.startswith("SM")]
                    raise RecipeError(
                        f"{capability} is not a target of {flavour}; available: "
                        + ", ".join(known),
                        field="compute_capabilities",
                    )
                targets.append((int(major), int(minor)))
            kwargs["compute_capabilities"] = targets
        if params.compute_capabilities:
            record["compute_capabilities"] = params.compute_capabilities
    else:
        kwargs.update({flag: True for flag in plan.flags})
    return kwargs, record


# ---------------------------------------------------------------------------------------------------------
# Polygraphy's log -> the node's log; TensorRT's errors -> the failure message


class LogRelay(logging.Handler):
    def __init__(self, ctx: StageContext) -> None:
        super().__init__(level=logging.DEBUG)
        self.ctx = ctx
        self.errors: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.levelno >= 40:
            self.errors.append(message.strip())
        # Polygraphy's own levels (START 22, FINISH 28, VERBOSE 10, ...) onto the standard ones.
        level = next(lvl for lvl in (logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG)
                     if record.levelno >= lvl or lvl == logging.DEBUG)
        self.ctx.log.log(level, "polygraphy: %s", message)


@contextmanager
def polygraphy_log_to(ctx: StageContext) -> Iterator[LogRelay]:
    from polygraphy.logger import G_LOGGER

    relay = LogRelay(ctx)
    python_logger = logging.getLogger("Polygraphy")
    previous = (G_LOGGER.use_python_logging_system, python_logger.level, python_logger.propagate)
    G_LOGGER.use_python_logging_system = True
    python_logger.setLevel(logging.DEBUG)
    python_logger.propagate = False
    python_logger.addHandler(relay)
    try:
        yield relay
    finally:
        python_logger.removeHandler(relay)
        G_LOGGER.use_python_logging_system = previous[0]
        python_logger.setLevel(previous[1])
        python_logger.propagate = previous[2]


def progress_monitor(trt: Any, ctx: StageContext) -> Any:
    """A TensorRT progress monitor that reports the top build phase and cancels the build when asked."""

    class BuildProgress(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self.steps: dict[str, int] = {}
            self.top: str | None = None

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            self.steps[phase_name] = max(int(num_steps), 1)
            if parent_phase is None and self.top is None:
                self.top = phase_name

        def step_complete(self, phase_name: str, step: int) -> bool:
            if phase_name == self.top:
                ctx.progress(0.2 + 0.7 * (step + 1) / self.steps[phase_name], f"building: {phase_name}")
            return not ctx.cancelled

        def phase_finish(self, phase_name: str) -> None:
            if phase_name == self.top:
                self.top = None

    return BuildProgress()


# ---------------------------------------------------------------------------------------------------------
# The shared timing cache (full TensorRT only)


def merge_timing_caches(trt: Any, blobs: list[bytes]) -> bytes:
    """Combine serialized timing caches of one TensorRT version into one (entries of later blobs win ties)."""
    from polygraphy.backend.trt import util as trt_util

    config = trt.Builder(trt_util.get_trt_logger()).create_builder_config()
    merged = config.create_timing_cache(b"")
    for blob in blobs:
        if blob and not merged.combine(config.create_timing_cache(blob), ignore_mismatch=False):
            raise StageFailed("could not merge timing caches: they come from different TensorRT versions or GPUs",
                              hint="delete the shared timing cache file named in the log; the next build refills it")
    return bytes(merged.serialize())


def blob_digest(data: bytes | None) -> str | None:
    if not data:
        return None
    import xxhash

    return xxhash.xxh3_128_hexdigest(data)


# ---------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------
# Precision audit: the network and the engine must compute in the precision the recipe asked for

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


def error_summary(errors: list[str]) -> str:
    """TensorRT's and Polygraphy's error lines, without severity tags and the parser's node banners."""
    lines = []
    for error in errors:
        text = re.sub(r"^\[[E!]\]\s*", "", error.strip())
        if "--- Begin node ---" in text or "--- End node ---" in text:
            continue
        text = " ".join(text.split())
        if text and text not in lines:
            lines.append(text)
    return "; ".join(lines)


def io_record(count: int, get: Any) -> list[dict[str, Any]]:
    tensors = []
    for index in range(count):
        tensor = get(index)
        tensors.append({"name": tensor.name, "dtype": tensor.dtype.name.lower(), "shape": list(tensor.shape)})
    return tensors
