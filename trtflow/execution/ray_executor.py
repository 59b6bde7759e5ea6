"""The Ray executor: each node a Ray task with the resources it declares, artifacts through the remote cache.

`trtflow run --executor ray` starts a local Ray cluster, or joins one (``--ray-address``: KubeRay, a Slurm-launched
cluster, ``auto``). The driver (this process) plans, keys, schedules and commits; a worker only runs the stage:
it pulls the node's inputs from the transfer area (verified by digest), runs the stage in a child process of its
own (a crashing stage cannot take the Ray worker down), and uploads the outputs there. The driver then pulls them
into its store and commits the manifest, only if every required output came back, so a node is never committed
half-done: a worker that dies mid-node makes Ray retry the task elsewhere (``MAX_RETRIES``), and Ctrl-C cancels
the cluster's tasks.

The transfer area (``transfer``) is the remote cache when the run may push to it; under ``--no-push`` the cache is
only read, and the workers' traffic goes to a folder of this run in ``--ray-transfer`` (a location the workers
share: ``<ray-transfer>/<run id>``), or, on a local cluster, in the store (``ray-remote/<run id>``, made through the
store's confined tree: a real folder). Without ``--remote``, a local cluster uses that folder too. A run's own
transfer folder is removed when the run ends (the committed results are in the store by then); `trtflow gc` removes
what a killed run left in ``ray-remote/``.

GPU nodes are keyed with the facts of the GPU class they are placed on: at start the driver asks every cluster
node for its GPUs (a small probe task pinned to it), the scheduler picks GPUs whose class the node's requirements
accept, all on one machine, and the task is pinned to that machine with as many GPUs; the stage's process sees
every GPU Ray gave the task. Software facts (library and TensorRT versions) are the driver's: run the driver and
the workers from one image, as Ray itself expects.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from trtflow.environment import GpuInfo
from trtflow.errors import EnvironmentUnavailable, TrtflowError, UsageError
from trtflow.execution.protocol import CRASHED, FAILED, INTERRUPTED, OK, Job, Outcome, unwritten_outputs
from trtflow.execution.results import RunOptions
from trtflow.execution.scheduler import Capacity
from trtflow.storage.confined.folders import NodeFolders, discard, make_folder
from trtflow.storage.confined.names import check_relative
from trtflow.storage.confined.reading import tail_of_fd
from trtflow.storage.confined.tree import Tree, locate, private_folder
from trtflow.storage.confined.writing import write_all
from trtflow.storage.store import TRANSFER, Store

MAX_RETRIES = 2
POLL_S = 0.2
MAX_LOG_BYTES = 16 << 20  # the tail of a worker's node log sent back to the driver


class RayExecutor:
    name = "ray"

    def __init__(self, store: Store, options: RunOptions, run_id: str = "") -> None:
        from trtflow.execution.results import new_run_id

        self.store = store
        self.options = options
        self.run_id = run_id or new_run_id()
        self.transfer, self._own_transfer = transfer_area(store, options, self.run_id)
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
            try:
                if address:
                    ray.init(address=address, **kwargs)
                else:
                    ray.init(**kwargs)
                    self._owns_cluster = True
            except (Exception, SystemExit) as exc:  # Ray exits (SystemExit) when a cluster's GCS never answers
                where = f"join the Ray cluster at {address}" if address else "start a local Ray cluster"
                detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise EnvironmentUnavailable(
                    f"could not {where}: {detail}",
                    hint="check the address (--ray-address / RAY_ADDRESS) and that the cluster is up (`ray status`)"
                    if address else "see `ray start --head` for what Ray needs; /tmp/ray/session_latest/logs has "
                    "its logs") from None
        self._started = True

    def capacity(self, jobs: int, memory: int) -> Capacity:
        """The cluster's CPUs and GPUs (each GPU with the facts of the machine it is on)."""
        self.start()
        ray = self._ray()
        resources = ray.cluster_resources()
        cpus = float(resources.get("CPU", 1))
        gpus: list[GpuInfo] = []
        hosts: dict[str, str] = {}
        probe = ray.remote(num_cpus=0)(_probe_gpus)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        for node in ray.nodes():
            if not node.get("Alive") or not node.get("Resources", {}).get("GPU"):
                continue
            strategy = NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
            for gpu in ray.get(probe.options(scheduling_strategy=strategy).remote()):
                info = GpuInfo(**gpu)
                gpus.append(info)
                self._gpu_nodes[info.visible_id] = hosts[info.visible_id] = node["NodeID"]
        memory = int(resources.get("memory", memory))
        return Capacity(min(float(jobs), cpus) if jobs else cpus, memory, gpus, hosts)

    def placement(self, device: str | None) -> str | None:
        """The Ray node a job's GPUs are on (the scheduler gives a node GPUs of one machine); None: anywhere."""
        if not device:
            return None
        return self._gpu_nodes.get(device.split(",")[0])

    def pid_of(self, node: str) -> int | None:
        return None

    # ----------------------------------------------------------------- one node
    def execute(self, job: Job, cancel: threading.Event) -> Outcome:
        self.start()
        ray = self._ray()
        from trtflow.params import validated_params
        from trtflow.registry import get_stage

        stage = get_stage(job.stage)
        resources = stage.resources_for(validated_params(stage.params, job.params))
        options: dict[str, Any] = {"num_cpus": resources.cpu, "num_gpus": resources.gpu,
                                   "max_retries": MAX_RETRIES, "retry_exceptions": False}
        node_id = self.placement(job.device)
        if node_id is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        outputs = {name: (o.filename, o.kind, o.optional) for name, o in stage.outputs.items()}
        task = ray.remote(_run_node).options(**options)
        ref = task.remote(job.to_json(), outputs, self.transfer)
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
        if job.held is not None:  # the node's log, held by the runner since the node started
            write_all(job.held.log_fd, log_text.encode("utf-8", "replace"))
        else:
            tree, rel = locate(job.log_path, self.store.root)
            tree.append_text(rel, log_text)
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
        try:
            if self._owns_cluster:
                ray = self._ray()
                ray.shutdown()
                self._owns_cluster = False
            self._started = False
        finally:
            self._clear_transfer()

    def _clear_transfer(self) -> None:
        """Remove this run's own transfer folder (never the remote cache): its objects are committed by now."""
        if not self._own_transfer:
            return
        self._own_transfer = False
        from trtflow.storage.remote import RemoteCache, RemoteError

        try:
            if self.options.ray_transfer:
                RemoteCache(self.transfer).clear()
            else:
                self.store.tree.remove_tree((TRANSFER, self.run_id))
        except (OSError, RemoteError) as exc:
            import logging

            logging.getLogger("trtflow.ray").warning("could not remove the transfer folder %s: %s", self.transfer,
                                                     getattr(exc, "message", None) or exc)


