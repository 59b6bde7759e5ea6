"""An exported model checked against PyTorch at several shapes (ONNX Runtime), and the failure at a shape other than
the sample: what, where, why and what to do (trying torch.export where TorchScript fails)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtflow.stage import (
    RecipeMismatch,
    StageContext,
    StageFailed,
)

from ..formats.torch_check import (
    CheckShape,
    ShapeResult,
    ort_error,
    sample_inputs,
    torch_outputs,
)
from .exporters import run_exporter, specialised
from .params import ExportParams


def _check_shape(ctx: StageContext, params: ExportParams, session: Any, path: Path, model: Any, binding: Any,
                 check: CheckShape) -> ShapeResult:
    import numpy as np

    from ..accuracy.model_problems import ort_run_step

    arrays = sample_inputs(params, check.shapes)
    try:
        expected = torch_outputs(model, binding, params, arrays)
    except Exception as error:  # the model's own code: any exception type
        detail = f"PyTorch itself fails at this shape: {first_line(error)}"
        if check.origin == "derived from the sample":  # a size we chose, not one the recipe promises
            return ShapeResult(check, "skipped", detail)
        return ShapeResult(check, "failed", detail, cause="framework")
    shapes = [list(e.shape) for e in expected]
    feed = {i.name: arrays[i.name] for i in session.get_inputs()}
    try:
        with ort_run_step(ctx, path, feed, what=f"checking the exported model at {check.label}"):
            actual = session.run(None, feed)
    except Exception as error:
        detail, node = ort_error(error)
        return ShapeResult(check, "failed", f"ONNX Runtime: {detail}", node=node, output_shapes=shapes)
    worst = 0.0
    for index, (exp, got) in enumerate(zip(expected, actual, strict=False)):
        got = np.asarray(got, dtype=np.float32)
        names = params.outputs or []
        name = names[index] if index < len(names) else f"#{index}"
        if exp.shape != got.shape:
            return ShapeResult(check, "deviates", f"output {name}: ONNX Runtime shape {list(got.shape)}, PyTorch "
                               f"{list(exp.shape)}", output_shapes=shapes)
        diff = float(np.max(np.abs(exp - got))) if exp.size else 0.0
        worst = max(worst, diff)
        if not np.allclose(got, exp, atol=params.atol, rtol=params.rtol, equal_nan=True):
            return ShapeResult(check, "deviates", f"output {name}: ONNX Runtime differs from PyTorch by up to "
                               f"{diff:.3g} (atol {params.atol}, rtol {params.rtol})", max_abs_diff=diff,
                               output_shapes=shapes)
    return ShapeResult(check, "ok", max_abs_diff=worst, output_shapes=shapes)


def first_line(error: BaseException) -> str:
    """An exception as one line: TorchScript's interpreter traceback cut off (its cause is the last line)."""
    text = str(error)
    if "Traceback of TorchScript" in text or "The following operation failed" in text:
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        text = lines[-1] if lines else text
    return f"{type(error).__name__}: {' '.join(text.split())[:300]}"


def check_model(ctx: StageContext, params: ExportParams, path: Path, model: Any, binding: Any,
                 checks: list[CheckShape]) -> list[ShapeResult]:
    """Run every check (stops at the first failure); a session that cannot even load is a failure too."""
    from ..accuracy.model_problems import ort_session_step
    from ..accuracy.recovery import recover
    from ..runtimes.ort import create_session

    options = recover(path, log=ctx.log).options  # a crash in a child: settings that run (accuracy.recovery)
    try:
        with ort_session_step(ctx, path, options=options):
            session = create_session(path, options)
    except Exception as error:
        detail, node = ort_error(error)
        return [ShapeResult(checks[0], "failed", f"ONNX Runtime cannot load the model: {detail}", node=node)]
    results = []
    for index, check in enumerate(checks):
        ctx.progress(0.6 + 0.3 * index / len(checks), f"checking at {check.label}")
        result = _check_shape(ctx, params, session, path, model, binding, check)
        results.append(result)
        if result.status in ("failed", "deviates"):
            break
    return results


def dynamo_probe(ctx: StageContext, params: ExportParams, model: Any, binding: Any, checks: list[CheckShape]) -> str:
    """Whether `dynamo: true` would do better, found by trying it (a sentence for the hint)."""
    probe = ctx.scratch / "dynamo-probe" / "model.onnx"
    probe.parent.mkdir(parents=True, exist_ok=True)
    ctx.progress(0.8, "trying the torch.export-based exporter (dynamo: true)")
    try:
        run_exporter(ctx, params, model, binding, True, probe)
    except StageFailed as failed:
        return f"dynamo: true does not help here (tried: {failed.message})"
    fixed = specialised(params, probe)
    if fixed:
        return f"dynamo: true does not help here (tried: {fixed})"
    results = check_model(ctx, params, probe, model, binding, checks)
    bad = [r for r in results if r.status in ("failed", "deviates")]
    if bad:
        return f"dynamo: true does not help here (tried: at {bad[0].check.label}: {bad[0].detail})"
    return ("set `dynamo: true`: tried here, the torch.export-based exporter gives a model that matches PyTorch at "
            "every checked shape")


def fail_at(ctx: StageContext, params: ExportParams, model: Any, binding: Any, path: Path, result: ShapeResult,
             checks: list[CheckShape]) -> StageFailed:
    """The failure of the export node at a shape other than the sample: what, where, why, what to do."""
    from ..formats.torch_export import baked_sizes

    check = result.check
    sizes = params.dim_sizes()
    if result.cause == "framework":
        return RecipeMismatch(f"the model cannot run at {check.label}, which the recipe declares: {result.detail}",
                           hint=f"lower the {check.origin.split()[-1]} of {check.dim!r} in the profiles "
                           f"({', '.join(p.name for p in params.profiles)}) to sizes the model takes"
                           if check.dim else "give a sample shape the model takes (inputs: shape)")
    what = (f"the exported model {'fails' if result.status == 'failed' else 'deviates from PyTorch'} at "
            f"{check.label}: {result.detail}")
    if check.dim is None:
        return StageFailed(what, hint=f"the export is not faithful at the {check.origin} shape; check the "
                           "operators named in the log, or loosen atol/rtol")
    baked = baked_sizes(path, [sizes[check.dim]])
    nodes = [result.node] if result.node else []
    nodes += [b for b in baked if not (result.node and b.split(" ", 1)[1] in result.node)]
    exporter = "torch.export-based exporter" if params.dynamo else "TorchScript exporter"
    cause = (f"cause: the {exporter} recorded the sample's size of {check.dim!r} ({sizes[check.dim]}) as a "
             "constant" + (f" (in {', '.join(nodes[:3])})" if nodes else ""))
    if not params.dynamo:
        cause += ("; the tracer records sizes that pass through Python (int(), size arithmetic, loops over a "
                  "dimension, nn.MultiheadAttention) as fixed numbers")
    fixes = []
    if not params.dynamo:
        fixes.append(dynamo_probe(ctx, params, model, binding, checks))
    fixes.append("or keep sizes symbolic in the model's code (x.shape[i] without int(), -1 in view/reshape)")
    fixes.append(f"or remove {check.dim!r} from dynamic_axes if that size never changes")
    return StageFailed(f"{what}; {cause}", hint="; ".join(fixes))
