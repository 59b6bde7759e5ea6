"""The run's observers: journal, refs and the user's hooks hear the run's events instead of being called by it.

Events, and the thread each one comes from:
  ``run_started(run_id, steps)``       the run's thread, before any node
  ``nodes_up_to_date(results)``        the run's thread: the plan's fresh nodes, before the loop starts
  ``node_started(start)``              the node's thread, once its scratch space exists and before its stage runs
  ``node_waiting(node, message)``      the node's thread (a key lock, a pull), or the run's thread (the store lock)
  ``result_used(node, key)``           the node's thread, right after the node committed or reused a result and
                                       before the node's end is reported: what gc must keep is durable first
  ``node_progress(node, progress)``    the run's thread
  ``node_ended(result)``               the run's thread
  ``nodes_not_run(results)``           the run's thread: an interrupted run's nodes that never ended
  ``run_ended(status)``                the run's thread, always, also when the run dies of an error
Each observer guards its own state: the journal runs one statement at a time (its lock), refs are appended under
the recipe's file lock and `RefsObserver` keeps its set of used keys under a lock, `Notes` holds a lock, and
`HooksObserver` forwards to the user's `Hooks`, whose documentation says which thread calls what.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtflow.errors import StoreError
from trtflow.execution.results import Hooks, NodeResult, Notes, Progress

if TYPE_CHECKING:
    from trtflow.graph import Graph
    from trtflow.plan import Step
from trtflow.storage.confined.tree import Tree
from trtflow.storage.journal import Journal
from trtflow.storage.refs import RecipeIdentity, RefStore
from trtflow.storage.store import Store
from trtflow.verdicts import with_verdicts


@dataclass(frozen=True)
class NodeStart:
    """A node about to run its stage."""

    node: str
    stage: str
    key: str
    reason: str
    started: float
    log_path: Path
    scratch: Path  # shown; its files are read through ``folder``
    folder: Tree | None = None  # the node's scratch folder, held by the runner while the node runs


def guarded(notes: Notes, doing: str, action: Callable[[], Any]) -> Any:
    """Run a journal statement; a failure (full disk, ...) is recorded as a run problem and None returned."""
    try:
        return action()
    except StoreError as exc:
        notes.problem(exc.message + (f" (hint: {exc.hint})" if exc.hint else ""))
    except OSError as exc:
        notes.problem(f"{doing} failed: {exc.strerror or exc}")
    return None


class RunObserver:
    """Hears a run's events; every method is optional to override."""

    def run_started(self, run_id: str, steps: list[Step]) -> None: ...
    def nodes_up_to_date(self, results: list[NodeResult]) -> None: ...
    def node_started(self, start: NodeStart) -> None: ...
    def node_waiting(self, node: str, message: str) -> None: ...
    def result_used(self, node: str, key: str) -> None: ...
    def node_progress(self, node: str, progress: Progress) -> None: ...
    def node_ended(self, result: NodeResult) -> None: ...
    def nodes_not_run(self, results: list[NodeResult]) -> None: ...
    def run_ended(self, status: str) -> None: ...


class Observers(RunObserver):
    """Passes each event to every observer, in order (the journal first: a hook sees what is recorded)."""

    def __init__(self, observers: Sequence[RunObserver]) -> None:
        self.observers = list(observers)

    def run_started(self, run_id: str, steps: list[Step]) -> None:
        for o in self.observers:
            o.run_started(run_id, steps)

    def nodes_up_to_date(self, results: list[NodeResult]) -> None:
        for o in self.observers:
            o.nodes_up_to_date(results)

    def node_started(self, start: NodeStart) -> None:
        for o in self.observers:
            o.node_started(start)

    def node_waiting(self, node: str, message: str) -> None:
        for o in self.observers:
            o.node_waiting(node, message)

    def result_used(self, node: str, key: str) -> None:
        for o in self.observers:
            o.result_used(node, key)

    def node_progress(self, node: str, progress: Progress) -> None:
        for o in self.observers:
            o.node_progress(node, progress)

    def node_ended(self, result: NodeResult) -> None:
        for o in self.observers:
            o.node_ended(result)

    def nodes_not_run(self, results: list[NodeResult]) -> None:
        for o in self.observers:
            o.nodes_not_run(results)

    def run_ended(self, status: str) -> None:
        """Every observer hears it, even if an earlier one fails; the first failure is raised afterwards."""
        failure: BaseException | None = None
        for o in self.observers:
            try:
                o.run_ended(status)
            except Exception as exc:
                failure = failure or exc
        if failure is not None:
            raise failure


