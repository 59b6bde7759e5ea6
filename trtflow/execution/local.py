"""The local executor: one process per node on this machine, forked from a warm server (or started afresh).

The process runs in its own session (its whole process group is signalled on timeout or Ctrl-C), with the
node's log as stdout/stderr and, for a GPU node, ``CUDA_VISIBLE_DEVICES`` naming its device alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from trtflow.execution import diagnosis
from trtflow.execution.forkserver import WORKER_BOOTSTRAP, ForkServerClient, ServerGone, isolated_python
from trtflow.execution.protocol import (
    CRASHED,
    FAILED,
    GATE_FAILED,
    INTERRUPTED,
    OK,
    SKIPPED,
    TIMED_OUT,
    Job,
    Outcome,
)
from trtflow.settings import node_environment
from trtflow.storage import records
from trtflow.storage.confined.folders import RunFolders
from trtflow.storage.confined.tree import locate

POLL_S = 0.1


class LocalExecutor:
    name = "local"

    def __init__(self, store_root: Path, kill_grace: float = 5.0, use_fork_server: bool | None = None,
                 server_log: Path | None = None) -> None:
        self.store_root = store_root
        self.server_log = server_log or store_root / "logs" / "fork-server.log"
        # the run's folders, held (`use_folders`); its log folder is made on first use, in `start`: under the store
        # lock the run holds (made before it, gc could remove it as an old run's logs while the run waits for it)
        self.folders: RunFolders | None = None
        self.kill_grace = kill_grace
        if use_fork_server is None:
            use_fork_server = sys.platform.startswith("linux") and not os.environ.get("TRTFLOW_NO_FORK_SERVER")
        self.use_fork_server = use_fork_server
        self._server: ForkServerClient | None = None
        self._server_log: Any = None
        self._pids: dict[str, int] = {}
        self._lock = threading.Lock()
        self._interrupted = threading.Event()

    def use_folders(self, folders: RunFolders) -> None:
        """The run's folders, held by the runner: the fork server's log goes in its log folder."""
        self.folders = folders

    def start(self) -> None:
        if self.use_fork_server and self._server is None:
            if self.folders is not None:
                fd = self.folders.logs.open_append_fd(self.server_log.name)
            else:
                tree, rel = locate(self.server_log, self.store_root)
                fd = tree.open_append_fd(rel)
            self._server_log = os.fdopen(fd, "ab")  # kept open while the server runs
            self._server = ForkServerClient(stderr=self._server_log)

    def pid_of(self, node: str) -> int | None:
        return self._pids.get(node)

    def prefetch(self, modules: list[str]) -> None:
        """The modules the run's nodes will preload, in the order they are needed: the fork server imports them
        while idle (`forkserver` protocol), instead of in front of each node's start."""
        if self._server is not None and self._server.alive and modules:
            self._server.prefetch(modules)

    def execute(self, job: Job, cancel: threading.Event) -> Outcome:
        if job.held is None:
            return Outcome(FAILED, error="a node's scratch folder was not handed to the local executor",
                           hint="make jobs with the runner (`Builder`), which holds the node's folders")
        job.held.scratch.write_text("job.json", json.dumps(job.to_json()))
        env: dict[str, str | None] = {"PYTHONUNBUFFERED": "1"}
        if job.device:
            env["CUDA_VISIBLE_DEVICES"] = job.device
        oom_before = diagnosis.oom_kills()
        started = time.monotonic()
        handle = self._start(job, env)
        with self._lock:
            self._pids[job.node] = handle.pid
        killed_by_us = False
        timed_out = False
        try:
            while not handle.wait(POLL_S):
                if cancel.is_set() or self._interrupted.is_set():
                    killed_by_us = True
                    self._stop(handle)
                elif job.timeout is not None and time.monotonic() - started > job.timeout:
                    killed_by_us = timed_out = True
                    self._stop(handle)
        finally:
            with self._lock:
                self._pids.pop(job.node, None)
        if cancel.is_set() or self._interrupted.is_set():
            return Outcome(INTERRUPTED, error="interrupted", peak_rss=handle.maxrss)
        if timed_out:
            return Outcome(TIMED_OUT, error=f"timed out after {job.timeout:g} s (the recipe's timeout for this node)",
                           hint="raise the node's `timeout:` if it is just slow", peak_rss=handle.maxrss)
        result = _read_result(job)
        if result is None:
            return diagnosis.diagnose(handle.exit_code, killed_by_us, handle.maxrss, oom_before, job.held.scratch,
                                      job.held.log_fd, self.store_root)
        status = result.get("status")
        if status not in (OK, FAILED, GATE_FAILED, SKIPPED, INTERRUPTED):
            status = CRASHED
        return Outcome(status, summary=result.get("summary") or {}, error=result.get("error"),
                       hint=result.get("hint"), exit_code=handle.exit_code, peak_rss=handle.maxrss,
                       error_code=result.get("error_code"), deps=result.get("deps"))

    def _start(self, job: Job, env: dict[str, str | None]) -> _Handle:
        assert job.held is not None
        scratch_fd = job.held.scratch.fd()
        if self._server is not None and self._server.alive:
            try:
                child = self._server.spawn(scratch_fd, job.held.log_fd, env, job.preload, job.stage,
                                           alone=job.ran_alone)
                return _ServerHandle(child)
            except ServerGone:
                pass
        full_env: dict[str, str] = node_environment()  # no signing key, no setting that is not a node's
        for name, value in env.items():
            if value is None:
                full_env.pop(name, None)
            else:
                full_env[name] = value
        proc = subprocess.Popen([*isolated_python(WORKER_BOOTSTRAP), str(scratch_fd)], stdout=job.held.log_fd,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env,
                                start_new_session=True, pass_fds=(scratch_fd,))
        return _ProcessHandle(proc)

    def _stop(self, handle: _Handle) -> None:
        _signal_group(handle.pid, signal.SIGTERM)
        if not handle.wait(self.kill_grace):
            _signal_group(handle.pid, signal.SIGKILL)
            handle.wait(None)

    def interrupt(self) -> None:
        self._interrupted.set()
        with self._lock:
            pids = list(self._pids.values())
        for pid in pids:
            _signal_group(pid, signal.SIGTERM)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._server_log is not None:
            self._server_log.close()
            self._server_log = None


