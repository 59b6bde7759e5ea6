"""The models validate compares, each run over the data in its own pass (one session alive at a time).

`DataPasses` reads the data one batch at a time in the batch the models take; `reference_pass` runs the reference
ONNX model with ONNX Runtime, `saved_reference` reads saved reference outputs instead, and `candidate_pass` runs the
candidate the way its backend runs it: an engine through its `runtimes.candidate.Candidate`, a fake-quantized
PyTorch model (nvfp4/mxfp8), or an ONNX model with ONNX Runtime after the numerics rewrites of `ort_fixes`. ONNX
Runtime's options are the recipe's narrowed by what the model's producer recorded, checked in a child process
(`ort_settings`, `recovery`); every session is created inside a native step with the command that reproduces it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.stage import RecipeError, StageContext, StageFailed

from ..data import DataSource, InputSpec, batch_rows, open_dataset
from ..runtimes.candidate import Candidate
from ..runtimes.ort import OrtOptions, level_member


def ort_hint(path: Path, options: OrtOptions) -> str | None:
    """A known ONNX Runtime crash this model and these options may hit, and the setting that avoids it."""
    import onnx

    if options.graph_optimization_level not in ("all", "layout") or "NchwcTransformer" in options.disabled_optimizers:
        return None
    model = onnx.load(str(path), load_external_data=False)
    if any(init.data_type == onnx.TensorProto.FLOAT16 for init in model.graph.initializer):
        return ("ONNX Runtime's CPU layout optimiser (NchwcTransformer) is known to crash on some fp16 models: set "
                "onnxruntime: {disabled_optimizers: [NchwcTransformer]} (or graph_optimization_level: extended) "
                "in this node's params")
    return None


def ort_repro(options: OrtOptions, which: str) -> str:
    """The command that creates the session ``which`` model ran in."""
    level = level_member(options.graph_optimization_level)
    disabled = f", disabled_optimizers={options.disabled_optimizers!r}" if options.disabled_optimizers else ""
    return (f"python -c \"import onnxruntime as o; s = o.SessionOptions(); s.graph_optimization_level = "
            f"o.GraphOptimizationLevel.{level}; o.InferenceSession('MODEL.onnx', s, "
            f"providers=['CPUExecutionProvider']{disabled})\"  (MODEL.onnx: the {which} model)")


def ort_settings(ctx: StageContext, model: Path, requested: OrtOptions, which: str, settings: dict[str, Any],
                 recorded_beside: Path | None = None) -> OrtOptions:
    """The ONNX Runtime options for one model: the recipe's, narrowed by what its producer recorded, checked in a
    child process (a crash there is recovered from: `recovery`); recorded in ``settings[which]``."""
    from .recovery import merge, recorded_settings, recover

    options = merge(requested, recorded_settings(recorded_beside or model))
    found = recover(model, options, log=ctx.log)
    settings[which] = found.record()
    if found.recovered:
        ctx.log.warning("%s model: %s", which, found.note())
    return found.options


@dataclass
class DataPasses:
    """The data, read one batch at a time in the batch the models take, for as many passes as there are models."""

    ctx: StageContext
    dataset: Any
    batch_size: int
    drop_last: bool
    total: int  # batches per pass
    rows: int

    def batches(self) -> Iterator[dict[str, Any]]:
        return self.dataset.batches(self.batch_size, self.drop_last)

    def reporter(self, start: float, label: str) -> Callable[[int, int], None]:
        return lambda done, count: self.ctx.progress(start + 0.4 * done / count, f"{label}: batch {done}/{count}")

    def run(self, runner: Any, start: float, label: str) -> dict[str, Any]:
        from ..runtimes.runners import run_over

        return run_over(runner, self.batches, self.total, self.reporter(start, label))


def data_passes(ctx: StageContext, data: DataSource, specs: list[InputSpec], batch_size: int | None) -> DataPasses:
    """The data in batches of ``batch_size`` (default: the model's static batch, else 1); recipe errors name
    ``batch_size``, a data set smaller than one batch fails the node."""
    try:
        size, drop_last = batch_rows(specs, batch_size)
    except ValueError as error:
        raise RecipeError(str(error), field="batch_size", hint="set batch_size to the model's batch or leave it "
                          "out") from None
    ctx.progress(0.05, f"reading {data.describe()}")
    dataset = open_dataset(data, specs, ctx.resolve, ctx.log)
    total = dataset.num_batches(size, drop_last)
    if total == 0:
        raise StageFailed(f"the data has fewer rows than one batch of {size}",
                          hint="give more samples or a smaller batch_size")
    return DataPasses(ctx, dataset, size, drop_last, total, dataset.rows if not drop_last else total * size)


def reference_pass(ctx: StageContext, path: Path, requested: OrtOptions, passes: DataPasses,
                   settings: dict[str, Any]) -> dict[str, Any]:
    """The reference ONNX model's outputs over the data, with ONNX Runtime on the CPU."""
    from ..runtimes.runners import onnx_runner

    options = ort_settings(ctx, path, requested, "reference", settings)
    with ctx.native_step("onnxruntime", "running the reference model", repro=ort_repro(options, "reference"),
                         hint=ort_hint(path, options)):
        return passes.run(onnx_runner(path, "reference", options), 0.1, "reference")


@dataclass
class CandidateOutputs:
    outputs: dict[str, Any]
    described: str  # what ran it, for validate.json
    rewrites: list[str]  # the numerics rewrites made for ONNX Runtime (`ort_fixes`)


def candidate_pass(ctx: StageContext, candidate: Candidate, requested: OrtOptions, passes: DataPasses,
                   settings: dict[str, Any]) -> CandidateOutputs:
    """The candidate's outputs over the data, run the way its backend runs it."""
    from ..runtimes.runners import engine_session_runner, onnx_runner
    from .ort_fixes import fix_for_onnxruntime

    assert candidate.path is not None
    if candidate.backend == "fake-quant":
        from .fake_quant import fake_quant_runner

        with ctx.native_step("modelopt", "running the fake-quantized PyTorch model"):
            outputs = passes.run(fake_quant_runner(candidate.path, ctx.load_callable, "candidate"), 0.5, "candidate")
        return CandidateOutputs(outputs, "fake-quantized PyTorch model (CUDA)", [])
    if candidate.engine is not None:
        described = f"{candidate.backend} engine"
        with ctx.native_step(described, "running the engine candidate"), candidate:
            outputs = passes.run(engine_session_runner(candidate.engine, "candidate"), 0.5, "candidate")
        return CandidateOutputs(outputs, described, [])
    from .fake_quant import refuse_onnxruntime

    refuse_onnxruntime(candidate.path)
    fixed_path, fixes = fix_for_onnxruntime(candidate.path, ctx.scratch / "candidate")
    rewrites = [fix.reason for fix in fixes]
    for note in rewrites:
        ctx.log.info("candidate rewritten for ONNX Runtime: %s", note)
    options = ort_settings(ctx, fixed_path, requested, "candidate", settings, candidate.path)
    with ctx.native_step("onnxruntime", "running the candidate model", repro=ort_repro(options, "candidate"),
                         hint=ort_hint(candidate.path, options)):
        outputs = passes.run(onnx_runner(fixed_path, "candidate", options), 0.5, "candidate")
    return CandidateOutputs(outputs, "onnxruntime (CPU)", rewrites)


def saved_reference(path: Path, named: str, candidate: Mapping[str, Any], rows: int) -> dict[str, Any]:
    """Reference outputs saved in a .npz (``named``: as the recipe names it), checked against the candidate's rows."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as saved:
            reference = {name: saved[name] for name in saved.files}
    except (OSError, ValueError) as error:
        raise StageFailed(f"cannot read reference outputs {named}: {error}",
                          hint="save them with numpy.savez(path, output_name=array, ...)") from error
    for name, array in reference.items():
        if name in candidate and array.shape[0] != candidate[name].shape[0]:
            raise StageFailed(
                f"reference_outputs {name!r} has {array.shape[0]} rows but the candidate produced "
                f"{candidate[name].shape[0]} from {rows} data rows",
                hint="save reference outputs for exactly the rows of the data (same order)")
    return reference
