"""What trtflow prints to a terminal carries no control characters but its own: text from models and records (ONNX
tensor names, node messages, summaries, errors, a planted journal's rows) may hold C0/C1 controls and escape
sequences (a clipboard write, OSC 52; a window title; clear screen; a carriage return that hides a line), and
printing them raw would let a model or a record act on the user's terminal.

One place does it for every printer of the CLI: `guard` (called by ``trtflow.cli.main``) puts `Plain` in front of
``sys.stdout`` and ``sys.stderr``, so ``print``, ``typer.echo``, logging, tracebacks and the plugins' commands all
write through `plain`; the rich consoles (`console`: the CLI's, the live run display's, errors') write to the real
stream, keep their own styling and control segments, and pass every text segment through `plain` first
(`SafeConsole`). JSON output keeps such characters escaped (``\\u001b``); the HTML report and JUnit XML show them as
visible escapes (`visible`). ``tests/reliability/test_terminal.py`` runs every printing command over a model whose
tensor names hold such sequences.
"""

from __future__ import annotations

import io
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

#: An escape sequence (CSI, OSC up to its terminator, DCS/SOS/PM/APC up to ST, or ESC and one character), or one C0
#: control but tab and newline, DEL, or a C1 control.
CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]?|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
                     r"|\x1b[^\n]?|\x9b[0-?]*[ -/]*[@-~]?|\x9d[^\x07\x1b\x9c]*[\x07\x9c]?"
                     r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]",
                     re.DOTALL)


def plain(text: str) -> str:
    """``text`` without control characters and escape sequences (tab and newline are kept)."""
    return CONTROL.sub("", text) if not text.isprintable() else text


def visible(text: str) -> str:
    r"""``text`` with each control character shown as an escape (``\x1b``), for documents (HTML, XML) that keep it."""
    return re.sub(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", lambda m: f"\\x{ord(m.group()):02x}", text)


class Plain(io.TextIOBase):
    """A text stream that writes to ``raw`` what it is given, through `plain`."""

    def __init__(self, raw: TextIO) -> None:
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(plain(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:  # type: ignore[override]
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.raw.flush()

    def isatty(self) -> bool:
        return self.raw.isatty()

    def fileno(self) -> int:
        return self.raw.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.raw, "encoding", "utf-8")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def real(stream: TextIO) -> TextIO:
    """The stream below a `Plain` (``stream`` itself otherwise)."""
    return stream.raw if isinstance(stream, Plain) else stream


@contextmanager
def guard() -> Iterator[None]:
    """Within the block, ``sys.stdout`` and ``sys.stderr`` strip control characters (`Plain`); restored after."""
    before = sys.stdout, sys.stderr
    sys.stdout = Plain(real(sys.stdout))
    sys.stderr = Plain(real(sys.stderr))
    try:
        yield
    finally:
        sys.stdout, sys.stderr = before


def console(stderr: bool = False, **options: Any) -> Any:
    """A rich console (`SafeConsole`) on the real stdout (stderr), writing no control characters but its own."""
    from rich.console import Console
    from rich.segment import Segment

    class SafeConsole(Console):
        """Its own styling and control segments (cursor moves of the live display) kept; every text `plain`."""

        def _render_buffer(self, buffer: Iterable[Segment]) -> str:
            return super()._render_buffer(segment if segment.control else Segment(plain(segment.text), segment.style)
                                          for segment in buffer)

    return SafeConsole(file=real(sys.stderr if stderr else sys.stdout), **options)
