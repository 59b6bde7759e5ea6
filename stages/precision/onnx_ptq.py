"""The quantize stage's ONNX route (modes int8, fp8, int4): ModelOpt's post-training quantization of an ONNX model.

`calibration_input` opens the calibration data in the batch the model takes (none for weight-only methods);
`Quantizer` runs ``modelopt.onnx.quantization.quantize`` with the node's options and a Q/DQ placement, once per
calibration method it is asked for (a retry with the other method is `accuracy.calibration`'s decision), ModelOpt's
log relayed to the node's log.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trtflow.stage import RecipeError, StageContext, StageFailed

from ..data import InputSpec

if TYPE_CHECKING:
    from ..data import Dataset, DataSource

#: ModelOpt's ONNX PTQ converts the non-quantized rest of an int8/fp8 model to this by default.
MODELOPT_DEFAULT_HIGH_PRECISION = "fp16"


class PtqParams(Protocol):
    """What the ONNX route reads of a quantize node's params (the quantize stage's ``Params``)."""

    @property
    def mode(self) -> str: ...
    @property
    def method(self) -> str: ...
    @property
    def uses_data(self) -> bool: ...
    @property
    def calibration_data(self) -> DataSource | None: ...
    @property
    def calibration_batch_size(self) -> int | None: ...
    @property
    def calibration_eps(self) -> Sequence[str]: ...
    @property
    def op_types_to_quantize(self) -> list[str] | None: ...
    @property
    def op_types_to_exclude(self) -> list[str] | None: ...
    @property
    def nodes_to_quantize(self) -> list[str] | None: ...
    @property
    def nodes_to_exclude(self) -> list[str] | None: ...
    @property
    def high_precision_dtype(self) -> str | None: ...
    @property
    def block_size(self) -> int | None: ...
    @property
    def use_external_data_format(self) -> bool: ...
    @property
    def simplify(self) -> bool: ...


class PlacementLike(Protocol):
    """The Q/DQ placement the quantize stage chose (its `Placement`)."""

    @property
    def name(self) -> str: ...
    @property
    def op_types(self) -> tuple[str, ...]: ...
    @property
    def unquantized_matmuls(self) -> tuple[str, ...]: ...


@dataclass
class Calibration:
    """The calibration data in batches of ``batch_size`` (``dataset`` None: the method reads only the weights)."""

    dataset: Dataset | None = None
    batch_size: int | None = None
    progress: Callable[[int, int], None] | None = None

    @property
    def rows(self) -> int:
        return self.dataset.rows if self.dataset is not None else 0

    def reader(self) -> Any:
        """A fresh ModelOpt calibration data reader over the data (None without data)."""
        from .modelopt import calibration_reader

        if self.dataset is None or self.batch_size is None:
            return None
        return calibration_reader(self.dataset, self.batch_size, self.progress)


def calibration_input(ctx: StageContext, specs: list[InputSpec], params: PtqParams) -> Calibration:
    """The calibration data, opened when the method reads data; recipe errors name ``calibration_batch_size``."""
    from ..data import batch_rows, open_dataset

    if not params.uses_data:
        if params.calibration_data is not None:
            ctx.log.info("calibration_method %s reads only the weights: calibration_data is not used",
                         params.method)
        return Calibration()
    assert params.calibration_data is not None
    ctx.progress(0.05, f"reading calibration data ({params.calibration_data.describe()})")
    dataset = open_dataset(params.calibration_data, specs, ctx.resolve, ctx.log)
    try:
        batch_size, _ = batch_rows(specs, params.calibration_batch_size)
    except ValueError as error:
        raise RecipeError(str(error), field="calibration_batch_size",
                          hint="leave calibration_batch_size out to use the model's batch") from None
    if params.calibration_data.is_random:
        ctx.log.warning("calibrating with RANDOM data: the scales say nothing about real inputs; use "
                        "it for smoke tests only")

    def progress(done: int, total: int) -> None:
        then = "; computing scales and writing the model" if done == total else ""
        ctx.progress(0.1 + 0.7 * done / total, f"calibrating: batch {done}/{total}{then}")

    return Calibration(dataset, batch_size, progress)


def high_precision_dtype(params: PtqParams) -> str | None:
    """The dtype int8/fp8 keep unquantized tensors in (None for int4)."""
    if params.mode not in ("int8", "fp8"):
        return None
    return params.high_precision_dtype or MODELOPT_DEFAULT_HIGH_PRECISION


@dataclass
class Quantizer:
    """ModelOpt's quantization of ``model_path`` with the node's options and ``placement``; call it with a
    calibration method and a folder to get the quantized model's path."""

    ctx: StageContext
    model_path: Path
    params: PtqParams
    placement: PlacementLike
    calibration: Calibration
    kwargs: dict[str, Any] = field(default_factory=dict)
    nodes_to_exclude: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        params, placement = self.params, self.placement
        self.nodes_to_exclude = list(params.nodes_to_exclude or [])
        if params.mode in ("int8", "fp8"):
            self.kwargs.update(op_types_to_quantize=params.op_types_to_quantize,
                               op_types_to_exclude=params.op_types_to_exclude,
                               nodes_to_quantize=params.nodes_to_quantize,
                               high_precision_dtype=high_precision_dtype(params))
            if placement.name == "weighted":
                self.kwargs.update(op_types_to_quantize=list(placement.op_types), disable_mha_qdq=True)
                self.nodes_to_exclude += [f"{re.escape(name)}$" for name in placement.unquantized_matmuls]
        if params.block_size is not None:
            self.kwargs["block_size"] = params.block_size

    def __call__(self, method: str, folder: Path) -> Path:
        """The model quantized with calibration ``method`` into ``folder``."""
        from modelopt.onnx.quantization import quantize

        ctx, params = self.ctx, self.params
        log_file = ctx.scratch / "modelopt.log"
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / "model.onnx"
        ctx.progress(0.1, f"quantizing to {params.mode} ({method}) with ModelOpt")
        try:
            with ctx.native_step("modelopt", f"quantizing the model to {params.mode} (calibration runs the model "
                                 "on ONNX Runtime)"):
                quantize(
                    str(self.model_path),
                    quantize_mode=params.mode,
                    calibration_data_reader=self.calibration.reader(),
                    calibration_method=method,
                    calibration_eps=list(params.calibration_eps),
                    nodes_to_exclude=self.nodes_to_exclude or None,
                    use_external_data_format=params.use_external_data_format,
                    simplify=params.simplify,
                    output_path=str(target),
                    log_level="INFO",
                    log_file=str(log_file),
                    **self.kwargs,
                )
        except (StageFailed, RecipeError):
            raise
        except Exception as error:
            ctx.log.exception("ModelOpt quantization failed")
            raise StageFailed(
                f"ModelOpt {params.mode} quantization ({method}) failed: {type(error).__name__}: {error}",
                hint="the node's log holds ModelOpt's log and the traceback; try excluding the failing nodes "
                "with nodes_to_exclude",
            ) from error
        finally:
            _relay_log(log_file, ctx)
        if not target.exists():
            raise StageFailed(f"ModelOpt wrote no quantized model to {target}",
                              hint="see ModelOpt's messages in the node's log")
        return target


def _relay_log(log_file: Path, ctx: StageContext) -> None:
    if log_file.exists():
        for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines():
            ctx.log.info("%s", line)
