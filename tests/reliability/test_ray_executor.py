"""The Ray executor on a local Ray cluster: same artifacts as the local executor, retries when a worker dies
mid-node (never committing half a node), and a second store sharing the remote cache builds nothing.

Cost (issue 35): starting a local Ray cluster is most of a Ray run's time (5-7 s of wall time on the 2-core CI
machine). The first test runs `trtflow run --executor ray` as a user does (its own local cluster, started and shut
down by the command); the others run the same executor in this process on one local cluster per module
(``ray_cluster``), which the executor finds started (it then neither starts nor shuts one down), so the cluster
starts twice per module, not six times.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from trtflow import api
from trtflow.execution.results import RunOptions, RunSummary
from trtflow.storage.store import Store
from trtflow.storage.verify import verify_store

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray"),  # one worker: the module's cluster starts once
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray (trtflow[ray])")]

CHAIN = """\
name: chain
nodes:
  - {name: a, stage: synth, params: {text: a, size: 30000}}
  - {name: b, stage: synth, params: {text: b, size: 20000}, inputs: {source: a}}
  - {name: c, stage: synth, params: {text: c, size: 10000}, inputs: {source: a}}
  - {name: d, stage: faulty, params: {mode: MODE, marker: MARKER}, inputs: {source: b}}
"""


def _recipe(tmp_path: Path, mode: str = "ok") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    recipe = tmp_path / "chain.yaml"
    recipe.write_text(CHAIN.replace("MODE", mode).replace("MARKER", str(tmp_path / "attempt.marker")))
    return recipe


def _outputs(folder: Path) -> dict[str, bytes]:
    return {n: (folder / n / "data.bin").read_bytes() for n in "abcd"}


@pytest.fixture(scope="module")
def ray_cluster(plugin_paths: list[str]) -> Iterator[None]:
    """One local Ray cluster for this module's in-process runs; its workers find the test stages (PYTHONPATH, as
    the `trtflow` subprocesses of the tests are given it)."""
    import ray

    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([*plugin_paths, *filter(None, [saved])])
    try:
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False, namespace="trtflow")
        yield
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def ray_run(recipe: Path, store: Path, output_dir: Path, **options) -> RunSummary:
    """`trtflow run RECIPE --executor ray --store STORE --output-dir OUTPUT_DIR` (with ``options``: remote, push,
    ray_transfer), in this process on the module's cluster."""
    _, _, summary = api.run(recipe, store=store, options=RunOptions(executor="ray", output_dir=output_dir, **options))
    return summary


def built(summary: RunSummary) -> list[str]:
    return sorted(n for n, r in summary.results.items() if r.status == "done")


def test_ray_gives_the_local_executors_artifacts_and_a_shared_remote_serves_a_fresh_store(tmp_path, trtflow):
    recipe = _recipe(tmp_path)
    local = trtflow("run", str(recipe), "--store", str(tmp_path / "local"), "--output-dir", str(tmp_path / "out-local"))
    assert local.returncode == 0, local.stdout + local.stderr
    remote = tmp_path / "remote"
    remote.mkdir()
    on_ray = trtflow("run", str(recipe), "--executor", "ray", "--remote", str(remote), "--store",
                     str(tmp_path / "ray"), "--output-dir", str(tmp_path / "out-ray"), timeout=300)
    assert on_ray.returncode == 0, on_ray.stdout + on_ray.stderr
    assert "4 built" in on_ray.stdout
    assert _outputs(tmp_path / "out-ray") == _outputs(tmp_path / "out-local")
    assert verify_store(Store(tmp_path / "ray")).problems == []
    # a second store that shares the remote: everything is pulled (verified), nothing built
    second = trtflow("run", str(recipe), "--remote", str(remote), "--store", str(tmp_path / "second"),
                     "--output-dir", str(tmp_path / "out-second"))
    assert second.returncode == 0, second.stdout + second.stderr
    assert "0 built, 4 reused" in second.stdout, second.stdout
    assert "pulled from the remote cache" in second.stdout
    assert _outputs(tmp_path / "out-second") == _outputs(tmp_path / "out-local")
    assert verify_store(Store(tmp_path / "second")).problems == []


def test_a_worker_that_dies_mid_node_is_retried_and_the_node_committed_once(tmp_path, trtflow, ray_cluster):
    recipe = _recipe(tmp_path, mode="kill_parent_once")
    summary = ray_run(recipe, tmp_path / "store", tmp_path / "build" / "chain")
    assert summary.ok and built(summary) == ["a", "b", "c", "d"], summary.results
    assert (tmp_path / "attempt.marker").exists(), "the first attempt did not run"
    store = Store(tmp_path / "store")
    nodes = sorted(m["node"] for _, m in store.iter_manifests())
    assert nodes == ["a", "b", "c", "d"]
    assert verify_store(store).problems == []
    good = trtflow("run", str(_recipe(tmp_path / "ref")), "--store", str(tmp_path / "ref-store"),
                   "--output-dir", str(tmp_path / "ref-out"))
    assert good.returncode == 0
    assert (tmp_path / "build" / "chain" / "d" / "data.bin").read_bytes() == \
        (tmp_path / "ref-out" / "d" / "data.bin").read_bytes()


