"""What the build stage does around TensorRT's builder, through Polygraphy: builder options from the recipe's names
(checked against the flavour's enums), Polygraphy's log relayed to the node's log with TensorRT's errors kept for the
failure message, a progress monitor that cancels, the shared timing cache around a build (`timing_cache`), and the
build itself (`build_engine`: parse, audit the network, build). The precision audit of the parsed network and of the
built engine is `trt_audit`'s.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trtflow.stage import RecipeError, StageContext, StageFailed

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


# ---------------------------------------------------------------------------------------------------------
# One build: the shared timing cache around it, and the network parsed, audited and built


@dataclass
class TimingCacheUse:
    """The shared timing cache around one build (full TensorRT only): read before, merged back after."""

    record: dict[str, Any]  # engine.json's timing_cache
    shared: Any = None  # the shared cache (`StageContext.shared_cache`) when the build uses it
    saved: Path | None = None  # where the build saves the cache it ends with

    def merge_back(self, trt: Any) -> None:
        """Merge what the build learnt into the shared cache, under its lock."""
        if self.shared is None or self.saved is None:
            return
        with self.shared.lock():
            merged = merge_timing_caches(trt, [self.shared.read_bytes() or b"", self.saved.read_bytes()])
            self.shared.replace_atomically(merged)
        self.record.update({"digest_after": blob_digest(merged), "bytes_after": len(merged)})


def timing_cache(ctx: StageContext, backend: str, version: str, setting: str,
                 config_kwargs: dict[str, Any]) -> TimingCacheUse:
    """The shared timing cache this build loads (``setting``: the build's ``timing_cache``), named for the flavour,
    version and GPU; adds ``load_timing_cache`` to ``config_kwargs`` when there is one to load."""
    from .tensorrt import timing_cache_name

    if backend != "tensorrt":
        return TimingCacheUse({"status": f"unsupported by {backend}"})
    use = TimingCacheUse({"status": "off" if setting == "off" else "used"})
    if setting == "use":
        name = timing_cache_name(backend, version, ctx.gpu)
        use.shared, use.saved = ctx.shared_cache(name), ctx.scratch / "timing-after.cache"
        loaded = ctx.scratch / "timing-before.cache"
        with use.shared.lock():
            before = use.shared.read_bytes()
        if before:
            loaded.write_bytes(before)
            config_kwargs["load_timing_cache"] = str(loaded)
        use.record.update({"name": name, "digest_before": blob_digest(before), "bytes_before": len(before or b"")})
    return use


@dataclass
class BuiltEngine:
    """What one build made: the serialised engine and what the network held, with the parse and build times."""

    engine: Any  # the serialised engine (a buffer)
    parse_seconds: float
    build_seconds: float
    network_audit: dict[str, Any]
    layers: int
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]


def _build_hint(details: str, backend: str, version: str, fail_on_timing_cache_miss: bool) -> str:
    if fail_on_timing_cache_miss and "timing cache" in details.lower():
        return ("the shared timing cache lacks a tactic this build needs: build once with "
                "fail_on_timing_cache_miss: false to fill it")
    if "could not parse onnx" in details.lower():
        return (f"the ONNX parser of {backend} {version} rejected the node named above: run the simplify "
                "stage, export with another opset, or replace the operator; the node's log has the details")
    return "see the node's log for TensorRT's full output"


def build_engine(ctx: StageContext, trt: Any, backend: str, model_path: Path, profiles: list[Any], plan: Any,
                 config_kwargs: dict[str, Any], requested: str, timing: TimingCacheUse, *,
                 fail_on_timing_cache_miss: bool, repro: str, hint: str | None) -> BuiltEngine:
    """Parse ``model_path`` (strongly typed as ``plan`` says), audit the network's precision against ``requested``
    (`trt_audit`), and build the engine with ``profiles`` (recipe `ProfileSpec`s) and ``config_kwargs``; each native
    call inside a native step with ``repro`` and ``hint``. A failed build is `StageFailed` with TensorRT's errors."""
    import time
    import warnings

    from polygraphy.backend.trt import CreateConfig, EngineBytesFromNetwork, NetworkFromOnnxPath, Profile
    from polygraphy.exception import PolygraphyException

    from .trt_audit import audit_network

    version = str(trt.__version__)
    trt_profiles = []
    for spec in profiles:
        profile = Profile()
        for input_name, shape in spec.shapes.items():
            profile.add(input_name, shape.min, shape.opt, shape.max)
        trt_profiles.append(profile)
    config_class: Any = CreateConfig
    if backend == "tensorrt-rtx":
        from polygraphy.backend.tensorrt_rtx import CreateConfigRTX

        config_class = CreateConfigRTX

    monitor = progress_monitor(trt, ctx)
    with polygraphy_log_to(ctx) as relay, warnings.catch_warnings():
        # Polygraphy attaches an empty timing cache to every config; TensorRT-RTX deprecates that as a no-op.
        warnings.filterwarnings("ignore", message=".*Timing cache operations are no-ops", category=DeprecationWarning)
        try:
            started = time.perf_counter()
            with ctx.native_step(backend, f"parsing {model_path.name}", repro=repro, hint=hint):
                builder, network, parser = NetworkFromOnnxPath(str(model_path), strongly_typed=plan.strongly_typed)()
            parse_seconds = time.perf_counter() - started
            ctx.progress(0.2, f"parsed {network.num_layers} layers")
            network_audit = audit_network(requested, network)
            config = config_class(profiles=trt_profiles or None, progress_monitor=monitor, **config_kwargs)
            started = time.perf_counter()
            with ctx.native_step(backend, f"building an engine from {model_path.name}", repro=repro, hint=hint):
                engine = EngineBytesFromNetwork(
                    (builder, network, parser), config=config,
                    save_timing_cache=str(timing.saved) if timing.shared is not None else None,
                )()
            build_seconds = time.perf_counter() - started
        except PolygraphyException as exc:
            if ctx.cancelled:
                raise StageFailed("the build was cancelled") from None
            details = error_summary(relay.errors) or str(exc)
            raise StageFailed(f"{backend} {version} could not build {model_path.name}: {details}",
                              hint=_build_hint(details, backend, version, fail_on_timing_cache_miss)) from None
        return BuiltEngine(engine, parse_seconds, build_seconds, network_audit, network.num_layers,
                           io_record(network.num_inputs, network.get_input),
                           io_record(network.num_outputs, network.get_output))
