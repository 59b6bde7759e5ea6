"""Runs one stage in its own process: ``python -m trtflow.worker JOB.json``.

The runner starts one worker per node so that a stage that hangs, crashes, leaks memory or calls
``os._exit`` cannot damage the run; the worker writes ``result.json`` and the runner commits outputs.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import traceback
from pathlib import Path


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to kill this process if the runner dies (e.g. kill -9), so no orphan keeps working."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except OSError:
        return
    if os.getppid() != parent_pid:
        os._exit(1)


def _write_result(path: Path, result: dict) -> None:
    from trtflow.fsutil import atomic_write_text

    atomic_write_text(path, json.dumps(result, default=str))


def main(job_file: str) -> int:
    job = json.loads(Path(job_file).read_text(encoding="utf-8"))
    _die_with_parent(job["parent_pid"])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger(f"trtflow.node.{job['node']}")
    result_path = Path(job["result_file"])

    from trtflow.errors import GateFailed, StageSkipped, TrtflowError
    from trtflow.registry import get_stage
    from trtflow.stage import StageContext

    try:
        stage = get_stage(job["stage"])
        params = stage.params.model_validate(job["params"])
        ctx = StageContext(
            node=job["node"], scratch=Path(job["scratch"]), recipe_dir=Path(job["recipe_dir"]),
            outputs=stage.outputs, cache_dir=Path(job["cache_dir"]), facts=job["facts"], gpu=job.get("gpu"),
            allowed_roots=[Path(p) for p in job["allowed_roots"]], logger=log,
            progress_file=Path(job["progress_file"]), previous_summary=job.get("previous_summary"),
            input_sources=job.get("input_sources"),
        )
        signal.signal(signal.SIGTERM, lambda *_: (ctx.cancel(), sys.exit(143)))
        log.info("stage %s %s starting; params %s", stage.name, stage.version, json.dumps(job["params"]))
        inputs = {slot: [Path(each) for each in p] if isinstance(p, list) else Path(p)
                  for slot, p in job["inputs"].items()}
        summary = stage.run(ctx, inputs, params) or {}
        result = {"status": "ok", "summary": dict(summary)}
    except StageSkipped as exc:
        log.warning("skipped: %s", exc.reason)
        result = {"status": "skipped", "error": exc.reason, "hint": exc.needs}
    except GateFailed as exc:
        log.error("gate failed: %s", exc.message)
        result = {"status": "gate_failed", "error": exc.message, "hint": exc.hint, "summary": exc.metrics}
    except TrtflowError as exc:
        log.error("%s", exc)
        result = {"status": "failed", "error": exc.message, "hint": exc.hint}
    except KeyboardInterrupt:
        result = {"status": "interrupted", "error": "interrupted"}
    except BaseException as exc:
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            exc = RuntimeError("stage called sys.exit()")
        log.error("stage raised:\n%s", traceback.format_exc())
        result = {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "traceback": True}
    if result["status"] != "ok":
        # Partial outputs are discarded anyway; removing them first frees the space a full disk needs to
        # record why the stage failed.
        import shutil

        shutil.rmtree(Path(job["scratch"]) / "out", ignore_errors=True)
    _write_result(result_path, result)
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
