"""Execute a plan: the `Runner` wires a run's parts together and sees the run through from start to end.

The parts, each in its own module:
  ``loop``        schedules ready nodes by resources, hands each to a node thread, waits (the run's thread)
  ``lifecycle``   one node's life: key, reuse, lock, pull, build, commit, push, deliver, gate (a node's thread)
  ``build``       a node's scratch, inputs (``inputs``) and job, the executor's outcome made a commit or an error
  ``ledger``      what each node produced, owned by the run's thread; node threads get frozen views
  ``observers``   journal, refs and the user's hooks, attached to the run's events; ``progress``: live progress
  ``signals``     Ctrl-C and SIGTERM set the run's cancel event; ``memory``: a node's memory need
  ``local``, ``ray_executor``: where a node runs (``protocol``: the job in, the outcome out)
The runner holds the store lock (shared) for the whole run, ends the run in the journal and folds the refs
whatever way the run ends: done, failed, interrupted, or stopped by an error (a Ray cluster that cannot be
reached, a hook that raised), which it re-raises after that.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from trtflow.environment import Environment
from trtflow.execution.context import RunContext
from trtflow.execution.ledger import Ledger, Produced
from trtflow.execution.observers import HistoryObserver, HooksObserver, JournalObserver, Observers, RefsObserver
from trtflow.execution.outcome import rejections, shipments
from trtflow.execution.progress import ProgressBoard
from trtflow.execution.protocol import Executor
from trtflow.execution.results import (
    GATE_FAILED,
    INTERRUPTED,
    Hooks,
    NodeResult,
    Notes,
    RunOptions,
    RunSummary,
    new_run_id,
)
from trtflow.execution.signals import cancel_on_signals
from trtflow.graph import Graph
from trtflow.node_keys import KeyContext
from trtflow.plan import FRESH, Step
from trtflow.storage.confined.folders import RunFolders
from trtflow.storage.journal import Journal
from trtflow.storage.lock import SHARED, StoreLock
from trtflow.storage.refs import RecipeIdentity
from trtflow.storage.store import Store, materialize_error


class Runner:
    def __init__(self, graph: Graph, store: Store, env: Environment, recipe: RecipeIdentity, journal: Journal,
                 options: RunOptions | None = None, hooks: Hooks | None = None,
                 executor: Executor | None = None, recipe_nodes: list[str] | None = None) -> None:
        self.graph = graph
        self.store = store
        self.recipe = recipe
        self.journal = journal
        self.options = options or RunOptions()
        self.hooks = hooks or Hooks()
        self.run_id = new_run_id()
        self.notes = Notes()
        self.board = ProgressBoard()
        nodes = list(recipe_nodes if recipe_nodes is not None else graph.nodes)
        self.journal_observer = JournalObserver(journal, self.run_id, recipe, self.options.command, self.notes)
        self.observers = Observers([
            self.journal_observer,
            HistoryObserver(journal, graph, self.run_id, recipe, self.notes),
            RefsObserver(store.refs, recipe, self.run_id, nodes, self.notes),
            self.board,
            HooksObserver(self.hooks),
        ])
        executor = executor or make_executor(self.options, store, self.run_id)
        folders = RunFolders(store.tree, self.run_id)
        if hasattr(executor, "use_folders"):
            executor.use_folders(folders)
        cache = open_remote(self.options.remote, self.options.remote_digest, self.options.remote_namespace,
                            self.options.remote_read_namespaces)
        transfer_url = getattr(executor, "transfer", None)
        transfer = cache if cache is not None and transfer_url == cache.url else open_remote(transfer_url)
        self.ctx = RunContext(graph=graph, store=store, recipe=recipe, run_id=self.run_id, options=self.options,
                              kctx=KeyContext.for_recipe(recipe.path.parent, env, journal), journal=journal,
                              executor=executor, observers=self.observers, notes=self.notes,
                              cancel=threading.Event(), cache=cache, transfer=transfer, folders=folders,
                              refs_at_start=store.refs.current(recipe.id))

    @property
    def executor(self) -> Executor:
        return self.ctx.executor

    def run(self, steps: list[Step]) -> RunSummary:
        self.store.ensure()
        for remote in {id(r): r for r in (self.ctx.cache, self.ctx.transfer) if r is not None}.values():
            remote.check()  # an unreachable or foreign remote stops the run before any work
        results: dict[str, NodeResult] = {}
        summary = RunSummary(self.run_id, results)
        ledger = Ledger()  # owned by this thread, which runs the loop
        with StoreLock(self.store.tree).held(SHARED, f"trtflow run {self.recipe.id} (run {self.run_id})",
                                             on_wait=lambda msg: self.observers.node_waiting("(store)", msg)):
            self.journal_observer.reap_dead_runs(self.store)
            with cancel_on_signals(self.ctx.cancel):
                status = "failed"  # what the journal says if anything below raises
                try:
                    try:
                        self.observers.run_started(self.run_id, steps)
                        self._record_fresh([s for s in steps if s.status == FRESH], results, ledger)
                        pending = [s for s in steps if s.status != FRESH]
                        self._stop_if_cancelled()
                        summary.cleared = self._retract_outdated(pending)
                        self._stop_if_cancelled()
                        if pending:  # a no-op run loads no scheduler, no node lifecycle
                            from trtflow.execution.lifecycle import Lifecycle
                            from trtflow.execution.loop import Loop

                            Loop(self.ctx, Lifecycle(self.ctx), ledger, self.board).run(pending, results)
                    except KeyboardInterrupt:  # a signal (see signals) or Ctrl-C inside a library
                        summary.interrupted = True
                    summary.interrupted = summary.interrupted or self.ctx.cancel.is_set()
                    if summary.interrupted:
                        self._interrupt_the_rest(steps, summary)
                    summary.rejected = rejections(self.graph, results)
                    summary.shipped = shipments(self.graph, results)
                    summary.require_all_candidates = self.options.require_all_candidates
                    status = "interrupted" if summary.interrupted else (
                        "ok" if summary.ok and not self.notes.problems else "failed")
                finally:
                    self._end(status)
        summary.problems = self.notes.problems
        summary.warnings = self.notes.warnings
        if self.ctx.cache is not None:
            summary.remote = self.ctx.remote_tally.summary(self.ctx.cache.url, self.options.push)
        return summary

    def _end(self, status: str) -> None:
        """Release the executor, free the run's scratch space, then end the run in the journal and fold the refs;
        each step happens even if the one before it fails."""
        try:
            self.ctx.executor.close()
        finally:
            try:
                if self.ctx.folders is not None:  # None: a context made by hand
                    self.ctx.folders.close()  # frees space a full disk needs; through descriptors held from the start
            except OSError:
                pass
            self.observers.run_ended(status)

    def _stop_if_cancelled(self) -> None:
        if self.ctx.cancel.is_set():
            raise KeyboardInterrupt

    def _interrupt_the_rest(self, steps: list[Step], summary: RunSummary) -> None:
        self.ctx.executor.interrupt()
        rest = [NodeResult(s.node.name, s.node.stage, INTERRUPTED, "interrupted before it finished")
                for s in steps if s.node.name not in summary.results]
        for res in rest:
            summary.results[res.node] = res
        self.observers.nodes_not_run(rest)

    def _record_fresh(self, fresh: list[Step], results: dict[str, NodeResult], ledger: Ledger) -> None:
        """The plan's up-to-date nodes: in the ledger, their outputs under build/, their gates judged as planned."""
        done = []
        note = getattr(self.journal, "note_dep_set", None)
        for step in fresh:
            name = step.node.name
            manifest = step.manifest or {}
            if note is not None and step.parts is not None and step.parts.runs_code and step.key is not None:
                note(step.parts.pre_key, step.parts.dep_set)  # the set the plan found it by: found again next time
            has_gate = self.graph.stages[step.node.stage].gate is not None
            ledger.record(name, Produced.from_manifest(manifest, list(step.gate_failures) if has_gate else None))
            outputs: dict[str, Path] = {}
            error = "; ".join(step.gate_failures) or None
            hint = None
            if error:
                from trtflow.execution.lifecycle import gate_hint

                hint = gate_hint(step.verdicts)
            if self.options.output_dir is not None:
                try:
                    outputs = self.store.materialize(manifest, self.options.output_dir / name,
                                                     self.options.output_base)
                except OSError as exc:
                    self.notes.problem(materialize_error(name, self.options.output_dir / name, exc).message)
            res = NodeResult(name, step.node.stage, GATE_FAILED if error else FRESH, step.reason, step.key,
                             error=error, hint=hint, outputs=outputs,
                             summary=manifest.get("summary", {}), verdicts=list(step.verdicts))
            results[name] = res
            done.append(res)
        self.observers.nodes_up_to_date(done)

    def _retract_outdated(self, pending: list[Step]) -> list[str]:
        """Remove outputs under build/ that belong to a previous key of a node that is about to change."""
        if self.options.output_dir is None:
            return []
        cleared = []
        for step in pending:
            try:
                removed = self.store.retract(self.options.output_dir / step.node.name, f"outdated: {step.reason}",
                                             self.options.output_base)
            except OSError:
                continue
            if removed:
                cleared.append(step.node.name)
        return cleared


def open_remote(url: str | None, digest: str | None = None, namespace: str | None = None,
                also_read: tuple[str, ...] = ()) -> Any:
    """A remote cache (``digest``: the hash it must name objects by; None: what its format.json says), seen from
    ``namespace`` and also reading ``also_read`` (`remote.namespaces`) when they are named."""
    if not url:
        return None
    if namespace or also_read:
        from trtflow.storage.remote.namespaces import NamespacedRemote

        return NamespacedRemote(url, namespace, digest=digest, also_read=also_read)
    from trtflow.storage.remote import RemoteCache

    return RemoteCache(url, digest=digest)


def make_executor(options: RunOptions, store: Store, run_id: str) -> Executor:
    if options.executor == "inline":
        from trtflow.execution.local import InlineExecutor

        return InlineExecutor()
    if options.executor == "ray":
        from trtflow.execution.ray_executor import RayExecutor

        return RayExecutor(store, options, run_id)
    from trtflow.execution.local import LocalExecutor

    return LocalExecutor(store.root, options.kill_grace, server_log=store.root / "logs" / run_id / "fork-server.log")
