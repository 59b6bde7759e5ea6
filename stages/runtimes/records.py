"""The records one stage writes beside its artifact and a later stage reads back, declared once and read checked.

``engine.json`` (build: the flavour, version and GPU an engine was built with, its builder options, profiles,
network I/O and precision audit), ``quantize.json`` and ``convert.json`` (how a model's precision was lowered) and
the ``runtime_settings`` that these and ``export.json``/``simplify.json`` record (the ONNX Runtime settings the
model needs). They travel with the artifact (select and triton copy an engine's engine.json beside it), so a reader
gets them from a folder it did not write: each is read here, through `trtflow.storage.records` (at most its byte
cap, its nesting and size bounded, then validated strictly against its TypedDict below), and one that fails is
refused with a message naming the file and the fix, never half-read. Keys a reader does not know pass (a newer
writer's additions); a key declared here has the type declared, or the record is refused.

The readers (`trt_runtime.read_provenance` for `candidate.open_candidate`, triton and select; validate's
``candidate_origin``; `accuracy.recovery.recorded_settings`) get these types, so mypy checks what they read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Required

from typing_extensions import TypedDict

from trtflow.stage import StageFailed
from trtflow.storage.records import Damaged, Limits, RecordKind, parse
from trtflow.userfiles import read_file

MiB = 1 << 20


class RuntimeSettings(TypedDict, total=False):
    """The ONNX Runtime settings a model needs (`accuracy.recovery`: a graph optimiser that crashes on it, off)."""

    onnxruntime: Required[dict[str, Any]]


class ProducerRecord(TypedDict, total=False):
    """What every producer's summary file beside its model may tell the runtimes (export, simplify, convert,
    quantize)."""

    runtime_settings: RuntimeSettings | None


class QuantizeRecord(ProducerRecord, total=False):
    """quantize.json: the quantization a model went through (the quantize stage's summary)."""

    mode: Required[str]
    calibration_method: str | None
    calibrated: bool
    calibration_data: str | dict[str, Any] | None
    calibration_samples: int | None
    quantize_ops: str | list[str] | None
    high_precision_dtype: str | None
    quantized_nodes: int
    quantized_by_op_type: dict[str, int]


class ConvertRecord(ProducerRecord, total=False):
    """convert.json: a model's conversion to a lower float precision (the convert stage's summary)."""

    precision: Required[str]
    reference_data: str | dict[str, Any] | None
    data_max: float | None
    fp32_nodes: int
    converted_nodes: int


class GpuRecord(TypedDict, total=False):
    """The GPU an engine was built on."""

    name: Required[str]
    compute_capability: Required[str]
    driver: str
    memory_mib: int


class BuilderRecord(TypedDict, total=False):
    """The builder options that were applied (`trt_build.builder_config`'s record)."""

    precision: str
    strongly_typed: bool
    precision_flags: list[str]
    version_compatible: bool
    hardware_compatibility: str | None
    compute_capabilities: list[str] | None


class NetworkRecord(TypedDict, total=False):
    """The parsed network: its layer count and I/O tensors (name, TensorRT dtype, shape with -1 for dynamic)."""

    layers: int
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]


class PrecisionAudit(TypedDict, total=False):
    """The precision asked for, and what the network and the built engine hold (`trt_audit`)."""

    requested: Required[str]
    network: dict[str, Any] | None
    engine: dict[str, Any] | None


class EngineRecord(TypedDict, total=False):
    """engine.json: where and with what an engine was built (`tensorrt.provenance` plus the build stage's
    record); `tensorrt.check_provenance` refuses an engine this machine cannot load from it."""

    backend: Required[str]  # the TensorRT flavour: tensorrt or tensorrt-rtx
    version: str
    gpu: GpuRecord | str  # a string when built without a GPU ("none: built on CPU")
    builder: BuilderRecord
    profiles: list[dict[str, Any]]  # ProfileSpec's fields
    network: NetworkRecord
    precision: PrecisionAudit
    onnx: dict[str, Any]
    timing_cache: dict[str, Any]
    engine_bytes: int
    engine_digest: str
    parse_seconds: float
    build_seconds: float


_LIMITS = Limits(bytes=64 * MiB)  # an engine's precision audit lists every layer
ENGINE = RecordKind("engine provenance (engine.json)", EngineRecord, limits=_LIMITS,
                    fix="re-run the build stage that produced the engine")
QUANTIZE = RecordKind("quantize summary (quantize.json)", QuantizeRecord, limits=_LIMITS,
                      fix="re-run the quantize stage that produced the model")
CONVERT = RecordKind("convert summary (convert.json)", ConvertRecord, limits=_LIMITS,
                     fix="re-run the convert stage that produced the model")
PRODUCER = RecordKind("model summary", ProducerRecord, limits=_LIMITS,
                      fix="re-run the stage that produced the model")
#: The record kind of each summary file a model's producer leaves beside it.
BESIDE_A_MODEL: dict[str, RecordKind] = {"engine.json": ENGINE, "quantize.json": QUANTIZE,
                                         "convert.json": CONVERT, "export.json": PRODUCER,
                                         "simplify.json": PRODUCER}


def read_record(path: Path, kind: RecordKind) -> Any:
    """The record at ``path``, checked against ``kind`` (its caps, then its declared type, strictly); raises
    `StageFailed` naming the file and the fix when it cannot be read or breaks its type."""
    try:
        return parse(kind, read_file(path, kind.limits.bytes), str(path))  # a regular file, bounded
    except Damaged as error:
        raise StageFailed(error.message, hint=error.hint) from None
    except OSError as error:
        raise StageFailed(f"cannot read the {kind.name} {path}: {error.strerror or error}", hint=kind.fix) from None


def engine_record(path: Path) -> EngineRecord:
    """An engine's engine.json, checked (`read_record`)."""
    record: EngineRecord = read_record(path, ENGINE)
    return record
