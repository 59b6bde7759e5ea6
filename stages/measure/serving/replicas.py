"""Replicas: one process per GPU, each serving the same model, all driven through each load level at once.

Each replica is a spawned process that sees only its GPU (``CUDA_VISIBLE_DEVICES``), loads the model through
`measure.serving.instances.open_executor`, serves it with a `measure.serving.traffic.Server` and runs the load levels it
is sent; the replicas start each level together (a barrier) and send their request records back. Separate processes, not
threads, so that neither Python's interpreter lock nor one CUDA context limits the scaling being measured.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
from collections.abc import Sequence
from typing import Any

from trtflow.stage import StageFailed

from .instances import ExecutorSpec, open_executor
from .levels import Level, run_level
from .traffic import DynamicBatching, LoadRun, Server, steady_interpreter

START_TIMEOUT_S = 600.0  # loading a large model (and importing torch) on a busy host is slow


def _replica_main(spec: ExecutorSpec, device: str, instances: int, batching: DynamicBatching | None,
                  warm_sizes: Sequence[int], barrier: Any, conn: Any) -> None:
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # device ids as nvidia-smi numbers them
    os.environ["CUDA_VISIBLE_DEVICES"] = device
    try:
        with open_executor(spec) as executor:
            runs = executor.instances(instances)
            with steady_interpreter() as quiet, Server(runs, batching, warm_sizes) as server:
                conn.send(("ready", dict(executor.settings, **quiet, cuda_visible_devices=device)))
                while (level := conn.recv()) is not None:
                    barrier.wait()
                    run = run_level(server, level)
                    for request in run.requests:
                        request.done = request.notify = None  # events and callbacks do not cross processes
                    conn.send(("ok", run))
    except BaseException as error:  # the parent raises it
        barrier.abort()
        conn.send(("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))
    finally:
        conn.close()


class Replicas:
    """One replica process per device in ``devices`` (CUDA device ids as the parent sees them)."""

    def __init__(self, spec: ExecutorSpec, devices: Sequence[str], instances: int,
                 batching: DynamicBatching | None, warm_sizes: Sequence[int] = (1,)) -> None:
        self._spec, self._devices, self._instances, self._batching = spec, list(devices), instances, batching
        self._warm_sizes = list(warm_sizes)
        self._processes: list[Any] = []
        self._pipes: list[Any] = []
        self.settings: list[dict[str, Any]] = []

    def __enter__(self) -> Replicas:
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(len(self._devices))
        for device in self._devices:
            parent, child = context.Pipe()
            process = context.Process(target=_replica_main, name=f"replica-gpu{device}", daemon=True,
                                      args=(self._spec, device, self._instances, self._batching, self._warm_sizes,
                                            barrier, child))
            process.start()
            child.close()
            self._processes.append(process)
            self._pipes.append(parent)
        try:
            self.settings = [self._receive(index, START_TIMEOUT_S) for index in range(len(self._devices))]
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _receive(self, index: int, timeout_s: float) -> Any:
        pipe = self._pipes[index]
        if not pipe.poll(timeout_s):
            raise StageFailed(f"the replica on GPU {self._devices[index]} sent nothing for {timeout_s:g} s",
                              hint="see the node's log; a replica may hang loading the model")
        try:
            status, payload = pipe.recv()
        except EOFError:
            code = self._processes[index].exitcode
            raise StageFailed(f"the replica on GPU {self._devices[index]} exited (code {code}) without a result",
                              hint="see the node's log for its output") from None
        if status == "error":
            raise StageFailed(f"the replica on GPU {self._devices[index]} failed: {payload}")
        return payload

    def run(self, levels: Sequence[Level], timeout_s: float) -> list[LoadRun]:
        """Run ``levels[i]`` on replica i, all at once; their request records, in replica order."""
        for pipe, level in zip(self._pipes, levels, strict=True):
            pipe.send(level)
        return [self._receive(index, timeout_s) for index in range(len(self._pipes))]

    def __exit__(self, *exc: object) -> None:
        for pipe in self._pipes:
            try:
                pipe.send(None)
            except (BrokenPipeError, OSError):
                pass
        for process in self._processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
        for pipe in self._pipes:
            pipe.close()
        self._processes, self._pipes = [], []
