"""Live console output of a run: one line per node event, a spinner on terminals, a closing summary."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trtflow.plan import Step
from trtflow.runner import CACHED, DONE, FRESH, SKIPPED, Hooks, NodeResult, RunSummary

_MARKS = {
    DONE: "[green]✓[/]", CACHED: "[green]✓[/]", FRESH: "[green]✓[/]", SKIPPED: "[yellow]-[/]",
    "failed": "[red]✗[/]", "gate_failed": "[red]✗[/]", "blocked": "[yellow]-[/]", "interrupted": "[yellow]![/]",
}


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


class ConsoleHooks(Hooks):
    """Prints run events. ``console`` is a rich Console or a zero-argument factory making one on first use."""

    def __init__(self, console: Any, quiet: bool = False) -> None:
        self._console = console
        self.quiet = quiet
        self.width = 12
        self.status: Any = None
        self.running: dict[str, str] = {}

    @property
    def console(self) -> Any:
        if callable(self._console) and not hasattr(self._console, "print"):
            self._console = self._console()
        return self._console

    def _print(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def _refresh(self) -> None:
        if self.status is None:
            return
        if self.running:
            parts = [f"{n} {m}".strip() for n, m in self.running.items()]
            self.status.update("running: " + escape(" | ".join(parts)))
        else:
            self.status.update("")

    def on_run_start(self, run_id: str, steps: list[Step]) -> None:
        self.width = max([12, *(len(s.node.name) for s in steps)])
        stale = [s for s in steps if s.status != FRESH]
        if not stale:
            return
        if not self.quiet:
            self._print(f"[bold]{len(stale)} to run[/], {len(steps) - len(stale)} up to date (run {run_id})")
        if self.console.is_terminal and not self.quiet:
            self.status = self.console.status("starting")
            self.status.start()

    def on_node_start(self, node: str, reason: str) -> None:
        self.running[node] = ""
        if not self.quiet:
            self._print(f"[cyan]▶[/] {escape(node):<{self.width}} [dim]{escape(reason)}[/]")
        self._refresh()

    def on_node_waiting(self, node: str, message: str) -> None:
        if not self.quiet:
            self._print(f"[yellow]…[/] {escape(node):<{self.width}} {escape(message)}")

    def on_node_progress(self, node: str, fraction: float | None, message: str) -> None:
        if node in self.running:
            pct = f"{fraction:.0%} " if fraction is not None else ""
            self.running[node] = f"{pct}{message}"[:60]
            self._refresh()

    def on_node_end(self, result: NodeResult) -> None:
        self.running.pop(result.node, None)
        self._refresh()
        mark = _MARKS.get(result.status, "?")
        name = f"{escape(result.node):<{self.width}}"
        if result.status == DONE:
            if not self.quiet:
                self._print(f"{mark} {name} done in {result.duration:.1f}s")
        elif result.status == CACHED:
            if not self.quiet:
                self._print(f"{mark} {name} reused: {escape(result.reason)}")
        elif result.status == SKIPPED:
            needs = f" (needs: {escape(result.hint)})" if result.hint else ""
            self._print(f"{mark} {name} skipped: {escape(result.error or result.reason)}{needs}")
        elif result.status == "blocked":
            self._print(f"{mark} {name} not run: {escape(result.reason)}")
        elif result.status in ("failed", "gate_failed"):
            what = "quality gate failed" if result.status == "gate_failed" else "failed"
            self._print(f"{mark} {name} [red]{what}[/]: {escape(result.error or '')}")
            if result.hint:
                self._print(f"  hint: {escape(result.hint)}")
            if result.log_path:
                self._print(f"  log:  {escape(_rel(result.log_path))}")
                if result.error and ("Error" in result.error or "process" in result.error):
                    tail = _log_tail(result.log_path, 12)
                    if tail:
                        self._print("[dim]" + escape(tail) + "[/]")

    def finish(self, summary: RunSummary, steps: list[Step], seconds: float, output_dir: Path | None,
               resume: str) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None
        results = summary.results
        total = len(results)
        done = summary.count(DONE)
        reused = summary.count(CACHED)
        fresh = summary.count(FRESH)
        if summary.interrupted:
            self._print(f"[yellow]interrupted[/]: {done} nodes finished and were saved. Resume with:\n  {resume}")
            return
        if done == 0 and reused == 0 and fresh == total:
            print(f"Nothing to do: all {total} nodes are up to date ({seconds:.2f}s).", flush=True)
        else:
            skipped = summary.count(SKIPPED)
            failed = summary.count("failed", "gate_failed")
            blocked = summary.count("blocked")
            parts = [f"{done} built", f"{reused} reused", f"{fresh} up to date"]
            if skipped:
                parts.append(f"{skipped} skipped")
            if failed:
                parts.append(f"[red]{failed} failed[/]")
            if blocked:
                parts.append(f"{blocked} not run")
            self._print(("[green]Done[/]" if summary.ok else "[red]Failed[/]") + f" in {seconds:.1f}s: "
                        + ", ".join(parts) + ".")
        if not summary.ok:
            self._print(f"Fix the problem above, then resume (finished nodes are kept):\n  {escape(resume)}")
        if output_dir is not None and not self.quiet and (done or reused):
            self._print(f"Outputs in {escape(_rel(output_dir))}/:")
            for name, res in results.items():
                for path in res.outputs.values():
                    self._print(f"  {escape(name):<{self.width}} {escape(_rel(path))}")


def _log_tail(path: Path, lines: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join("  | " + line for line in text.strip().splitlines()[-lines:])
