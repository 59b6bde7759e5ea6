"""The small protocol every executor speaks: a `Job` goes in, an `Outcome` comes back.

An executor decides only *where* a node runs (a local process forked from a warm server, this process, a Ray
worker). It knows nothing of plans, keys or the store: the runner prepares the job (inputs in place, key facts
chosen) and commits what comes back.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Container, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trtflow.storage.confined.folders import NodeFolders, fd_path
from trtflow.storage.confined.tree import Tree

OK, FAILED, GATE_FAILED, SKIPPED, INTERRUPTED, CRASHED, TIMED_OUT = (
    "ok", "failed", "gate_failed", "skipped", "interrupted", "crashed", "timed_out")


@dataclass
class Job:
    run_id: str
    node: str
    stage: str
    params: dict[str, Any]
    inputs: dict[str, str | list[str]]  # slot -> path of the input file (its source node's other outputs beside
    # it); a many-slot: a list of paths, each in a folder named after its producer
    scratch: str  # private folder; outputs go to scratch/out
    recipe_dir: str
    cache_dir: str
    log_path: str
    facts: dict[str, str] = field(default_factory=dict)
    allowed_roots: list[str] = field(default_factory=list)
    device: str | None = None  # CUDA_VISIBLE_DEVICES for the node (GPU or MIG UUIDs, comma-separated), None: no GPU
    ran_alone: bool = False  # the scheduler ran nothing beside it (an exclusive node)
    previous_summary: dict[str, Any] | None = None
    timeout: float | None = None
    preload: list[str] = field(default_factory=list)  # modules worth importing once in a warm server
    parent_pid: int = 0
    # for executors that run nodes elsewhere: where each input's bytes come from (place -> output name -> its
    # manifest entry: filename, digest, size, kind)
    input_objects: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    # slot -> per input: its producer's node, template, matrix and own inputs (StageContext.input_sources)
    input_sources: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # the reference the node measures beside its candidate, laid out in its scratch (`stage.Reference.as_json`)
    reference: dict[str, Any] | None = None
    gate_family: int = 1  # how many nodes of the recipe make a comparison (StageContext.gate_family)
    # the node's scratch folder and log as descriptors (`folders.NodeFolders`), held by the runner; never in JSON
    held: NodeFolders | None = field(default=None, repr=False, compare=False)

    @property
    def gpu(self) -> int | None:
        """The CUDA ordinal the stage uses: the node sees only its devices, the first as device 0."""
        return 0 if self.device else None

    @property
    def job_file(self) -> Path:
        return Path(self.scratch) / "job.json"

    @property
    def result_file(self) -> Path:
        return Path(self.scratch) / "result.json"

    @property
    def progress_file(self) -> Path:
        return Path(self.scratch) / "progress.jsonl"

    @property
    def out_dir(self) -> Path:
        return Path(self.scratch) / "out"

    def scratch_tree(self) -> Tree:
        """The node's scratch folder: the descriptor the runner made it with (`held`); a job without one (made
        by hand) opens ``scratch`` (everything below it is walked without links)."""
        return self.held.scratch if self.held is not None else Tree(self.scratch)

    def to_json(self) -> dict[str, Any]:
        data = asdict(dataclasses.replace(self, held=None))
        data.pop("held")
        return data

    def in_folder(self, scratch: Tree) -> Job:
        """This job as the node's process sees it, its scratch folder held as ``scratch``: every path below the
        scratch folder (``scratch``, the inputs, the reference's files) becomes a path through the descriptor
        (`folders.fd_path`), which no rename or link in the store can redirect."""
        old, new = self.scratch.rstrip("/"), str(fd_path(scratch))

        def moved(value: Any) -> Any:
            if isinstance(value, str):
                return new + value[len(old):] if value == old or value.startswith(old + "/") else value
            if isinstance(value, list):
                return [moved(v) for v in value]
            if isinstance(value, dict):
                return {k: moved(v) for k, v in value.items()}
            return value

        return dataclasses.replace(self, scratch=new, inputs=moved(self.inputs), reference=moved(self.reference),
                                   held=NodeFolders(scratch, -1))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        return cls(**{k: v for k, v in data.items() if k != "held"})


@dataclass
class Outcome:
    status: str
    summary: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    hint: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    #: the CLI exit code of the kind of mistake the stage raised (errors.EXIT_*), when it raised a TrtflowError
    error_code: int | None = None
    peak_rss: int | None = None  # bytes
    # outputs already stored elsewhere (a remote cache) by the executor: name -> {digest, size, filename, kind};
    # None: the outputs are files in job.out_dir
    stored_outputs: dict[str, dict[str, Any]] | None = None
    # the project modules the stage's python: code imported while it ran (`depfile.Deps.as_json`); None: not recorded
    deps: dict[str, Any] | None = None


def unwritten_outputs(stage: str, outputs: Mapping[str, Any], present: Container[str]) -> str | None:
    """Why a stage that ended well cannot be committed: the required outputs (``outputs``: the stage's declared
    outputs, each with ``optional``) it did not write; None when all are ``present``."""
    missing = [name for name, out in outputs.items() if not out.optional and name not in present]
    return f"stage {stage!r} finished without writing outputs {missing}" if missing else None


class Executor(Protocol):
    """Where nodes run. Optional extras an executor may have: ``capacity(jobs, memory) -> Capacity`` (the
    resources of a cluster, instead of this machine's), and ``transfer`` (the URL of a remote-cache-like area
    through which its workers fetch inputs and leave outputs, when they do not share this machine's disk)."""

    name: str

    def start(self) -> None:
        """Get ready to run jobs (called from the main thread before the first job of a run)."""

    def execute(self, job: Job, cancel: threading.Event) -> Outcome:
        """Run one job to its end (blocking; called from one runner thread per running node)."""

    def pid_of(self, node: str) -> int | None:
        """The process running ``node`` here, if any (for live memory readings)."""

    def interrupt(self) -> None:
        """Stop every running job now (Ctrl-C): they come back as INTERRUPTED."""

    def close(self) -> None:
        """Release what `start` acquired."""
