"""A PyTorch model to ONNX: the model built from its factory (and checkpoint), the recipe's inputs bound to forward(),
the sample run once, the export, and its checks at several shapes."""

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
    check_shapes,
    sample_inputs,
    size_one_warnings,
)
from .exporters import run_exporter, specialised
from .onnx_file import checker
from .output_names import name_output_dims, named_outputs
from .params import ExportParams
from .shape_checks import check_model, dynamo_probe, fail_at, first_line


def build_model(ctx: StageContext, params: ExportParams) -> Any:
    import torch

    factory = ctx.load_callable(params.model, "model factory")
    try:
        model = factory(**params.factory_args)
    except Exception as exc:
        ctx.log.exception("model factory failed")
        raise StageFailed(f"the model factory {params.model!r} raised {type(exc).__name__}: {exc}",
                          hint="fix the factory (the full traceback is in the log)") from exc
    if not isinstance(model, torch.nn.Module):
        raise StageFailed(f"the model factory {params.model!r} returned {type(model).__name__}, not a torch.nn.Module")
    if params.checkpoint:
        path = ctx.resolve(params.checkpoint)
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise StageFailed(f"cannot load checkpoint {params.checkpoint!r} with weights_only=True: {exc}",
                              hint="save a plain state_dict (torch.save(model.state_dict(), path))") from exc
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            raise StageFailed(f"checkpoint {params.checkpoint!r} does not fit the model: {exc}") from exc
    return model.eval()


def _sample_fits(ctx: StageContext, params: ExportParams, model: Any, binding: Any) -> list[str]:
    """Run the model once on the sample: inputs it cannot take (the wrong dtype, range, rank or size) fail here,
    naming what to set, before any exporter runs. Returns names for its outputs (`torch_check.output_names`)."""
    from ..formats.torch_check import explain_input_error, output_names, torch_result

    shapes = {n: s.shape for n, s in params.inputs.items()}
    try:
        result = torch_result(model, binding, params, sample_inputs(params, shapes))
    except Exception as error:  # the model's own code: any exception type
        ctx.log.info("the model fails on the sample inputs", exc_info=True)
        explained = explain_input_error(error, params, model)
        if explained is not None:
            raise RecipeMismatch(*explained) from None
        given = ", ".join(f"{n}: {s.dtype}{list(s.shape)}" for n, s in params.inputs.items())
        hint = ("give inputs: with the names, ranks, sizes and dtypes forward() takes (the node's log holds the "
                "model's traceback)") if params.task is None else (
                "the inputs and profiles come from the Hugging Face folder's config.json: write them again with "
                "`trtflow init` (or set task: to what the weights are for); the node's log holds the traceback")
        raise StageFailed(f"the model fails on the sample inputs ({given}): {first_line(error)}", hint=hint) from None
    return output_names(result)


def _bind(params: ExportParams, model: Any, by_name: list[str] | None) -> Any:
    """How the recipe's inputs reach forward(): by name where forward()'s names are known (a TorchScript module's
    schema, a program's inputs), else `bind_inputs`."""
    from trtflow.errors import did_you_mean

    from ..formats.torch_export import Binding, bind_inputs

    names = list(params.inputs)
    if not by_name:
        return bind_inputs(model, names)
    if set(names) <= set(by_name):
        return Binding(tuple(n for n in by_name if n in names), by="name")
    unknown = [n for n in names if n not in by_name]
    suggestions = [s for s in (did_you_mean(n, by_name) for n in unknown) if s]
    raise RecipeMismatch(f"input {unknown[0]!r} is not an argument of the model's forward({', '.join(by_name)})"
                      + (f"; {suggestions[0]}" if suggestions else ""),
                      hint=f"name the inputs like forward()'s arguments: {', '.join(by_name)}")


