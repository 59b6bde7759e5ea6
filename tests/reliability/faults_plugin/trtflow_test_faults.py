"""A stage that misbehaves on purpose, registered as a real plugin (``trtflow.stages`` entry point).

It stands for any third-party or built-in stage that raises an unexpected exception, exits the process,
crashes with a signal, hangs, or leaves a half-written output behind. Each mode first writes part of its
output, so the tests can check that the runner discards partial outputs; ``forget`` ends well without writing
its output at all (a result that must not be committed).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from trtflow.stage import FILE, Input, Output, Stage, StageContext, StageParams

Mode = Literal["ok", "raise", "exit", "sys_exit_0", "segfault", "hang", "fill", "kill_parent_once", "forget"]


class Params(StageParams):
    mode: Mode = Field(default="ok", description="How the stage behaves after writing half of its output.")
    size: int = Field(default=4096, ge=2, description="Bytes of the complete output.")
    text: str = Field(default="", description="Text mixed into the output (makes distinct node keys).")
    marker: str = Field(default="", description="kill_parent_once: a file whose absence means 'first attempt'.")


def run(ctx: StageContext, inputs: dict[str, Path], params: Params) -> dict[str, Any]:
    if params.mode == "forget":  # ends well without writing its (required) output
        return {"bytes": 0}
    seed = (params.text.encode() or b"x") + (inputs["source"].read_bytes()[:64] if "source" in inputs else b"")
    data = (seed * (params.size // len(seed) + 1))[: params.size]
    target = ctx.output("data")
    with open(target, "wb") as f:
        f.write(data[: params.size // 2])
        f.flush()
        if params.mode == "raise":
            raise RuntimeError("faulty stage raised on purpose")
        if params.mode == "exit":
            os._exit(7)
        if params.mode == "sys_exit_0":
            sys.exit(0)
        if params.mode == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        if params.mode == "kill_parent_once" and not os.path.exists(params.marker):
            # stands for a worker machine or process that dies mid-node: the process that runs this stage's
            # process (a Ray worker) is killed on the first attempt only
            Path(params.marker).write_text("first attempt killed its worker")
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(60)
        if params.mode == "hang":
            ctx.log.info("hanging on purpose")
            time.sleep(3600)
        if params.mode == "fill":
            chunk = b"\0" * (1 << 20)
            while True:  # until the disk is full: the OSError escapes as an unexpected error
                f.write(chunk)
                f.flush()
        f.write(data[params.size // 2:])
    return {"bytes": params.size}


stage = Stage(
    name="faulty",
    version="1",
    description="Misbehaves on purpose (tests of crash handling).",
    params=Params,
    run=run,
    inputs={"source": Input(FILE, "Optional file mixed into the output.", optional=True)},
    outputs={"data": Output(FILE, "data.bin", "Deterministic bytes.")},
)
