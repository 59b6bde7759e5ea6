"""A calibration that failed numerically: found after quantizing, recovered with the other calibration method.

ModelOpt's default int8/fp8 calibrator, ``entropy``, picks each activation's range from a histogram of its values
(ONNX Runtime's ``HistogramCollector``, on the fp16 copy of the activations). When a tensor's values sit in a band
narrower than the histogram's resolution (a near-constant activation far from zero: a bias, a LayerNorm offset, a
mean), the bins collapse and the range it picks can clip every value: the model quantizes without an error and
computes garbage (reproduced: an activation of 500 +- 20 got a range of +-41, the output differed by 92 %).
Like an ONNX Runtime crash (`recovery`), nothing here knows the cause in advance: `agreement` runs the original
and the quantized model on calibration batches; a quantized model whose outputs are not finite, whose cosine
similarity to the original falls below `FAILED_COSINE` or whose relative error (``|q - f| / |f|``, L2 over all
values) exceeds `FAILED_RELATIVE_ERROR`, has failed, and quantize retries with the other method
(``max``: the largest absolute value, which never clips) and keeps the one that agrees better, saying so.
The bound is far below any accuracy budget: it tells a broken calibration from a lossy one; judging the loss is
validate's job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trtflow.stage import StageContext, StageFailed

#: Below this cosine similarity, or above this relative error (on calibration data), a quantized model is broken,
#: not merely lossy (a clipped range keeps the direction of the outputs but not their size: both are needed).
FAILED_COSINE = 0.9
FAILED_RELATIVE_ERROR = 0.5
#: The method tried after each default method fails.
FALLBACK = {"entropy": "max", "max": "entropy"}


@dataclass(frozen=True)
class Agreement:
    """How a quantized model's outputs compare with the original's on calibration batches."""

    method: str
    cosine: float  # the lowest, over outputs, of the cosine similarity of all rows' values
    relative_error: float  # the largest, over outputs, of |q - f| / |f| (L2 over all rows' values)
    finite: bool  # every output value of the quantized model is finite where the original's is
    rows: int
    worst_output: str = ""

    @property
    def failed(self) -> bool:
        return not self.finite or self.cosine < FAILED_COSINE or self.relative_error > FAILED_RELATIVE_ERROR

    @property
    def score(self) -> tuple[bool, float]:
        """Larger is better: finite first, then the smaller relative error."""
        return self.finite, -self.relative_error

    def record(self) -> dict[str, Any]:
        return {"method": self.method, "cosine_similarity": round(self.cosine, 6),
                "relative_error": round(self.relative_error, 6), "finite": self.finite, "rows": self.rows,
                "worst_output": self.worst_output}

    def describe(self) -> str:
        if not self.finite:
            return f"{self.method}: outputs not finite ({self.worst_output})"
        return (f"{self.method}: cosine similarity {self.cosine:.4f}, relative error {self.relative_error:.3g} on "
                f"{self.rows} calibration rows (worst output {self.worst_output})")


def agreement(method: str, reference: Any, candidate: Any, batches: Iterable[Mapping[str, Any]]) -> Agreement:
    """Compare ``candidate`` (an ONNX Runtime session of the quantized model) with ``reference`` on ``batches``."""
    import numpy as np

    names = [o.name for o in reference.get_outputs()]
    inputs = [i.name for i in reference.get_inputs()]
    expected: dict[str, list[Any]] = {n: [] for n in names}
    actual: dict[str, list[Any]] = {n: [] for n in names}
    rows = 0
    for batch in batches:
        feed = {name: batch[name] for name in inputs}
        rows += len(next(iter(feed.values()))) if feed else 0
        for name, ref, got in zip(names, reference.run(names, feed), candidate.run(names, feed), strict=True):
            expected[name].append(np.asarray(ref, dtype=np.float64).ravel())
            actual[name].append(np.asarray(got, dtype=np.float64).ravel())
    worst_cosine, worst_error, worst_name = 1.0, 0.0, ""
    for name in names:
        ref = np.concatenate(expected[name]) if expected[name] else np.zeros(0)
        got = np.concatenate(actual[name]) if actual[name] else np.zeros(0)
        usable = np.isfinite(ref)
        if not np.isfinite(got[usable]).all():
            return Agreement(method, 0.0, float("inf"), False, rows, name)
        ref, got = ref[usable], got[usable]
        size = float(np.linalg.norm(ref))
        norm = size * float(np.linalg.norm(got))
        cosine = float(np.dot(ref, got) / norm) if norm > 0 else (1.0 if np.allclose(ref, got) else 0.0)
        error = float(np.linalg.norm(got - ref) / size) if size > 0 else float(np.linalg.norm(got) > 0)
        if not worst_name or error - worst_error > 0 or cosine < worst_cosine:
            worst_name = name if (error > worst_error or cosine < worst_cosine or not worst_name) else worst_name
        worst_cosine, worst_error = min(worst_cosine, cosine), max(worst_error, error)
    return Agreement(method, worst_cosine, worst_error, True, rows, worst_name)


def calibration_batches(dataset: Any, batch_size: int, rows: int = 8) -> list[dict[str, Any]]:
    """The first batches of ``dataset`` holding about ``rows`` rows (what `agreement` runs the models on)."""
    batches = []
    seen = 0
    for batch in dataset.batches(batch_size):
        batches.append(batch)
        seen += len(next(iter(batch.values())))
        if seen >= rows:
            break
    return batches


def session(path: Path, log: Any = None) -> Any:
    """An ONNX Runtime session of ``path``, with the settings crash recovery finds for it (`recovery`)."""
    from ..runtimes.ort import create_session
    from .recovery import recover

    return create_session(path, recover(path, log=log).options)


class CalibrationParams(Protocol):
    """What the recovery reads of a quantize node's params (the quantize stage's ``Params``)."""

    @property
    def mode(self) -> str: ...
    @property
    def method(self) -> str: ...
    @property
    def calibration_method(self) -> str | None: ...


def quantize_and_check(ctx: StageContext, params: CalibrationParams, quantize_with: Callable[[str, Path], Path],
                       calibration: Any, original: Path, folder: Path) -> tuple[str, Path, dict[str, Any] | None]:
    """(method, model, recovery record): the model quantized by ``quantize_with`` (a `precision.onnx_ptq.Quantizer`)
    with the node's method into ``folder``; an int8/fp8 calibration that fails on the data (the calibrator raises)
    or numerically (`agreement`) is retried with the other method (`FALLBACK`) where the recipe left the method
    to ModelOpt, and the record says what was tried and kept."""
    method = params.method
    recovery: dict[str, Any] | None = None
    calibrated = calibration.dataset is not None and params.mode in ("int8", "fp8")
    recoverable = calibrated and params.calibration_method is None
    try:
        quantized_path = quantize_with(method, folder)
    except StageFailed as failed:
        if not recoverable:
            raise
        # the calibrator itself failed on the data (entropy: "Too many bins for data range"): the other method
        method = FALLBACK[params.method]
        ctx.log.warning("calibration %s failed (%s): trying %s", params.method, failed.message, method)
        try:
            quantized_path = quantize_with(method, ctx.scratch / f"quantized-{method}")
        except StageFailed as again:
            raise StageFailed(f"{failed.message}; retried with calibration_method {method}, which failed too: "
                              f"{again.message}", hint=failed.hint) from None
        recovery = {"tried": [{"method": params.method, "error": failed.message}], "chosen": method,
                    "reason": f"calibration {params.method} failed on the calibration data ({failed.message}); "
                    f"{method} worked"}
    if recovery is None and calibrated:
        method, quantized_path, recovery = _numeric_recovery(ctx, params, original, quantized_path,
                                                             calibration.dataset, calibration.batch_size,
                                                             quantize_with)
    return method, quantized_path, recovery


def _numeric_recovery(ctx: StageContext, params: CalibrationParams, original: Path, quantized: Path, dataset: Any,
                      batch_size: int, quantize_with: Callable[[str, Path], Path],
                      ) -> tuple[str, Path, dict[str, Any] | None]:
    """(method, model, record): a calibration that failed numerically (`accuracy.calibration`) retried with the
    other method when the method was ModelOpt's default; the model that agrees better with the original is kept."""
    batches = calibration_batches(dataset, batch_size)
    reference = session(original, ctx.log)
    try:
        first = agreement(params.method, reference, session(quantized, ctx.log), batches)
    except Exception as exc:  # ONNX Runtime's CPU kernels lack some fp8 ops TensorRT has
        reason = (f"ONNX Runtime cannot run the quantized model here ({type(exc).__name__}: "
                  f"{str(exc).splitlines()[0][:300]}), so the numeric check of the calibration was not made; "
                  "validate on the engine judges its accuracy")
        ctx.log.warning("%s", reason)
        return params.method, quantized, {"tried": [], "chosen": params.method, "checked": False, "reason": reason}
    ctx.log.info("quantized model vs the original on calibration data: %s", first.describe())
    if not first.failed:
        return params.method, quantized, None
    if params.calibration_method is not None:  # the recipe chose it: said, not overridden
        ctx.log.warning("calibration %s failed numerically (%s); calibration_method: %s might not",
                        params.method, first.describe(), FALLBACK[params.method])
        return params.method, quantized, {"tried": [first.record()], "chosen": params.method,
                                          "reason": f"failed numerically ({first.describe()}); the recipe chose "
                                          "the method, so it is kept"}
    other = FALLBACK[params.method]
    ctx.log.warning("calibration %s failed numerically (%s): trying %s", params.method, first.describe(), other)
    retried = quantize_with(other, quantized.parent.parent / f"quantized-{other}")
    second = agreement(other, reference, session(retried, ctx.log), batches)
    ctx.log.info("with %s: %s", other, second.describe())
    better = second if second.score > first.score else first
    reason = (f"{first.describe()}: a broken calibration, not a lossy one; retried with {other} "
              f"({second.describe()}); kept {better.method}")
    return better.method, retried if better is second else quantized, {
        "tried": [first.record(), second.record()], "chosen": better.method, "reason": reason}
