"""The Ray executor: each node a Ray task with the resources it declares, artifacts through the remote cache.

`trtflow run --executor ray` starts a local Ray cluster, or joins one (``--ray-address``: KubeRay, a Slurm-launched
cluster, ``auto``). The driver (this process) plans, keys, schedules and commits; a worker only runs the stage:
it pulls the node's inputs from the remote cache (verified by digest), runs the stage in a child process of its
own (a crashing stage cannot take the Ray worker down), and uploads the outputs to the remote cache. The driver
then pulls them into its store and commits the manifest, so a node is never committed half-done: a worker that
dies mid-node makes Ray retry the task elsewhere (``MAX_RETRIES``), and Ctrl-C cancels the cluster's tasks.

GPU nodes are keyed with the facts of the GPU class they are placed on: at start the driver asks every cluster
node for its GPUs (a small probe task pinned to it), the scheduler picks a GPU whose class the node's requirements
accept, and the task is pinned to that GPU's machine. Software facts (library and TensorRT versions) are the
driver's: run the driver and the workers from one image, as Ray itself expects.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trtflow.environment import GpuInfo
from trtflow.errors import EnvironmentUnavailable, TrtflowError, UsageError
from trtflow.execution.protocol import CRASHED, FAILED, INTERRUPTED, OK, Job, Outcome
from trtflow.execution.results import RunOptions
from trtflow.execution.scheduler import Capacity
from trtflow.storage.store import Store

MAX_RETRIES = 2
POLL_S = 0.2


class RayExecutor:
    name = "ray"
    remote_inputs = True  # workers fetch inputs from the remote cache, not from the driver's disk

    def __init__(self, store: Store, options: RunOptions) -> None:
        self.store = store
        self.options = options
        if options.remote is None:
            if options.ray_address:
                raise UsageError("a Ray cluster of several machines moves artifacts through a remote cache",
                                 hint="add --remote DIR_ON_SHARED_STORAGE or --remote s3://bucket/prefix "
                                 "(or set TRTFLOW_REMOTE)")
            implicit = store.root / "ray-remote"  # a local cluster: a directory beside the store is the remote
            implicit.mkdir(parents=True, exist_ok=True)
            options.remote = str(implicit)
        self.remote_url = options.remote
        self._gpu_nodes: dict[str, str] = {}  # GPU visible id -> Ray node id
        self._refs: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._started = False
        self._owns_cluster = False

    # ----------------------------------------------------------------- cluster
    def _ray(self) -> Any:
        try:
            import ray
        except ImportError:
            raise EnvironmentUnavailable("--executor ray needs Ray, which is not installed",
                                         hint="pip install 'trtflow[ray]'") from None
        return ray

    def start(self) -> None:
        if self._started:
            return
        ray = self._ray()
        address = self.options.ray_address
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                      "configure_logging": False, "namespace": "trtflow"}
            if address:
                ray.init(address=address, **kwargs)
            else:
                ray.init(**kwargs)
                self._owns_cluster = True
        self._started = True

    def capacity(self, jobs: int, memory: int) -> Capacity:
        """The cluster's CPUs and GPUs (each GPU with the facts of the machine it is on)."""
        self.start()
        ray = self._ray()
        resources = ray.cluster_resources()
        cpus = float(resources.get("CPU", 1))
        gpus: list[GpuInfo] = []
        probe = ray.remote(num_cpus=0)(_probe_gpus)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        for node in ray.nodes():
            if not node.get("Alive") or not node.get("Resources", {}).get("GPU"):
                continue
            strategy = NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
            for gpu in ray.get(probe.options(scheduling_strategy=strategy).remote()):
                info = GpuInfo(**gpu)
                gpus.append(info)
                self._gpu_nodes[info.visible_id] = node["NodeID"]
        memory = int(resources.get("memory", memory))
        return Capacity(min(float(jobs), cpus) if jobs else cpus, memory, gpus)

    def pid_of(self, node: str) -> int | None:
        return None

    # ----------------------------------------------------------------- one node
    def execute(self, job: Job, cancel: threading.Event) -> Outcome:
        self.start()
        ray = self._ray()
        from trtflow.registry import get_stage

        stage = get_stage(job.stage)
        resources = stage.resources_for(stage.params.model_validate(job.params))
        options: dict[str, Any] = {"num_cpus": resources.cpu, "num_gpus": resources.gpu,
                                   "max_retries": MAX_RETRIES, "retry_exceptions": False}
        if job.device and job.device in self._gpu_nodes:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                node_id=self._gpu_nodes[job.device], soft=False)
        outputs = {name: (o.filename, o.kind) for name, o in stage.outputs.items()}
        task = ray.remote(_run_node).options(**options)
        ref = task.remote(asdict(job), outputs, self.remote_url)
        with self._lock:
            self._refs[job.node] = ref
        try:
            while True:
                ready, _ = ray.wait([ref], timeout=POLL_S)
                if ready:
                    break
                if cancel.is_set():
                    ray.cancel(ref, force=True)
                    return Outcome(INTERRUPTED, error="interrupted")
            try:
                result, log_text = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:  # our task code raised: say what, not "a worker died"
                if cancel.is_set():
                    return Outcome(INTERRUPTED, error="interrupted")
                cause = getattr(exc, "cause", None)
                if isinstance(cause, TrtflowError):
                    return Outcome(FAILED, error=cause.message, hint=cause.hint)
                return Outcome(CRASHED, error=f"the Ray task of node {job.node} raised "
                               f"{type(cause or exc).__name__}: {str(cause or exc).strip().splitlines()[-1]}",
                               hint="see the Ray worker's log (/tmp/ray/session_latest/logs on that machine)")
            except Exception as exc:  # the worker died (retries exhausted), the task was cancelled, the node was lost
                if cancel.is_set():
                    return Outcome(INTERRUPTED, error="interrupted")
                return Outcome(CRASHED, error=f"the Ray task of node {job.node} failed after {MAX_RETRIES} retries: "
                               f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                               hint="a worker died, or the cluster lost the machine it was on; see `ray status` and "
                               "the Ray logs (/tmp/ray/session_latest/logs on the worker)")
        finally:
            with self._lock:
                self._refs.pop(job.node, None)
        Path(job.log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(job.log_path, "a", encoding="utf-8") as log:
            log.write(log_text)
        return Outcome(**result)

    def interrupt(self) -> None:
        if not self._started:
            return
        ray = self._ray()
        with self._lock:
            refs = list(self._refs.values())
        for ref in refs:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # already finished
                continue

    def close(self) -> None:
        if self._owns_cluster:
            ray = self._ray()
            ray.shutdown()
            self._owns_cluster = False
        self._started = False


def _probe_gpus() -> list[dict[str, Any]]:
    """Every GPU of the machine this runs on (not just those Ray would show a task)."""
    from trtflow.environment import _SMI_FIELDS, _smi, parse_smi

    query = _smi(f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader,nounits")
    return [asdict(g) for g in parse_smi(query, _smi("-L"))] if query else []


def _run_node(job_data: dict[str, Any], outputs: dict[str, tuple[str, str]], remote_url: str
              ) -> tuple[dict[str, Any], str]:
    """On a Ray worker: pull inputs from the remote cache, run the stage in a child process, upload the outputs."""
    import shutil
    import tempfile

    from trtflow.execution.local import LocalExecutor
    from trtflow.storage.remote import RemoteCache

    job = Job.from_json(job_data)
    remote = RemoteCache(remote_url)
    work = Path(tempfile.mkdtemp(prefix=f"trtflow-{job.node}-"))
    try:
        cache = Store(work / "inputs")
        inputs_dir = work / "scratch" / "in"
        for place, objects in job.input_objects.items():  # place: "<slot>", or "<slot>/<producer>" in a many-slot
            remote.pull_objects(objects, cache, node=job.node)
            folder = inputs_dir / place
            folder.mkdir(parents=True, exist_ok=True)
            for out in objects.values():
                target = folder / out["filename"]
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(cache.object_path(out["digest"]), target)
        inputs: dict[str, str | list[str]] = {
            slot: [str(inputs_dir / slot / rel) for rel in names] if isinstance(names, list)
            else str(inputs_dir / slot / names)
            for slot, names in job.inputs.items()}
        local = Job(**{**job_data, "inputs": inputs, "scratch": str(work / "scratch"),
                       "log_path": str(work / "node.log"), "cache_dir": str(work / "caches"), "device": None,
                       "parent_pid": os.getpid()})
        executor = LocalExecutor(work, use_fork_server=False)
        started = time.time()
        outcome = executor.execute(local, threading.Event())
        if outcome.status == OK:
            outcome.stored_outputs = remote.upload_outputs(local.out_dir, outputs)
        log_text = (work / "node.log").read_text(encoding="utf-8", errors="replace") if (work / "node.log").exists() \
            else ""
        host = os.uname().nodename
        log_text = f"[ran on {host} via Ray in {time.time() - started:.1f} s]\n" + log_text
        return asdict(outcome), log_text
    finally:
        shutil.rmtree(work, ignore_errors=True)
