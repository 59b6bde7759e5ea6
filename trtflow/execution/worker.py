"""Runs one stage for one job, inside the process the executor gave it (a forked child, or this process).

Writes ``result.json`` (atomically, fsynced) before returning, so the runner learns how the stage ended even if
the process is then torn down with ``os._exit``. For a node with ``python:`` code, the result also lists the
project modules the run imported (`trtflow.depfile`): the node's key is made with them. faulthandler is on: a
native crash (segfault, abort) prints the Python stack at the crash into the node's log, which the runner quotes in
its diagnosis.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtflow.execution.protocol import FAILED, GATE_FAILED, INTERRUPTED, OK, SKIPPED, Job


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to kill this process if its parent dies (kill -9 of trtflow), so no orphan keeps working."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except OSError:
        return
    if parent_pid and os.getppid() != parent_pid:
        os._exit(1)


def write_result(job: Job, result: dict[str, Any]) -> None:
    job.scratch_tree().write_text("result.json", json.dumps(result, default=str))


def run_job(job: Job, get_stage: Callable[[str], Any] | None = None, log: logging.Logger | None = None
            ) -> dict[str, Any]:
    """Run the job's stage and return its result record ({status, summary, error, hint}). A node with python:
    code runs in a child process whose every read is observed (`trtflow.readtrace`), with only the environment
    `depfile.code_environment` shows it; what it read is keyed (`depfile.add_reads`)."""
    from trtflow.callables import code_references

    if not code_references(job.params):
        return _run_job(job, get_stage, log)
    from trtflow import depfile, readtrace

    named = depfile.named_in(job.params)
    # values from this process's environment: a local worker's is the runner's (a secret passed to the code is
    # never written into the job); a worker elsewhere keys its own values, and the planner's differ: rebuilt
    code_env = depfile.code_environment(named=named)
    try:
        result, reads = readtrace.observed(lambda: _run_job(job, get_stage, log), _observable,
                                           depfile.run_environment(code_env))
    except KeyboardInterrupt:
        return {"status": INTERRUPTED, "error": "interrupted"}
    if result.get("status") == OK:
        deps = depfile.Deps.from_json(result.get("deps"))
        if deps is not None:
            depfile.add_reads(deps, reads, environ=code_env, named=named)
            result["deps"] = deps.as_json()
    return result


def _observable(path: str) -> bool:
    """Paths worth a look (the kernel's own file systems never hold a project)."""
    return not path.startswith(("/proc/", "/sys/"))


def _run_job(job: Job, get_stage: Callable[[str], Any] | None = None, log: logging.Logger | None = None
             ) -> dict[str, Any]:
    from trtflow import depfile
    from trtflow.callables import code_references
    from trtflow.errors import GateFailed, StageSkipped, TrtflowError
    from trtflow.params import validated_params
    from trtflow.stage import Reference, StageContext

    if get_stage is None:
        from trtflow.registry import get_stage as registered

        get_stage = registered
    log = log or logging.getLogger(f"trtflow.node.{job.node}")
    try:
        stage = get_stage(job.stage)
        params = validated_params(stage.params, job.params)
        ctx = StageContext(
            node=job.node, scratch=Path(job.scratch), recipe_dir=Path(job.recipe_dir), outputs=stage.outputs,
            scratch_tree=job.held.scratch if job.held is not None else None,
            cache_dir=Path(job.cache_dir), facts=job.facts, gpu=job.gpu,
            allowed_roots=[Path(p) for p in job.allowed_roots], logger=log, progress_file=job.progress_file,
            previous_summary=job.previous_summary, input_sources=job.input_sources, ran_alone=job.ran_alone,
            reference=Reference.from_json(job.reference), gate_family=job.gate_family,
        )
        log.info("stage %s %s starting; params %s", stage.name, stage.version, json.dumps(job.params))
        inputs = {slot: [Path(each) for each in p] if isinstance(p, list) else Path(p)
                  for slot, p in job.inputs.items()}
        recorded = None
        if code_references(job.params):
            with depfile.recording(_code_roots(job), [*_not_project_code(stage), _store_of(job)]) as recorded:
                summary = stage.run(ctx, inputs, params) or {}
        else:
            summary = stage.run(ctx, inputs, params) or {}
        result: dict[str, Any] = {"status": OK, "summary": dict(summary)}
        if recorded is not None:
            result["deps"] = recorded.with_places()
    except StageSkipped as exc:
        log.warning("skipped: %s", exc.reason)
        result = {"status": SKIPPED, "error": exc.reason, "hint": exc.needs}
    except GateFailed as exc:
        log.error("gate failed: %s", exc.message)
        result = {"status": GATE_FAILED, "error": exc.message, "hint": exc.hint, "summary": exc.metrics}
    except TrtflowError as exc:
        log.error("%s", exc)
        result = {"status": FAILED, "error": exc.message, "hint": exc.hint, "error_code": exc.exit_code}
    except KeyboardInterrupt:
        result = {"status": INTERRUPTED, "error": "interrupted"}
    except BaseException as exc:
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            exc = RuntimeError("stage called sys.exit()")
        log.error("stage raised:\n%s", traceback.format_exc())
        result = {"status": FAILED, "error": f"{type(exc).__name__}: {exc}", "traceback": True}
    if result["status"] != OK:
        # Partial outputs are discarded anyway; removing them first frees the space a full disk needs to
        # record why the stage failed.
        try:
            job.scratch_tree().remove_tree("out")
        except OSError:
            pass
    return result


def _code_roots(job: Job) -> list[str]:
    """Where the project modules of a node's python: code live: the recipe's project and the allowed folders."""
    if job.allowed_roots:
        return list(job.allowed_roots)
    from trtflow.fsutil import project_root

    return [str(project_root(job.recipe_dir) or job.recipe_dir)]


def _not_project_code(stage: Any) -> list[str]:
    """trtflow's own package and the stage's package: keyed as the stage's code, never as the project's."""
    import trtflow

    folders = [os.path.dirname(trtflow.__file__)]
    top = sys.modules.get(stage.run.__module__.split(".")[0])
    file = getattr(top, "__file__", None)
    if file:
        folders.append(os.path.dirname(file) if os.path.basename(file).startswith("__init__.") else file)
    return folders


def _store_of(job: Job) -> str:
    """The store the job's scratch, logs and caches live in: trtflow's files, never the project's."""
    return os.path.dirname(os.path.abspath(job.cache_dir))


def main(scratch_fd: int) -> int:
    """Entry point of a node process: run the job in ``job.json`` of the scratch folder held as ``scratch_fd`` (the
    descriptor the runner made it with, inherited or passed over a socket); exit code 0 when the stage
    succeeded. The folder is reached only through that descriptor (`Job.in_folder`)."""
    from trtflow.storage import records
    from trtflow.storage.confined.tree import Tree

    os.set_inheritable(scratch_fd, False)  # a program the stage starts gets no descriptor of the store
    scratch = Tree.of_fd(scratch_fd, Path(f"/proc/self/fd/{scratch_fd}"))
    job = Job.from_json(records.read(scratch, "job.json", records.JOB))
    scratch.path = Path(job.scratch)  # shown in messages
    job = job.in_folder(scratch)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger(f"trtflow.node.{job.node}")

    def cancel(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, cancel)
    signal.signal(signal.SIGINT, cancel)
    result = run_job(job, log=log)
    try:
        write_result(job, result)
    except OSError as exc:
        print(f"trtflow: could not write the node's result: {exc}", file=sys.stderr)
        return 2
    return 0 if result["status"] == OK else 1


def exit_now(code: int) -> None:
    """Leave without interpreter shutdown (0.4-1.5 s with torch loaded): the result is already durable."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    exit_now(main(int(sys.argv[1])))
