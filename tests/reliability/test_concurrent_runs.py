"""Several `trtflow run` processes on one store: nothing is corrupted and no node is built twice.

One process builds each node while holding its per-key lock; the others wait for it (bounded by
--lock-timeout) and reuse the result. The shared timing cache (SharedCache) is merged under its lock.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from trtflow.storage.store import Store
from trtflow.storage.verify import verify_store

from .conftest import TRTFLOW

NODES = """\
  - {name: base, stage: synth, params: {text: base, size: 20000, sleep: 0.4}}
  - {name: left, stage: synth, params: {text: left, sleep: 0.3}, inputs: {source: base}}
  - {name: right, stage: synth, params: {text: right, sleep: 0.3}, inputs: {source: base}}
  - {name: tip, stage: synth, params: {text: tip, sleep: 0.2}, inputs: {source: left}}
"""


def _start(recipe: Path, store: Path, out: Path, env: dict[str, str], *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*TRTFLOW, "run", str(recipe), "--store", str(store), "--output-dir", str(out),
                             "-j", "2", *extra], cwd=recipe.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _node_rows(store: Path) -> list[tuple[str, str, str]]:
    conn = sqlite3.connect(store / "trtflow.db")
    try:
        return conn.execute("SELECT run_id, node, status FROM node_runs").fetchall()
    finally:
        conn.close()


def test_four_runs_of_one_recipe_build_each_node_once(tmp_path: Path, plugin_env: dict[str, str]) -> None:
    recipe = tmp_path / "shared.yaml"
    recipe.write_text("name: shared\nnodes:\n" + NODES)
    store = tmp_path / "store"
    procs = [_start(recipe, store, tmp_path / f"out{i}", plugin_env) for i in range(4)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out
    rows = _node_rows(store)
    done = Counter(node for _, node, status in rows if status == "done")
    assert done == Counter({"base": 1, "left": 1, "right": 1, "tip": 1}), rows
    assert {status for _, _, status in rows} <= {"done", "cached", "fresh"}
    assert len({run for run, _, _ in rows}) == 4
    assert any("built meanwhile by another trtflow run" in out for out in outputs) or \
        any("up to date" in out for out in outputs)
    reference = {n: (tmp_path / "out0" / n / "data.bin").read_bytes() for n in ("base", "left", "right", "tip")}
    for i in range(1, 4):
        for node, data in reference.items():
            assert (tmp_path / f"out{i}" / node / "data.bin").read_bytes() == data
    report = verify_store(Store(store))
    assert report.problems == [] and report.objects == 4 and report.manifests == 4


def test_two_recipes_sharing_nodes_build_the_shared_ones_once(tmp_path: Path, plugin_env: dict[str, str]) -> None:
    one = tmp_path / "one.yaml"
    one.write_text("name: one\nnodes:\n" + NODES + "  - {name: only_one, stage: synth, params: {text: one}, "
                   "inputs: {source: tip}}\n")
    two = tmp_path / "two.yaml"
    two.write_text("name: two\nnodes:\n" + NODES + "  - {name: only_two, stage: synth, params: {text: two}, "
                   "inputs: {source: right}}\n")
    store = tmp_path / "store"
    procs = [_start(recipe, store, tmp_path / f"out-{recipe.stem}-{i}", plugin_env)
             for i in range(2) for recipe in (one, two)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], "\n".join(outputs)
    done = Counter(node for _, node, status in _node_rows(store) if status == "done")
    assert done == Counter({"base": 1, "left": 1, "right": 1, "tip": 1, "only_one": 1, "only_two": 1})
    assert verify_store(Store(store)).problems == []
    refs = Store(store).refs
    assert refs.current(str(one))["tip"] == refs.current(str(two))["tip"]  # per recipe file (absolute: no project)


def _wait_until_running(store: Path, node: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        if (store / "trtflow.db").exists():
            try:
                if any(n == node and s == "running" for _, n, s in _node_rows(store)):
                    return
            except sqlite3.OperationalError:
                pass
        time.sleep(0.05)
    raise AssertionError(f"{node} never started")


def test_lock_timeout_bounds_the_wait_with_a_clear_message(tmp_path: Path, plugin_env: dict[str, str]) -> None:
    # the first run's node holds until the test ends (not a sleep the second run might outlast on a loaded machine)
    release = tmp_path / "release"
    recipe = tmp_path / "slow.yaml"
    recipe.write_text(f"name: slow\nnodes:\n  - {{name: slow, stage: hold, params: {{until: '{release}'}}}}\n")
    store = tmp_path / "store"
    first = _start(recipe, store, tmp_path / "out1", plugin_env)
    try:
        _wait_until_running(store, "slow", first)
        second = subprocess.run([*TRTFLOW, "run", str(recipe), "--store", str(store), "--lock-timeout", "1"],
                                cwd=tmp_path, env=plugin_env, capture_output=True, text=True, timeout=60)
        out = second.stdout + second.stderr
        assert second.returncode == 1, out
        assert "slow" in out and "another trtflow run is building it; waiting" in out
        assert "failed: waited 1 s for another trtflow run building this node" in out
        assert "trtflow status" in out and str(store / "locks") in out
    finally:
        first.kill()
        first.communicate()
    # The first run was killed while holding the lock: the lock dies with it and a new run builds the node.
    release.write_text("")
    third = subprocess.run([*TRTFLOW, "run", str(recipe), "--store", str(store), "--lock-timeout", "5"],
                           cwd=tmp_path, env=plugin_env,
                           capture_output=True, text=True, timeout=60)
    assert third.returncode == 0, third.stdout + third.stderr
    assert verify_store(Store(store)).problems == []


def test_waiting_run_reuses_what_the_other_built(tmp_path: Path, plugin_env: dict[str, str]) -> None:
    # the first run's node holds until the second run says it waits (not a fixed sleep: a loaded machine can take
    # longer than any sleep to start the second run)
    release = tmp_path / "release"
    recipe = tmp_path / "slow.yaml"
    recipe.write_text(f"name: slow\nnodes:\n  - {{name: slow, stage: hold, params: {{until: '{release}'}}}}\n")
    store = tmp_path / "store"
    first = _start(recipe, store, tmp_path / "out1", plugin_env)
    _wait_until_running(store, "slow", first)
    second = _start(recipe, store, tmp_path / "out2", plugin_env, "--lock-timeout", "300")
    assert second.stdout is not None
    said = []
    for line in second.stdout:  # the second run's lines as they come, until it says it waits
        said.append(line)
        if "another trtflow run is building it; waiting" in line:
            break
    release.write_text("")
    out1, rest = first.communicate(timeout=300)[0], second.communicate(timeout=300)[0]
    out2 = "".join(said) + rest
    assert first.returncode == 0 and second.returncode == 0, out1 + out2
    assert "another trtflow run is building it; waiting" in out2
    assert "reused: built meanwhile by another trtflow run" in out2
    assert (tmp_path / "out1/slow/data.bin").read_bytes() == (tmp_path / "out2/slow/data.bin").read_bytes()


SHARED_CACHE_WRITER = """
import json, sys
from pathlib import Path
from trtflow.stage import SharedCache