@dataclass(frozen=True)
class _Declared:
    optional: bool


def _probe_gpus() -> list[dict[str, Any]]:
    """Every GPU of the machine this runs on (not just those Ray would show a task)."""
    from trtflow.environment import _SMI_FIELDS, _smi, parse_smi

    query = _smi(f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader,nounits")
    return [asdict(g) for g in parse_smi(query, _smi("-L"))] if query else []


def transfer_area(store: Store, options: RunOptions, run_id: str) -> tuple[str, bool]:
    """Where the workers fetch inputs and leave outputs, and whether it is this run's own (removed at its end): the
    remote cache when the run may push to it; under --no-push never the cache, but a folder of this run in
    --ray-transfer, or in the store for a local cluster."""
    if options.ray_transfer:
        url = options.ray_transfer.rstrip("/")
        if "://" not in url or url.startswith("file://"):
            from trtflow.storage.remote.backend import local_path

            Tree(local_path(url)).mkdir(run_id)  # the location may be a link (the user's); its content is walked
        return f"{url}/{run_id}", True
    if options.remote and options.push:
        if options.remote_namespace:  # a namespace's run writes only there (storage/remote/namespaces.py)
            from trtflow.storage.remote.namespaces import namespace_url

            return namespace_url(options.remote, options.remote_namespace), False
        return options.remote, False
    if options.ray_address:
        if options.remote:
            raise UsageError("--no-push keeps the remote cache read-only, yet the workers of a Ray cluster exchange "
                             "artifacts through a location they share",
                             hint="add --ray-transfer DIR_ON_SHARED_STORAGE or --ray-transfer s3://bucket/prefix (kept "
                             "apart from the cache), or drop --no-push")
        raise UsageError("a Ray cluster of several machines moves artifacts through a remote cache",
                         hint="add --remote DIR_ON_SHARED_STORAGE or --remote s3://bucket/prefix (or set "
                         "TRTFLOW_REMOTE)")
    store.ensure()
    store.tree.mkdir((TRANSFER, run_id))  # a local cluster: a folder of this run in the store, a real one
    return str(store.shown((TRANSFER, run_id))), True


def _run_node(job_data: dict[str, Any], outputs: dict[str, tuple[str, str, bool]], transfer_url: str
              ) -> tuple[dict[str, Any], str]:
    """On a Ray worker: pull inputs from the transfer area, run the stage in a child process, upload the outputs
    there if the stage wrote every required one."""
    from trtflow.execution.local import LocalExecutor
    from trtflow.storage.remote import RemoteCache

    job = Job.from_json(job_data)
    remote = RemoteCache(transfer_url)
    tree = private_folder(f"trtflow-{job.node}-")  # this worker's own folder, held from its creation
    work = tree.path
    held = None
    try:
        cache = Store(work / "inputs")
        held = NodeFolders(make_folder(tree, "scratch"), tree.open_append_fd("node.log", readable=True))
        scratch = held.scratch
        for place, objects in job.input_objects.items():  # place: "<slot>", or "<slot>/<producer>" in a many-slot
            remote.pull_objects(objects, cache, node=job.node)
            folder = ("in", *check_relative(place, "input place"))
            for out in objects.values():
                target = (*folder, *check_relative(out["filename"], "output file name"))
                tree.link_into(("inputs", *cache.object_rel(out["digest"])), scratch, target)
        inputs_dir = scratch.path / "in"
        inputs: dict[str, str | list[str]] = {
            slot: [str(inputs_dir / slot / rel) for rel in names] if isinstance(names, list)
            else str(inputs_dir / slot / names)
            for slot, names in job.inputs.items()}
        # the GPUs Ray gave this task (it sets CUDA_VISIBLE_DEVICES for them), not the ids the driver chose from
        device = os.environ.get("CUDA_VISIBLE_DEVICES") if job.device else None
        local = Job(**{**job_data, "inputs": inputs, "scratch": str(scratch.path),
                       "log_path": str(work / "node.log"), "cache_dir": str(work / "caches"), "device": device,
                       "parent_pid": os.getpid(), "held": held})
        executor = LocalExecutor(work, use_fork_server=False)
        started = time.time()
        outcome = executor.execute(local, threading.Event())
        if outcome.status == OK:
            declared = {name: _Declared(optional) for name, (_, _, optional) in outputs.items()}
            written = {name for name, (filename, _, _) in outputs.items()
                       if scratch.stat(("out", *check_relative(filename))) is not None}
            unwritten = unwritten_outputs(job.stage, declared, written)
            if unwritten:
                outcome = Outcome(FAILED, error=unwritten, exit_code=outcome.exit_code, peak_rss=outcome.peak_rss)
            else:
                with contextlib.closing(scratch.subtree("out")) as out_dir:
                    outcome.stored_outputs = remote.upload_outputs(
                        out_dir, {name: (filename, kind) for name, (filename, kind, _) in outputs.items()})
        log_text = tail_of_fd(held.log_fd, MAX_LOG_BYTES)
        host = os.uname().nodename
        log_text = f"[ran on {host} via Ray in {time.time() - started:.1f} s]\n" + log_text
        return asdict(outcome), log_text
    finally:
        if held is not None:
            held.close()
            held.scratch.close()
        with contextlib.closing(Tree(work.parent)) as parent:
            discard(parent, work.name, tree)
