"""The export of a saved model that runs code of its own, in a child process the kernel confines
(`formats.confinement`): what the child does, and what of its answer the node takes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trtflow.params import validated_params
from trtflow.stage import (
    Output,
    StageContext,
    StageFailed,
)

from .onnx_file import checker
from .params import ExportParams
from .saved_models import export_saved_torch

#: What the confined child may add to the summary, with its type (it runs the model's code, so nothing else is
#: taken from it, and nothing of another type).
_CHILD_SUMMARY: dict[str, type | tuple[type, ...]] = {
    "exporter": str, "inputs_bound_by": str, "warnings": list, "checked": (bool, str), "checked_at": list,
    "checked_shapes": list, "max_abs_diff_vs_torch": (int, float), "not_checked_because": str,
    "task": str, "model_type": str, "part": str}


_CHILD_EXTRA = ("task", "model_type", "part")


def export_confined(ctx: StageContext, params: ExportParams, fmt: str, source: Path, target: Path,
                    extra: dict[str, Any], export_in_child: str) -> dict[str, Any]:
    """`export_saved_torch` in a child process the kernel confines (formats.confinement) that runs
    ``export_in_child`` (the stage's function, as module:function): this process never loads the model; it takes the
    ONNX file and the summary the child made."""
    from ..formats import confinement

    box = ctx.scratch / "confined"
    ctx.progress(0.05, "exporting in a confined child process")
    request = {"node": ctx.node, "params": params.model_dump(mode="json"), "format": fmt,
               "source": str(source.absolute())}
    answer = confinement.run(export_in_child, request, box, [source], log=ctx.log,
                             what=f"exporting {params.model} (in a confined child process)",
                             take={_CHILD_MODEL: target})
    checker(target)
    answer = confinement.checked(answer, {"check": dict, "extra": dict}, f"exporting {params.model}")
    parts = {**answer["extra"], **answer["check"]}
    taken = {k: v for k, v in parts.items() if k in _CHILD_SUMMARY and isinstance(v, _CHILD_SUMMARY[k])}
    if "checked" not in taken:
        raise StageFailed(f"exporting {params.model}: the confined child answered without saying what it checked",
                          hint="the model's code may have tampered with the conversion; see the node's log")
    extra.update({k: v for k, v in taken.items() if k in _CHILD_EXTRA})
    return {k: v for k, v in taken.items() if k not in _CHILD_EXTRA}


_CHILD_MODEL = "work/out/model.onnx"


def in_child(request: dict[str, Any], params_type: type[ExportParams], outputs: Mapping[str, Output]
             ) -> dict[str, Any]:
    """In the confined child (formats.confinement.child_main): load, export and check the saved model in the
    working folder, as the node's process does for a trusted one (``params_type``: the stage's params, ``outputs``
    its outputs); the summary parts."""
    import logging
    import sys

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    box = Path.cwd()
    ctx = StageContext(node=request["node"], scratch=box / "work", recipe_dir=box, outputs=outputs,
                       cache_dir=box / "cache", logger=logging.getLogger(f"trtflow.node.{request['node']}"))
    params = validated_params(params_type, request["params"])
    extra: dict[str, Any] = {}
    target = ctx.output("model")
    assert target == box / _CHILD_MODEL
    check = export_saved_torch(ctx, params, request["format"], Path(request["source"]), target, extra)
    return {"check": check, "extra": extra}