cache = SharedCache(Path(sys.argv[1]))
writer, count = sys.argv[2], int(sys.argv[3])
for i in range(count):
    with cache.lock():
        raw = cache.read_bytes()
        entries = json.loads(raw) if raw else {}
        entries[f"{writer}-{i}"] = {"tactic": i, "by": writer}
        cache.replace_atomically(json.dumps(entries, sort_keys=True).encode())
"""

SHARED_CACHE_READER = """
import json, sys, time
from pathlib import Path
from trtflow.stage import SharedCache

cache = SharedCache(Path(sys.argv[1]))
reads = 0
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    raw = cache.read_bytes()
    if raw is not None:
        json.loads(raw)  # never a torn file, even without the lock
        reads += 1
print(reads)
"""


def test_shared_cache_merges_concurrent_writers_without_losing_entries(tmp_path: Path) -> None:
    path = tmp_path / "caches" / "timing" / "tensorrt-rtx-1.7-cpu.cache"
    writers = [subprocess.Popen([sys.executable, "-c", SHARED_CACHE_WRITER, str(path), f"w{i}", "40"])
               for i in range(4)]
    reader = subprocess.Popen([sys.executable, "-c", SHARED_CACHE_READER, str(path), "3"], stdout=subprocess.PIPE,
                              text=True)
    for w in writers:
        assert w.wait(timeout=120) == 0
    reads, _ = reader.communicate(timeout=60)
    assert reader.returncode == 0
    assert int(reads) > 0
    entries = json.loads(path.read_bytes())
    assert len(entries) == 160
    assert set(entries) == {f"w{w}-{i}" for w in range(4) for i in range(40)}
    assert not [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")], "temporary files left behind"
