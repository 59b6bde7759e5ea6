"""The convert stage's conversion: ModelOpt AutoCast to fp16/bf16, keeping overflow-prone nodes in fp32.

`reference_data` opens the data AutoCast's reference run measures ranges on (the first batch also goes to a file,
for the reproduction command and the ONNX Runtime check); `autocast_arguments` are AutoCast's options from the
node's params (the same for the call and its command line); `convert_model` runs AutoCast with the reference run
streamed batch by batch (`modelopt.streamed_reference_run`) and AutoCast's log in the node's log.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trtflow.stage import RecipeError, StageContext, StageFailed

if TYPE_CHECKING:
    from ..data import Dataset, DataSource


class AutocastParams(Protocol):
    """What the conversion reads of a convert node's params (the convert stage's ``Params``)."""

    @property
    def precision(self) -> str: ...
    @property
    def nodes_to_exclude(self) -> list[str] | None: ...
    @property
    def op_types_to_exclude(self) -> list[str] | None: ...
    @property
    def nodes_to_include(self) -> list[str] | None: ...
    @property
    def op_types_to_include(self) -> list[str] | None: ...
    @property
    def data_max(self) -> float | None: ...
    @property
    def init_max(self) -> float: ...
    @property
    def keep_io_types(self) -> bool: ...
    @property
    def init_conversion_max_bytes(self) -> int | None: ...
    @property
    def calibration_eps(self) -> Sequence[str]: ...
    @property
    def max_depth_of_reduction(self) -> int | None: ...
    @property
    def opset(self) -> int | None: ...
    @property
    def calibration_data(self) -> DataSource | None: ...
    @property
    def calibration_batch_size(self) -> int | None: ...
    @property
    def uses_data(self) -> bool: ...


def autocast_arguments(params: AutocastParams) -> dict[str, Any]:
    """AutoCast's options besides the model and the precision, as the recipe gives them (``data_max`` None: no
    reference run)."""
    return {
        "nodes_to_exclude": params.nodes_to_exclude, "op_types_to_exclude": params.op_types_to_exclude,
        "nodes_to_include": params.nodes_to_include, "op_types_to_include": params.op_types_to_include,
        "data_max": params.data_max, "init_max": params.init_max, "keep_io_types": params.keep_io_types,
        "init_conversion_max_bytes": params.init_conversion_max_bytes, "providers": params.calibration_eps,
        "max_depth_of_reduction": params.max_depth_of_reduction, "opset": params.opset,
    }


@dataclass
class ReferenceData:
    """The data of AutoCast's reference run: none (random inputs, or no run), or a data set in batches."""

    dataset: Dataset | None = None
    batch_size: int = 1
    path: Path | None = None  # the first batch, saved (.npz)

    @property
    def rows(self) -> int:
        return self.dataset.rows if self.dataset is not None else 0


def reference_data(ctx: StageContext, model_path: Path, params: AutocastParams) -> ReferenceData:
    """The reference run's data, when the node uses it; logs what happens without it."""
    import numpy as np

    from ..data import batch_rows, onnx_input_specs, open_dataset

    if not params.uses_data:
        if params.calibration_data is not None:
            ctx.log.info("data_max is null: no reference run, calibration_data is not used")
        elif params.data_max is not None:
            ctx.log.warning("no calibration_data: AutoCast measures ranges on random inputs in [-1, 1]")
        return ReferenceData()
    assert params.calibration_data is not None
    ctx.progress(0.05, f"reading reference data ({params.calibration_data.describe()})")
    specs = onnx_input_specs(model_path)
    dataset = open_dataset(params.calibration_data, specs, ctx.resolve, ctx.log)
    try:
        batch_size, _ = batch_rows(specs, params.calibration_batch_size)
    except ValueError as error:
        raise RecipeError(str(error), field="calibration_batch_size",
                          hint="leave calibration_batch_size out to use the model's batch") from None
    # The first batch alone goes to a file: for the reproduction command and the ONNX Runtime check.
    reference_file = ctx.scratch / "reference.npz"
    np.savez(reference_file, **next(dataset.batches(batch_size)))  # type: ignore[arg-type]  # numpy's stub: **kwds could name allow_pickle
    return ReferenceData(dataset, batch_size, reference_file)


def convert_model(ctx: StageContext, model_path: Path, params: AutocastParams, reference: ReferenceData,
                  step: AbstractContextManager[Any]) -> Any:
    """The converted model (an ``onnx.ModelProto``); ``step``: the native step around the ModelOpt call
    (`accuracy.model_problems.modelopt_step`, with the command that reproduces it). AutoCast's failures are
    `StageFailed` with what to try."""
    import numpy as np
    from modelopt.onnx.autocast import convert_to_mixed_precision

    from .modelopt import streamed_reference_run

    def reference_progress(done: int, total: int) -> None:
        ctx.progress(0.1 + 0.7 * done / total, f"reference run: batch {done}/{total}")

    arguments = autocast_arguments(params)
    arguments.update(data_max=np.inf if params.data_max is None else params.data_max, calibration_data=None,
                     providers=list(params.calibration_eps))
    try:
        with _forward_logs("modelopt.onnx.autocast", ctx.log), ExitStack() as stack:
            if reference.dataset is not None:
                stack.enter_context(streamed_reference_run(reference.dataset, reference.batch_size, str(ctx.scratch),
                                                           reference_progress))
            stack.enter_context(step)
            return convert_to_mixed_precision(onnx_path=str(model_path), low_precision_type=params.precision,
                                              **arguments)
    except (StageFailed, RecipeError):
        raise
    except Exception as error:
        ctx.log.exception("AutoCast failed")
        hint = "the node's log holds AutoCast's messages and the traceback"
        if params.data_max is not None:
            hint = ("AutoCast runs the fp32 model on ONNX Runtime to measure ranges: give calibration_data "
                    "with real input shapes, or set data_max: null to skip that run; " + hint)
        raise StageFailed(f"AutoCast {params.precision} conversion failed: {type(error).__name__}: {error}",
                          hint=hint) from error


class _Forward(logging.Handler):
    def __init__(self, target: logging.Logger) -> None:
        super().__init__()
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        self.target.log(record.levelno, "%s", record.getMessage())


@contextmanager
def _forward_logs(name: str, target: logging.Logger) -> Iterator[None]:
    """Copy a library logger's records into the node's log while the library runs."""
    source = logging.getLogger(name)
    handler = _Forward(target)
    source.addHandler(handler)
    try:
        yield
    finally:
        source.removeHandler(handler)
