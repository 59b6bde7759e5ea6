"""What a name read from a record or given by a caller must be before it becomes part of a path below a tree
(no ``/`` for a name, no ``..`` or ``.``, no NUL, no empty part, at most 255 bytes per part), and `Refused`, the
error of everything the confined layer will not use."""

from __future__ import annotations

from collections.abc import Sequence

from trtflow.userfiles import Refused

__all__ = ["Refused", "Rel", "check_name", "check_relative", "is_plain_name", "parts_of"]

NAME_MAX = 255


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
