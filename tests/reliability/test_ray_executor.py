"""The Ray executor on a local Ray cluster: same artifacts as the local executor, retries when a worker dies
mid-node (never committing half a node), and a second store sharing the remote cache builds nothing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from trtflow.storage.store import Store
from trtflow.storage.verify import verify_store

pytestmark = [pytest.mark.slow,
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


def test_a_worker_that_dies_mid_node_is_retried_and_the_node_committed_once(tmp_path, trtflow):
    recipe = _recipe(tmp_path, mode="kill_parent_once")
    proc = trtflow("run", str(recipe), "--executor", "ray", "--store", str(tmp_path / "store"), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
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
