"""One node's life, in one place, on the node's own thread:

    key (with the facts of the device it was given) -> reuse a stored result -> the stage's check -> per-key lock
    (concurrent runs build it once) -> reuse what another run built meanwhile -> pull from the remote cache ->
    build (`build`) -> commit -> record it in refs -> push -> deliver (copies under build/) -> quality gate

A `Lifecycle` is shared by the run's node threads but holds nothing that changes: what a node needs from its
producers comes in an `Upstream` view (`ledger`), and what it produced goes back to the run's thread in
`Finished`, which records it. Events (started, waiting, result used) go to the run's observers, which guard their
own state. Every failure on the way becomes the node's clear error: nothing escapes as an internal error.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.errors import StageSkipped, TrtflowError
from trtflow.execution.build import Builder
from trtflow.execution.context import RunContext
from trtflow.execution.ledger import Produced, Upstream
from trtflow.execution.results import CACHED, FAILED, GATE_FAILED, INTERRUPTED, NodeResult, skipped_result
from trtflow.execution.scheduler import Allocation
from trtflow.plan import Step, explain, judge, key_parts, previous_manifest
from trtflow.recipe.expand import ConcreteNode
from trtflow.storage.store import materialize_error

GATE_HINT = ("the measurements are cached: change the threshold to re-judge them without re-running, or change the "
             "model; `trtflow show RECIPE NODE` lists the metrics")


@dataclass
class Finished:
    """A node's end as its thread hands it to the run's thread."""

    result: NodeResult
    produced: Produced | None = None  # the result it committed or reused (None: none)


class Lifecycle:
    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.builder = Builder(ctx)

    def process(self, step: Step, allocation: Allocation, upstream: Upstream) -> Finished:
        """Take the node through its life; a bug in trtflow fails this node, not the whole run."""
        started = time.time()
        try:
            finished = self._life(step, allocation, upstream, started)
        except Exception as exc:
            store = self.ctx.store
            log = store.log_path(self.ctx.run_id, step.node.name)
            try:
                store.tree.append_text(store.log_rel(self.ctx.run_id, step.node.name), traceback.format_exc())
            except OSError:
                pass
            finished = Finished(NodeResult(
                step.node.name, step.node.stage, FAILED, step.reason, step.key, log_path=log,
                error=f"internal error in trtflow while running this node: {type(exc).__name__}: {exc}",
                hint="this is a bug in trtflow: please report it with the log"))
        finished.result.duration = time.time() - started
        finished.result.started = started
        return finished

    def _life(self, step: Step, allocation: Allocation, upstream: Upstream, started: float) -> Finished:
        ctx = self.ctx
        node = step.node
        stage = ctx.graph.stages[node.stage]
        try:
            parts = key_parts(ctx.graph, node, upstream.digests, ctx.kctx, allocation.device, upstream.verdicts)
        except TrtflowError as exc:
            return Finished(NodeResult(node.name, node.stage, FAILED, step.reason, error=exc.message,
                                       hint=exc.hint))
        if parts is None:  # every upstream node finished, yet one did not write an (optional) output wired here
            digests = upstream.digests
            missing = [f"{slot} <- {src}.{out}" for slot, refs in node.upstream.items() for src, out in refs
                       if (src, out) not in digests]
            return Finished(NodeResult(
                node.name, node.stage, FAILED, step.reason,
                error=f"input(s) not produced: {', '.join(missing)} (optional outputs their node did not write "
                "this time)",
                hint="wire an output the upstream node writes in this case, e.g. select.engine when the candidates "
                "are engines"))
        key = parts.key
        previous = previous_manifest(ctx.store, ctx.recipe.id, node.name, ctx.refs_at_start)
        if step.parts is None or step.key != key:  # planned before its inputs were known: say what changed
            step.reasons = explain(parts, previous)
        reused = self._reuse(node, key, "identical result already in the store")
        if reused is not None:
            return reused
        if stage.check is not None:
            try:
                stage.check(node.params_model)
            except StageSkipped as exc:
                return Finished(skipped_result(node.name, node.stage, key, exc.reason, exc.needs,
                                               ctx.options.require_gpu))
            except TrtflowError as exc:
                return Finished(NodeResult(node.name, node.stage, FAILED, step.reason, key, error=exc.message,
                                           hint=exc.hint))
        lock = self._key_lock(node, key)
        if isinstance(lock, NodeResult):
            return Finished(lock)
        try:
            reused = self._reuse(node, key, "built meanwhile by another trtflow run")
            if reused is not None:
                return reused
            if self._pull(node, key):
                reused = self._reuse(node, key, f"pulled from the remote cache {ctx.cache.url}")
                if reused is not None:
                    return reused
            built = self.builder.build(step, parts, key, allocation, upstream, previous, started)
            if built.manifest is None:
                return Finished(built.result)
            ctx.observers.result_used(node.name, key)  # durable in refs before anyone hears the node is done
            self._push(node.name, key)
            return self._deliver(built.result, built.manifest)
        finally:
            lock.release()

    # ----------------------------------------------------------------- the store and the remote cache
    def _reuse(self, node: ConcreteNode, key: str, why: str) -> Finished | None:
        ctx = self.ctx
        manifest = ctx.store.read_manifest(key)
        if manifest is None or not ctx.store.intact(manifest, ctx.journal):
            return None
        ctx.observers.result_used(node.name, key)
        res = NodeResult(node.name, node.stage, CACHED, why, key, summary=manifest.get("summary", {}))
        return self._deliver(res, manifest)

    def _key_lock(self, node: ConcreteNode, key: str) -> Any:
        """The lock of ``key`` (every trtflow run on this store builds it once), or the result of waiting."""
        from trtflow.storage.confined import Flock

        ctx = self.ctx
        try:
            lock = Flock(ctx.store.tree, ctx.store.lock_rel(key))
        except OSError as exc:
            return NodeResult(node.name, node.stage, FAILED, "", key,
                              error=f"cannot take the node's build lock: {exc.strerror or exc}",
                              hint="check the store's locks/ folder (`trtflow gc` clears it when no run is running)")
        if lock.acquire(timeout=0):
            return lock
        ctx.observers.node_waiting(node.name, "another trtflow run is building it; waiting")
        if lock.acquire(ctx.options.lock_timeout, cancelled=ctx.cancel.is_set):
            return lock
        lock.release()
        if ctx.cancel.is_set():
            return NodeResult(node.name, node.stage, INTERRUPTED, "interrupted", key)
        return NodeResult(node.name, node.stage, FAILED, "", key,
                          error=f"waited {ctx.options.lock_timeout:g} s for another trtflow run building this node",
                          hint=f"check for a stuck run (`trtflow status`); its lock is {ctx.store.lock_path(key)}")

    def _pull(self, node: ConcreteNode, key: str) -> bool:
        """Fetch the node's result from the remote cache, verified; False if it has none (or a damaged one)."""
        ctx = self.ctx
        if ctx.cache is None:
            return False
        from trtflow.storage.remote import RemoteError

        try:
            manifest = ctx.cache.get_manifest(key)
            if manifest is None:
                return False
            ctx.observers.node_waiting(node.name, f"pulling from the remote cache {ctx.cache.url}")
            ctx.cache.pull(manifest, ctx.store, ctx.journal)
            return True
        except RemoteError as exc:
            ctx.notes.warning(f"{node.name}: not taken from the remote cache: {exc.message}")
            return False
        except OSError as exc:
            ctx.notes.warning(f"{node.name}: pulling from the remote cache failed: {exc.strerror or exc}")
            return False

    def _push(self, node: str, key: str) -> None:
        """Upload a committed result to the remote cache, unless the run was told not to (--no-push)."""
        ctx = self.ctx
        if ctx.cache is None or not ctx.options.push:
            return
        from trtflow.storage.remote import RemoteError

        try:
            ctx.cache.push(key, ctx.store, ctx.journal)
        except (RemoteError, TrtflowError) as exc:
            ctx.notes.warning(f"{node}: not pushed to the remote cache: {exc.message}")
        except OSError as exc:
            ctx.notes.warning(f"{node}: pushing to the remote cache failed: {exc.strerror or exc}")

    # ----------------------------------------------------------------- delivery
    def _deliver(self, res: NodeResult, manifest: dict[str, Any]) -> Finished:
        """Copy a committed node's outputs under build/ and judge its gate; a copy that fails fails the node."""
        ctx = self.ctx
        if ctx.options.output_dir is not None:
            out_dir: Path = ctx.options.output_dir / res.node
            try:
                res.outputs = ctx.store.materialize(manifest, out_dir, ctx.options.output_base)
            except OSError as exc:
                err = materialize_error(res.node, out_dir, exc)
                res.status, res.error, res.hint = FAILED, err.message, err.hint
                return Finished(res, Produced.from_manifest(manifest, None))
        node = ctx.graph.nodes[res.node]
        failures = judge(ctx.graph, node, manifest, ctx.kctx)
        if failures:
            res.status, res.error, res.hint = GATE_FAILED, "; ".join(failures), GATE_HINT
        has_gate = ctx.graph.stages[node.stage].gate is not None
        return Finished(res, Produced.from_manifest(manifest, failures if has_gate else None))
