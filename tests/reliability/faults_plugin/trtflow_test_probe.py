"""A stage that reports which GPUs its process was given, registered as a real plugin (``trtflow.stages``).

It asks for ``gpus`` GPUs and returns, in its summary and its output file, the ``CUDA_VISIBLE_DEVICES`` its
process got and the devices `trtflow.environment.gpus()` lists there: what a multi-GPU stage (a benchmark serving
from every GPU it is given) would see.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import Field

from trtflow.stage import FILE, Output, Resources, Stage, StageContext, StageParams


class Params(StageParams):
    gpus: int = Field(default=1, ge=0, description="GPUs the node asks for.")


def run(ctx: StageContext, inputs: dict[str, Path], params: Params) -> dict[str, Any]:
    from trtflow.environment import gpus

    seen = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "devices": [g.visible_id for g in gpus()], "ctx_gpu": ctx.gpu}
    ctx.output("devices").write_text(json.dumps(seen))
    return seen


stage = Stage(
    name="probe",
    version="1",
    description="Reports the GPUs its process sees (tests of GPU placement).",
    params=Params,
    run=run,
    outputs={"devices": Output(FILE, "devices.json", "What the process saw.")},
    resources=lambda p: Resources(cpu=1.0, gpu=p.gpus),
    environment=(),
)
