"""Error types and the CLI exit codes they map to.

`TrtflowError` is a user-facing problem (bad recipe, missing file, unavailable backend): it carries a
message and a hint saying what to do. Anything else that escapes is our bug (`InternalError`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

EXIT_OK = 0
EXIT_FAILED = 1  # a stage failed or a quality gate failed
EXIT_USAGE = 2  # bad recipe or bad command-line usage
EXIT_ENVIRONMENT = 3  # this machine cannot run the requested backend
EXIT_STORE = 4  # the store is busy (gc), damaged, read-only, full, or of a newer format
EXIT_INCONCLUSIVE = 5  # a quality gate could not decide at its cap (on_inconclusive: fail), and nothing else failed
EXIT_INTERRUPTED = 130


#: Terminal control sequences (colours, cursor moves) that a library's message may carry (transformers' load
#: report, Keras errors): a message is text, whatever prints it (a terminal, a log, a JSON report).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def plain(text: str) -> str:
    """``text`` without terminal control sequences."""
    return _ANSI.sub("", text) if "\x1b" in text else text


class TrtflowError(Exception):
    """A problem the user can fix; the CLI prints it without a traceback."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, hint: str | None = None) -> None:
        message, hint = plain(message), plain(hint) if hint is not None else None
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


@dataclass(frozen=True)
class Location:
    """Where in a recipe file a value came from (1-based line and column)."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        if self.line <= 0:
            return self.file
        return f"{self.file}:{self.line}:{self.column}"


class RecipeError(TrtflowError):
    """The recipe is invalid; names the file, line, column and field."""

    exit_code = EXIT_USAGE

    def __init__(
        self,
        message: str,
        location: Location | None = None,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.location = location
        self.field = field
        prefix = f"{location}: " if location else ""
        where = f"{field}: " if field else ""
        super().__init__(f"{prefix}{where}{message}", hint)


class UsageError(TrtflowError):
    exit_code = EXIT_USAGE


class EnvironmentUnavailable(TrtflowError):
    """The requested backend cannot run on this machine."""

    exit_code = EXIT_ENVIRONMENT


class StoreError(TrtflowError):
    """The store cannot be used as asked: damaged journal, read-only, full disk, newer format."""

    exit_code = EXIT_STORE


class StoreBusy(StoreError):
    """Another trtflow process holds the store lock (a gc, or runs while gc waits)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint or "retry when it has finished, or wait longer (gc: --wait SECONDS)")


class StageFailed(TrtflowError):
    """Raised by a stage for an expected failure whose message is enough (no traceback in the log)."""


class RecipeMismatch(StageFailed):
    """What the recipe (or `trtflow init`'s options) declares does not fit the model, found when a stage looks at the
    model: inputs it does not take, a profile beyond its limits, a task it cannot do. A usage mistake (exit 2),
    like a recipe error, whichever command finds it."""

    exit_code = EXIT_USAGE


class GateFailed(StageFailed):
    """A quality gate (accuracy, latency) was not met; carries the metrics that failed it."""

    def __init__(self, message: str, metrics: dict | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.metrics = metrics or {}


class StageSkipped(Exception):
    """Raised by a stage whose backend cannot run here; the node is recorded as skipped, never passed."""

    def __init__(self, reason: str, needs: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.needs = needs


class InternalError(Exception):
    """A bug in trtflow itself."""


def did_you_mean(word: str, choices: list[str] | set[str] | tuple[str, ...]) -> str | None:
    """Return a 'did you mean' suggestion for a misspelt name, or None."""
    import difflib

    matches = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f"did you mean '{matches[0]}'?" if matches else None