class JournalObserver(RunObserver):
    """Records the run and its nodes in the journal. A failed write (full disk, ...) is a run problem, never an
    exception, except the run's first record: a journal that cannot be written stops the run before any work."""

    def __init__(self, journal: Journal, run_id: str, recipe: RecipeIdentity, command: str, notes: Notes) -> None:
        self.journal = journal
        self.run_id = run_id
        self.recipe = recipe
        self.command = command
        self.notes = notes
        self._started = False

    def guarded(self, doing: str, action: Callable[[], Any]) -> Any:
        return guarded(self.notes, doing, action)

    def reap_dead_runs(self, store: Store) -> None:
        """Mark runs whose process died (kill -9, power loss) as killed and drop their scratch space."""
        import os

        from trtflow.storage.lock import pid_alive

        host = os.uname().nodename
        for run_id, pid, run_host in self.guarded("reading running runs", self.journal.running_runs) or []:
            if run_host == host and pid and not pid_alive(pid):
                self.guarded("recording a dead run", functools.partial(self.journal.mark_dead, run_id))
                try:
                    store.tree.remove_tree(store.scratch_rel(run_id))  # a run id is a plain name (journal.py)
                except OSError:
                    pass

    def run_started(self, run_id: str, steps: list[Step]) -> None:
        self.journal.start_run(self.run_id, self.recipe.name, str(self.recipe.path), self.command, self.recipe.id)
        self._started = True

    def nodes_up_to_date(self, results: list[NodeResult]) -> None:
        import json

        rows = [(self.run_id, r.node, r.stage, r.key, r.status, r.reason,
                 json.dumps(recorded) if (recorded := with_verdicts(r.summary, r.verdicts)) else None)
                for r in results]
        self.guarded("recording up-to-date nodes", lambda: self.journal.record_nodes(rows))

    def node_started(self, start: NodeStart) -> None:
        self.guarded(f"recording node {start.node}", lambda: self.journal.node_state(
            self.run_id, start.node, start.stage, start.key, "running", start.reason, started=start.started,
            log_path=str(start.log_path)))

    def node_ended(self, result: NodeResult) -> None:
        res = result
        self.guarded(f"recording node {res.node}", lambda: self.journal.node_state(
            self.run_id, res.node, res.stage, res.key, res.status, res.reason, started=res.started,
            ended=time.time() if res.started else None, log_path=str(res.log_path) if res.log_path else None,
            error=res.error, summary=with_verdicts(res.summary, res.verdicts) or None))
        if res.peak_rss:
            peak = res.peak_rss
            self.guarded("recording memory", lambda: self.journal.set_peak_rss(self.run_id, res.node, peak))

    def nodes_not_run(self, results: list[NodeResult]) -> None:
        for res in results:
            self.node_ended(res)

    def run_ended(self, status: str) -> None:
        if self._started:
            self.guarded("recording the end of the run", lambda: self.journal.end_run(self.run_id, status))


