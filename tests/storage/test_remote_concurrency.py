"""Several processes push the same node key to one remote at once (CI runners that built the same node).

Each builder's node has one output identical across builders and one of its own (engines are not
deterministic). Whatever the interleaving, the remote ends with one usable manifest of the key, every object
it names is present and intact, and a fresh store pulls it and verifies clean.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from tests.storage.conftest import commit_node, make_store, node_key, raw_remote
from trtflow.storage.remote import RemoteCache
from trtflow.storage.store import Store
from trtflow.storage.verify import verify_store

BUILDERS = 4


def _build_and_push(store_root: str, url: str, key: str, files: dict[str, bytes], barrier) -> None:
    store = make_store(Path(store_root))
    commit_node(store, key, files, Path(store_root) / "scratch")
    remote = RemoteCache(url)
    remote.check()
    barrier.wait(timeout=120)  # all builders push at the same moment
    remote.push(key, store)


@pytest.mark.slow
def test_concurrent_pushes_of_one_key_leave_one_usable_node(remote_url: str, tmp_path: Path) -> None:
    key = node_key("built on every runner")
    shared = bytes(range(256)) * 1200
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(BUILDERS)
    builders = [
        ctx.Process(target=_build_and_push,
                    args=(str(tmp_path / f"builder{i}"), remote_url, key,
                          {"timing": shared, "engine": f"engine of builder {i}\n".encode() * 5000}, barrier))
        for i in range(BUILDERS)
    ]
    for proc in builders:
        proc.start()
    for proc in builders:
        proc.join(timeout=300)
    assert [proc.exitcode for proc in builders] == [0] * BUILDERS

    remote = RemoteCache(remote_url)
    manifest = remote.get_manifest(key)
    assert manifest is not None
    winners = [i for i in range(BUILDERS) if Store(tmp_path / f"builder{i}").read_manifest(key) == manifest]
    assert len(winners) == 1

    fresh = make_store(tmp_path / "fresh")
    remote.pull(manifest, fresh)
    assert verify_store(fresh).problems == []
    engine = fresh.object_path(manifest["outputs"]["engine"]["digest"]).read_bytes()
    assert engine == f"engine of builder {winners[0]}\n".encode() * 5000
    assert fresh.object_path(manifest["outputs"]["timing"]["digest"]).read_bytes() == shared
    if not remote_url.startswith("s3://"):
        assert raw_remote(remote_url).leftovers() == []
