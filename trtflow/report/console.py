"""Live console output of a run: one line per node event, a live panel of running nodes, a closing summary.

On a terminal, running nodes are shown in a live panel (one line each: progress, what it is doing, elapsed time,
memory), cut to the terminal's width; event lines and failure details are printed above the panel, never
through it. Elsewhere (CI logs) output is plain lines: events, and a progress line per running node when its
message changes or every ``PLAIN_PROGRESS_EVERY_S`` seconds.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtflow.execution.results import CACHED, DONE, SKIPPED, Hooks, NodeResult, Progress, RunSummary
from trtflow.redact import hide
from trtflow.status import FRESH, SKIP
from trtflow.storage.confined.tree import tail_of

if TYPE_CHECKING:
    from trtflow.plan import Step

_MARKS = {
    DONE: "[green]✓[/]", CACHED: "[green]✓[/]", FRESH: "[green]✓[/]", SKIPPED: "[yellow]-[/]",
    "failed": "[red]✗[/]", "gate_failed": "[red]✗[/]", "blocked": "[yellow]-[/]", "interrupted": "[yellow]![/]",
}
PLAIN_PROGRESS_EVERY_S = 15.0
REASON_CHARS = 200  # a rejected candidate's reason in the closing summary, cut here (its node's line has it whole)


def escape(text: str) -> str:
    """Escape rich markup (imported lazily: the no-op path never needs rich)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def _rel(path: Path | str | None) -> str:
    if path is None:
        return ""
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def _memory(rss: int | None) -> str:
    if rss is None:
        return ""
    return f"{rss / (1 << 30):.1f} GiB" if rss >= 1 << 30 else f"{rss >> 20} MiB"


def progress_line(progress: Progress) -> str:
    """"42% calibrating: batch 3/16  1m12s  2.1 GiB"."""
    parts = []
    if progress.fraction is not None:
        parts.append(f"{progress.fraction:.0%}")
    if progress.message:
        parts.append(progress.message)
    parts.append(_duration(progress.elapsed_s))
    if progress.rss_bytes:
        parts.append(_memory(progress.rss_bytes))
    return "  ".join(parts)


