"""Where the `trtflow` commands print: rich consoles for a terminal, whole lines for a pipe, a file or stdout."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def rich_console(stderr: bool = False) -> Any:
    from trtflow.terminal import console

    return console(stderr=stderr, highlight=False, soft_wrap=True)


def whole_lines_console() -> Any:
    """A console for stdout that is not a terminal: tables as wide as their content (rich would cut them to
    $COLUMNS, or 80), so that a script, grep or a CI log gets whole ids and names."""
    from trtflow.terminal import console

    return console(highlight=False, soft_wrap=True, width=100_000, color_system=None)


def emit(text: str, output: Path | None) -> None:
    """Write ``text`` to ``output`` (saying so on stderr) or to stdout."""
    if output:
        from trtflow.userfiles import write_file

        write_file(output, text)  # a random temporary file renamed over it: a link there is replaced, not followed
        rich_console(stderr=True).print(f"wrote {output}")
    else:
        sys.stdout.write(text)

