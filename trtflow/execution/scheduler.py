"""Decide what may start now: resources as counts (CPU slots, memory, GPUs) and classes (which GPU).

Rules:
- CPU: the nodes running at once use at most ``jobs`` CPU slots (a node asking for more runs alone).
- Memory: their memory needs (the stage's estimate, or the node's measured peak last time, whichever is larger)
  add up to at most what the machine has free; a node that needs more than that runs alone.
- GPUs: a GPU node gets as many GPUs as it asks for, all that its requirements accept (compute capability, name)
  and all on one machine (a cluster's GPUs are grouped by ``Capacity.hosts``), each held through a lock shared by
  every trtflow process on this host, so several runs share the GPUs instead of each handing out all.
- Exclusive nodes (benchmarks) run alone: nothing starts beside them, and they start only when nothing runs.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, field
from pathlib import Path

from trtflow.environment import GpuInfo
from trtflow.stage import Resources

MIB = 1 << 20


def available_memory() -> int:
    """Memory this machine can give new processes now (MemAvailable, bounded by the cgroup's limit)."""
    free = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    limit = _cgroup_room()
    candidates = [v for v in (free, limit) if v is not None]
    return min(candidates) if candidates else 8 << 30


def _cgroup_room() -> int | None:
    try:
        line = Path("/proc/self/cgroup").read_text().strip().splitlines()[-1]
        base = Path("/sys/fs/cgroup") / line.split(":", 2)[2].lstrip("/")
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int((base / "memory.current").read_text().strip())
    except (OSError, ValueError, IndexError):
        return None


class GpuLocks:
    """One lock file per GPU, shared by every trtflow process on this host (released when a process dies)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or Path(os.environ.get("TRTFLOW_GPU_LOCK_DIR", "/tmp/trtflow-gpu-locks"))

    def try_take(self, gpu: GpuInfo) -> int | None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # a host-wide folder others may have made (or planted as a link): opened without following a link,
            # made shared (sticky, world-writable) only when it is ours
            folder = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return -1  # no shared lock directory: share nothing, but do not stop the run
        try:
            if os.fstat(folder).st_uid == os.geteuid():
                try:
                    os.fchmod(folder, 0o1777)
                except OSError:
                    pass
            name = "".join(c if c.isalnum() or c in "-_" else "_" for c in gpu.visible_id)
            fd = os.open(f"gpu-{name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         0o666, dir_fd=folder)
        except OSError:
            return -1
        finally:
            os.close(folder)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    @staticmethod
    def release(fd: int) -> None:
        if fd >= 0:
            os.close(fd)


@dataclass
class Allocation:
    cpu: float
    memory: int
    exclusive: bool
    gpus: list[GpuInfo] = field(default_factory=list)
    lock_fds: list[int] = field(default_factory=list)

    @property
    def device(self) -> GpuInfo | None:
        """The first GPU: the one whose facts (name, compute capability, driver) key the node's result."""
        return self.gpus[0] if self.gpus else None


@dataclass
class Capacity:
    cpu_slots: float
    memory: int
    gpus: list[GpuInfo]
    hosts: dict[str, str] = field(default_factory=dict)  # GPU visible id -> its machine (a cluster); {}: this one

    def by_host(self, gpus: list[GpuInfo]) -> list[list[GpuInfo]]:
        """``gpus`` grouped by machine, each group in the order given."""
        groups: dict[str, list[GpuInfo]] = {}
        for gpu in gpus:
            groups.setdefault(self.hosts.get(gpu.visible_id, ""), []).append(gpu)
        return list(groups.values())


class Scheduler:
    def __init__(self, capacity: Capacity, gpu_locks: GpuLocks | None = None) -> None:
        self.capacity = capacity
        self.gpu_locks = gpu_locks or GpuLocks()
        self.running: list[Allocation] = []
        self._busy_gpus: set[str] = set()

    @property
    def idle(self) -> bool:
        return not self.running

    def can_ever_run(self, resources: Resources) -> str | None:
        """Why a node can never run on this machine (None if it can)."""
        if resources.gpu <= 0:
            return None
        fitting = [g for g in self.capacity.gpus if resources.accepts(g)]
        if any(len(group) >= resources.gpu for group in self.capacity.by_host(fitting)):
            return None
        wanted = []
        if resources.compute_capability:
            wanted.append(f"compute capability {resources.compute_capability}")
        if resources.gpu_name:
            wanted.append(f"a name containing {resources.gpu_name!r}")
        what = f"{resources.gpu} GPU(s)" + (f" with {' and '.join(wanted)}" if wanted else "")
        if len(fitting) >= resources.gpu:
            what += " on one machine"
        have = ", ".join(g.label for g in self.capacity.gpus) or "no GPU"
        return f"needs {what}; this machine has {have}"

    def try_allocate(self, resources: Resources, memory: int) -> Allocation | None:
        if any(a.exclusive for a in self.running):
            return None
        if resources.exclusive and self.running:
            return None
        if self.running:
            if sum(a.cpu for a in self.running) + resources.cpu > self.capacity.cpu_slots:
                return None
            if sum(a.memory for a in self.running) + memory > self.capacity.memory:
                return None
        allocation = Allocation(resources.cpu, memory, resources.exclusive)
        if resources.gpu > 0:
            free = [g for g in self.capacity.gpus if g.visible_id not in self._busy_gpus and resources.accepts(g)]
            for group in self.capacity.by_host(free):
                if self._take(group, resources.gpu, allocation):
                    break
            else:
                return None
            self._busy_gpus.update(g.visible_id for g in allocation.gpus)
        self.running.append(allocation)
        return allocation

    def _take(self, group: list[GpuInfo], count: int, allocation: Allocation) -> bool:
        """Lock ``count`` GPUs of one machine's ``group`` into ``allocation``; none if fewer are free."""
        for gpu in group:
            if len(allocation.gpus) == count:
                break
            fd = self.gpu_locks.try_take(gpu)
            if fd is None:
                continue  # another trtflow process on this host is using it
            allocation.gpus.append(gpu)
            allocation.lock_fds.append(fd)
        if len(allocation.gpus) == count:
            return True
        for fd in allocation.lock_fds:
            GpuLocks.release(fd)
        allocation.gpus.clear()
        allocation.lock_fds.clear()
        return False

    def release(self, allocation: Allocation) -> None:
        if allocation in self.running:
            self.running.remove(allocation)
        for gpu in allocation.gpus:
            self._busy_gpus.discard(gpu.visible_id)
        for fd in allocation.lock_fds:
            GpuLocks.release(fd)
        allocation.lock_fds.clear()


def default_memory_need(input_bytes: int) -> int:
    """A node's memory need when its stage gives no estimate: a process plus a few copies of its inputs."""
    return 256 * MIB + 3 * input_bytes
