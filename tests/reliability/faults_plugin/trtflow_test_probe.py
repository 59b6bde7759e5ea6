"""Test stages registered as a real plugin (``trtflow.stages``).

``probe`` asks for ``gpus`` GPUs and returns, in its summary and its output file, the ``CUDA_VISIBLE_DEVICES`` its
process got and the devices `trtflow.environment.gpus()` lists there: what a multi-GPU stage (a benchmark serving
from every GPU it is given) would see; and whether Python's cyclic collector is on in its process, and how many
objects it was forked with frozen (the fork server's start-up, `trtflow.execution.forkserver`).
``copy`` reads a data file or folder that its parameters name, and appends what a ``python:`` callable returns: a
stage whose key depends on project files and code.
``hold`` runs until a file it names appears (a test makes it once it has seen what it waits for), then writes its
output: a node that stays running for as long as a test needs, however slow the machine, without a fixed sleep.
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from typing import Any

from pydantic import Field

from trtflow.stage import FILE, CodeReference, Output, Resources, Stage, StageContext, StageParams


class Params(StageParams):
    gpus: int = Field(default=1, ge=0, description="GPUs the node asks for.")


def run(ctx: StageContext, inputs: dict[str, Path], params: Params) -> dict[str, Any]:
    from trtflow.environment import gpus

    seen = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "devices": [g.visible_id for g in gpus()], "ctx_gpu": ctx.gpu,
            "gc_enabled": gc.isenabled(), "gc_frozen": gc.get_freeze_count()}
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


class CopyParams(StageParams):
    path: str = Field(description="A data file or folder, relative to the recipe.")
    make: CodeReference | None = Field(default=None, description="A python: callable whose result is appended.")


def copy(ctx: StageContext, inputs: dict[str, Path], params: CopyParams) -> dict[str, Any]:
    source = ctx.resolve(params.path)
    if source.is_dir():
        data = b"".join(p.read_bytes() for p in sorted(source.rglob("*")) if p.is_file())
    else:
        data = source.read_bytes()
    if params.make:
        data += str(ctx.load_callable(params.make)()).encode()
    ctx.output("data").write_bytes(data)
    return {"bytes": len(data)}


copy_stage = Stage(
    name="copy",
    version="1",
    description="Copies a data file or folder the recipe names (tests of file-dependent keys).",
    params=CopyParams,
    run=copy,
    outputs={"data": Output(FILE, "data.bin", "The copied bytes.")},
    files=lambda p: [p.path],
    environment=("python",),
)


class HoldParams(StageParams):
    until: str = Field(description="An absolute path: the node runs until a file appears there.")
    limit_s: float = Field(default=300.0, gt=0, description="Fail after this long without the file.")


def hold(ctx: StageContext, inputs: dict[str, Path], params: HoldParams) -> dict[str, Any]:
    import time

    from trtflow.stage import StageFailed

    deadline = time.monotonic() + params.limit_s
    while not os.path.exists(params.until):
        if time.monotonic() > deadline:
            raise StageFailed(f"{params.until} did not appear in {params.limit_s} s")
        time.sleep(0.02)
    ctx.output("data").write_bytes(b"held")
    return {"held": True}


hold_stage = Stage(
    name="hold",
    version="1",
    description="Runs until a file appears (tests that need a node running while something else happens).",
    params=HoldParams,
    run=hold,
    outputs={"data": Output(FILE, "data.bin", "Four bytes.")},
    environment=(),
)
