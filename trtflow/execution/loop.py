"""The scheduling loop: it decides what may start now, hands it to a node thread, and waits. Nothing else.

Ownership: the loop runs on the run's thread and is the only one to touch what it schedules with: the waiting and
running nodes, the results, the scheduler's allocations and the `Ledger`. A node thread gets its step, its
allocation and a frozen `Upstream` view, and gives back a `Finished`; the loop records it (ledger first, then the
result, then the ``node_ended`` event) before it looks at the next ready node, so a consumer is only ever handed
out after everything it reads has been recorded.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from trtflow.environment import gpus
from trtflow.execution.context import RunContext
from trtflow.execution.ledger import Ledger
from trtflow.execution.lifecycle import Finished, Lifecycle
from trtflow.execution.memory import memory_need
from trtflow.execution.observers import guarded
from trtflow.execution.progress import ProgressBoard
from trtflow.execution.results import BLOCKED, GATE_FAILED, SKIPPED, SUCCESS, NodeResult, skipped_result
from trtflow.execution.scheduler import Allocation, Capacity, Scheduler, available_memory
from trtflow.plan import SKIP, Step, node_resources
from trtflow.recipe.expand import ConcreteNode

TICK_S = 0.25  # the longest the loop waits before it looks at cancellation and progress again
WAIT = "wait"


class Loop:
    def __init__(self, ctx: RunContext, lifecycle: Lifecycle, ledger: Ledger, board: ProgressBoard) -> None:
        self.ctx = ctx
        self.graph = ctx.graph
        self.lifecycle = lifecycle
        self.ledger = ledger
        self.board = board

    def capacity(self) -> Capacity:
        options = self.ctx.options
        memory = options.memory_limit or int(available_memory() * 0.9)
        cluster = getattr(self.ctx.executor, "capacity", None)
        if cluster is not None:
            return cluster(options.jobs, memory)
        return Capacity(float(max(1, options.jobs)), memory, list(gpus()))

    def run(self, pending: list[Step], results: dict[str, NodeResult]) -> None:
        """Run ``pending`` to their ends into ``results``. Raises KeyboardInterrupt when the run is cancelled, after
        every running node has come back (interrupted); any other error also stops the running nodes first."""
        if not pending:
            return
        ctx = self.ctx
        scheduler = Scheduler(self.capacity())
        waiting = list(pending)
        running: dict[Future, tuple[Step, Allocation]] = {}
        started_executor = False
        workers = max(1, ctx.options.jobs) + len(scheduler.capacity.gpus) + 1
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trtflow-node") as pool:
            try:
                stop = False
                while waiting or running:
                    if ctx.cancel.is_set():
                        raise KeyboardInterrupt
                    for step in list(waiting):
                        verdict = self._before_start(step, results, scheduler, stop)
                        if verdict == WAIT:
                            continue
                        waiting.remove(step)
                        if isinstance(verdict, NodeResult):
                            stop = self._record(Finished(verdict), results) or stop
                            continue
                        assert isinstance(verdict, Allocation)
                        if not started_executor:
                            ctx.executor.start()
                            started_executor = True
                            self._prefetch(pending)
                        upstream = self.ledger.upstream(self.graph.upstream(step.node.name))
                        running[pool.submit(self.lifecycle.process, step, verdict, upstream)] = (step, verdict)
                    if not running:
                        if waiting and stop:
                            for step in waiting:
                                self._record(Finished(NodeResult(
                                    step.node.name, step.node.stage, BLOCKED,
                                    "not started: an earlier node failed (use --keep-going to continue)")), results)
                            waiting = []
                        elif waiting:
                            time.sleep(0.2)  # e.g. every fitting GPU is busy in another trtflow process
                        continue
                    done, _ = wait(list(running), timeout=TICK_S, return_when=FIRST_COMPLETED)
                    for node, progress in self.board.poll(ctx.executor.pid_of):
                        ctx.observers.node_progress(node, progress)
                    for future in done:
                        _, allocation = running.pop(future)
                        scheduler.release(allocation)
                        stop = self._record(future.result(), results) or stop
            except BaseException:
                ctx.cancel.set()
                ctx.executor.interrupt()
                for future, (_, allocation) in list(running.items()):
                    finished = future.result()
                    scheduler.release(allocation)
                    try:
                        self._record(finished, results)
                    except Exception:  # an observer failing again must not hide the first error
                        results[finished.result.node] = finished.result
                raise

    def _prefetch(self, pending: list[Step]) -> None:
        """Tell an executor that can import ahead (the fork server's) what the nodes to run will preload, in
        the order they run: their stages' ``preload`` modules, each once."""
        prefetch = getattr(self.ctx.executor, "prefetch", None)
        if prefetch is None:
            return
        modules = [name for step in pending if step.status != SKIP and step.node.stage in self.graph.stages
                   for name in self.graph.stages[step.node.stage].preload]
        prefetch(list(dict.fromkeys(modules)))

    def _record(self, finished: Finished, results: dict[str, NodeResult]) -> bool:
        """Record a node's end; True if it stops the run (fail-fast)."""
        res = finished.result
        if finished.produced is not None:
            self.ledger.record(res.node, finished.produced)
        results[res.node] = res
        self.ctx.observers.node_ended(res)
        return self._stops_run(res)

    def _stops_run(self, res: NodeResult) -> bool:
        options = self.ctx.options
        if options.keep_going or self._gate_failure_absorbed(res):
            return False
        return res.status not in SUCCESS and not (res.status == SKIPPED and not options.require_gpu)

    def _before_start(self, step: Step, results: dict[str, NodeResult], scheduler: Scheduler,
                      stop: bool) -> str | NodeResult | Allocation:
        """WAIT, a result that ends the node without running it, or the allocation to run it with."""
        ctx = self.ctx
        node = step.node
        upstream = self.graph.upstream(node.name)
        failed = next((u for u in upstream if u in results and not self._usable(node, u, results[u])), None)
        if failed is not None:
            up = results[failed]
            skipped = up.status == SKIPPED or (up.status == BLOCKED and up.reason.endswith("cannot run here"))
            return NodeResult(node.name, node.stage, SKIPPED if skipped else BLOCKED,
                              f"upstream {failed} {'cannot run here' if skipped else up.status.replace('_', ' ')}")
        pending_upstream = any(u not in results for u in upstream)
        if step.status == SKIP and not pending_upstream:
            return skipped_result(node.name, node.stage, step.key, step.reason, step.needs, ctx.options.require_gpu)
        if stop or pending_upstream:
            return WAIT
        resources = node_resources(self.graph, node)
        never = scheduler.can_ever_run(resources)
        if never is not None:
            return skipped_result(node.name, node.stage, step.key, f"{never} (not run here; never cached)",
                                  "a machine with such a GPU", ctx.options.require_gpu)
        measured = guarded(ctx.notes, "reading measured memory",
                           lambda: ctx.journal.peak_rss(node.name, ctx.recipe.id))
        allocation = scheduler.try_allocate(resources, memory_need(self.graph, node, self.ledger.input_sizes(node),
                                                                   measured))
        return allocation if allocation is not None else WAIT

    def _usable(self, consumer: ConcreteNode, producer: str, result: NodeResult) -> bool:
        """A producer's outputs may feed ``consumer``: it succeeded, or its gate failed on committed outputs and
        every slot it feeds accepts that (a chooser excludes the candidate instead of being blocked)."""
        if result.status in SUCCESS:
            return True
        if result.status != GATE_FAILED:
            return False
        specs = self.graph.stages[consumer.stage].inputs
        feeds = [(slot, out) for slot, refs in consumer.upstream.items() for src, out in refs if src == producer]
        return all(specs[slot].accept_gate_failed and self.ledger.has_output(producer, out) for slot, out in feeds)

    def _gate_failure_absorbed(self, result: NodeResult) -> bool:
        """A failed gate whose committed outputs only feed slots that accept them (candidates of a chooser)
        does not stop a fail-fast run: the chooser still runs and reports the excluded candidate."""
        consumers = self.graph.downstream(result.node)
        return result.status == GATE_FAILED and bool(consumers) and all(
            self._usable(self.graph.nodes[c], result.node, result) for c in consumers)
