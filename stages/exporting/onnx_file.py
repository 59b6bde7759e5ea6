"""An ONNX file as the model: copied, checked with onnx.checker, loaded and run in ONNX Runtime at each profile's
min and max."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from trtflow.stage import (
    RecipeMismatch,
    StageContext,
    StageFailed,
)

from ..formats.torch_check import (
    ort_error,
)
from .params import ExportParams


def checker(path: Path) -> None:
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:
        raise StageFailed(f"the ONNX model does not pass onnx.checker: {str(exc)[:500]}") from exc


def _check_onnx_file(ctx: StageContext, params: ExportParams, path: Path) -> dict[str, Any]:
    checker(path)
    if not params.check:
        return {"checked": False}
    from ..accuracy.model_problems import ort_session_step
    from ..accuracy.recovery import recover
    from ..runtimes.ort import create_session

    found = recover(path, log=ctx.log)  # a crash in a child: settings that run (accuracy.recovery)
    try:
        with ort_session_step(ctx, path, options=found.options):
            session = create_session(path, found.options)
    except Exception as exc:
        raise StageFailed(f"ONNX Runtime cannot load the model: {str(exc)[:500]}") from exc
    summary: dict[str, Any] = {"checked": "loads in ONNX Runtime"}
    if params.profiles:
        summary["checked"] = "loads and runs in ONNX Runtime at the profiles' min and max"
        summary["checked_shapes"] = _run_at_profiles(ctx, params, path, session)
    if found.recovered:
        summary.update(runtime_settings=found.record(), notes=[found.note()])
    return summary


def _run_at_profiles(ctx: StageContext, params: ExportParams, path: Path, session: Any) -> list[dict[str, Any]]:
    """Run an ONNX file at each profile's min and max (random values; integers 0 or 1): a profile the model cannot
    run fails here, not in a build or a Triton server."""
    import numpy as np

    from ..accuracy.model_problems import ort_run_step
    from ..formats.onnx_model import inspect_model
    from ..runtimes.profiles import check_profiles

    check_profiles(params.profiles, inspect_model(path).inputs)
    types = {i.name: i.type for i in session.get_inputs()}
    rng = np.random.default_rng(params.seed)
    checked = []
    for profile in params.profiles:
        for pick in ("min", "max"):
            shapes = {name: list(getattr(shape, pick)) for name, shape in profile.shapes.items()}
            feed = {}
            for name, kind in types.items():
                shape = shapes.get(name)
                if shape is None:
                    continue
                if "int" in kind:
                    feed[name] = rng.integers(0, 2, size=shape).astype("int32" if "int32" in kind else "int64")
                elif "bool" in kind:
                    feed[name] = rng.random(shape) > 0.5
                else:
                    feed[name] = rng.random(shape).astype("float16" if "float16" in kind else "float32")
            label = f"profile {profile.name!r} {pick} ({', '.join(f'{n} {s}' for n, s in shapes.items())})"
            try:
                with ort_run_step(ctx, path, feed, what=f"running the model at {label}"):
                    session.run(None, feed)
            except Exception as error:  # ONNX Runtime raises its own types
                detail, _ = ort_error(error)
                raise RecipeMismatch(f"the model cannot run at {label}, which the recipe declares: {detail}",
                                     hint=f"give profile {profile.name!r} sizes the model takes") from None
            checked.append({"profile": profile.name, "at": pick, "shapes": shapes, "status": "ok"})
    return checked


def copy_onnx(ctx: StageContext, params: ExportParams, source: Path, target: Path) -> dict[str, Any]:
    shutil.copyfile(source, target)
    try:
        import onnx

        onnx.load(str(target), load_external_data=False)
    except Exception as exc:
        raise StageFailed(f"{params.model!r} is not a loadable ONNX file: {str(exc)[:300]}",
                          hint="re-export it; the file may be truncated or not ONNX at all") from exc
    return _check_onnx_file(ctx, params, target)
