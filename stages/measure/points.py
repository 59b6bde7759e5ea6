"""The benchmark's fixed-batch points: every batch size and stream count timed (engines one point after another,
host-timed models in turns, `measure.timing.fixed`), the gate point timed in A/B pairs with the reference
(`measure.timing.ab`, the reference planned by `measure.judging.reference`), and the layer and kernel profiles."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from trtflow.stage import RecipeError, StageContext, StageFailed, StageSkipped

from ..data import InputSpec
from .params import Params
from .serving.traffic import steady_interpreter
from .timing.feeds import batch_of, make_feed, with_batch
from .timing.fixed import PointSettings


def open_host_model(ctx: StageContext, params: Params, backend: str, model: Path | None) -> Any:
    """What runs the model on the host clock: an ONNX Runtime session (backend onnxruntime) or a PyTorch module
    (backend torch); None for an engine (the candidate's)."""
    from trtflow.callables import load_callable

    if backend == "torch" and params.torch_model is None:
        from ..accuracy.fake_quant import fake_quant_module

        if model is None:
            raise RecipeError("backend torch needs torch_model (a factory) or, as model, an nvfp4/mxfp8 quantize "
                              "node's model (its fake-quantized PyTorch model)", field="torch_model")
        module = fake_quant_module(model, ctx.load_callable)[0]
    elif backend == "torch" and params.torch_model is not None:
        module = load_callable(params.torch_model, ctx.resolve, "torch_model")()
    if backend == "torch":
        if params.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise StageSkipped("device cuda for backend torch but this PyTorch sees no CUDA device",
                                   needs="a CUDA build of PyTorch on a GPU machine, or device: cpu")
        return module
    if backend == "onnxruntime":
        from ..accuracy.recovery import runtime_options
        from ..runtimes.ort import create_session
        from .timing.calls import ort_providers

        assert model is not None
        providers = ort_providers(params.device)
        with ctx.native_step("onnxruntime", f"creating a session for {model.name}",
                             repro=f"python -c \"import onnxruntime as ort; ort.InferenceSession('{model}', "
                             f"providers={providers})\"",
                             hint="lower onnxruntime.graph_optimization_level or add the failing optimiser to "
                             "onnxruntime.disabled_optimizers"):
            return create_session(model, runtime_options(model, params.onnxruntime, ctx.log).options, providers)
    return None


def point_settings(params: Params, device: str) -> PointSettings:
    return PointSettings(params.window_plan(), params.warmup_ms, params.unstable_cv_percent, device,
                         params.spin_wait, params.use_cuda_graph, params.include_host_transfers)


def _open_reference(ctx: StageContext, params: Params, backend: str, specs: Sequence[InputSpec],
                    feed: Mapping[str, Any], planned: Any) -> Any:
    """The reference's call at the gate point, opened with the candidate's runtime and the reference's pinned
    settings (`measure.judging.reference.pinned_params`; a ``python:`` factory from the reference's copy of its
    file); raises what keeps it from running here."""
    from trtflow.callables import load_callable
    from trtflow.fsutil import project_root

    from ..formats.onnx_model import candidate_kind
    from .judging.reference import torch_factory
    from .timing.calls import torch_call

    reference = ctx.reference
    if reference is None:
        raise StageFailed("the gate's reference was not laid out for this node, so it cannot be paired with it",
                          hint="re-run the node; if it happens again, report it")
    model = reference.inputs.get("model")
    if backend == "torch" and model is None:
        spec = planned.params.get("torch_model") or params.torch_model
        copy = torch_factory(spec, reference, ctx.resolve, project_root(ctx.recipe_dir) or ctx.recipe_dir) \
            if spec else None
        if copy is None:
            raise RecipeError(f"the reference pins no copy of its model factory {spec!r}")
        module = load_callable(copy, Path, "reference torch_model")()
        return torch_call(module, specs, feed, params.device)
    kind = candidate_kind(model) if model is not None else None
    if kind is None or (backend == "onnxruntime") != (kind == "onnx") or backend == "torch":
        raise RecipeError(f"the reference is {'no model' if kind is None else 'an ' + kind}, which this node's "
                          f"backend {backend} does not time beside its candidate")
    from .judging.reference import pinned_params
    from .timing.calls import onnxruntime_call

    pinned, planned.settings = pinned_params(params, planned.params)
    session = open_host_model(ctx, pinned, backend, model)
    return onnxruntime_call(session, feed, pinned.device, pinned.include_host_transfers)[0]


def _pairings(ctx: StageContext, params: Params, backend: str, device: str, specs: Sequence[InputSpec],
              feeds: Sequence[tuple[int, Any, Any]], planned: Any) -> dict[int, Any]:
    """The gate point timed in pairs with the reference (`measure.timing.ab`), or nothing (``planned.why`` says why)."""
    from .judging.reference import gate_batch, pair_plan
    from .timing.ab import Pairing
    from .timing.fixed import host_timer

    if planned is None or planned.why is not None:
        return {}
    batches = [batch for batch, _, _ in feeds]
    batch = gate_batch(params, batches)
    if batch is None:
        planned.why = f"the gate point (batch {params.gate_batch_size}) is not among the measured {batches}"
        return {}
    index = batches.index(batch)
    try:
        with ctx.native_step(backend, f"opening the reference at batch {batch}"):
            call = _open_reference(ctx, params, backend, specs, feeds[index][2], planned)
    except (RecipeError, StageSkipped, StageFailed, OSError) as error:
        planned.why = f"the reference does not run here: {getattr(error, 'message', None) or error}"
        return {}
    settings = point_settings(params, device)
    plan = pair_plan(params, settings.plan.window_s, settings.plan.min_duration_s, ctx.gate_family, batch,
                     seed=params.ab_seed, cost_budget=params.gate_cost_budget)
    return {index: Pairing(plan, host_timer(call, settings, backend == "torch" and device == "cuda"))}


def _engine_reference(ctx: StageContext, params: Params, backend: str, feeds: Sequence[tuple[int, Any, Any]],
                      planned: Any, stack: ExitStack) -> tuple[Any, tuple[int, int] | None, Any, Any]:
    """The reference engine, opened inside ``stack``, the gate point (batch, streams) it is paired at, what makes
    its pairing and the reference's settings as pinned; (None, None, None, None) when it cannot be
    (``planned.why`` says why)."""
    from ..formats.onnx_model import candidate_kind
    from ..runtimes.candidate import open_candidate
    from .judging.reference import gate_batch, pair_plan, pinned_params
    from .timing.ab import Pairing

    if planned is None or planned.why is not None or ctx.reference is None:
        return None, None, None, None
    model = ctx.reference.inputs.get("model")
    if model is None or candidate_kind(model) != "engine":
        planned.why = "the reference is not an engine, which this node's backend times"
        return None, None, None, None
    batches = [batch for batch, _, _ in feeds]
    batch = gate_batch(params, batches)
    if batch is None:
        planned.why = f"the gate point (batch {params.gate_batch_size}) is not among the measured {batches}"
        return None, None, None, None
    try:
        reference = stack.enter_context(open_candidate(ctx, model, backend, slot="reference")).engine
    except (RecipeError, StageSkipped, StageFailed, OSError) as error:
        planned.why = f"the reference does not run here: {getattr(error, 'message', None) or error}"
        return None, None, None, None
    settings = point_settings(params, "cuda")
    streams = min(params.stream_counts)
    plan = pair_plan(params, settings.plan.window_s, settings.plan.min_duration_s, ctx.gate_family, batch, streams,
                     seed=params.ab_seed, cost_budget=params.gate_cost_budget)
    pinned, planned.settings = pinned_params(params, planned.params)
    return reference, (batch, streams), lambda window: Pairing(plan, window), point_settings(pinned, "cuda")


def fixed_points(ctx: StageContext, params: Params, backend: str, device: str, session: Any, host_model: Any,
                 specs: Sequence[InputSpec], base_shapes: Mapping[str, list[int]], planned: Any,
                 cuda_timer: Any) -> tuple[list, Any, Any, Any]:
    """Every fixed-batch point (batch sizes x streams), and the layer and kernel profiles where asked for. Engine
    points are timed one after another (each holds its contexts); host-timed ones take turns, a window each, the
    gate point in pairs with the reference when there is one (``planned``, `measure.judging.reference`). ``session``:
    the candidate's engine, active; else ``host_model``: an ONNX Runtime session or a PyTorch module. ``cuda_timer``
    makes the engine harness's timer (`measure.timing.cuda_timing.CudaTimer`)."""
    from .timing.calls import layer_profile, onnxruntime_call, torch_call
    from .timing.fixed import engine_point, host_points

    settings = point_settings(params, device)
    points: list[dict[str, Any]] = []
    layers = kernels = paired = None
    feeds = []
    batches: list[int | None] = [*params.batch_sizes] or [None]  # no sweep: the shapes as given
    for batch in batches:
        shapes = with_batch(base_shapes, batch)
        feeds.append((batch if batch is not None else batch_of(shapes), shapes, make_feed(specs, shapes, params,
                                                                                        ctx.resolve, ctx.log)))
    if session is not None:
        with ExitStack() as stack:
            reference, gate_at, pair, pinned = _engine_reference(ctx, params, backend, feeds, planned, stack)
            total = len(feeds) * len(params.stream_counts)
            for batch_size, shapes, feed in feeds:
                for streams in params.stream_counts:
                    paired_here = (batch_size, streams) == gate_at
                    ctx.progress(0.5 * len(points) / total if params.has_load else len(points) / total,
                                 f"batch {batch_size}, {streams} stream(s): timing on {backend}"
                                 + (" in A/B pairs with the reference" if paired_here else ""))
                    with ctx.native_step(backend, f"timing batch {batch_size} on {streams} stream(s)"):
                        report = engine_point(session, feed, batch_size, streams, settings, cuda_timer,
                                              reference if paired_here else None, pair if paired_here else None,
                                              pinned)
                    paired = report.pop("paired", paired)
                    points.append({"batch_size": batch_size, "streams": streams, "shapes": shapes,
                                   "runs_on": f"{backend} engine, {streams} stream(s)", "report": report})
    else:
        if backend == "onnxruntime":
            calls = [onnxruntime_call(host_model, feed, params.device, params.include_host_transfers)
                     for _, _, feed in feeds]
        else:
            calls = [(torch_call(host_model, specs, feed, params.device), f"torch {params.device}")
                     for _, _, feed in feeds]
        pairings = _pairings(ctx, params, backend, device, specs, feeds, planned)
        ctx.progress(0.0, f"batch {', '.join(str(b) for b, _, _ in feeds)}: timing on {backend}, in turns"
                     + (" (the gate point in A/B pairs with the reference)" if pairings else ""))
        with ctx.native_step(backend, f"timing batch {', '.join(str(b) for b, _, _ in feeds)}"), steady_interpreter():
            reports = host_points([call for call, _ in calls], [b for b, _, _ in feeds], settings,
                                  cuda_events=backend == "torch" and device == "cuda", pairings=pairings)
        paired = next((pairing.summary() for pairing in pairings.values()), None)
        points = [{"batch_size": batch_size, "streams": 1, "shapes": shapes, "runs_on": how, "report": report}
                  for (batch_size, shapes, _), (_, how), report in zip(feeds, calls, reports, strict=True)]
    for point in points:
        report, ci = point["report"], point["report"]["latency_ci_ms"]
        ctx.log.info("batch %d, %d stream(s): median %.4g ms [%.4g, %.4g], p99 %.4g ms, %.1f qps, %d queries in %d "
                     "windows%s, flags %s", point["batch_size"], point["streams"], report["latency_ms"]["median"],
                     *ci["p50"], report["latency_ms"]["p99"], report["throughput_qps"], report["queries"],
                     len(report["repeats"]),
                     "" if report["converged"] else f" (not converged: stopped at {report['stopped']})",
                     report["flags"])
    batch_size, _, feed = feeds[0]
    if params.profile_kernels:
        from .timing.kernel_profile import timed_call_kernels

        module_call = None if session is not None else torch_call(host_model, specs, feed, "cuda")
        with ctx.native_step(backend, f"recording CUDA kernels at batch {batch_size}"):
            kernels = dict(timed_call_kernels(session, module_call, feed, params.kernel_iterations, cuda_timer),
                           batch_size=batch_size)
    if params.profile_layers and session is not None:
        with ctx.native_step(backend, f"profiling layers at batch {batch_size}"):
            layers = dict(layer_profile(session, feed, params.profile_iterations, cuda_timer), batch_size=batch_size)
    return points, layers, kernels, paired
