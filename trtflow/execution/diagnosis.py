"""Turn a node process that died before reporting a result into a diagnosis a user can act on.

Sources: how it died (exit code or signal), whether the kernel's out-of-memory killer fired (cgroup v2
``memory.events``), its peak memory, the native call it was inside (``native_step.json``, written by
`StageContext.native_step`), the Python stack faulthandler printed into its log at the crash, and how much space
is left where the store lives.
"""

from __future__ import annotations

import re
import shutil
import signal
from pathlib import Path
from typing import Any

from trtflow.execution.protocol import CRASHED, Outcome
from trtflow.stage import NATIVE_STEP_FILE
from trtflow.storage import records
from trtflow.storage.confined.reading import tail_of_fd
from trtflow.storage.confined.tree import Tree, tail_of

_SIGNAL_WORDS: dict[int, str] = {
    signal.SIGSEGV: "a segmentation fault (SIGSEGV)",
    signal.SIGABRT: "an abort (SIGABRT)",
    signal.SIGBUS: "a bus error (SIGBUS)",
    signal.SIGFPE: "a floating-point exception (SIGFPE)",
    signal.SIGILL: "an illegal instruction (SIGILL)",
    signal.SIGKILL: "SIGKILL",
}
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)')
LOW_DISK_BYTES = 64 << 20


def gib(n: int | float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def oom_kills() -> int | None:
    """The out-of-memory kill counter of this process's cgroup (cgroup v2), or None where unavailable."""
    try:
        line = Path("/proc/self/cgroup").read_text().strip().splitlines()[-1]
        path = Path("/sys/fs/cgroup") / line.split(":", 2)[2].lstrip("/") / "memory.events"
        for row in path.read_text().splitlines():
            name, _, value = row.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError, IndexError):
        return None
    return None


def total_memory() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def native_step(scratch: Path | Tree) -> dict[str, Any] | None:
    """The native call the node's process was in when it died (its scratch folder: held, or a path)."""
    try:
        tree = scratch if isinstance(scratch, Tree) else Tree(scratch)  # a held folder is read through its descriptor
        data = records.read(tree, NATIVE_STEP_FILE, records.JOB)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def crash_trace(log: Path | int, limit: int = 12) -> list[str]:
    """The innermost Python frames faulthandler printed at the crash ("file:line in function"), from the node's
    log (its descriptor, held by the runner, or a path)."""
    try:
        text = tail_of_fd(log, 65536) if isinstance(log, int) else tail_of(log, 65536)
    except OSError:
        return []
    start = text.rfind("Fatal Python error")
    if start < 0:
        return []
    block = text[start:]
    current = block.find("Current thread")
    if current >= 0:
        block = block[current:]
    frames = []
    for line in block.splitlines():
        match = _FRAME.match(line)
        if match:
            frames.append(f"{_short_path(match.group(1))}:{match.group(2)} in {match.group(3)}")
        elif frames and not line.strip():
            break
    return frames[:limit]


def _short_path(path: str) -> str:
    for marker in ("site-packages/", "/stages/", "/trtflow/"):
        if marker in path:
            return (marker.strip("/") + "/" if marker != "site-packages/" else "") + path.split(marker, 1)[1]
    return path


def diagnose(exit_code: int | None, killed_by_us: bool, peak_rss: int | None, oom_before: int | None,
             scratch: Path | Tree, log: Path | int, store_root: Path) -> Outcome:
    """The outcome of a node process that ended without writing its result."""
    step = native_step(scratch)
    sig = -exit_code if exit_code is not None and exit_code < 0 else None
    oom_after = oom_kills()
    memory = total_memory()
    hints: list[str] = []
    if exit_code is None:
        what = "the process running it was lost (its fork server died)"
    elif sig is not None:
        what = f"the stage process died of {_SIGNAL_WORDS.get(sig, f'signal {sig}')}"
    else:
        what = f"the stage process exited with code {exit_code} before reporting a result"
    is_oom = sig == signal.SIGKILL and not killed_by_us and (
        (oom_before is not None and oom_after is not None and oom_after > oom_before)
        or (peak_rss is not None and memory is not None and peak_rss > 0.8 * memory))
    if is_oom:
        what = "the kernel's out-of-memory killer stopped the stage process"
        if peak_rss and memory:
            what += f" (peak memory {gib(peak_rss)} of the machine's {gib(memory)})"
        hints.append("run fewer nodes at once (-j 1), give the stage smaller batches or less calibration data, or "
                     "use a machine with more memory; trtflow now reserves this node's measured peak for it")
    elif sig == signal.SIGKILL and not killed_by_us:
        what += " (sent by another process or the kernel; most often the out-of-memory killer"
        what += f", peak memory {gib(peak_rss)})" if peak_rss else ")"
    if step:
        what += f", in {step.get('library', '?')} while {step.get('what', '?')}"
    frames = crash_trace(log)
    if frames:
        what += "; Python stack at the crash (innermost last): " + " <- ".join(reversed(frames[:4]))
    if step and step.get("hint"):
        hints.insert(0, str(step["hint"]))
    if step and step.get("repro"):
        hints.append(f"reproduce it alone: {step['repro']}")
    try:
        free = shutil.disk_usage(store_root).free
    except OSError:
        free = None
    if free is not None and free < LOW_DISK_BYTES:
        hints.insert(0, f"the disk holding the store {store_root} has only {free >> 20} MiB free: free space, then "
                     "run again (finished nodes are kept)")
    if not hints and sig in (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE):
        hints.append("a crash inside a native library: the log has the full trace; try another version of that "
                     "library or the stage's options that avoid the failing code path")
    return Outcome(CRASHED, error=what, hint="; ".join(hints) or None, exit_code=exit_code, signal=sig,
                   peak_rss=peak_rss)
