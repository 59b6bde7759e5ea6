"""An example third-party stage, registered through the ``trtflow.stages`` entry-point group.

``synth`` writes a deterministic file derived from its parameters and (optionally) its input file. It is
cheap, so tests and benchmarks use it to build large pipelines; ``sleep`` makes it slow on purpose (to
interrupt it), and ``fail`` makes it fail (to test error handling).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from trtflow.stage import FILE, Input, Output, Stage, StageContext, StageFailed, StageParams


class Params(StageParams):
    text: str = Field(default="", description="Text mixed into the output.")
    size: int = Field(default=1024, ge=0, le=1 << 30, description="Size of the output file in bytes.")
    sleep: float = Field(default=0.0, ge=0, description="Seconds to sleep before writing (to simulate work).")
    fail: bool = Field(default=False, description="Fail on purpose, after sleeping.")


def run(ctx: StageContext, inputs: dict[str, Path], params: Params) -> dict[str, Any]:
    seed = hashlib.sha256(params.text.encode())
    if "source" in inputs:
        seed.update(inputs["source"].read_bytes())
    if params.sleep:
        ctx.progress(0.0, f"sleeping {params.sleep}s")
        time.sleep(params.sleep)
    if params.fail:
        raise StageFailed("failing on purpose (fail: true)", hint="set fail: false")
    block = seed.digest()
    with open(ctx.output("data"), "wb") as f:
        written = 0
        counter = 0
        while written < params.size:
            chunk = hashlib.sha256(block + counter.to_bytes(8, "little")).digest() * 128
            chunk = chunk[: params.size - written]
            f.write(chunk)
            written += len(chunk)
            counter += 1
    return {"bytes": params.size, "seed": seed.hexdigest()[:16]}


stage = Stage(
    name="synth",
    version="1",
    description="Write a deterministic synthetic file (example plugin stage).",
    params=Params,
    run=run,
    inputs={"source": Input(FILE, "Optional file mixed into the output.", optional=True)},
    outputs={"data": Output(FILE, "data.bin", "The synthetic file.")},
)
