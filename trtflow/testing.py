"""Run one stage in-process on real files: for stage authors' tests and for debugging a stage."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.environment import Environment
from trtflow.params import validated_params, written_out
from trtflow.stage import Reference, Stage, StageContext


@dataclass
class StageRun:
    outputs: dict[str, Path]
    summary: dict[str, Any]
    context: StageContext


def run_stage(
    stage: Stage,
    params: Mapping[str, Any],
    inputs: Mapping[str, Path] | None = None,
    workdir: Path | None = None,
    recipe_dir: Path | None = None,
    facts: Mapping[str, str] | None = None,
    reference: Reference | None = None,
    gate_family: int = 1,
) -> StageRun:
    """Validate ``params``, run ``stage`` in this process and return its output paths and summary. ``reference``:
    what the node measures beside its candidate (`StageContext.reference`), as the engine would lay it out.

    Exceptions from the stage propagate unchanged, so tests can assert on them.
    """
    import tempfile

    workdir = Path(workdir or tempfile.mkdtemp(prefix="trtflow-stage-"))
    recipe_dir = Path(recipe_dir or workdir)
    # as a node's process reads them: written out in full and read back (trtflow.params), not as the test wrote them
    validated = written_out(stage.name, validated_params(stage.params, params))[1]
    env = Environment(dict(facts or {}))
    ctx = StageContext(
        node=stage.name,
        scratch=workdir / "scratch",
        recipe_dir=recipe_dir,
        outputs=stage.outputs,
        cache_dir=workdir / "caches",
        facts=env.facts(stage.environment_for(validated)),
        allowed_roots=[recipe_dir, workdir, Path.cwd()],
        logger=logging.getLogger(f"trtflow.test.{stage.name}"),
        reference=reference, gate_family=gate_family,
    )
    if stage.check is not None:
        stage.check(validated)
    summary = stage.run(ctx, {k: Path(v) for k, v in (inputs or {}).items()}, validated) or {}
    json.dumps(summary)  # a summary must be JSON-serialisable
    outputs = {name: ctx.output(name) for name in stage.outputs if ctx.output(name).exists()}
    missing = [n for n, o in stage.outputs.items() if not o.optional and n not in outputs]
    if missing:
        raise AssertionError(f"stage {stage.name!r} did not write declared outputs {missing}")
    return StageRun(outputs=outputs, summary=dict(summary), context=ctx)