class _Handle:
    pid: int
    exit_code: int | None = None
    maxrss: int | None = None

    def wait(self, timeout: float | None) -> bool:
        raise NotImplementedError


class _ServerHandle(_Handle):
    def __init__(self, child: Any) -> None:
        self.child = child
        self.pid = child.pid

    def wait(self, timeout: float | None) -> bool:
        if not self.child.exited.wait(timeout):
            return False
        self.exit_code = self.child.exit_code
        # the node's own memory: what it reached beyond the pages it shares with the server it was forked from
        if self.child.maxrss is not None:
            self.maxrss = max(0, self.child.maxrss - self.child.base_rss)
        return True


class _ProcessHandle(_Handle):
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.pid = proc.pid

    def wait(self, timeout: float | None) -> bool:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        self.exit_code = self.proc.returncode
        return True


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _read_result(job: Job) -> dict[str, Any] | None:
    try:
        data = records.read(job.scratch_tree(), job.result_file.name, records.JOB)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class InlineExecutor:
    """Runs stages in this process, one thread per node: for debugging (breakpoints work) and for tests of stages
    that are not installed. No isolation: a crash or a hang in a stage takes the run with it."""

    name = "inline"

    def __init__(self, stages: Any = None) -> None:
        self.stages = stages

    def start(self) -> None:
        return None

    def pid_of(self, node: str) -> int | None:
        return None

    def execute(self, job: Job, cancel: threading.Event) -> Outcome:
        from trtflow.execution.worker import run_job, write_result

        get_stage = self.stages.__getitem__ if self.stages is not None else None
        if job.held is not None:  # this process holds the scratch folder: the stage reaches it through that
            job = job.in_folder(job.held.scratch)
        result = run_job(job, get_stage)
        write_result(job, result)
        return Outcome(result["status"], summary=result.get("summary") or {}, error=result.get("error"),
                       hint=result.get("hint"), error_code=result.get("error_code"), deps=result.get("deps"))

    def interrupt(self) -> None:
        return None

    def close(self) -> None:
        return None
