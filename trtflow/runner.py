"""Execute a plan: topological scheduling with CPU/GPU slots, one worker process per node, atomic commits.

Each stale node runs ``python -m trtflow.worker`` in its own process group with its log file as
stdout/stderr. Outputs are committed by this process only after the worker reports success, so a crash,
a timeout, Ctrl-C or ``kill -9`` never leaves a half-written artifact. A per-key file lock makes
concurrent runs on one store build each node once: the others wait, then reuse the result.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.environment import Environment
from trtflow.errors import TrtflowError
from trtflow.fingerprint import hash_file_content
from trtflow.fsutil import allowed_roots_for
from trtflow.graph import Graph
from trtflow.plan import FRESH, Step, judge, key_parts
from trtflow.storage.journal import Journal
from trtflow.storage.store import Store

DONE, CACHED, FAILED, GATE_FAILED, SKIPPED, BLOCKED, INTERRUPTED = (
    "done", "cached", "failed", "gate_failed", "skipped", "blocked", "interrupted")
SUCCESS = {FRESH, DONE, CACHED}


@dataclass
class RunOptions:
    jobs: int = max(1, min(4, os.cpu_count() or 1))
    keep_going: bool = False
    require_gpu: bool = False
    lock_timeout: float = 6 * 3600.0
    output_dir: Path | None = None
    command: str = "trtflow run"
    kill_grace: float = 5.0


@dataclass
class NodeResult:
    node: str
    stage: str
    status: str
    reason: str = ""
    key: str | None = None
    duration: float = 0.0
    log_path: Path | None = None
    error: str | None = None
    hint: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Path] = field(default_factory=dict)


@dataclass
class RunSummary:
    run_id: str
    results: dict[str, NodeResult]
    interrupted: bool = False

    def count(self, *statuses: str) -> int:
        return sum(1 for r in self.results.values() if r.status in statuses)

    @property
    def ok(self) -> bool:
        return not self.interrupted and all(r.status in SUCCESS or r.status == SKIPPED
                                            for r in self.results.values())


class Hooks:
    """Callbacks for progress reporting; every method is optional to override."""

    def on_run_start(self, run_id: str, steps: list[Step]) -> None: ...
    def on_node_start(self, node: str, reason: str) -> None: ...
    def on_node_waiting(self, node: str, message: str) -> None: ...
    def on_node_progress(self, node: str, fraction: float | None, message: str) -> None: ...
    def on_node_end(self, result: NodeResult) -> None: ...


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + os.urandom(3).hex()


class Runner:
    def __init__(self, graph: Graph, store: Store, env: Environment, recipe_path: Path, journal: Journal,
                 options: RunOptions | None = None, hooks: Hooks | None = None) -> None:
        self.graph = graph
        self.store = store
        self.env = env
        self.recipe_path = recipe_path
        self.recipe_dir = recipe_path.parent
        self.journal = journal
        self.options = options or RunOptions()
        self.hooks = hooks or Hooks()
        self.run_id = new_run_id()
        self._cancel = threading.Event()
        self._procs: dict[str, subprocess.Popen] = {}
        self._procs_lock = threading.Lock()
        self._db_lock = threading.Lock()
        self._digests: dict[tuple[str, str], str] = {}
        self._gpu_free: list[int] = []
        self._progress_files: dict[str, Path] = {}

    # ------------------------------------------------------------------ public
    def run(self, steps: list[Step]) -> RunSummary:
        self.store.ensure()
        self._reap_dead_runs()
        results: dict[str, NodeResult] = {}
        pending = [s for s in steps if s.status != FRESH]
        interrupted = False
        on_main_thread = threading.current_thread() is threading.main_thread()
        previous_handler = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt) if on_main_thread else None
        try:
            # a run is either not recorded at all or recorded as running, never half-way
            with _signals_deferred(on_main_thread), self._db_lock:
                self.journal.start_run(self.run_id, self.graph.recipe_name, str(self.recipe_path),
                                       self.options.command)
            self.hooks.on_run_start(self.run_id, steps)
            self._record_fresh([s for s in steps if s.status == FRESH], results)
            if any(self.graph.stages[s.node.stage].resources_for(s.node.params_model).gpu for s in pending):
                from trtflow.environment import gpus

                self._gpu_free = [g.index for g in gpus()] or [-1]
            else:
                self._gpu_free = [-1]
            self._schedule(pending, results)
        except KeyboardInterrupt:
            interrupted = True
        with _signals_deferred(on_main_thread):  # the closing bookkeeping cannot be interrupted half-way
            if interrupted:
                self._interrupt(pending, results)
            if previous_handler is not None:
                signal.signal(signal.SIGTERM, previous_handler)
            summary = RunSummary(self.run_id, results, interrupted)
            status = "interrupted" if interrupted else ("ok" if summary.ok else "failed")
            with self._db_lock:
                self.journal.end_run(self.run_id, status)
            self._cleanup_tmp()
        return summary

    # ------------------------------------------------------------------ scheduling
    def _record_fresh(self, fresh: list[Step], results: dict[str, NodeResult]) -> None:
        out_dir = self.options.output_dir
        rows = []
        for step in fresh:
            manifest = step.manifest or {}
            for out_name, out in manifest.get("outputs", {}).items():
                self._digests[(step.node.name, out_name)] = out["digest"]
            outputs = self.store.materialize(manifest, out_dir / step.node.name) if out_dir else {}
            status, error = (GATE_FAILED, "; ".join(step.gate_failures)) if step.gate_failures else (FRESH, None)
            results[step.node.name] = NodeResult(step.node.name, step.node.stage, status, step.reason, step.key,
                                                 error=error, outputs=outputs, summary=manifest.get("summary", {}),
                                                 hint=_gate_hint(error))
            summary = manifest.get("summary")
            rows.append((self.run_id, step.node.name, step.node.stage, step.key, status, step.reason,
                         json.dumps(summary) if summary else None))
        if rows:
            with self._db_lock:
                conn = self.journal.conn
                conn.execute("BEGIN")
                conn.executemany("INSERT OR REPLACE INTO node_runs (run_id, node, stage, key, status, reason, "
                                 "summary) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
                conn.execute("COMMIT")

    def _schedule(self, pending: list[Step], results: dict[str, NodeResult]) -> None:
        waiting = list(pending)
        running: dict[Future, tuple[Step, int | None]] = {}
        with ThreadPoolExecutor(max_workers=max(1, self.options.jobs)) as pool:
            try:
                self._loop(pool, waiting, running, results)
            except KeyboardInterrupt:
                self._kill_running()
                raise

    def _loop(self, pool: ThreadPoolExecutor, waiting: list[Step], running: dict[Future, tuple[Step, int | None]],
              results: dict[str, NodeResult]) -> None:
        stop_submitting = False
        while waiting or running:
            for step in list(waiting):
                if stop_submitting:
                    break
                blocked_by = self._failed_upstream(step, results)
                if blocked_by:
                    waiting.remove(step)
                    upstream = results[blocked_by]
                    why = f"upstream {blocked_by} {upstream.status.replace('_', ' ')}"
                    status = SKIPPED if upstream.status in (SKIPPED,) or (
                        upstream.status == BLOCKED and upstream.reason.endswith("skipped")) else BLOCKED
                    res = NodeResult(step.node.name, step.node.stage, status, why)
                    results[step.node.name] = res
                    self._journal_node(res)
                    self.hooks.on_node_end(res)
                    continue
                if not self._inputs_ready(step, results) or len(running) >= self.options.jobs:
                    continue
                needs_gpu = self.graph.stages[step.node.stage].resources_for(step.node.params_model).gpu > 0
                gpu: int | None = None
                if needs_gpu:
                    if not self._gpu_free:
                        continue
                    gpu = self._gpu_free.pop(0)
                waiting.remove(step)
                running[pool.submit(self._execute, step, gpu)] = (step, gpu)
            if not running:
                if waiting and stop_submitting:
                    for step in waiting:
                        res = NodeResult(step.node.name, step.node.stage, BLOCKED,
                                         "not started: an earlier node failed (use --keep-going to continue)")
                        results[step.node.name] = res
                        self._journal_node(res)
                    waiting = []
                elif waiting and not any(self._inputs_ready(s, results) or self._failed_upstream(s, results)
                                         for s in waiting):
                    raise RuntimeError("scheduler stalled: " + ", ".join(s.node.name for s in waiting))
                continue
            done, _ = wait(list(running), timeout=0.25, return_when=FIRST_COMPLETED)
            self._poll_progress()
            for future in done:
                step, gpu = running.pop(future)
                if gpu is not None:
                    self._gpu_free.append(gpu)
                res = future.result()
                results[step.node.name] = res
                self.hooks.on_node_end(res)
                if res.status not in SUCCESS and not (res.status == SKIPPED and not self.options.require_gpu):
                    if not self.options.keep_going and not self._gate_failure_absorbed(res):
                        stop_submitting = True

    def _inputs_ready(self, step: Step, results: dict[str, NodeResult]) -> bool:
        return all(results.get(u) is not None and self._usable(step.node, u, results[u])
                   for u in self.graph.upstream(step.node.name))

    def _failed_upstream(self, step: Step, results: dict[str, NodeResult]) -> str | None:
        for u in self.graph.upstream(step.node.name):
            r = results.get(u)
            if r is not None and not self._usable(step.node, u, r):
                return u
        return None

    def _gate_failure_absorbed(self, result: NodeResult) -> bool:
        """A failed gate whose committed outputs only feed slots that accept them (candidates of a chooser)
        does not stop a fail-fast run: the chooser still runs and reports the excluded candidate."""
        consumers = self.graph.downstream(result.node)
        return result.status == GATE_FAILED and bool(consumers) and all(
            self._usable(self.graph.nodes[c], result.node, result) for c in consumers)

    def _usable(self, consumer: Any, producer: str, result: NodeResult) -> bool:
        """A producer's outputs may feed ``consumer``: it succeeded, or its gate failed on committed outputs and
        every slot it feeds accepts that (a chooser excludes the candidate instead of being blocked)."""
        if result.status in SUCCESS:
            return True
        if result.status != GATE_FAILED:
            return False
        specs = self.graph.stages[consumer.stage].inputs
        feeds = [(slot, out) for slot, refs in consumer.upstream.items() for src, out in refs if src == producer]
        return all(specs[slot].accept_gate_failed and (producer, out) in self._digests for slot, out in feeds)

    def _poll_progress(self) -> None:
        for node, path in list(self._progress_files.items()):
            try:
                with open(path, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    size = f.tell()
                    f.seek(max(0, size - 4096))
                    lines = f.read().decode("utf-8", "replace").strip().splitlines()
            except OSError:
                continue
            if lines:
                try:
                    last = json.loads(lines[-1])
                except ValueError:
                    continue
                self.hooks.on_node_progress(node, last.get("fraction"), last.get("message", ""))

    # ------------------------------------------------------------------ one node
    def _execute(self, step: Step, gpu: int | None) -> NodeResult:
        node = step.node
        stage = self.graph.stages[node.stage]
        log_path = self.store.log_path(self.run_id, node.name)
        started = time.time()
        try:
            parts = key_parts(self.graph, node, self._digests, self.env, self.recipe_dir, self.journal)
        except TrtflowError as exc:
            return self._finish(NodeResult(node.name, node.stage, FAILED, step.reason, error=exc.message,
                                           hint=exc.hint), started)
        assert parts is not None, "inputs of a ready node must be known"
        key = parts.key
        if step.parts is None:  # planned as "upstream will run first": say what actually changed
            from trtflow.plan import explain

            previous_key = self.store.read_ref(self.graph.recipe_name, node.name)
            previous = self.store.read_manifest(previous_key) if previous_key else None
            step.reasons = explain(parts, previous)
        reused = self._reuse(node.name, key, "identical result already in the store")
        if reused:
            return self._finish(reused, started)
        if stage.check is not None:
            from trtflow.errors import StageSkipped

            try:
                stage.check(node.params_model)
            except StageSkipped as exc:
                return self._finish(self._skipped(node.name, node.stage, key, exc.reason, exc.needs), started)
            except TrtflowError as exc:
                return self._finish(NodeResult(node.name, node.stage, FAILED, step.reason, key, error=exc.message,
                                               hint=exc.hint), started)
        from filelock import FileLock, Timeout

        lock = FileLock(str(self.store.lock_path(key)))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            self.hooks.on_node_waiting(node.name, "another trtflow run is building it; waiting")
            try:
                lock.acquire(timeout=self.options.lock_timeout)
            except Timeout:
                return self._finish(NodeResult(
                    node.name, node.stage, FAILED, step.reason, key,
                    error=f"waited {self.options.lock_timeout:g} s for another trtflow run building this node",
                    hint=f"check for a stuck run (`trtflow status`); its lock is {self.store.lock_path(key)}",
                ), started)
        try:
            reused = self._reuse(node.name, key, "built meanwhile by another trtflow run")
            if reused:
                return self._finish(reused, started)
            self.hooks.on_node_start(node.name, step.reason)
            with self._db_lock:
                self.journal.node_state(self.run_id, node.name, node.stage, key, "running", step.reason,
                                        started=started, log_path=str(log_path))
            return self._finish(self._run_worker(step, parts, key, gpu, log_path, started), started)
        finally:
            lock.release()

    def _reuse(self, node: str, key: str, why: str) -> NodeResult | None:
        manifest = self.store.read_manifest(key)
        if manifest is None or not self.store.complete(manifest):
            return None
        for out_name, out in manifest["outputs"].items():
            self._digests[(node, out_name)] = out["digest"]
        self.store.write_ref(self.graph.recipe_name, node, key)
        outputs = self._materialize(node, manifest)
        res = NodeResult(node, manifest.get("stage", ""), CACHED, why, key, outputs=outputs,
                         summary=manifest.get("summary", {}))
        return self._apply_gate(res, manifest)

    def _apply_gate(self, res: NodeResult, manifest: dict[str, Any]) -> NodeResult:
        failures = judge(self.graph, self.graph.nodes[res.node], manifest, self.recipe_dir)
        if failures:
            res.status, res.error = GATE_FAILED, "; ".join(failures)
            res.hint = _gate_hint(res.error)
        return res

    def _skipped(self, node: str, stage: str, key: str | None, reason: str, needs: str | None) -> NodeResult:
        if self.options.require_gpu:
            return NodeResult(node, stage, FAILED, "backend unavailable", key,
                              error=f"{reason} (and --require-gpu was given)", hint=needs)
        return NodeResult(node, stage, SKIPPED, reason, key, error=reason, hint=needs)

    def _materialize(self, node: str, manifest: dict[str, Any]) -> dict[str, Path]:
        if self.options.output_dir is None:
            return {}
        return self.store.materialize(manifest, self.options.output_dir / node)

    def _run_worker(self, step: Step, parts: Any, key: str, gpu: int | None, log_path: Path,
                    started: float) -> NodeResult:
        node = step.node
        stage = self.graph.stages[node.stage]
        scratch = self.store.tmp_dir / self.run_id / node.name
        if scratch.exists():
            shutil.rmtree(scratch)
        scratch.mkdir(parents=True)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            inputs = self._link_inputs(node, scratch)
        except TrtflowError as exc:
            shutil.rmtree(scratch, ignore_errors=True)
            return NodeResult(node.name, node.stage, FAILED, step.reason, key, error=exc.message, hint=exc.hint)
        job = {
            "node": node.name, "stage": node.stage, "params": node.params, "inputs": inputs,
            "scratch": str(scratch), "recipe_dir": str(self.recipe_dir), "cache_dir": str(self.store.cache_dir),
            "facts": parts.facts, "gpu": gpu if gpu is not None and gpu >= 0 else None,
            "allowed_roots": [str(p) for p in allowed_roots_for(self.recipe_dir)],
            "progress_file": str(scratch / "progress.jsonl"), "result_file": str(scratch / "result.json"),
            "parent_pid": os.getpid(),
            "previous_summary": self._previous_summary(node.name),
            "input_sources": self._input_sources(node),
        }
        job_file = scratch / "job.json"
        job_file.write_text(json.dumps(job), encoding="utf-8")
        env = dict(os.environ)
        if gpu is not None and gpu >= 0:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._progress_files[node.name] = scratch / "progress.jsonl"
        try:
            with open(log_path, "ab") as log:
                proc = subprocess.Popen([sys.executable, "-m", "trtflow.worker", str(job_file)], stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                        start_new_session=True)
                with self._procs_lock:
                    self._procs[node.name] = proc
                timed_out = False
                try:
                    proc.wait(timeout=node.timeout)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    _kill_group(proc, self.options.kill_grace)
            with self._procs_lock:
                self._procs.pop(node.name, None)
            self._progress_files.pop(node.name, None)
            if self._cancel.is_set():
                return NodeResult(node.name, node.stage, INTERRUPTED, "interrupted", key, log_path=log_path)
            if timed_out:
                return NodeResult(node.name, node.stage, FAILED, step.reason, key, log_path=log_path,
                                  error=f"timed out after {node.timeout:g} s (the recipe's timeout for this node)",
                                  hint="raise the node's `timeout:` if it is just slow")
            result = _read_result(scratch / "result.json")
            if result is None:
                code = proc.returncode
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                return NodeResult(node.name, node.stage, FAILED, step.reason, key, log_path=log_path,
                                  error=f"the stage process {how} before reporting a result")
            status = result.get("status")
            if status == "skipped":
                res = self._skipped(node.name, node.stage, key, result.get("error", ""), result.get("hint"))
                res.log_path = log_path
                return res
            if status != "ok":
                return NodeResult(node.name, node.stage, GATE_FAILED if status == "gate_failed" else FAILED,
                                  step.reason, key, log_path=log_path, error=result.get("error"),
                                  hint=result.get("hint"), summary=result.get("summary") or {})
            missing = [n for n, o in stage.outputs.items()
                       if not o.optional and not (scratch / "out" / o.filename).exists()]
            if missing:
                return NodeResult(node.name, node.stage, FAILED, step.reason, key, log_path=log_path,
                                  error=f"stage {node.stage!r} finished without writing outputs {missing}")
            manifest = dict(parts.as_manifest(), node=node.name, recipe=self.graph.recipe_name,
                            summary=result.get("summary") or {}, run_id=self.run_id,
                            started=started, duration=time.time() - started,
                            previous_summary=self._previous_summary(node.name))
            outputs_spec = {n: (o.filename, o.kind) for n, o in stage.outputs.items()}
            try:
                manifest = self.store.commit(key, manifest, scratch / "out", outputs_spec)
            except OSError as exc:
                return NodeResult(node.name, node.stage, FAILED, step.reason, key, log_path=log_path,
                                  error=f"could not store the outputs: {exc.strerror or exc}",
                                  hint="free disk space or fix the store's permissions; nothing was committed "
                                  "for this node and finished nodes are intact")
            for out_name, out in manifest["outputs"].items():
                self._digests[(node.name, out_name)] = out["digest"]
            self.store.write_ref(self.graph.recipe_name, node.name, key)
            outputs = self._materialize(node.name, manifest)
            return self._apply_gate(NodeResult(node.name, node.stage, DONE, step.reason, key, log_path=log_path,
                                               summary=manifest.get("summary", {}), outputs=outputs), manifest)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _previous_summary(self, node: str) -> dict[str, Any] | None:
        """The summary of this node's last successful run (whatever its settings), for regression gates."""
        key = self.store.read_ref(self.graph.recipe_name, node)
        manifest = self.store.read_manifest(key) if key else None
        return (manifest or {}).get("summary") or None

    def _link_inputs(self, node: Any, scratch: Path) -> dict[str, str | list[str]]:
        """Hard-link each input into ``scratch/in/<slot>/``, with the source node's other outputs beside it.

        Siblings travel along so that companion files stay together: an ONNX model's external weights
        (``model.onnx_data``) or an engine's provenance manifest (``engine.json``). A many-slot gets a list:
        each artifact in ``scratch/in/<slot>/<producer node>/``.
        """
        inputs: dict[str, str | list[str]] = {}
        specs = self.graph.stages[node.stage].inputs
        for slot, refs in node.upstream.items():
            if specs[slot].many:
                inputs[slot] = [self._link_one(src, out, scratch / "in" / slot / src) for src, out in refs]
            else:
                inputs[slot] = self._link_one(*refs[0], scratch / "in" / slot)
        return inputs

    def _input_sources(self, node: Any) -> dict[str, list[dict[str, Any]]]:
        """Per slot, where each input came from: the producer's name, template, matrix and own inputs."""
        sources: dict[str, list[dict[str, Any]]] = {}
        for slot, refs in node.upstream.items():
            sources[slot] = []
            for src, _ in refs:
                producer = self.graph.nodes[src]
                sources[slot].append({
                    "node": src, "template": producer.template, "matrix": producer.matrix,
                    "inputs": {s: [n for n, _ in r] for s, r in producer.upstream.items()},
                })
        return sources

    def _link_one(self, src_node: str, out_name: str, folder: Path) -> str:
        stage = self.graph.stages[self.graph.nodes[src_node].stage]
        folder.mkdir(parents=True, exist_ok=True)
        for name, out in stage.outputs.items():
            digest = self._digests.get((src_node, name))
            if digest is None:
                continue
            target = folder / out.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            source = self.store.object_path(digest)
            try:
                os.link(source, target)
            except OSError:
                shutil.copyfile(source, target)
            # A stage reads only inputs whose bytes are still those committed (an engine is never
            # deserialised from a file that changed since its build).
            actual = hash_file_content(target)
            if actual != digest:
                raise TrtflowError(
                    f"the stored output {src_node}.{name} ({source}) changed after it was committed "
                    f"(content digest {actual}, recorded {digest}); it is not used",
                    hint="run `trtflow verify --fix`, then run again: the damaged node is rebuilt")
        return str(folder / stage.outputs[out_name].filename)

    def _finish(self, res: NodeResult, started: float) -> NodeResult:
        res.duration = time.time() - started
        self._journal_node(res, started)
        return res

    def _journal_node(self, res: NodeResult, started: float | None = None) -> None:
        with self._db_lock:
            self.journal.node_state(
                self.run_id, res.node, res.stage, res.key, res.status, res.reason, started=started,
                ended=time.time() if started else None, log_path=str(res.log_path) if res.log_path else None,
                error=res.error, summary=res.summary or None,
            )

    # ------------------------------------------------------------------ interruption
    def _kill_running(self) -> None:
        self._cancel.set()
        with self._procs_lock:
            procs = list(self._procs.values())
        for proc in procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.time() + self.options.kill_grace
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)

    def _interrupt(self, pending: list[Step], results: dict[str, NodeResult]) -> None:
        self._kill_running()
        for step in pending:
            if step.node.name not in results:
                res = NodeResult(step.node.name, step.node.stage, INTERRUPTED, "interrupted before it finished")
                results[step.node.name] = res
                self._journal_node(res)

    def _reap_dead_runs(self) -> None:
        """Mark runs whose process died (kill -9, power loss) as killed and drop their scratch space."""
        with self._db_lock:
            rows = self.journal.conn.execute(
                "SELECT id, pid, host FROM runs WHERE status = 'running'").fetchall()
        host = os.uname().nodename
        for run_id, pid, run_host in rows:
            if run_host == host and pid and not _pid_alive(pid):
                with self._db_lock:
                    self.journal.end_run(run_id, "killed")
                    self.journal.conn.execute(
                        "UPDATE node_runs SET status = 'interrupted', reason = 'the run was killed' "
                        "WHERE run_id = ? AND status = 'running'", (run_id,))
                shutil.rmtree(self.store.tmp_dir / run_id, ignore_errors=True)

    def _cleanup_tmp(self) -> None:
        shutil.rmtree(self.store.tmp_dir / self.run_id, ignore_errors=True)


@contextmanager
def _signals_deferred(active: bool) -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block is done (main thread only), then act on the last one received."""
    if not active:
        yield
        return
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        raise KeyboardInterrupt


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_group(proc: subprocess.Popen, grace: float) -> None:
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()


def _read_result(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _gate_hint(error: str | None) -> str | None:
    if not error:
        return None
    return ("the measurements are cached: change the threshold to re-judge them without re-running, or change "
            "the model; `trtflow show RECIPE NODE` lists the metrics")


def resume_command(argv: list[str] | None = None) -> str:
    import shlex

    args = list(sys.argv[1:] if argv is None else argv)
    return "trtflow " + shlex.join(args)


Callback = Callable[[NodeResult], None]
