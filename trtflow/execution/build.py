"""Build one node: its scratch space, its inputs in place, the job an executor runs, and what comes back turned
into a committed result or the node's clear error.

Runs on the node's thread, for `lifecycle` (which decided that the node must be built and holds its key lock).
It reads the node's `Upstream` view and the shared `RunContext`; everything it creates (scratch, job, manifest)
belongs to this node alone. A result is committed only when every required output is there, whichever executor
ran the stage (files in the scratch space, or objects a worker left in the transfer area).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.errors import TrtflowError
from trtflow.execution import protocol
from trtflow.execution.context import RunContext
from trtflow.execution.inputs import link_inputs, remote_inputs
from trtflow.execution.ledger import Upstream
from trtflow.execution.observers import NodeStart
from trtflow.execution.protocol import Job, Outcome
from trtflow.execution.results import DONE, FAILED, GATE_FAILED, INTERRUPTED, NodeResult, skipped_result
from trtflow.execution.scheduler import Allocation
from trtflow.node_keys import KeyParts, recorded_parts
from trtflow.plan import Step, gate_family
from trtflow.stage import NATIVE_STEP_FILE, Reference
from trtflow.storage.confined.folders import RunFolders
from trtflow.storage.confined.reading import tail_of_fd
from trtflow.storage.confined.tree import Tree

LOG_TAIL_BYTES = 8192
FD_PATH = re.compile(r"/proc/(?:\d+|self)/fd/\d+(?=/|\b)")


@dataclass
class Built:
    result: NodeResult
    manifest: dict[str, Any] | None = None  # the committed manifest when the result is DONE


def device_list(allocation: Allocation) -> str | None:
    """CUDA_VISIBLE_DEVICES for a node: every GPU it was given, in order (None: no GPU)."""
    return ",".join(g.visible_id for g in allocation.gpus) or None


class Builder:
    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def build(self, step: Step, parts: KeyParts, key: str, allocation: Allocation, upstream: Upstream,
              previous: dict[str, Any] | None, started: float) -> Built:
        ctx = self.ctx
        node = step.node
        stage = ctx.graph.stages[node.stage]
        log_path = ctx.store.log_path(ctx.run_id, node.name)
        scratch = ctx.store.shown(ctx.store.scratch_rel(ctx.run_id, node.name))  # shown; reached by descriptor
        run_folders = ctx.folders if ctx.folders is not None else RunFolders(ctx.store.tree, ctx.run_id)

        def failed(error: str, hint: str | None = None) -> Built:
            return Built(NodeResult(node.name, node.stage, FAILED, step.reason, key, log_path=log_path, error=error,
                                    hint=hint))

        try:
            held = run_folders.node(node.name)  # made and held from here on: never walked again by its name
        except OSError as exc:
            return failed(f"cannot prepare the node's scratch space: {exc.strerror or exc}",
                          "free disk space or fix the store's permissions")
        ctx.observers.node_started(NodeStart(node.name, node.stage, key, step.reason, started, log_path, scratch,
                                                 held.scratch))
        try:
            input_objects: dict[str, dict[str, dict[str, Any]]] = {}
            try:
                if ctx.transfer is not None:
                    inputs, input_objects = self._hand_over_inputs(step, upstream)
                else:
                    inputs = link_inputs(ctx.graph, ctx.store, node, upstream, held.scratch)
            except TrtflowError as exc:
                return failed(exc.message, exc.hint)
            except OSError as exc:
                return failed(f"cannot place the node's inputs: {exc.strerror or exc}", "free disk space")
            previous_summary = (previous or {}).get("summary") if (previous or {}).get("key") != key else None
            try:
                reference = self._reference(step, held.scratch)
            except TrtflowError as exc:
                return failed(exc.message, exc.hint)
            except OSError as exc:
                return failed(f"cannot lay out the node's reference artifact: {exc.strerror or exc}", "free disk space")
            job = Job(run_id=ctx.run_id, node=node.name, stage=node.stage, params=node.params, inputs=inputs,
                      scratch=str(scratch), recipe_dir=str(ctx.kctx.recipe_dir), cache_dir=str(ctx.store.cache_dir),
                      log_path=str(log_path), facts=parts.facts,
                      allowed_roots=[str(p) for p in ctx.kctx.allowed_roots], device=device_list(allocation),
                      previous_summary=previous_summary, timeout=node.timeout, preload=list(stage.preload),
                      ran_alone=allocation.exclusive,
                      parent_pid=os.getpid(), input_objects=input_objects,
                      input_sources=self._judged_sources(node.name, upstream),
                      reference=reference.as_json() if reference is not None else None,
                      gate_family=gate_family(ctx.graph, ctx.kctx), held=held)
            try:
                outcome = ctx.executor.execute(job, ctx.cancel)
            except OSError as exc:
                return failed(f"could not start the stage process: {exc.strerror or exc}",
                              "free disk space and memory, then run again")
            shown_paths(outcome, scratch)
            if outcome.status == protocol.CRASHED and held.scratch.stat(NATIVE_STEP_FILE) is not None:
                self._keep_for_repro(node.name, run_folders, outcome)
            built = self._conclude(step, parts, key, outcome, job, log_path, previous_summary, started, held.scratch)
            if built.result.status != DONE:  # read now, through the descriptor: the log's name may lead elsewhere
                with contextlib.suppress(OSError):
                    built.result.log_tail = tail_of_fd(held.log_fd, LOG_TAIL_BYTES)
            return built
        finally:
            try:
                run_folders.end_node(node.name, held)
            except OSError:
                pass

    def _hand_over_inputs(self, step: Step, upstream: Upstream
                          ) -> tuple[dict[str, str | list[str]], dict[str, dict[str, dict[str, Any]]]]:
        """For workers that fetch their inputs: put the producers' results in the executor's transfer area (a
        place of its own under --no-push, never the shared cache then), and say which objects each slot needs."""
        ctx = self.ctx
        for src in sorted({src for refs in step.node.upstream.values() for src, _ in refs}):
            ctx.transfer.push(upstream.key(src), ctx.store, ctx.journal)
        return remote_inputs(ctx.graph, ctx.store, step.node, upstream)

    def _reference(self, step: Step, scratch: Tree) -> Reference | None:
        """The artifact the node measures beside its candidate (`Stage.reference`), laid out in its scratch like
        its inputs: a pinned one (from the recipe), or the node's last accepted result. None: it has none."""
        from trtflow.storage.pins import Pin, PinStore

        ctx = self.ctx
        node = step.node
        wanted = ctx.graph.stages[node.stage].reference_for(node.params_model, ctx.kctx.resolve, node.name)
        if wanted is None:
            return None
        pins = PinStore(ctx.store)
        if wanted == "accepted":
            pin = pins.read_accepted(ctx.recipe.id, node.name)
            if pin is None or not _trusted_pin(ctx, pin):
                return None
            name = "the last accepted result"
        else:
            pin = Pin.from_dict(wanted)
            if pin is None:
                raise TrtflowError(f"node {node.name}: its reference artifact is not described correctly",
                                   hint="pin it again (`trtflow baseline pin RECIPE`)")
            name = f"pinned artifact {pin.identity[:12]}"
        if ctx.transfer is not None:
            return Reference(name, record=pin.record, missing="reference artifacts are not handed to remote "
                             "workers (Ray) yet")
        laid = pins.lay_out(pin, scratch, ("reference",))
        return Reference(name, laid.inputs, laid.files, pin.record, laid.missing)

    def _judged_sources(self, node: str, upstream: Upstream) -> dict[str, list[dict[str, Any]]]:
        """Where each input comes from, with the producer's gate verdict as judged now (thresholds may have
        changed since its files were written)."""
        sources = self.ctx.graph.input_sources(node)
        verdicts = upstream.verdicts
        for entries in sources.values():
            for entry in entries:
                if entry["node"] in verdicts:
                    entry["gate_failures"] = list(verdicts[entry["node"]])
        return sources

    def _keep_for_repro(self, node: str, run_folders: RunFolders, outcome: Outcome) -> None:
        """Keep a crashed node's scratch (its inputs) where the reproduction command can still find them: moved
        from the run's held folder (never by its path in ``tmp/``) to ``crashes/``."""
        store = self.ctx.store
        scratch_rel = store.scratch_rel(self.ctx.run_id, node)
        kept_rel = ("crashes", *scratch_rel[1:])
        scratch, kept = store.shown(scratch_rel), store.shown(kept_rel)
        try:
            run_folders.scratch.move_to(node, store.tree, kept_rel)
        except OSError:
            return
        for field_name in ("error", "hint"):
            text = getattr(outcome, field_name)
            if text:
                setattr(outcome, field_name, text.replace(str(scratch), str(kept)))

    def _conclude(self, step: Step, parts: KeyParts, key: str, outcome: Outcome, job: Job, log_path: Path,
                  previous_summary: dict[str, Any] | None, started: float, scratch: Tree) -> Built:
        ctx = self.ctx
        node = step.node
        stage = ctx.graph.stages[node.stage]
        common: dict[str, Any] = {"log_path": log_path, "peak_rss": outcome.peak_rss}
        if outcome.status == protocol.INTERRUPTED or ctx.cancel.is_set():
            return Built(NodeResult(node.name, node.stage, INTERRUPTED, "interrupted", key, **common))
        if outcome.status == protocol.SKIPPED:
            res = skipped_result(node.name, node.stage, key, outcome.error or "", outcome.hint,
                                 ctx.options.require_gpu)
            res.log_path = log_path
            return Built(res)
        if outcome.status != protocol.OK:
            status = GATE_FAILED if outcome.status == protocol.GATE_FAILED else FAILED
            return Built(NodeResult(node.name, node.stage, status, step.reason, key, error=outcome.error,
                                    hint=outcome.hint, summary=outcome.summary, error_code=outcome.error_code,
                                    **common))
        if outcome.stored_outputs is not None:
            present = set(outcome.stored_outputs)
        else:
            present = {n for n, o in stage.outputs.items() if _present(scratch, ("out", o.filename))}
        unwritten = protocol.unwritten_outputs(node.stage, stage.outputs, present)
        if unwritten:
            return Built(NodeResult(node.name, node.stage, FAILED, step.reason, key, error=unwritten, **common))
        if parts.runs_code:  # committed under the key made with the modules its code was seen importing
            from trtflow.depfile import Deps

            parts = recorded_parts(parts, Deps.from_json(outcome.deps), ctx.kctx)
            key = parts.key
        manifest = dict(parts.as_manifest(), node=node.name, recipe=ctx.recipe.name, recipe_id=ctx.recipe.id,
                        source_commit=_source_commit(ctx),
                        summary=outcome.summary, run_id=ctx.run_id, started=started,
                        duration=time.time() - started, previous_summary=previous_summary,
                        peak_rss=outcome.peak_rss)
        try:
            if outcome.stored_outputs is not None:
                committed = self._commit_stored(node.name, key, manifest, outcome.stored_outputs)
            else:
                outputs_spec = {n: (o.filename, o.kind) for n, o in stage.outputs.items()}
                with closing(scratch.subtree("out")) as out:  # through the descriptor held since it was made
                    committed = ctx.store.commit(key, manifest, out, outputs_spec, ctx.journal)
        except TrtflowError as exc:  # the transfer area lost or damaged an object
            return Built(NodeResult(node.name, node.stage, FAILED, step.reason, key, error=exc.message,
                                    hint=exc.hint, **common))
        except OSError as exc:
            return Built(NodeResult(
                node.name, node.stage, FAILED, step.reason, key,
                error=f"the stage finished, but storing its outputs failed: {exc.strerror or exc}",
                hint="free disk space or fix the store's permissions, then run again: nothing was committed for "
                "this node and finished nodes are intact", **common))
        res = NodeResult(node.name, node.stage, DONE, step.reason, key, summary=committed.get("summary", {}),
                         **common)
        return Built(res, committed)

    def _commit_stored(self, node: str, key: str, manifest: dict[str, Any],
                       stored: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Commit outputs a worker left in the transfer area: pull them (verified), then write the manifest."""
        from trtflow.storage.store import FORMAT

        ctx = self.ctx
        ctx.transfer.pull_objects(stored, ctx.store, ctx.journal, node=node)
        from trtflow.storage.signing import sign_stored

        committed = dict(manifest, outputs=stored, key=key, format=FORMAT, committed=time.time())
        try:
            committed = sign_stored(ctx.store, key, committed)  # pulled just above, verified
        except ValueError as exc:
            raise TrtflowError(f"node {node}: {exc}", hint="run again: the node is built again") from None
        ctx.store.write_manifest(key, committed)
        return committed


def shown_paths(outcome: Outcome, scratch: Path) -> None:
    """The node's process named its scratch folder by its descriptor (``/proc/<pid>/fd/<n>``, which ends with it);
    its messages and summary name the folder by its place in the store instead."""
    def shown(value: Any) -> Any:
        if isinstance(value, str):
            return FD_PATH.sub(str(scratch), value)
        if isinstance(value, list):
            return [shown(v) for v in value]
        if isinstance(value, dict):
            return {k: shown(v) for k, v in value.items()}
        return value

    outcome.error, outcome.hint, outcome.summary = shown(outcome.error), shown(outcome.hint), shown(outcome.summary)


def _present(tree: Any, rel: tuple[str, ...]) -> bool:
    """Whether the stage wrote ``rel`` (its output's file name, relative; any entry: commit refuses non-files)."""
    try:
        return tree.stat((*rel[:-1], *rel[-1].split("/"))) is not None
    except OSError:
        return True  # something is in the way (a link on the path): commit says what


def _source_commit(ctx: RunContext) -> str | None:
    """The git commit the project is at (signed into each result: `storage.signing`); read once per run."""
    memo = ctx.kctx.memo
    if "source commit" not in memo:
        from trtflow.storage.signing import git_commit

        memo["source commit"] = git_commit(ctx.kctx.project_root)
    return memo["source commit"]


def _trusted_pin(ctx: RunContext, pin: Any) -> bool:
    """Whether the accepted result a pin records was signed by a key the project trusts (a cloned store's pins/
    are no reference otherwise). The pin's own files are not bound by that signature: see README, Limitations."""
    from trtflow.storage.manifest import is_key
    from trtflow.storage.signing import trust_problem

    key = (pin.record or {}).get("key")
    manifest = ctx.store.read_manifest(key) if is_key(key) else None
    return manifest is not None and trust_problem(ctx.store, manifest, ctx.kctx, check_bytes=False) is None
