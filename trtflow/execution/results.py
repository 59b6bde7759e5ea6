"""What a run produces per node, and the hooks that report it as it happens."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtflow.status import FRESH
from trtflow.verdicts import GateVerdict

if TYPE_CHECKING:
    from trtflow.execution.outcome import Rejection, Shipment
    from trtflow.plan import Step

DONE, CACHED, FAILED, GATE_FAILED, SKIPPED, BLOCKED, INTERRUPTED = (
    "done", "cached", "failed", "gate_failed", "skipped", "blocked", "interrupted")
SUCCESS = frozenset({FRESH, DONE, CACHED})


@dataclass
class RunOptions:
    jobs: int = max(1, min(4, os.cpu_count() or 1))
    keep_going: bool = False
    require_gpu: bool = False
    lock_timeout: float = 6 * 3600.0
    output_dir: Path | None = None
    #: The folder whose own links are the user's: outputs under it are walked without following links (the working
    #: folder for the default build/<recipe>; None: output_dir itself, the folder the user named).
    output_base: Path | None = None
    command: str = "trtflow run"
    kill_grace: float = 5.0
    executor: str = "local"  # local | inline | ray
    ray_address: str | None = None
    remote: str | None = None  # URL of a remote cache shared by several stores
    remote_digest: str | None = None  # the hash a remote must name objects by (xxh3-128, sha256); None: the remote's
    remote_namespace: str | None = None  # the remote's namespace this run writes (and reads first); None: main's
    remote_read_namespaces: tuple[str, ...] = ()  # other namespaces it also reads (their trusted results only)
    push: bool = True  # push what this run builds to the remote cache (False: only pull, e.g. untrusted CI)
    ray_transfer: str | None = None  # where Ray workers exchange artifacts (default: the remote cache, if pushing)
    memory_limit: int | None = None  # bytes the scheduler may hand out (default: what the machine has free)
    rerun: frozenset[str] = frozenset()  # nodes run again although their result is stored (--rerun)
    #: The recipe's ``require_all_candidates``: a candidate a chooser rejected for a failed gate fails the run too
    require_all_candidates: bool = False


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
    peak_rss: int | None = None  # bytes, for nodes that ran a process
    started: float | None = None  # when the node's thread took it (time.time()), for nodes that were processed
    verdicts: list[GateVerdict] = field(default_factory=list)  # its gate's verdicts as judged in this run
    error_code: int | None = None  # a failed node: the exit code of its kind of mistake (errors.EXIT_*)
    log_tail: str | None = None  # a node that ran and did not succeed: its log's end, read through the held log


@dataclass
class RunSummary:
    run_id: str
    results: dict[str, NodeResult]
    interrupted: bool = False
    cleared: list[str] = field(default_factory=list)  # output folders whose outdated files were removed
    problems: list[str] = field(default_factory=list)  # run-level problems (journal could not be written, ...)
    warnings: list[str] = field(default_factory=list)  # things the user should know that fail nothing
    #: Nodes whose failed gate rejected a candidate a chooser did not pick (`execution.outcome.rejections`)
    rejected: dict[str, list[Rejection]] = field(default_factory=dict)
    require_all_candidates: bool = False  # the recipe's: rejected candidates fail the run too
    shipped: list[Shipment] = field(default_factory=list)  # what each chooser picked, with what was made of it
    remote: str | None = None  # what the run pulled from and pushed to its remote cache (`RemoteTally.summary`)

    def count(self, *statuses: str) -> int:
        return sum(1 for r in self.results.values() if r.status in statuses)

    def failures(self) -> list[NodeResult]:
        """The nodes that fail the run: neither up to date, built, reused nor skipped, nor a candidate's evaluation
        whose failed gate only rejected it (unless the recipe requires every candidate to pass)."""
        return [r for r in self.results.values() if r.status not in SUCCESS and r.status != SKIPPED
                and (self.require_all_candidates or r.node not in self.rejected)]

    @property
    def ok(self) -> bool:
        return not self.interrupted and not self.problems and not self.failures()


@dataclass(frozen=True)
class Progress:
    """A running node's latest progress report, with what the runner observes itself."""

    fraction: float | None
    message: str
    elapsed_s: float
    rss_bytes: int | None = None


