"""What the stages that run NVIDIA ModelOpt on an ONNX model (quantize, convert) share.

- Declarations: files, resources and environment facts that depend on their calibration data.
- Data in batches: ModelOpt reads calibration data either whole (a dict of arrays) or through an ONNX Runtime
  ``CalibrationDataReader``; `CalibrationReader` feeds it from a `Dataset` one batch at a time and reports
  progress. AutoCast's reference run (``modelopt.onnx.autocast``) keeps every intermediate tensor of every
  batch until it has run them all (tens of GiB for a ViT-B on 32 images); `streamed_reference_run` replaces
  it, for one call of ``convert_to_mixed_precision``, by a runner that keeps only the per-tensor statistics
  AutoCast reads (absolute maximum, minimum, maximum, shape), merged batch by batch: the same numbers, in
  the memory of one batch.
- Memory estimates, calibrated on measured runs (bench/vit_memory.py).
- Model-file helpers: a private copy of the model for ModelOpt to write beside, checks of node patterns and op types.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trtflow.stage import StageFailed

from ..data import data_files

if TYPE_CHECKING:
    from ..data import Dataset, DataSource

MODELOPT_FACTS = ("modelopt", "onnx", "onnxruntime", "numpy")

#: Progress callback: (batches done, batches in all).
BatchProgress = Callable[[int, int], None]


class ModeloptParams(Protocol):
    """What the declarations below read of a quantize or convert node's params (either stage's ``Params``)."""

    @property
    def calibration_data(self) -> DataSource | None: ...

    @property
    def uses_data(self) -> bool: ...

    @property
    def uses_gpu(self) -> bool: ...


def check_calibration_eps(eps: list[str], accepted: str, names: str) -> list[str]:
    """A ``calibration_eps`` field's validation (convert and quantize): at least one execution provider, each one the
    regular expression ``accepted`` matches whole (``names`` spells them for the message)."""
    if not eps:
        raise ValueError("calibration_eps needs at least one execution provider, e.g. ['cpu']")
    bad = [ep for ep in eps if not re.fullmatch(accepted, ep)]
    if bad:
        raise ValueError(f"unknown calibration_eps {bad}; use {names}")
    return eps


def modelopt_files(params: ModeloptParams) -> list[str]:
    """The calibration/reference data files whose content the result depends on."""
    return data_files(params.calibration_data) if params.uses_data else []


def modelopt_resources(params: ModeloptParams) -> frozenset[str]:
    return frozenset({"gpu"}) if params.uses_gpu else frozenset({"cpu"})


def modelopt_environment(params: ModeloptParams) -> list[str]:
    from .torch_quant import TORCH_MODES

    torch = ["torch"] if getattr(params, "mode", None) in TORCH_MODES else []
    return [*MODELOPT_FACTS, *torch, "gpu"] if params.uses_gpu else list(MODELOPT_FACTS)


# -- memory ------------------------------------------------------------------------------------------------------

GIB = 1 << 30
#: Resident memory of a worker once numpy, onnx, ONNX Runtime, torch and ModelOpt are imported (measured 0.45-0.7
#: GiB depending on what ModelOpt pulls in; the estimate keeps a margin).
LIBRARY_BASELINE = int(0.8 * GIB)

# Peak memory per byte of the input model, fitted to ViT runs at widths 768 and depths 2, 4 and 12 (63, 119 and
# 346 MB; bench/vit_memory.py, calibration batch 1) and rounded up. convert: AutoCast's copies of the model,
# the reference run's session and every intermediate tensor of one batch (measured 0.77, 1.29 and 2.96 GiB).
# quantize: ModelOpt's and ONNX Runtime's copies of the model during calibration and the fp16 conversion
# (measured 1.09, 1.61 and 4.55-4.87 GiB).
CONVERT_COPIES = 8.0
QUANTIZE_COPIES = 15.0


def model_memory(model_bytes: int, copies: float, activations: int = 0) -> int:
    """Peak memory of a stage holding ``copies`` copies of a model of ``model_bytes`` plus ``activations``."""
    return LIBRARY_BASELINE + int(copies * model_bytes) + activations


def convert_memory(params: ModeloptParams, input_sizes: Mapping[str, int]) -> int:
    return model_memory(input_sizes.get("model", 0), CONVERT_COPIES)


def quantize_memory(params: ModeloptParams, input_sizes: Mapping[str, int]) -> int:
    return model_memory(input_sizes.get("model", 0), QUANTIZE_COPIES)


# -- calibration data in batches ----------------------------------------------------------------------------------


def calibration_reader(dataset: Dataset, batch_size: int, progress: BatchProgress | None = None) -> Any:
    """An ONNX Runtime ``CalibrationDataReader`` drawing batches from ``dataset`` as ModelOpt asks for them.

    ModelOpt reads the first batch to infer shapes (``get_first``), may rewind, then calibrates on every
    batch; ``progress`` hears about each batch of the calibration pass.
    """
    from onnxruntime.quantization.calibrate import CalibrationDataReader

    class CalibrationReader(CalibrationDataReader):
        def __init__(self) -> None:
            self.total = dataset.num_batches(batch_size)
            self.rewind()

        def get_next(self) -> dict[str, Any] | None:
            batch = next(self._batches, None)
            if batch is not None:
                self.done += 1
                if progress is not None:
                    progress(self.done, self.total)
            return batch

        def get_first(self) -> dict[str, Any]:
            return next(dataset.batches(batch_size))

        def rewind(self) -> None:
            self._batches = dataset.batches(batch_size)
            self.done = 0

        def __len__(self) -> int:
            return self.total

    return CalibrationReader()


# -- AutoCast's reference run, streamed ------------------------------------------------------------------------------


class _RangeStats:
    """Running absolute maximum, minimum and maximum of one tensor over batches (plus its first shape)."""

    __slots__ = ("absmax", "high", "low", "shape")

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.absmax = float("-inf")
        self.low = float("inf")
        self.high = float("-inf")
        self.shape = shape

    def add(self, array: Any) -> None:
        import numpy as np

        if array.size == 0:
            low = high = 0.0
        else:
            if array.dtype == np.bool_:
                array = array.view(np.uint8)
            low, high = float(array.min()), float(array.max())
        self.low = min(self.low, low)
        self.high = max(self.high, high)
        self.absmax = max(self.absmax, abs(low), abs(high))


def _session_with_every_output(model: Any, providers: list[Any], workdir: str) -> Any:
    """An ONNX Runtime session of ``model`` returning every intermediate tensor, as AutoCast's runner builds it.

    The model is marked and serialised in place, then restored, rather than deep-copied: a copy of the
    weights fewer. Weight prepacking is off (it would hold a second copy of every MatMul weight).
    """
    import os

    import onnx
    import onnxruntime as ort
    from modelopt.onnx import utils as onnx_utils
    from polygraphy.backend.onnx.util import all_tensor_names, mark_outputs

    graph = model.graph
    saved_outputs = [onnx.ValueInfoProto.FromString(v.SerializeToString()) for v in graph.output]
    saved_value_info = [onnx.ValueInfoProto.FromString(v.SerializeToString()) for v in graph.value_info]
    try:
        onnx_utils.clear_stale_value_info(model)
        mark_outputs(model, all_tensor_names(model))
        if onnx_utils.check_model_uses_external_data(model) or onnx_utils.is_model_too_large_for_protobuf(model):
            source: Any = os.path.join(workdir, "reference_run.onnx")
            onnx_utils.save_onnx(model, source, save_as_external_data=True)
        else:
            source = model.SerializeToString()
    finally:
        del graph.output[:]
        graph.output.extend(saved_outputs)
        del graph.value_info[:]
        graph.value_info.extend(saved_value_info)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_prepacking", "1")
    ort.set_default_logger_severity(3)
    return ort.InferenceSession(source, sess_options=options, providers=providers)


@contextmanager
def streamed_reference_run(dataset: Dataset, batch_size: int, workdir: str,
                           progress: BatchProgress | None = None) -> Iterator[None]:
    """While inside, AutoCast's reference run reads ``dataset`` in batches and keeps only range statistics.

    AutoCast builds ``ReferenceRunner(model, providers, trt_plugins)`` from its module namespace and calls
    ``run(calibration_data)``; the runner put there for the duration of the block ignores that argument and
    returns, for every input and intermediate tensor, the `TensorStats` AutoCast's own runner computes when
    it is given several batches.
    """
    import modelopt.onnx.autocast.convert as autocast
    from modelopt.onnx.autocast.logging_config import logger
    from modelopt.onnx.autocast.referencerunner import ReferenceRunner, TensorStats

    class StreamedReferenceRunner(ReferenceRunner):
        def run(self, inputs: Any = None) -> dict[str, Any]:
            from collections import OrderedDict

            logger.info("Running ONNX Runtime to measure ranges, %d batch(es) of up to %d row(s), one batch in "
                        "memory at a time", dataset.num_batches(batch_size), batch_size)
            session = _session_with_every_output(self.model, self.providers, workdir)
            names = [output.name for output in session.get_outputs()]
            stats: dict[str, _RangeStats] = OrderedDict()
            total = dataset.num_batches(batch_size)
            for index, batch in enumerate(dataset.batches(batch_size), 1):
                results = session.run(names, batch)
                for name, array in [*batch.items(), *zip(names, results, strict=True)]:
                    entry = stats.get(name)
                    if entry is None:
                        entry = stats[name] = _RangeStats(tuple(array.shape))
                    entry.add(array)
                del results
                if progress is not None:
                    progress(index, total)
            del session
            return OrderedDict(
                (name, TensorStats(absmax=s.absmax, min_val=s.low, max_val=s.high, shape=s.shape))
                for name, s in stats.items()
            )

    if getattr(autocast, "ReferenceRunner", None) is not ReferenceRunner:
        raise RuntimeError("modelopt.onnx.autocast.convert no longer uses ReferenceRunner: the streamed "
                           "reference run needs updating for this ModelOpt version")
    autocast.ReferenceRunner = StreamedReferenceRunner
    try:
        yield
    finally:
        autocast.ReferenceRunner = ReferenceRunner


# Model-file helpers shared by the stages that hand a model to ModelOpt.


def private_model_copy(model: Path, directory: Path) -> Path:
    """Copy ``model`` (and the external data files it names) into ``directory``; return the copy's path.

    ModelOpt writes intermediate files beside the model it reads: it must never write into the store.
    """
    import shutil

    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "model.onnx"
    shutil.copyfile(model, target)
    proto = onnx.load(str(model), load_external_data=False)
    for tensor in proto.graph.initializer:
        if not uses_external_data(tensor):
            continue
        location = ExternalDataInfo(tensor).location
        copied = directory / location
        if copied.exists():
            continue
        source = model.parent / location
        if not source.is_file():
            raise StageFailed(
                f"the input model refers to external data {location!r}, which is missing beside {model}",
                hint="keep the model's external data file next to it",
            )
        copied.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, copied)
    return target


def check_node_patterns(model_path: Path, patterns: Mapping[str, Sequence[str] | None]) -> None:
    """Fail on node-name patterns (ModelOpt's ``re.match`` semantics) that are invalid or match no node."""
    import onnx

    if not any(patterns.values()):
        return
    names = [node.name for node in onnx.load(str(model_path), load_external_data=False).graph.node]
    for field, values in patterns.items():
        for pattern in values or ():
            try:
                compiled = re.compile(pattern)
            except re.error as error:
                raise StageFailed(f"{field}: {pattern!r} is not a valid regular expression: {error}") from None
            if not any(compiled.match(name) for name in names):
                raise StageFailed(
                    f"{field}: {pattern!r} matches no node of the model (patterns match the start of node "
                    f"names, e.g. {names[:3]})",
                    hint="list the names with: python -c \"import onnx; print([n.name for n in "
                    "onnx.load('model.onnx').graph.node])\"",
                )


def check_op_types(model_path: Path, field: str, op_types: Sequence[str] | None) -> list[str]:
    """Op types from ``op_types`` that the model does not contain (to warn about likely misspellings)."""
    import onnx

    if not op_types:
        return []
    present = {node.op_type for node in onnx.load(str(model_path), load_external_data=False).graph.node}
    return [op for op in op_types if op not in present]
