"""What else ran while a benchmark timed: measured, not assumed.

A benchmark node runs alone in its trtflow run (it is exclusive), but nothing stops other programs on the host:
another user's job, a CI neighbour, a second trtflow run. `HostWatch` takes a snapshot of the host before a
measurement and, after it, reports what the host did meanwhile, from Linux's own accounting:

- ``others_cpu_percent``: CPU time used by every process outside this one (and its children), as a share of all
  the CPUs' time (/proc/stat and /proc/<pid>/stat);
- ``busiest_others``: the processes that used most of it, with their command names and share of one CPU;
- ``wait_percent``: the time this process's threads were ready to run but waited for a CPU (the scheduler's
  run-queue delay, /proc/self/task/*/schedstat), as a share of the measured time: the latency that other work
  added to ours, directly;
- ``steal_percent``: time the hypervisor gave this virtual machine's CPUs to others (/proc/stat steal);
- the 1-minute load average before and after.

Where /proc is not readable (not Linux) the figures are None. `thread_wait_ns` is cheap enough to read per window.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROC = Path("/proc")
#: A measurement is disturbed when our threads waited for a CPU longer than this share of the time measured,
WAIT_BUSY_PERCENT = 5.0
#: or other processes used more than this share of all CPUs.
OTHERS_BUSY_PERCENT = 25.0
BUSIEST = 3


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def thread_wait_ns() -> int | None:
    """Nanoseconds this process's threads have spent waiting on a run queue so far (None: not readable)."""
    total, found = 0, False
    try:
        tasks = list((PROC / "self" / "task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[1])
            found = True
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total if found else None


def _cpu_ticks() -> tuple[int, int, int] | None:
    """(total, busy, steal) jiffies of all CPUs since boot."""
    try:
        fields = [int(v) for v in (PROC / "stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    steal = fields[7] if len(fields) > 7 else 0
    total = sum(fields[:8])  # guest time is already counted in user time
    return total, total - idle - steal, steal


def _processes() -> dict[int, tuple[str, int, int]]:
    """pid -> (command, parent pid, user+system jiffies) of every readable process."""
    found = {}
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        head, _, rest = text.rpartition(")")
        command = head.partition("(")[2]
        parts = rest.split()
        try:
            found[int(entry.name)] = (command, int(parts[1]), int(parts[11]) + int(parts[12]))
        except (IndexError, ValueError):
            continue
    return found


def _family(processes: dict[int, tuple[str, int, int]], root: int) -> set[int]:
    """``root`` and its descendants."""
    members, grew = {root}, True
    while grew:
        grew = False
        for pid, (_, parent, _) in processes.items():
            if parent in members and pid not in members:
                members.add(pid)
                grew = True
    return members


def _load_average() -> list[float] | None:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


@dataclass
class _Snapshot:
    at: float
    ticks: tuple[int, int, int] | None
    processes: dict[int, tuple[str, int, int]]
    wait_ns: int | None
    load: list[float] | None

    @classmethod
    def take(cls) -> _Snapshot:
        return cls(time.monotonic(), _cpu_ticks(), _processes(), thread_wait_ns(), _load_average())


@dataclass
class HostWatch:
    """Watches the host from creation until `report`."""

    start: _Snapshot = field(default_factory=_Snapshot.take)

    def report(self, busiest: int = BUSIEST) -> dict[str, Any]:
        end = _Snapshot.take()
        seconds = max(end.at - self.start.at, 1e-9)
        record: dict[str, Any] = {"seconds": round(seconds, 3), "cpus": available_cpus(),
                                  "load_average_before": self.start.load, "load_average_after": end.load,
                                  "others_cpu_percent": None, "steal_percent": None, "wait_percent": None,
                                  "busiest_others": []}
        if self.start.wait_ns is not None and end.wait_ns is not None:
            record["wait_percent"] = round((end.wait_ns - self.start.wait_ns) / 1e9 / seconds * 100.0, 2)
        if self.start.ticks is None or end.ticks is None:
            return record
        total = end.ticks[0] - self.start.ticks[0]
        if total <= 0:
            return record
        ours = _family(end.processes, os.getpid()) | _family(self.start.processes, os.getpid())
        used = {pid: jiffies - self.start.processes[pid][2] for pid, (_, _, jiffies) in end.processes.items()
                if pid in self.start.processes and pid not in ours}
        busy_others = sum(max(v, 0) for v in used.values())
        record["others_cpu_percent"] = round(min(busy_others / total * 100.0, 100.0), 2)
        record["steal_percent"] = round((end.ticks[2] - self.start.ticks[2]) / total * 100.0, 2)
        ticks_per_s = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        record["busiest_others"] = [
            {"pid": pid, "command": end.processes[pid][0],
             "cpu_percent": round(jiffies / ticks_per_s / seconds * 100.0, 1)}
            for pid, jiffies in sorted(used.items(), key=lambda item: -item[1])[:busiest] if jiffies > 0]
        return record


def busy_warning(record: dict[str, Any], device: str) -> dict[str, str] | None:
    """A ``busy-host`` warning when the host disturbed the measurement (None when it did not, or is unknown)."""
    wait, others = record.get("wait_percent"), record.get("others_cpu_percent")
    disturbed = (wait is not None and wait > WAIT_BUSY_PERCENT) or (others is not None and others > OTHERS_BUSY_PERCENT)
    if not disturbed:
        return None
    busiest = ", ".join(f"{p['command']} (pid {p['pid']}, {p['cpu_percent']:g}% of a CPU)"
                        for p in record.get("busiest_others") or [])
    parts = []
    if others is not None:
        parts.append(f"other processes used {others:g}% of the {record.get('cpus')} CPUs"
                     + (f" (busiest: {busiest})" if busiest else ""))
    if wait is not None:
        parts.append(f"this benchmark's threads waited for a CPU {wait:g}% of the time")
    advice = ("CPU timings are disturbed: stop the other work, or give the benchmark dedicated cores "
              "(onnxruntime.intra_op_threads below the idle CPUs)" if device == "cpu"
              else "the host's CPUs feed the GPU: stop other work on the machine")
    return {"flag": "busy-host", "message": "the host was busy while timing: " + "; ".join(parts) + f". {advice}"}
