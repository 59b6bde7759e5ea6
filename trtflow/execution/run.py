"""Execute a plan: schedule ready nodes by resources, hand each to an executor, commit what comes back.

The runner owns the store, the journal, refs and signals; an executor (local, inline, ray) only decides where a
node runs. A node's lifecycle, on one runner thread: key with the facts of the device it was given -> reuse a
stored (or remote) result -> per-key lock (concurrent runs build it once) -> run -> commit -> refs -> copies under
build/ -> quality gate. Every failure on the way becomes that node's clear error: nothing escapes as an internal
error, and the journal always ends the run with an outcome.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from trtflow.environment import Environment, gpus
from trtflow.errors import StageSkipped, StoreError, TrtflowError
from trtflow.execution import protocol
from trtflow.execution.protocol import Executor, Job, Outcome
from trtflow.execution.results import (
    BLOCKED,
    CACHED,
    DONE,
    FAILED,
    GATE_FAILED,
    INTERRUPTED,
    SKIPPED,
    SUCCESS,
    Hooks,
    NodeResult,
    Progress,
    RunOptions,
    RunSummary,
    new_run_id,
)
from trtflow.execution.scheduler import Allocation, Capacity, Scheduler, available_memory, default_memory_need
from trtflow.fsutil import read_tail
from trtflow.graph import Graph
from trtflow.plan import (
    FRESH,
    SKIP,
    KeyContext,
    KeyParts,
    Step,
    explain,
    judge,
    key_parts,
    node_resources,
    previous_manifest,
)
from trtflow.recipe.expand import ConcreteNode
from trtflow.stage import NATIVE_STEP_FILE
from trtflow.storage.journal import Journal
from trtflow.storage.lock import SHARED, StoreLock, pid_alive
from trtflow.storage.refs import RecipeIdentity
from trtflow.storage.store import Store, materialize_error

GATE_HINT = ("the measurements are cached: change the threshold to re-judge them without re-running, or change the "
             "model; `trtflow show RECIPE NODE` lists the metrics")


class Runner:
    def __init__(self, graph: Graph, store: Store, env: Environment, recipe: RecipeIdentity, journal: Journal,
                 options: RunOptions | None = None, hooks: Hooks | None = None,
                 executor: Executor | None = None, recipe_nodes: list[str] | None = None) -> None:
        self.graph = graph
        self.recipe_nodes = list(recipe_nodes if recipe_nodes is not None else graph.nodes)
        self.store = store
        self.recipe = recipe
        self.journal = journal
        self.options = options or RunOptions()
        self.hooks = hooks or Hooks()
        self.kctx = KeyContext.for_recipe(recipe.path.parent, env, journal)
        self.run_id = new_run_id()
        self.executor = executor or _make_executor(self.options, store, self.run_id)
        self.remote = _open_remote(self.options.remote, self.options.remote_digest)
        self._keys: dict[str, str] = {}  # node -> key of the result this run used
        self._verdicts: dict[str, list[str]] = {}  # node -> its gate's failures as judged in this run
        self._refs_at_start = store.refs.current(recipe.id)  # what the previous runs used: "previous" results
        self._cancel = threading.Event()
        self._digests: dict[tuple[str, str], str] = {}
        self._sizes: dict[tuple[str, str], int] = {}
        self._refs_lock = threading.Lock()
        self._pending_refs: dict[str, str] = {}
        self._refs_flushed = 0.0
        self._problems: list[str] = []
        self._warnings: list[str] = []
        self._scratch: dict[str, Path] = {}
        self._started: dict[str, float] = {}

    # ------------------------------------------------------------------ public
    def run(self, steps: list[Step]) -> RunSummary:
        self.store.ensure()
        if self.remote is not None:
            self.remote.check()  # an unreachable or foreign remote stops the run before any work
        results: dict[str, NodeResult] = {}
        summary = RunSummary(self.run_id, results)
        lock = StoreLock(self.store.root)
        with lock.held(SHARED, f"trtflow run {self.recipe.id} (run {self.run_id})",
                       on_wait=lambda msg: self.hooks.on_node_waiting("(store)", msg)):
            self._reap_dead_runs()
            previous = self._install_signal_handlers()
            try:
                self.journal.start_run(self.run_id, self.recipe.name, str(self.recipe.path),
                                       self.options.command, self.recipe.id)
                try:
                    self.hooks.on_run_start(self.run_id, steps)
                    self._record_fresh([s for s in steps if s.status == FRESH], results)
                    pending = [s for s in steps if s.status != FRESH]
                    self._stop_if_cancelled()
                    summary.cleared = self._retract_outdated(pending)
                    self._stop_if_cancelled()
                    self._schedule(pending, results)
                except KeyboardInterrupt:  # a signal (see _install_signal_handlers) or Ctrl-C inside a library
                    summary.interrupted = True
                summary.interrupted = summary.interrupted or self._cancel.is_set()
                self._finish(steps, summary)
            finally:
                self.executor.close()
                self._restore_signal_handlers(previous)
        summary.problems = list(dict.fromkeys(self._problems))
        summary.warnings = list(dict.fromkeys(self._warnings))
        return summary

    def _finish(self, steps: list[Step], summary: RunSummary) -> None:
        if summary.interrupted:
            self.executor.interrupt()
            for step in steps:
                if step.node.name not in summary.results:
                    res = NodeResult(step.node.name, step.node.stage, INTERRUPTED, "interrupted before it finished")
                    summary.results[step.node.name] = res
                    self._journal_node(res)
        shutil.rmtree(self.store.tmp_dir / self.run_id, ignore_errors=True)  # frees space a full disk may need
        self._flush_refs(force=True)
        status = "interrupted" if summary.interrupted else ("ok" if summary.ok and not self._problems else "failed")
        self._journal("recording the end of the run", lambda: self.journal.end_run(self.run_id, status))

    # ------------------------------------------------------------------ signals
    def _install_signal_handlers(self) -> dict[int, Any] | None:
        """SIGINT/SIGTERM only set the cancel event; the runner stops at its next safe point.

        A KeyboardInterrupt raised at an arbitrary bytecode (inside a print, a journal write, a library's
        callback) can leave shared state half-updated, so the handler never raises: the scheduling loop checks the
        event at least every 0.25 s and running nodes are told through the same event.
        """
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum: int, frame: Any) -> None:
            self._cancel.set()

        return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    @staticmethod
    def _restore_signal_handlers(previous: dict[int, Any] | None) -> None:
        for sig, handler in (previous or {}).items():
            signal.signal(sig, handler)

    def _stop_if_cancelled(self) -> None:
        if self._cancel.is_set():
            raise KeyboardInterrupt

    # ------------------------------------------------------------------ bookkeeping
    def _journal(self, doing: str, action: Callable[[], Any]) -> Any:
        """Run a journal write; a failure (full disk, ...) is recorded as a run problem, never raised."""
        try:
            return action()
        except StoreError as exc:
            self._problems.append(exc.message + (f" (hint: {exc.hint})" if exc.hint else ""))
        except OSError as exc:
            self._problems.append(f"{doing} failed: {exc.strerror or exc}")
        return None

    def _journal_node(self, res: NodeResult, started: float | None = None) -> None:
        self._journal(f"recording node {res.node}", lambda: self.journal.node_state(
            self.run_id, res.node, res.stage, res.key, res.status, res.reason, started=started,
            ended=time.time() if started else None, log_path=str(res.log_path) if res.log_path else None,
            error=res.error, summary=res.summary or None))
        if res.peak_rss:
            self._journal("recording memory", lambda: self.journal.set_peak_rss(self.run_id, res.node, res.peak_rss))

    REFS_FLUSH_S = 1.0

    def _record_refs(self, keys: dict[str, str]) -> None:
        """Note which results this run used; written at most once a second (and at the end), so that a run of
        thousands of cheap nodes does not rewrite its refs thousands of times."""
        with self._refs_lock:
            self._pending_refs.update(keys)

    def _flush_refs(self, force: bool = False) -> None:
        with self._refs_lock:
            if not self._pending_refs or (not force and time.monotonic() - self._refs_flushed < self.REFS_FLUSH_S):
                return
            keys, self._pending_refs = self._pending_refs, {}
            self._refs_flushed = time.monotonic()
        try:
            self.store.refs.update(self.recipe, self.run_id, self.recipe_nodes, keys)
        except (OSError, StoreError) as exc:
            detail = exc.strerror if isinstance(exc, OSError) else exc.message
            self._problems.append(f"could not record which results this run used (refs): {detail}; the results "
                                  "are stored, but `trtflow gc` could remove them until a run records them")

    def _reap_dead_runs(self) -> None:
        """Mark runs whose process died (kill -9, power loss) as killed and drop their scratch space."""
        rows = self._journal("reading running runs", self.journal.running_runs) or []
        host = os.uname().nodename
        for run_id, pid, run_host in rows:
            if run_host == host and pid and not pid_alive(pid):
                self._journal("recording a dead run", lambda r=run_id: self.journal.mark_dead(r))
                shutil.rmtree(self.store.tmp_dir / run_id, ignore_errors=True)

    def _record_fresh(self, fresh: list[Step], results: dict[str, NodeResult]) -> None:
        rows = []
        keys = {}
        for step in fresh:
            manifest = step.manifest or {}
            self._remember_outputs(step.node.name, manifest)
            outputs: dict[str, Path] = {}
            error = "; ".join(step.gate_failures) or None
            status = GATE_FAILED if step.gate_failures else FRESH
            if self.graph.stages[step.node.stage].gate is not None:
                self._verdicts[step.node.name] = list(step.gate_failures)
            try:
                outputs = self._materialize(step.node.name, manifest)
            except OSError as exc:
                self._problems.append(materialize_error(step.node.name, self._out_dir(step.node.name), exc).message)
            results[step.node.name] = NodeResult(step.node.name, step.node.stage, status, step.reason, step.key,
                                                 error=error, hint=GATE_HINT if error else None, outputs=outputs,
                                                 summary=manifest.get("summary", {}))
            if error:  # up to date, but its cached measurements fail the gate as it stands now: say so
                self.hooks.on_node_end(results[step.node.name])
            summary = manifest.get("summary")
            rows.append((self.run_id, step.node.name, step.node.stage, step.key, status, step.reason,
                         json.dumps(summary) if summary else None))
            keys[step.node.name] = step.key
        self._journal("recording up-to-date nodes", lambda: self.journal.record_nodes(rows))
        self._record_refs(keys)
        self._flush_refs(force=True)

    def _retract_outdated(self, pending: list[Step]) -> list[str]:
        """Remove outputs under build/ that belong to a previous key of a node that is about to change."""
        if self.options.output_dir is None:
            return []
        cleared = []
        for step in pending:
            try:
                removed = self.store.retract(self._out_dir(step.node.name), f"outdated: {step.reason}")
            except OSError:
                continue
            if removed:
                cleared.append(step.node.name)
        return cleared

    def _remember_outputs(self, node: str, manifest: dict[str, Any]) -> None:
        if manifest.get("key"):
            self._keys[node] = manifest["key"]
        for out_name, out in manifest.get("outputs", {}).items():
            self._digests[(node, out_name)] = out["digest"]
            self._sizes[(node, out_name)] = int(out.get("size", 0))

    def _out_dir(self, node: str) -> Path:
        assert self.options.output_dir is not None
        return self.options.output_dir / node

    def _materialize(self, node: str, manifest: dict[str, Any]) -> dict[str, Path]:
        if self.options.output_dir is None:
            return {}
        return self.store.materialize(manifest, self._out_dir(node))

    # ------------------------------------------------------------------ scheduling
    def _capacity(self) -> Capacity:
        memory = self.options.memory_limit or int(available_memory() * 0.9)
        cluster = getattr(self.executor, "capacity", None)
        if cluster is not None:
            return cluster(self.options.jobs, memory)
        return Capacity(float(max(1, self.options.jobs)), memory, list(gpus()))

    def _schedule(self, pending: list[Step], results: dict[str, NodeResult]) -> None:
        if not pending:
            return
        scheduler = Scheduler(self._capacity())
        waiting = list(pending)
        running: dict[Future, tuple[Step, Allocation]] = {}
        started_executor = False
        workers = max(1, self.options.jobs) + len(scheduler.capacity.gpus) + 1
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trtflow-node") as pool:
            try:
                stop = False
                while waiting or running:
                    self._stop_if_cancelled()
                    for step in list(waiting):
                        verdict = self._before_start(step, results, scheduler, stop)
                        if verdict == "wait":
                            continue
                        waiting.remove(step)
                        if isinstance(verdict, NodeResult):
                            self._end(verdict, results)
                            stop = stop or self._stops_run(verdict)
                            continue
                        if not started_executor:
                            self.executor.start()
                            started_executor = True
                        step_alloc = verdict
                        running[pool.submit(self._process, step, step_alloc)] = (step, step_alloc)
                    if not running:
                        if waiting and stop:
                            for step in waiting:
                                self._end(NodeResult(step.node.name, step.node.stage, BLOCKED,
                                                     "not started: an earlier node failed (use --keep-going to "
                                                     "continue)"), results)
                            waiting = []
                        elif waiting:
                            time.sleep(0.2)  # e.g. every fitting GPU is busy in another trtflow process
                        continue
                    done, _ = wait(list(running), timeout=0.25, return_when=FIRST_COMPLETED)
                    self._poll_progress([s for s, _ in running.values()])
                    self._flush_refs()
                    for future in done:
                        step, alloc = running.pop(future)
                        scheduler.release(alloc)
                        res = future.result()
                        self._end(res, results)
                        stop = stop or self._stops_run(res)
            except KeyboardInterrupt:
                self._cancel.set()
                self.executor.interrupt()
                for future, (_step, alloc) in list(running.items()):
                    res = future.result()
                    scheduler.release(alloc)
                    self._end(res, results)
                raise

    def _stops_run(self, res: NodeResult) -> bool:
        if self.options.keep_going or self._gate_failure_absorbed(res):
            return False
        return res.status not in SUCCESS and not (res.status == SKIPPED and not self.options.require_gpu)

    def _end(self, res: NodeResult, results: dict[str, NodeResult]) -> None:
        results[res.node] = res
        self.hooks.on_node_end(res)

    def _before_start(self, step: Step, results: dict[str, NodeResult], scheduler: Scheduler,
                      stop: bool) -> str | NodeResult | Allocation:
        """"wait", a result that ends the node without running it, or the allocation to run it with."""
        node = step.node
        upstream = self.graph.upstream(node.name)
        failed = next((u for u in upstream if u in results and not self._usable(node, u, results[u])), None)
        if failed is not None:
            up = results[failed]
            skipped = up.status == SKIPPED or (up.status == BLOCKED and up.reason.endswith("cannot run here"))
            res = NodeResult(node.name, node.stage, SKIPPED if skipped else BLOCKED,
                             f"upstream {failed} {'cannot run here' if skipped else up.status.replace('_', ' ')}")
            self._journal_node(res)
            return res
        if step.status == SKIP and not upstream_pending(upstream, results):
            res = self._skipped(node.name, node.stage, step.key, step.reason, step.needs)
            self._journal_node(res)
            return res
        if stop or not all(u in results for u in upstream):
            return "wait"
        resources = node_resources(self.graph, node)
        never = scheduler.can_ever_run(resources)
        if never is not None:
            res = self._skipped(node.name, node.stage, step.key, f"{never} (not run here; never cached)",
                                "a machine with such a GPU")
            self._journal_node(res)
            return res
        allocation = scheduler.try_allocate(resources, self._memory_need(node))
        return allocation if allocation is not None else "wait"

    def _memory_need(self, node: ConcreteNode) -> int:
        stage = self.graph.stages[node.stage]
        declared = node_resources(self.graph, node).memory_mb
        sizes: dict[str, int] = {}
        for slot, refs in node.upstream.items():  # an input travels with its producer's other outputs
            producers = {src for src, _ in refs}
            sizes[slot] = sum(size for (src, _), size in self._sizes.items() if src in producers)
        if declared is not None:
            estimate = declared << 20
        elif stage.memory is not None:
            try:
                estimate = int(stage.memory(node.params_model, sizes))
            except Exception:  # an estimate must never stop a run
                estimate = default_memory_need(sum(sizes.values()))
        else:
            estimate = default_memory_need(sum(sizes.values()))
        measured = self._journal("reading measured memory", lambda: self.journal.peak_rss(node.name, self.recipe.id))
        return max(estimate, int(measured or 0))

    def _poll_progress(self, steps: list[Step]) -> None:
        now = time.time()
        for step in steps:
            name = step.node.name
            scratch = self._scratch.get(name)
            if scratch is None:
                continue
            fraction, message = _last_progress(scratch / "progress.jsonl")
            pid = self.executor.pid_of(name)
            rss = _rss(pid) if pid else None
            self.hooks.on_node_progress(name, Progress(fraction, message, now - self._started.get(name, now), rss))

    # ------------------------------------------------------------------ one node
    def _process(self, step: Step, allocation: Allocation) -> NodeResult:
        started = time.time()
        try:
            res = self._process_node(step, allocation, started)
        except Exception as exc:  # a trtflow bug: it fails this node, not the whole run
            log = self.store.log_path(self.run_id, step.node.name)
            try:
                log.parent.mkdir(parents=True, exist_ok=True)
                with open(log, "a", encoding="utf-8") as f:
                    f.write(traceback.format_exc())
            except OSError:
                pass
            res = NodeResult(step.node.name, step.node.stage, FAILED, step.reason, step.key, log_path=log,
                             error=f"internal error in trtflow while running this node: {type(exc).__name__}: {exc}",
                             hint="this is a bug in trtflow: please report it with the log")
        res.duration = time.time() - started
        self._journal_node(res, started)
        return res

    def _process_node(self, step: Step, allocation: Allocation, started: float) -> NodeResult:
        node = step.node
        stage = self.graph.stages[node.stage]
        try:
            parts = key_parts(self.graph, node, self._digests, self.kctx, allocation.device, self._verdicts)
        except TrtflowError as exc:
            return NodeResult(node.name, node.stage, FAILED, step.reason, error=exc.message, hint=exc.hint)
        if parts is None:  # every upstream node finished, yet one did not write an (optional) output wired here
            missing = [f"{slot} <- {src}.{out}" for slot, refs in node.upstream.items() for src, out in refs
                       if (src, out) not in self._digests]
            return NodeResult(node.name, node.stage, FAILED, step.reason,
                              error=f"input(s) not produced: {', '.join(missing)} (optional outputs their node did "
                              "not write this time)",
                              hint="wire an output the upstream node writes in this case, e.g. select.engine when "
                              "the candidates are engines")
        key = parts.key
        previous = previous_manifest(self.store, self.recipe.id, node.name, self._refs_at_start)
        if step.parts is None or step.key != key:  # planned before its inputs were known: say what changed
            step.reasons = explain(parts, previous)
        reused = self._reuse(node, key, "identical result already in the store")
        if reused is not None:
            return reused
        if stage.check is not None:
            try:
                stage.check(node.params_model)
            except StageSkipped as exc:
                return self._skipped(node.name, node.stage, key, exc.reason, exc.needs)
            except TrtflowError as exc:
                return NodeResult(node.name, node.stage, FAILED, step.reason, key, error=exc.message, hint=exc.hint)
        lock = self._key_lock(node.name, key)
        if isinstance(lock, NodeResult):
            return lock
        try:
            reused = self._reuse(node, key, "built meanwhile by another trtflow run")
            if reused is not None:
                return reused
            if self._pull(node, key):
                reused = self._reuse(node, key, f"pulled from the remote cache {self.remote.url}")
                if reused is not None:
                    return reused
            return self._build(step, parts, key, allocation, previous, started)
        finally:
            lock.release()

    def _pull(self, node: ConcreteNode, key: str) -> bool:
        """Fetch the node's result from the remote cache, verified; False if it has none (or a damaged one)."""
        if self.remote is None:
            return False
        from trtflow.storage.remote import RemoteError

        try:
            manifest = self.remote.get_manifest(key)
            if manifest is None:
                return False
            self.hooks.on_node_waiting(node.name, f"pulling from the remote cache {self.remote.url}")
            self.remote.pull(manifest, self.store, self.journal)
            return True
        except RemoteError as exc:
            self._warnings.append(f"{node.name}: not taken from the remote cache: {exc.message}")
            return False
        except OSError as exc:
            self._warnings.append(f"{node.name}: pulling from the remote cache failed: {exc.strerror or exc}")
            return False

    def _push(self, node: str, key: str, force: bool = False) -> None:
        """Upload a committed result (``force``: also under --no-push, for workers that read inputs there)."""
        if self.remote is None or not (self.options.push or force):
            return
        from trtflow.storage.remote import RemoteError

        try:
            self.remote.push(key, self.store, self.journal)
        except (RemoteError, TrtflowError) as exc:
            self._warnings.append(f"{node}: not pushed to the remote cache: {exc.message}")
        except OSError as exc:
            self._warnings.append(f"{node}: pushing to the remote cache failed: {exc.strerror or exc}")

    def _key_lock(self, node: str, key: str) -> Any:
        from filelock import FileLock, Timeout

        lock = FileLock(str(self.store.lock_path(key)))
        try:
            lock.acquire(timeout=0)
            return lock
        except Timeout:
            pass
        self.hooks.on_node_waiting(node, "another trtflow run is building it; waiting")
        deadline = time.monotonic() + self.options.lock_timeout
        while time.monotonic() < deadline:
            if self._cancel.is_set():
                return NodeResult(node, self.graph.nodes[node].stage, INTERRUPTED, "interrupted", key)
            try:
                lock.acquire(timeout=0.5)
                return lock
            except Timeout:
                continue
        return NodeResult(node, self.graph.nodes[node].stage, FAILED, "", key,
                          error=f"waited {self.options.lock_timeout:g} s for another trtflow run building this node",
                          hint=f"check for a stuck run (`trtflow status`); its lock is {self.store.lock_path(key)}")

    def _reuse(self, node: ConcreteNode, key: str, why: str) -> NodeResult | None:
        manifest = self.store.read_manifest(key)
        if manifest is None or not self.store.intact(manifest, self.journal):
            return None
        self._remember_outputs(node.name, manifest)
        self._record_refs({node.name: key})
        res = NodeResult(node.name, node.stage, CACHED, why, key, summary=manifest.get("summary", {}))
        return self._deliver(res, manifest)

    def _deliver(self, res: NodeResult, manifest: dict[str, Any]) -> NodeResult:
        """Copy a committed node's outputs under build/ and judge its gate; a copy that fails fails the node."""
        try:
            res.outputs = self._materialize(res.node, manifest)
        except OSError as exc:
            err = materialize_error(res.node, self._out_dir(res.node), exc)
            res.status, res.error, res.hint = FAILED, err.message, err.hint
            return res
        return self._apply_gate(res, manifest)

    def _apply_gate(self, res: NodeResult, manifest: dict[str, Any]) -> NodeResult:
        failures = judge(self.graph, self.graph.nodes[res.node], manifest, self.kctx)
        if self.graph.stages[self.graph.nodes[res.node].stage].gate is not None:
            self._verdicts[res.node] = failures
        if failures:
            res.status, res.error, res.hint = GATE_FAILED, "; ".join(failures), GATE_HINT
        return res

    def _skipped(self, node: str, stage: str, key: str | None, reason: str, needs: str | None) -> NodeResult:
        if self.options.require_gpu:
            return NodeResult(node, stage, FAILED, "backend unavailable", key,
                              error=f"{reason} (and --require-gpu was given)", hint=needs)
        return NodeResult(node, stage, SKIPPED, reason, key, error=reason, hint=needs)

    def _build(self, step: Step, parts: KeyParts, key: str, allocation: Allocation,
               previous: dict[str, Any] | None, started: float) -> NodeResult:
        node = step.node
        stage = self.graph.stages[node.stage]
        log_path = self.store.log_path(self.run_id, node.name)
        scratch = self.store.tmp_dir / self.run_id / node.name

        def failed(error: str, hint: str | None = None, **extra: Any) -> NodeResult:
            return NodeResult(node.name, node.stage, FAILED, step.reason, key, log_path=log_path, error=error,
                              hint=hint, **extra)

        try:
            if scratch.exists():
                shutil.rmtree(scratch)
            scratch.mkdir(parents=True)
            log_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return failed(f"cannot prepare the node's scratch space: {exc.strerror or exc}",
                          "free disk space or fix the store's permissions")
        self._scratch[node.name], self._started[node.name] = scratch, started
        self.hooks.on_node_start(node.name, step.reason)
        self._journal(f"recording node {node.name}", lambda: self.journal.node_state(
            self.run_id, node.name, node.stage, key, "running", step.reason, started=started,
            log_path=str(log_path)))
        try:
            input_objects: dict[str, dict[str, dict[str, Any]]] = {}
            try:
                if getattr(self.executor, "remote_inputs", False):
                    inputs, input_objects = self._remote_inputs(node)
                else:
                    inputs = self._link_inputs(node, scratch)
            except TrtflowError as exc:
                return failed(exc.message, exc.hint)
            except OSError as exc:
                return failed(f"cannot place the node's inputs: {exc.strerror or exc}", "free disk space")
            previous_summary = (previous or {}).get("summary") if (previous or {}).get("key") != key else None
            job = Job(run_id=self.run_id, node=node.name, stage=node.stage, params=node.params, inputs=inputs,
                      scratch=str(scratch), recipe_dir=str(self.kctx.recipe_dir), cache_dir=str(self.store.cache_dir),
                      log_path=str(log_path), facts=parts.facts,
                      allowed_roots=[str(p) for p in self.kctx.allowed_roots],
                      device=allocation.device.visible_id if allocation.device else None,
                      previous_summary=previous_summary, timeout=node.timeout, preload=list(stage.preload),
                      parent_pid=os.getpid(), input_objects=input_objects,
                      input_sources=self._judged_sources(node.name))
            try:
                outcome = self.executor.execute(job, self._cancel)
            except OSError as exc:
                return failed(f"could not start the stage process: {exc.strerror or exc}",
                              "free disk space and memory, then run again")
            if outcome.status == protocol.CRASHED and (scratch / NATIVE_STEP_FILE).exists():
                self._keep_for_repro(node.name, scratch, outcome)
            return self._conclude(step, parts, key, outcome, job, log_path, previous_summary, started)
        finally:
            self._scratch.pop(node.name, None)
            shutil.rmtree(scratch, ignore_errors=True)

    def _keep_for_repro(self, node: str, scratch: Path, outcome: Outcome) -> None:
        """Keep a crashed node's scratch (its inputs) where the reproduction command can still find them."""
        kept = self.store.root / "crashes" / self.run_id / node
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(scratch), kept)
        except OSError:
            return
        for field_name in ("error", "hint"):
            text = getattr(outcome, field_name)
            if text:
                setattr(outcome, field_name, text.replace(str(scratch), str(kept)))

    def _conclude(self, step: Step, parts: KeyParts, key: str, outcome: Outcome, job: Job, log_path: Path,
                  previous_summary: dict[str, Any] | None, started: float) -> NodeResult:
        node = step.node
        stage = self.graph.stages[node.stage]
        common = {"log_path": log_path, "peak_rss": outcome.peak_rss}
        if outcome.status == protocol.INTERRUPTED or self._cancel.is_set():
            return NodeResult(node.name, node.stage, INTERRUPTED, "interrupted", key, **common)
        if outcome.status == protocol.SKIPPED:
            res = self._skipped(node.name, node.stage, key, outcome.error or "", outcome.hint)
            res.log_path = log_path
            return res
        if outcome.status == protocol.GATE_FAILED:
            return NodeResult(node.name, node.stage, GATE_FAILED, step.reason, key, error=outcome.error,
                              hint=outcome.hint, summary=outcome.summary, **common)
        if outcome.status != protocol.OK:
            return NodeResult(node.name, node.stage, FAILED, step.reason, key, error=outcome.error,
                              hint=outcome.hint, summary=outcome.summary, **common)
        if outcome.stored_outputs is not None:
            return self._commit_stored(step, parts, key, outcome, log_path, previous_summary, started)
        missing = [n for n, o in stage.outputs.items() if not o.optional and not (job.out_dir / o.filename).exists()]
        if missing:
            return NodeResult(node.name, node.stage, FAILED, step.reason, key,
                              error=f"stage {node.stage!r} finished without writing outputs {missing}", **common)
        manifest = dict(parts.as_manifest(), node=node.name, recipe=self.recipe.name, recipe_id=self.recipe.id,
                        summary=outcome.summary, run_id=self.run_id, started=started,
                        duration=time.time() - started, previous_summary=previous_summary,
                        peak_rss=outcome.peak_rss)
        outputs_spec = {n: (o.filename, o.kind) for n, o in stage.outputs.items()}
        try:
            manifest = self.store.commit(key, manifest, job.out_dir, outputs_spec, self.journal)
        except OSError as exc:
            return NodeResult(node.name, node.stage, FAILED, step.reason, key,
                              error=f"the stage finished, but storing its outputs failed: {exc.strerror or exc}",
                              hint="free disk space or fix the store's permissions, then run again: nothing was "
                              "committed for this node and finished nodes are intact", **common)
        return self._committed(node, key, manifest, step.reason, common)

    def _committed(self, node: ConcreteNode, key: str, manifest: dict[str, Any], reason: str,
                   common: dict[str, Any]) -> NodeResult:
        self._remember_outputs(node.name, manifest)
        self._record_refs({node.name: key})
        self._push(node.name, key)
        res = NodeResult(node.name, node.stage, DONE, reason, key, summary=manifest.get("summary", {}), **common)
        return self._deliver(res, manifest)

    def _commit_stored(self, step: Step, parts: KeyParts, key: str, outcome: Outcome, log_path: Path,
                       previous_summary: dict[str, Any] | None, started: float) -> NodeResult:
        """Commit outputs an executor already put in the remote cache: pull them (verified), then the manifest."""
        from trtflow.storage.remote import RemoteError

        node = step.node
        common = {"log_path": log_path, "peak_rss": outcome.peak_rss}
        assert self.remote is not None and outcome.stored_outputs is not None
        try:
            self.remote.pull_objects(outcome.stored_outputs, self.store, self.journal, node=node.name)
            manifest = dict(parts.as_manifest(), node=node.name, recipe=self.recipe.name, recipe_id=self.recipe.id,
                            summary=outcome.summary, run_id=self.run_id, started=started,
                            duration=time.time() - started, previous_summary=previous_summary,
                            peak_rss=outcome.peak_rss, outputs=outcome.stored_outputs, key=key,
                            format=2, committed=time.time())
            self.store.write_manifest(key, manifest)
        except RemoteError as exc:
            return NodeResult(node.name, node.stage, FAILED, step.reason, key, error=exc.message, hint=exc.hint,
                              **common)
        except OSError as exc:
            return NodeResult(node.name, node.stage, FAILED, step.reason, key,
                              error=f"the stage finished, but storing its outputs failed: {exc.strerror or exc}",
                              hint="free disk space, then run again", **common)
        return self._committed(node, key, manifest, step.reason, common)

    def _remote_inputs(self, node: ConcreteNode
                       ) -> tuple[dict[str, str | list[str]], dict[str, dict[str, dict[str, Any]]]]:
        """For executors whose workers fetch inputs from the remote cache: which objects each slot needs (pushed
        there first if this store has them from an earlier run), and the file name of each slot's input."""
        assert self.remote is not None
        inputs: dict[str, str | list[str]] = {}
        objects: dict[str, dict[str, dict[str, Any]]] = {}
        specs = self.graph.stages[node.stage].inputs
        for slot, refs in node.upstream.items():
            names = []
            for src_node, out_name in refs:
                # a many-slot's artifacts each get their own folder, in/<slot>/<producer node>/
                place = f"{slot}/{src_node}" if specs[slot].many else slot
                self._push(src_node, self._keys[src_node], force=True)  # first: a sha256 remote records its names
                manifest = self.store.read_manifest(self._keys[src_node]) or {}
                objects[place] = dict(manifest.get("outputs", {}))
                names.append(f"{src_node}/{objects[place][out_name]['filename']}" if specs[slot].many
                             else objects[place][out_name]["filename"])
            inputs[slot] = names if specs[slot].many else names[0]
        return inputs, objects

    def _link_inputs(self, node: ConcreteNode, scratch: Path) -> dict[str, str | list[str]]:
        """Hard-link each input into ``scratch/in/<slot>/``, with the source node's other outputs beside it.

        Siblings travel along so that companion files stay together: an ONNX model's external weights
        (``model.onnx_data``) or an engine's provenance manifest (``engine.json``). Objects are immutable and
        checked against their digest before use (re-hashed when their size, mtime or inode changed). A many-slot
        gets a list: each artifact in ``scratch/in/<slot>/<producer node>/``.
        """
        inputs: dict[str, str | list[str]] = {}
        specs = self.graph.stages[node.stage].inputs
        for slot, refs in node.upstream.items():
            if specs[slot].many:
                inputs[slot] = [self._link_one(src, out, scratch / "in" / slot / src) for src, out in refs]
            else:
                inputs[slot] = self._link_one(*refs[0], scratch / "in" / slot)
        return inputs

    def _link_one(self, src_node: str, out_name: str, folder: Path) -> str:
        stage = self.graph.stages[self.graph.nodes[src_node].stage]
        folder.mkdir(parents=True, exist_ok=True)
        for name, out in stage.outputs.items():
            digest = self._digests.get((src_node, name))
            if digest is None:
                continue
            source = self.store.object_path(digest)
            # re-hashed in full, not trusted on its (size, mtime, inode): a stage never reads damaged bytes
            if not self.store.object_intact(digest, self._sizes.get((src_node, name), -1)):
                raise TrtflowError(
                    f"the stored output {src_node}.{name} ({source}) is missing or changed after it was "
                    "committed; it is not used",
                    hint="run `trtflow verify --fix`, then run again: the damaged node is rebuilt")
            target = folder / out.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, target)
            except OSError:
                shutil.copyfile(source, target)
        return str(folder / stage.outputs[out_name].filename)

    def _judged_sources(self, node: str) -> dict[str, list[dict[str, Any]]]:
        """Where each input comes from, with the producer's gate verdict as judged now (thresholds may have
        changed since its files were written)."""
        sources = self.graph.input_sources(node)
        for entries in sources.values():
            for entry in entries:
                if entry["node"] in self._verdicts:
                    entry["gate_failures"] = list(self._verdicts[entry["node"]])
        return sources

    def _usable(self, consumer: ConcreteNode, producer: str, result: NodeResult) -> bool:
        """A producer's outputs may feed ``consumer``: it succeeded, or its gate failed on committed outputs and
        every slot it feeds accepts that (a chooser excludes the candidate instead of being blocked)."""
        if result.status in SUCCESS:
            return True
        if result.status != GATE_FAILED:
            return False
        specs = self.graph.stages[consumer.stage].inputs
        feeds = [(slot, out) for slot, refs in consumer.upstream.items() for src, out in refs if src == producer]
        return all(specs[slot].accept_gate_failed and (producer, out) in self._digests for slot, out in feeds)

    def _gate_failure_absorbed(self, result: NodeResult) -> bool:
        """A failed gate whose committed outputs only feed slots that accept them (candidates of a chooser)
        does not stop a fail-fast run: the chooser still runs and reports the excluded candidate."""
        consumers = self.graph.downstream(result.node)
        return result.status == GATE_FAILED and bool(consumers) and all(
            self._usable(self.graph.nodes[c], result.node, result) for c in consumers)


def upstream_pending(upstream: list[str], results: dict[str, NodeResult]) -> bool:
    return any(u not in results for u in upstream)


def _open_remote(url: str | None, digest: str | None = None) -> Any:
    if not url:
        return None
    from trtflow.storage.remote import RemoteCache

    return RemoteCache(url, digest=digest)


def _make_executor(options: RunOptions, store: Store, run_id: str) -> Executor:
    if options.executor == "inline":
        from trtflow.execution.local import InlineExecutor

        return InlineExecutor()
    if options.executor == "ray":
        from trtflow.execution.ray_executor import RayExecutor

        return RayExecutor(store, options)
    from trtflow.execution.local import LocalExecutor

    return LocalExecutor(store.root, options.kill_grace, server_log=store.root / "logs" / run_id / "fork-server.log")


def _last_progress(path: Path) -> tuple[float | None, str]:
    try:
        lines = read_tail(path, 4096).strip().splitlines()
        last = json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError, IndexError):
        return None, ""
    return last.get("fraction"), str(last.get("message", ""))


def _rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None