def test_a_result_missing_a_required_output_is_not_committed(tmp_path, trtflow, ray_cluster):
    """A worker's stage that ends well without writing its output fails its node: nothing is committed, cached or
    pushed (issue 20.4; the local executor always did so)."""
    recipe = _recipe(tmp_path, mode="forget")
    remote = tmp_path / "remote"
    remote.mkdir()
    summary = ray_run(recipe, tmp_path / "store", tmp_path / "out", remote=str(remote))
    assert not summary.ok and summary.results["d"].status == "failed", summary.results
    assert "finished without writing outputs ['data']" in (summary.results["d"].error or ""), summary.results["d"]
    import sqlite3

    from trtflow.storage.remote import RemoteCache

    store = Store(tmp_path / "store")
    assert sorted(m["node"] for _, m in store.iter_manifests()) == ["a", "b", "c"]
    (key,) = sqlite3.connect(store.db_path).execute("SELECT key FROM node_runs WHERE node = 'd'").fetchone()
    assert key and RemoteCache(str(remote)).get_manifest(key) is None, "an incomplete result was pushed"
    again = trtflow("plan", str(recipe), "--store", str(tmp_path / "store"), "--json")
    assert {s["node"]: s["status"] for s in json.loads(again.stdout)}["d"] == "stale"


def test_no_push_leaves_the_remote_cache_untouched(tmp_path, ray_cluster):
    """--no-push only reads the cache: the workers' inputs and outputs travel through a transfer area of their
    own, and nothing (no manifest, no object, no format file) is written to the cache (issue 20.5)."""
    recipe = _recipe(tmp_path)
    remote = tmp_path / "remote"
    remote.mkdir()
    summary = ray_run(recipe, tmp_path / "store", tmp_path / "out", remote=str(remote), push=False)
    assert summary.ok and built(summary) == ["a", "b", "c", "d"], summary.results
    assert sorted(str(p.relative_to(remote)) for p in remote.rglob("*")) == []
    assert verify_store(Store(tmp_path / "store")).problems == []


def test_no_push_on_a_cluster_needs_a_transfer_area_apart_from_the_cache(tmp_path, trtflow):
    recipe = _recipe(tmp_path)
    remote = tmp_path / "remote"
    remote.mkdir()
    proc = trtflow("run", str(recipe), "--executor", "ray", "--ray-address", "head:6379", "--remote", str(remote),
                   "--no-push")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--no-push keeps the remote cache read-only" in proc.stderr and "--ray-transfer" in proc.stderr


def test_a_cluster_that_cannot_be_joined_is_a_clear_error_and_the_run_is_ended(tmp_path, trtflow):
    """Ray refuses the address: exit 3 with what to check, and the journal ends the run as failed instead of
    leaving it "running" (issue 20.7)."""
    import sqlite3

    recipe = _recipe(tmp_path)
    remote = tmp_path / "remote"
    remote.mkdir()
    proc = trtflow("run", str(recipe), "--executor", "ray", "--ray-address", "not-an-address", "--remote",
                   str(remote), timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "could not join the Ray cluster at not-an-address" in proc.stderr and "internal error" not in proc.stderr
    rows = sqlite3.connect(tmp_path / "store" / "trtflow.db").execute("SELECT status FROM runs").fetchall()
    assert rows == [("failed",)]


def test_a_node_given_several_gpus_is_placed_on_their_machine(tmp_path):
    from trtflow.execution.ray_executor import RayExecutor
    from trtflow.execution.results import RunOptions

    executor = RayExecutor(Store(tmp_path / "store"), RunOptions(executor="ray"))
    executor._gpu_nodes.update({"GPU-a": "node-1", "GPU-b": "node-1", "GPU-c": "node-2"})
    assert executor.placement("GPU-c") == "node-2"
    assert executor.placement("GPU-a,GPU-b") == "node-1", "a list of GPUs must pin the task to their machine"
    assert executor.placement(None) is None


@pytest.mark.parametrize("where", ["in the store", "--ray-transfer"])
def test_a_runs_own_transfer_area_is_removed_when_it_ends(tmp_path, ray_cluster, where):
    """Under --no-push (and without a remote) the workers' artifacts travel through a folder of the run's own: in
    the store (ray-remote/<run>) or in --ray-transfer (<dir>/<run>); it is gone when the run ends, its results are
    in the store (issue 24: the transfer folder kept every artifact forever)."""
    recipe = _recipe(tmp_path)
    transfer = tmp_path / "transfer"
    transfer.mkdir()
    extra = {"ray_transfer": str(transfer)} if where == "--ray-transfer" else {}
    summary = ray_run(recipe, tmp_path / "store", tmp_path / "out", **extra)
    assert summary.ok and built(summary) == ["a", "b", "c", "d"], summary.results
    assert list((tmp_path / "store" / "ray-remote").glob("*")) == []
    assert list(transfer.iterdir()) == []
    assert verify_store(Store(tmp_path / "store")).problems == []