class ConsoleHooks(Hooks):
    """Prints run events. ``console`` is a rich Console or a zero-argument factory making one on first use."""

    def __init__(self, console: Any, quiet: bool = False) -> None:
        self._console = console
        self.quiet = quiet
        self.width = 12
        self.live: Any = None
        self.running: dict[str, Progress] = {}
        self._plain_seen: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    @property
    def console(self) -> Any:
        if callable(self._console) and not hasattr(self._console, "print"):
            self._console = self._console()
        return self._console

    def _print(self, text: str) -> None:
        text = hide(text)  # values a recipe took from the environment (see trtflow.redact)
        with self._lock:
            self.console.print(text, highlight=False)

    def _plain(self, text: str) -> None:
        """Text that is no markup (a reason may hold brackets), on the console if one was made; else printed: the
        no-op path never imports rich."""
        if callable(self._console) and not hasattr(self._console, "print"):
            print(hide(text), flush=True)
            return
        with self._lock:
            self.console.print(hide(text), markup=False, highlight=False)

    # ----- the live panel (terminals only)
    def _panel(self) -> Any:
        from rich.text import Text

        width = max(20, self.console.size.width - 1)
        lines = []
        for node, progress in self.running.items():
            line = f"  ⋯ {node:<{self.width}} {progress_line(progress)}"
            lines.append(line if len(line) <= width else line[: width - 1] + "…")
        return Text("\n".join(lines), style="cyan")

    def _refresh(self) -> None:
        if self.live is not None:
            with self._lock:
                self.live.update(self._panel(), refresh=True)

    # ----- hooks
    def on_run_start(self, run_id: str, steps: list[Step]) -> None:
        self.width = max([12, *(len(s.node.name) for s in steps)])
        stale = [s for s in steps if s.status not in (FRESH, SKIP)]
        if not stale:
            return
        if not self.quiet:
            self._print(f"[bold]{len(stale)} to run[/], {len(steps) - len(stale)} up to date or skipped "
                        f"(run {run_id})")
        if self.console.is_terminal and not self.quiet:
            from rich.live import Live

            self.live = Live(self._panel(), console=self.console, auto_refresh=False, transient=True)
            self.live.start()

    def on_node_start(self, node: str, reason: str) -> None:
        self.running[node] = Progress(None, "starting", 0.0)
        if not self.quiet:
            self._print(f"[cyan]▶[/] {escape(node):<{self.width}} [dim]{escape(reason)}[/]")
        self._refresh()

    def on_node_waiting(self, node: str, message: str) -> None:
        if not self.quiet:
            self._print(f"[yellow]…[/] {escape(node):<{self.width}} {escape(message)}")

    def on_node_progress(self, node: str, progress: Progress) -> None:
        if node not in self.running:
            return
        self.running[node] = progress
        if self.live is not None:
            self._refresh()
            return
        if self.quiet:
            return
        last_message, last_time = self._plain_seen.get(node, ("", 0.0))
        now = time.monotonic()
        if progress.message != last_message or now - last_time >= PLAIN_PROGRESS_EVERY_S:
            self._plain_seen[node] = (progress.message, now)
            self._print(f"  {escape(node):<{self.width}} {escape(progress_line(progress))}")

    def on_node_end(self, result: NodeResult) -> None:
        self.running.pop(result.node, None)
        self._plain_seen.pop(result.node, None)
        self._refresh()
        mark = _MARKS.get(result.status, "?")
        name = f"{escape(result.node):<{self.width}}"
        memory = f", peak {_memory(result.peak_rss)}" if result.peak_rss else ""
        if result.status == DONE:
            if not self.quiet:
                self._print(f"{mark} {name} done in {result.duration:.1f}s{memory}")
            self._print_inconclusive(result)
        elif result.status == CACHED:
            if not self.quiet:
                self._print(f"{mark} {name} reused: {escape(result.reason)}")
            self._print_inconclusive(result)
        elif result.status == FRESH:
            self._print_inconclusive(result)
        elif result.status == SKIPPED:
            needs = f" (needs: {escape(result.hint)})" if result.hint else ""
            self._print(f"{mark} {name} skipped: {escape(result.error or result.reason)}{needs}")
        elif result.status == "blocked":
            self._print(f"{mark} {name} not run: {escape(result.reason)}")
        elif result.status in ("failed", "gate_failed"):
            what = "quality gate failed" if result.status == "gate_failed" else "failed"
            lines = [f"{mark} {name} [red]{what}[/]: {escape(result.error or '')}"]
            if result.hint:
                lines.append(f"  hint: {escape(result.hint)}")
            if result.log_path:
                lines.append(f"  log:  {escape(_rel(result.log_path))}")
                if result.status == "failed":
                    tail = _log_tail(result.log_tail, result.log_path, 12, result.error or "")
                    if tail:
                        lines.append("[dim]" + escape(tail) + "[/]")
            self._print("\n".join(lines))

    def _print_inconclusive(self, result: NodeResult) -> None:
        """Primary gates that could not decide but fail nothing (on_inconclusive: warn): said, never silent."""
        for verdict in result.verdicts:
            if verdict.primary and verdict.outcome == "inconclusive" and not verdict.blocking:
                self._print(f"  [yellow]gate inconclusive[/] (on_inconclusive: warn, not failing the run): "
                            f"{escape(verdict.reason)}")

    def stop_live(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def finish(self, summary: RunSummary, steps: list[Step], seconds: float, output_dir: Path | None,
               resume: str) -> None:
        self.stop_live()
        results = summary.results
        total = len(results)
        done = summary.count(DONE)
        reused = summary.count(CACHED)
        fresh = summary.count(FRESH)
        skipped = summary.count(SKIPPED)
        # outputs removed before the run (the node could change) and not put back by it: a node that came out
        # identical, or was rebuilt, has its outputs in place again, and saying they were removed would be wrong
        cleared = [n for n in summary.cleared if n not in results or results[n].status not in (DONE, CACHED, FRESH)]
        if cleared and not self.quiet:
            self._print("Removed outdated outputs (they belonged to a previous version of the node) from: "
                        + ", ".join(escape(n) for n in cleared))
        for problem in summary.problems:
            self._print(f"[red]problem[/]: {escape(problem)}")
        for warning in summary.warnings:
            self._print(f"[yellow]warning[/]: {escape(warning)}")
        if summary.interrupted:
            self._print(f"[yellow]interrupted[/]: {done} nodes finished and were saved. Resume with:\n  {resume}")
            return
        if done == 0 and reused == 0 and fresh + skipped == total and summary.ok:
            if skipped:
                print(f"Nothing to do: {fresh} nodes are up to date and {skipped} cannot run here ({seconds:.2f}s).",
                      flush=True)
            else:
                print(f"Nothing to do: all {total} nodes are up to date ({seconds:.2f}s).", flush=True)
            for res in results.values():
                if res.status == SKIPPED and not self.quiet:
                    needs = f" (needs: {res.hint})" if res.hint else ""
                    print(hide(f"  - {res.node}: {res.error or res.reason}{needs}"), flush=True)
        else:
            failed = sum(1 for r in summary.failures() if r.status in ("failed", "gate_failed"))
            blocked = summary.count("blocked")
            parts = [f"{done} built", f"{reused} reused", f"{fresh} up to date"]
            if skipped:
                parts.append(f"{skipped} skipped")
            if failed:
                parts.append(f"[red]{failed} failed[/]")
            rejected = len({(r.chooser, r.candidate) for found in summary.rejected.values() for r in found})
            if rejected and not summary.require_all_candidates:
                parts.append(f"{rejected} candidate{'s' if rejected > 1 else ''} rejected")
            if blocked:
                parts.append(f"{blocked} not run")
            self._print(("[green]Done[/]" if summary.ok else "[red]Failed[/]") + f" in {seconds:.1f}s: "
                        + ", ".join(parts) + ".")
        for line in decision_lines(results.values()):
            self._plain(line)
        for line in outcome_lines(summary):
            self._plain(line)
        if summary.remote is not None:
            self._plain(summary.remote)
        if not summary.ok:
            self._print(f"Fix the problem above, then resume (finished nodes are kept):\n  {escape(resume)}")
        if output_dir is not None and not self.quiet and (done or reused):
            self._print(f"Outputs in {escape(_rel(output_dir))}/:")
            for name, res in results.items():
                for path in res.outputs.values():
                    self._print(f"  {escape(name):<{self.width}} {escape(_rel(path))}")


def decision_lines(results: Iterable[NodeResult]) -> list[str]:
    """What each chooser node (``select``) of the run chose and why, one line each, with the flags of the
    benchmarks it rested on (`report.decision.headline`); from the stored result when the node was up to date."""
    from trtflow.report.decision import headline
    from trtflow.storage.records import selection_of

    return [headline(res.node, selection) for res in results
            if (selection := selection_of(res.summary)) is not None]


def outcome_lines(summary: RunSummary) -> list[str]:
    """What the run shipped and which candidates it rejected, and why (`execution.outcome`), when a candidate was
    rejected or a chooser chose nothing; plain text."""
    from trtflow.execution.outcome import nothing_to_ship

    empty = nothing_to_ship(summary.results.values())
    if not summary.rejected and not empty:
        return []
    lines = []
    for shipment in summary.shipped:
        made = "; ".join(f"{node}: {', '.join(_rel(p) for p in paths)}" if paths else node
                         for node, paths in shipment.outputs.items())
        lines.append(f"Shipped: {shipment.candidate}, chosen by {shipment.chooser} ({made})")
    lines += [f"Nothing to ship: {node} chose no candidate (none qualifies; its table is above)" for node in empty]
    for found in summary.rejected.values():
        for r in found:  # the node's own line above has its whole message
            why = r.reason if r.node in r.reason else f"{r.node}'s quality gate failed: {r.error}; {r.reason}"
            why = " ".join(why.split())
            lines.append(f"Rejected: {r.candidate}, not chosen by {r.chooser}: "
                         + (why if len(why) <= REASON_CHARS else why[:REASON_CHARS].rstrip() + " ..."))
    if summary.rejected:
        lines.append("Rejected candidates fail this run: the recipe sets require_all_candidates: true"
                     if summary.require_all_candidates else
                     "A rejected candidate is an outcome of the decision and fails nothing by itself; "
                     "`require_all_candidates: true` in the recipe fails the run on it.")
    return lines


def _log_tail(read: str | None, path: Path, lines: int, error: str = "") -> str:
    """The last lines of a failed node's log (``read``: its end, read by the runner through the log's descriptor;
    None: read from ``path``, a result made elsewhere), unless the log ends with the error just printed: a failure
    the stage explained (its message is enough) is not printed again and again."""
    if read is not None:
        text = read
    else:
        try:
            text = tail_of(path, 8192)
        except OSError:
            return ""
    records = text.strip().splitlines()
    errors = [line for line in records if " ERROR " in line]
    first = " ".join(error.strip().splitlines()[0].split())[:80] if error.strip() else ""
    if first and errors and first in " ".join(errors[-1].split()):
        return ""
    return "\n".join("  | " + line for line in records[-lines:])