class HistoryObserver(RunObserver):
    """Adds the figures of every result the run used to the recipe's history (`trtflow.history.record.rows_of`),
    once per measurement. A failed write is a run problem; a stage whose ``figures`` raises gets a warning."""

    def __init__(self, journal: Journal, graph: Graph, run_id: str, recipe: RecipeIdentity, notes: Notes) -> None:
        self.journal = journal
        self.graph = graph
        self.run_id = run_id
        self.recipe = recipe
        self.notes = notes

    def _record(self, results: Sequence[NodeResult]) -> None:
        from trtflow.history.record import RunInfo, rows_of

        run = RunInfo(self.run_id, self.recipe.id)
        rows: list[dict[str, Any]] = []
        for res in results:
            node = self.graph.nodes.get(res.node)
            stage = self.graph.stages.get(res.stage)
            if node is None or stage is None or stage.figures is None:
                continue
            try:
                rows += rows_of(run, res, stage, node.params_model)
            except Exception as exc:  # the stage's code: its failure must not fail a run whose results are stored
                self.notes.warning(f"{res.node}: its figures were not added to the history: stage {res.stage}'s "
                                   f"figures() failed: {type(exc).__name__}: {exc}")
        if rows:
            guarded(self.notes, "recording the history of figures", lambda: self.journal.add_history(rows))

    def nodes_up_to_date(self, results: list[NodeResult]) -> None:
        self._record(results)

    def node_ended(self, result: NodeResult) -> None:
        self._record([result])


class RefsObserver(RunObserver):
    """Records which result each node used (gc's roots): each one durably as it is used (`RefStore.record`),
    and all of them folded into the recipe's refs at the start (up-to-date nodes) and at the end of the run."""

    def __init__(self, refs: RefStore, recipe: RecipeIdentity, run_id: str, recipe_nodes: list[str],
                 notes: Notes) -> None:
        self.refs = refs
        self.recipe = recipe
        self.run_id = run_id
        self.recipe_nodes = recipe_nodes
        self.notes = notes
        self._lock = threading.Lock()
        self._used: dict[str, str] = {}

    def _failed(self, exc: OSError | StoreError) -> None:
        detail = exc.strerror if isinstance(exc, OSError) else exc.message
        self.notes.problem(f"could not record which results this run used (refs): {detail}; the results are "
                           "stored, but `trtflow gc` could remove them until a run records them")

    def _fold(self) -> None:
        with self._lock:
            used = dict(self._used)
        try:
            self.refs.update(self.recipe, self.run_id, self.recipe_nodes, used)
        except (OSError, StoreError) as exc:
            self._failed(exc)

    def nodes_up_to_date(self, results: list[NodeResult]) -> None:
        with self._lock:
            self._used.update({r.node: r.key for r in results if r.key})
        self._fold()

    def result_used(self, node: str, key: str) -> None:
        with self._lock:
            self._used[node] = key
        try:
            self.refs.record(self.recipe, self.run_id, {node: key})
        except (OSError, StoreError) as exc:
            self._failed(exc)

    def run_ended(self, status: str) -> None:
        self._fold()


class HooksObserver(RunObserver):
    """Forwards events to the user's `Hooks` (the console's live output, or a caller's own)."""

    def __init__(self, hooks: Hooks) -> None:
        self.hooks = hooks

    def run_started(self, run_id: str, steps: list[Step]) -> None:
        self.hooks.on_run_start(run_id, steps)

    def nodes_up_to_date(self, results: list[NodeResult]) -> None:
        for res in results:
            # up to date, but its cached measurements fail the gate as it stands now, or a gate could not decide
            # (on_inconclusive: warn): say so
            if res.error or any(v.primary and v.outcome == "inconclusive" for v in res.verdicts):
                self.hooks.on_node_end(res)

    def node_started(self, start: NodeStart) -> None:
        self.hooks.on_node_start(start.node, start.reason)

    def node_waiting(self, node: str, message: str) -> None:
        self.hooks.on_node_waiting(node, message)

    def node_progress(self, node: str, progress: Progress) -> None:
        self.hooks.on_node_progress(node, progress)

    def node_ended(self, result: NodeResult) -> None:
        self.hooks.on_node_end(result)