def export_pytorch(ctx: StageContext, params: ExportParams, target: Path, model: Any, program: Any = None,
                    by_name: list[str] | None = None, dim_names: dict[str, str] | None = None,
                    limits: dict[str, Any] | None = None,
                    checks: list[CheckShape] | None = None) -> tuple[dict[str, Any], ExportParams]:
    """Export a PyTorch model (``program``: its torch.export program, exported as is; ``by_name``: forward()'s
    argument names where Python cannot see them, as in a TorchScript module; ``limits``: how far each dynamic dim
    may go) and check it at several shapes (``checks``, default `check_shapes`). Returns the summary and the params
    it used (output names resolved)."""
    binding = _bind(params, model, by_name)
    for note in binding.notes:
        ctx.log.info("%s", note)
    _within_limits(params, limits or {})
    warnings = size_one_warnings(params)
    for warning in warnings:
        ctx.log.warning("%s", warning)
    params = named_outputs(params, _sample_fits(ctx, params, model, binding))
    ctx.progress(0.1, f"exporting with {'torch.export (dynamo)' if params.dynamo else 'TorchScript'}")
    try:
        run_exporter(ctx, params, model, binding, params.dynamo, target, program)
        if dim_names and any(symbol != name for symbol, name in dim_names.items()):
            from ..formats.torch_export import rename_dims

            rename_dims(target, dim_names)
    except StageFailed as failed:
        if params.dynamo or by_name:
            raise
        probe = dynamo_probe(ctx, params, model, binding, check_shapes(params))
        raise StageFailed(failed.message, hint=f"{probe}; {failed.hint}") from failed.__cause__
    if params.dynamo:
        fixed = specialised(params, target)
        if fixed:
            raise StageFailed(
                f"{fixed}; the ONNX model would only accept those sizes",
                hint="the model's code turns that size into a constant (int() on a size, a Python branch or loop "
                "on it, .item()): keep it symbolic, use a sample size of 2 or more, or remove the name from "
                "dynamic_axes if the size never changes")
    checks = checks or check_shapes(params)
    summary: dict[str, Any] = {"exporter": "dynamo" if params.dynamo else "torchscript",
                               "inputs_bound_by": binding.by}
    if warnings:
        summary["warnings"] = warnings
    checker(target)
    if not params.check:
        summary["checked"] = False
        return summary, params
    results = check_model(ctx, params, target, model, binding, checks)
    summary["checked_shapes"] = [r.record() for r in results]
    for result in results:
        if result.status == "skipped":
            ctx.log.warning("not checked at %s: %s", result.check.label, result.detail)
            summary.setdefault("warnings", []).append(f"not checked at {result.check.label}: {result.detail}")
        if result.status in ("failed", "deviates"):
            raise fail_at(ctx, params, model, binding, target, result, checks)
    compared = [r for r in results if r.status == "ok"]  # the sample at least: it ran in PyTorch (_sample_fits)
    name_output_dims(ctx, params, target, compared)
    summary["checked"] = True
    summary["checked_at"] = [r.check.label for r in compared]
    summary["max_abs_diff_vs_torch"] = max(r.max_abs_diff or 0.0 for r in compared)
    return summary, params


def _within_limits(params: ExportParams, limits: dict[str, Any]) -> None:
    """Refuse a profile that asks a dim to go beyond what the model takes (RoBERTa's 128 tokens), before exporting."""
    for profile in params.profiles:
        for name, shape_range in profile.shapes.items():
            spec = params.inputs.get(name)
            if spec is None:
                continue
            for axis, dim in spec.dynamic_axes.items():
                limit = limits.get(dim)
                if limit is None or axis >= len(shape_range.max):
                    continue
                low, high = shape_range.min[axis], shape_range.max[axis]
                if limit.high is not None and high > limit.high:
                    raise RecipeMismatch(f"profile {profile.name!r} asks {dim!r} up to {high} (input {name!r}, axis "
                                      f"{axis}), but the model takes at most {limit.high}: {limit.why}",
                                      hint=f"set the profile's max {dim} to {limit.high} or less")
                if low < limit.low:
                    raise RecipeMismatch(f"profile {profile.name!r} asks {dim!r} down to {low} (input {name!r}, axis "
                                      f"{axis}), but the model needs at least {limit.low}: {limit.why}",
                                      hint=f"set the profile's min {dim} to {limit.low} or more")