class Hooks:
    """Callbacks for progress reporting; every method is optional to override.

    ``on_node_start`` and ``on_node_waiting`` are called from the node's own thread (several at once with
    ``jobs`` > 1): an implementation that keeps state guards it. The others are called from the thread that
    called `Runner.run`. An exception raised by a hook ends the run (recorded as failed in the journal).
    """

    def on_run_start(self, run_id: str, steps: list[Step]) -> None: ...
    def on_node_start(self, node: str, reason: str) -> None: ...
    def on_node_waiting(self, node: str, message: str) -> None: ...
    def on_node_progress(self, node: str, progress: Progress) -> None: ...
    def on_node_end(self, result: NodeResult) -> None: ...


def skipped_result(node: str, stage: str, key: str | None, reason: str, needs: str | None,
                   require_gpu: bool) -> NodeResult:
    """A node that cannot run on this machine: skipped, or failed under ``--require-gpu``."""
    if require_gpu:
        return NodeResult(node, stage, FAILED, "backend unavailable", key,
                          error=f"{reason} (and --require-gpu was given)", hint=needs)
    return NodeResult(node, stage, SKIPPED, reason, key, error=reason, hint=needs)


class Notes:
    """A run's problems (they fail the run) and warnings (they fail nothing), added from any of its threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._problems: list[str] = []
        self._warnings: list[str] = []

    def problem(self, text: str) -> None:
        with self._lock:
            self._problems.append(text)

    def warning(self, text: str) -> None:
        with self._lock:
            self._warnings.append(text)

    @property
    def problems(self) -> list[str]:
        with self._lock:
            return list(dict.fromkeys(self._problems))

    @property
    def warnings(self) -> list[str]:
        with self._lock:
            return list(dict.fromkeys(self._warnings))


class RemoteTally:
    """What a run took from and gave to its remote cache, added from the node threads: the nodes it pulled, those
    it pushed, and the results it refused there, with why (`summary` makes the run's closing line of it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pulled: list[str] = []
        self.pushed: list[str] = []
        self.present: list[str] = []  # pushed, but the remote had the result already
        self.refused: list[tuple[str, str]] = []  # (node, why its remote result was not taken)

    def pull(self, node: str) -> None:
        with self._lock:
            self.pulled.append(node)

    def push(self, node: str, written: bool = True) -> None:
        with self._lock:
            (self.pushed if written else self.present).append(node)

    def refuse(self, node: str, why: str) -> None:
        with self._lock:
            self.refused.append((node, why))

    def summary(self, url: str, pushing: bool) -> str:
        """One line: the remote (credentials hidden), what was pulled and pushed, what was refused and why."""
        from trtflow.redact import url_for_display

        with self._lock:
            pulled, pushed, present = list(self.pulled), list(self.pushed), list(self.present)
            refused = list(self.refused)
        line = f"Remote cache {url_for_display(url)}: pulled {_nodes(pulled)}, " + (
            f"pushed {_nodes(pushed)}" if pushing else "pushed nothing (--no-push)")
        if present:
            line += f", {_nodes(present)} already there"
        reasons: dict[str, list[str]] = {}
        for node, why in refused:
            reasons.setdefault(why, []).append(node)
        for why, nodes in reasons.items():  # one reason (an untrusted signer) usually refuses many results
            line += f"; refused {_nodes(nodes)}: {why}"
        return line


NAMED = 8  # nodes a count names before it says how many more


def _nodes(names: list[str]) -> str:
    if not names:
        return "0"
    more = f" and {len(names) - NAMED} more" if len(names) > NAMED else ""
    return f"{len(names)} ({', '.join(names[:NAMED])}{more})"


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + os.urandom(3).hex()


def resume_command(argv: list[str] | None = None) -> str:
    import shlex
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    return "trtflow " + shlex.join(args)
