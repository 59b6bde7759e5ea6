"""What a name read from a record or given by a caller must be before it becomes part of a path below a tree
(no ``/`` for a name, no ``..`` or ``.``, no NUL, no empty part, at most 255 bytes per part), and `Refused`, the
error of everything the confined layer will not use."""

from __future__ import annotations

import errno
from collections.abc import Sequence
from pathlib import Path

NAME_MAX = 255


class Refused(OSError):
    """An entry trtflow will not use: a symbolic link, not a regular file or folder, too large, not ours to
    append to, or a name that would leave its folder. ``message`` names the path and says why."""

    def __init__(self, path: Path | str, why: str, hint: str | None = None) -> None:
        self.path = Path(path)
        self.why = why
        self.hint = hint
        self.message = f"{path} {why}"
        super().__init__(errno.EPERM, self.message)

    def __str__(self) -> str:
        return self.message


# ------------------------------------------------------------------------------------------------ names
def is_plain_name(name: object, max_bytes: int = NAME_MAX) -> bool:
    """A single path component: a non-empty string without '/', NUL or backslash, not '.' or '..', at most
    ``max_bytes`` bytes in UTF-8."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\0" in name or "\\" in name:
        return False
    try:
        return len(name.encode("utf-8")) <= max_bytes
    except UnicodeEncodeError:
        return False


def check_name(name: object, what: str = "name", max_bytes: int = NAME_MAX) -> str:
    """``name`` if it is a plain name (`is_plain_name`); raises Refused otherwise."""
    if not is_plain_name(name, max_bytes):
        raise Refused(repr(name)[:300], f"is not a plain {what} (no '/', '..', NUL or backslash, at most "
                      f"{max_bytes} bytes)")
    assert isinstance(name, str)
    return name


def check_relative(path: object, what: str = "path") -> tuple[str, ...]:
    """The parts of a relative POSIX path whose every part is a plain name; raises Refused otherwise."""
    if isinstance(path, (tuple, list)):
        parts = tuple(path)
    elif isinstance(path, str) and path and not path.startswith("/"):
        parts = tuple(path.split("/"))
    else:
        raise Refused(repr(path)[:300], f"is not a relative {what}")
    for part in parts:
        check_name(part, f"part of a {what}")
    return parts


Rel = str | Sequence[str]




def parts_of(rel: Rel) -> tuple[str, ...]:
    """The parts of ``rel`` (checked by `check_relative`); at least one."""
    parts = check_relative(rel)
    if not parts:
        raise Refused(repr(rel), "names no file")
    return parts
