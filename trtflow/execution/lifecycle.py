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
from trtflow.execution.results import CACHED, DONE, FAILED, GATE_FAILED, INTERRUPTED, NodeResult, skipped_result
from trtflow.execution.scheduler import Allocation
from trtflow.node_keys import KeyParts, key_parts
from trtflow.plan import Step, explain, find_stored, judge, previous_manifest
from trtflow.recipe.expand import ConcreteNode
from trtflow.redact import url_for_display
from trtflow.storage.signing import trust_problem
from trtflow.storage.store import materialize_error
from trtflow.verdicts import GateVerdict, accepted, only_inconclusive
from trtflow.verdicts import failures as blocking_failures

GATE_HINT = ("the measurements are cached: change the threshold to re-judge them without re-running, or change the "
             "model; `trtflow show RECIPE NODE` lists the metrics")
INCONCLUSIVE_HINT = ("the gate could not decide at its cap: measure longer (max_duration_s), on a quieter host, or set "
                     "on_inconclusive: warn to report it without failing; `trtflow show RECIPE NODE` lists the figures")


def gate_hint(verdicts: list[GateVerdict]) -> str:
    """The hint of a node whose gate failed: what to do about a failure, or about a gate that could not decide."""
    return INCONCLUSIVE_HINT if only_inconclusive(verdicts) else GATE_HINT


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
                if self.ctx.folders is not None:  # the run's log folder, held since the run made it
                    self.ctx.folders.logs.append_text(f"{step.node.name}.log", traceback.format_exc())
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
        parts, _ = find_stored(ctx.store, parts, ctx.kctx)
        key = parts.key
        previous = previous_manifest(ctx.store, ctx.recipe.id, node.name, ctx.refs_at_start)
        if previous is not None and trust_problem(ctx.store, previous, ctx.kctx, check_bytes=False) is not None:
            previous = None  # a result the project does not trust is no baseline of a gate (a cloned store's refs)
        if step.parts is None or step.key != key:  # planned before its inputs were known: say what changed
            step.reasons = explain(parts, previous)
        again = node.name in ctx.options.rerun  # `--rerun`: measure again, whatever is stored or cached
        reused = None if again else self._reuse(node, parts, "identical result already in the store", upstream)
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
                                           hint=exc.hint, error_code=exc.exit_code))
        lock = self._key_lock(node, key)
        if isinstance(lock, NodeResult):
            return Finished(lock)
        try:
            reused = None if again else self._reuse(node, parts, "built meanwhile by another trtflow run", upstream)
            if reused is not None:
                return reused
            if not again and self._pull(node, key, step):
                reused = self._reuse(node, parts, f"pulled from the remote cache {url_for_display(ctx.cache.url)}",
                                     upstream)
                if reused is not None:
                    return reused
            built = self.builder.build(step, parts, key, allocation, upstream, previous, started)
            if built.manifest is None:
                return Finished(built.result)
            committed = built.manifest["key"]  # with the modules its code was seen importing
            self._note_deps(built.manifest)
            ctx.observers.result_used(node.name, committed)  # durable in refs before anyone hears the node is done
            self._push(node.name, committed)
            return self._deliver(built.result, built.manifest, upstream)
        finally:
            lock.release()

    # ----------------------------------------------------------------- the store and the remote cache
    def _reuse(self, node: ConcreteNode, parts: KeyParts, why: str,
               upstream: Upstream | None = None) -> Finished | None:
        ctx = self.ctx
        found, manifest = find_stored(ctx.store, parts, ctx.kctx)
        if manifest is None:
            return None
        self._note_deps(manifest)
        ctx.observers.result_used(node.name, found.key)
        res = NodeResult(node.name, node.stage, CACHED, why, found.key, summary=manifest.get("summary", {}))
        return self._deliver(res, manifest, upstream)

    def _note_deps(self, manifest: dict[str, Any]) -> None:
        """Index the module set of a result of python: code under its pre-key, so the next plan finds it."""
        note = getattr(self.ctx.journal, "note_dep_set", None)
        pre, deps, absent = manifest.get("pre"), manifest.get("deps"), manifest.get("absent")
        if note is not None and isinstance(pre, str) and isinstance(deps, dict) and isinstance(absent, list):
            note(pre, (tuple(sorted(deps)), tuple(sorted(absent))))

    def _key_lock(self, node: ConcreteNode, key: str) -> Any:
        """The lock of ``key`` (every trtflow run on this store builds it once), or the result of waiting."""
        from trtflow.storage.confined.locking import Flock

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

    def _pull(self, node: ConcreteNode, key: str, step: Step) -> bool:
        """Fetch the node's result from the remote cache, verified; False if it has none (or a damaged one). A
        result the project does not trust is refused, and why is added to the step's reasons (the node's line)."""
        ctx = self.ctx
        if ctx.cache is None:
            return False
        from trtflow.storage.remote import RemoteError

        for layer in getattr(ctx.cache, "layers", [ctx.cache]):  # a namespace's own, main's, others read
            try:
                manifest = layer.get_manifest(key)
                if manifest is None:
                    continue
                problem = trust_problem(ctx.store, manifest, ctx.kctx, check_bytes=False)  # bytes: once pulled
                if problem is not None:
                    ctx.notes.warning(f"{node.name}: not taken from the remote cache {url_for_display(layer.url)}: "
                                      f"{problem}")
                    ctx.remote_tally.refuse(node.name, problem)
                    step.reasons = [*step.reasons, f"the remote cache's result was refused: {problem}"]
                    continue
                ctx.observers.node_waiting(node.name, f"pulling from the remote cache {url_for_display(layer.url)}")
                layer.pull(manifest, ctx.store, ctx.journal,  # a local result this project does not trust: replaced
                           replace_if=lambda m: trust_problem(ctx.store, m, ctx.kctx) is not None)
                ctx.remote_tally.pull(node.name)
                return True
            except RemoteError as exc:
                ctx.notes.warning(f"{node.name}: not taken from the remote cache: {exc.message}")
            except OSError as exc:
                ctx.notes.warning(f"{node.name}: pulling from the remote cache failed: {exc.strerror or exc}")
        return False

    def _push(self, node: str, key: str) -> None:
        """Upload a committed result to the remote cache, unless the run was told not to (--no-push)."""
        ctx = self.ctx
        if ctx.cache is None or not ctx.options.push:
            return
        from trtflow.storage.remote import RemoteError

        def untrusted(there: dict[str, Any]) -> bool:  # a remote result this project would not reuse: replaced
            return trust_problem(ctx.store, there, ctx.kctx, check_bytes=False) is not None

        ctx.observers.node_waiting(node, f"pushing to the remote cache {url_for_display(ctx.cache.url)}")
        try:
            moved = ctx.cache.push(key, ctx.store, ctx.journal, replace_if=untrusted)
            ctx.remote_tally.push(node, bool(getattr(moved, "manifest_written", True)))
        except (RemoteError, TrtflowError) as exc:
            ctx.notes.warning(f"{node}: not pushed to the remote cache: {exc.message}")
        except OSError as exc:
            ctx.notes.warning(f"{node}: pushing to the remote cache failed: {exc.strerror or exc}")

    # ----------------------------------------------------------------- delivery
    def _deliver(self, res: NodeResult, manifest: dict[str, Any], upstream: Upstream | None = None) -> Finished:
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
        verdicts = judge(ctx.graph, node, manifest, ctx.kctx)
        failures = blocking_failures(verdicts)
        res.verdicts = verdicts
        if failures:
            res.status, res.error, res.hint = GATE_FAILED, "; ".join(failures), gate_hint(verdicts)
        elif res.status in (DONE, CACHED) and accepted(verdicts):
            self._accept(node, manifest, upstream)
        has_gate = ctx.graph.stages[node.stage].gate is not None
        return Finished(res, Produced.from_manifest(manifest, failures if has_gate else None))

    def _accept(self, node: ConcreteNode, manifest: dict[str, Any], upstream: Upstream | None) -> None:
        """Keep the artifact of an accepted result as the reference the node's next runs are compared with
        (`Stage.reference` "accepted"): what the node read (its inputs with their companions, and its recipe and
        code files), pinned in the store. Only a result whose every primary verdict passed gets here."""
        ctx = self.ctx
        stage = ctx.graph.stages[node.stage]
        if upstream is None or stage.reference is None:
            return
        try:
            if stage.reference_for(node.params_model, ctx.kctx.resolve, node.name) != "accepted":
                return
        except TrtflowError:
            return
        from trtflow.storage.pins import Pin, PinStore, pin_record

        pins = PinStore(ctx.store)
        inputs = {}
        for slot, refs in node.upstream.items():
            if stage.inputs[slot].many or len(refs) != 1:
                continue
            src, out = refs[0]
            outputs = ctx.graph.stages[ctx.graph.nodes[src].stage].outputs
            produced = upstream.outputs(src)
            objects = {outputs[name].filename: {"digest": digest, "size": size}
                       for name, (digest, size) in produced.items() if name in outputs}
            if out in outputs and outputs[out].filename in objects:
                inputs[slot] = {"file": outputs[out].filename, "objects": objects}
        try:
            previous = pins.read_accepted(ctx.recipe.id, node.name)
            if previous is not None and previous.record.get("key") == manifest.get("key"):
                return
            files = pins.keep_files({path: ctx.kctx.project_root / path for path in manifest.get("files") or {}})
            record = pin_record(node.name, ctx.recipe.id, node.params, manifest.get("summary") or {},
                                manifest.get("key"), run_id=ctx.run_id)
            pins.write_accepted(ctx.recipe.id, node.name, Pin(inputs, files, record))
        except (OSError, ValueError) as exc:
            ctx.notes.warning(f"{node.name}: its accepted result could not be kept as the reference of later runs: "
                              f"{getattr(exc, 'strerror', None) or exc}")
