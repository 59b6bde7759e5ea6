"""The scheduler hands a node every GPU it asks for, all on one machine of a cluster (issue 20.6)."""

from __future__ import annotations

from pathlib import Path

from trtflow.environment import GpuInfo
from trtflow.execution.build import device_list
from trtflow.execution.scheduler import Capacity, GpuLocks, Scheduler
from trtflow.stage import Resources

GIB = 1 << 30


def _gpu(index: int, name: str = "NVIDIA H100 80GB HBM3", cc: str = "9.0") -> GpuInfo:
    return GpuInfo(index, name, cc, "550.54", 81559, uuid=f"GPU-{index:04d}", host_index=index)


def test_a_node_asking_for_two_gpus_gets_two_and_its_device_list_names_both(tmp_path: Path) -> None:
    scheduler = Scheduler(Capacity(4, 64 * GIB, [_gpu(0), _gpu(1), _gpu(2)]), GpuLocks(tmp_path))
    pair = scheduler.try_allocate(Resources(cpu=1, gpu=2), GIB)
    assert pair is not None and [g.visible_id for g in pair.gpus] == ["GPU-0000", "GPU-0001"]
    assert device_list(pair) == "GPU-0000,GPU-0001"
    assert scheduler.try_allocate(Resources(cpu=1, gpu=2), GIB) is None  # one GPU left
    single = scheduler.try_allocate(Resources(cpu=1, gpu=1), GIB)
    assert single is not None and device_list(single) == "GPU-0002"
    scheduler.release(pair)
    scheduler.release(single)
    assert device_list(scheduler.try_allocate(Resources(cpu=1), GIB)) is None


def test_on_a_cluster_a_node_gets_its_gpus_from_one_machine(tmp_path: Path) -> None:
    gpus = [_gpu(0), _gpu(1), _gpu(2), _gpu(3)]
    hosts = {"GPU-0000": "m1", "GPU-0001": "m2", "GPU-0002": "m2", "GPU-0003": "m1"}
    scheduler = Scheduler(Capacity(8, 64 * GIB, gpus, hosts), GpuLocks(tmp_path))
    first = scheduler.try_allocate(Resources(cpu=1, gpu=2), GIB)
    assert first is not None and {hosts[g.visible_id] for g in first.gpus} == {"m1"}
    second = scheduler.try_allocate(Resources(cpu=1, gpu=2), GIB)
    assert second is not None and {hosts[g.visible_id] for g in second.gpus} == {"m2"}
    assert scheduler.can_ever_run(Resources(cpu=1, gpu=3)) == (
        "needs 3 GPU(s) on one machine; this machine has " + ", ".join(g.label for g in gpus))
    assert scheduler.can_ever_run(Resources(cpu=1, gpu=2)) is None


def test_gpus_one_machine_does_not_fit_are_not_held_while_waiting(tmp_path: Path) -> None:
    gpus = [_gpu(0), _gpu(1), _gpu(2)]
    hosts = {"GPU-0000": "m1", "GPU-0001": "m2", "GPU-0002": "m2"}
    scheduler = Scheduler(Capacity(8, 64 * GIB, gpus, hosts), GpuLocks(tmp_path))
    busy = scheduler.try_allocate(Resources(cpu=1, gpu=1, compute_capability="9.0"), GIB)
    assert busy is not None and busy.gpus[0].visible_id == "GPU-0000"
    held = scheduler.try_allocate(Resources(cpu=1, gpu=1), GIB)  # takes one of m2's
    assert held is not None
    assert scheduler.try_allocate(Resources(cpu=1, gpu=2), GIB) is None  # no machine has two free
    free = scheduler.try_allocate(Resources(cpu=1, gpu=1), GIB)
    assert free is not None, "a failed attempt kept a GPU locked"
