"""This process's original environment block: where a secret it was started with stays readable by others.

On Linux, ``/proc/<pid>/environ`` shows the memory between ``env_start`` and ``env_end`` (fields 50 and 51 of
``/proc/<pid>/stat``): the block the kernel copied the environment into when the process started. Removing a
variable from ``os.environ`` (``unsetenv``) drops libc's pointer to it, not those bytes, so any process of the same
user (a node's ``python:`` code reading ``/proc/<ppid>/environ``, its grandparent's) still reads the value, and a
process forked afterwards inherits the block. `erase` overwrites a variable's value bytes in place (through
``ctypes`` at ``env_start`` + its offset, as setproctitle-style tools rewrite argv), after checking that the memory
there holds exactly what ``/proc/self/environ`` showed, then reads the block again to confirm.

Not ``prctl(PR_SET_DUMPABLE, 0)``: that would hide the whole of ``/proc/<pid>`` from this user, be inherited by the
processes forked from this one, and stop the read tracer from reading their memory.
"""

from __future__ import annotations

import ctypes
import sys

from trtflow.userfiles import read_file

_CAP = 1 << 24  # an environment block is at most a few MiB (ARG_MAX)


def _block_bounds() -> tuple[int, int]:
    """(env_start, env_end) of this process (``/proc/self/stat`` fields 50 and 51, counted after the name)."""
    stat = read_file("/proc/self/stat", 1 << 16)
    fields = stat.rpartition(b")")[2].split()  # the name (field 2) may hold spaces and parentheses
    return int(fields[50 - 3]), int(fields[51 - 3])


def _values(block: bytes, name: str) -> list[tuple[int, int]]:
    """(offset, length) of the value of every ``name=`` entry of ``block``."""
    prefix = name.encode() + b"="
    found, offset = [], 0
    for entry in block.split(b"\0"):
        if entry.startswith(prefix):
            found.append((offset + len(prefix), len(entry) - len(prefix)))
        offset += len(entry) + 1
    return found


def holds(name: str) -> bool:
    """Whether this process's original environment block still holds a value of ``name`` (not all zero)."""
    block = read_file("/proc/self/environ", _CAP)
    return any(block[at:at + size].strip(b"\0") for at, size in _values(block, name))


def erase(name: str) -> bool:
    """Overwrite with zero bytes the value of ``name`` in this process's original environment block (Linux; on
    another system there is no ``/proc/<pid>/environ`` to read it from). True when the block holds it no more;
    False when it could not be erased (no ``/proc``, memory that does not hold what ``/proc`` showed)."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        start, end = _block_bounds()
        block = read_file("/proc/self/environ", _CAP)
    except (OSError, ValueError, IndexError):
        return False
    for at, size in _values(block, name):
        if size == 0 or start + at + size > end:
            continue
        value = block[at:at + size]
        if ctypes.string_at(start + at, size) != value:  # not the memory /proc showed: never written blindly
            return False
        ctypes.memset(start + at, 0, size)
    try:
        return not holds(name)
    except OSError:
        return False
