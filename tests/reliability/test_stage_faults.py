"""A stage that raises, exits, crashes, hangs past its `timeout:` or fills the disk leaves the store consistent.

Each case runs the real CLI on a recipe where a good upstream node feeds the misbehaving `faulty` node.
The faulty stage writes half of its output before misbehaving; the test checks that this partial output
is discarded (no manifest, no object, nothing materialised, no scratch left), that the upstream node is
kept, that the message names the node and its log, and that fixing the recipe resumes from there.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from trtflow.storage.store import Store
from trtflow.storage.verify import verify_store

RECIPE = """\
name: faults
nodes:
  - name: good
    stage: synth
    params: {{text: upstream, size: 3000}}
  - name: bad
    stage: faulty
    params: {{mode: {mode}, size: 5000}}
    inputs: {{source: good}}
{timeout}"""


def _write(tmp_path: Path, mode: str, timeout: float | None = None) -> Path:
    recipe = tmp_path / "faults.yaml"
    recipe.write_text(RECIPE.format(mode=mode, timeout=f"    timeout: {timeout}\n" if timeout else ""))
    return recipe


def _assert_consistent(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    manifests = {m["node"]: m for _, m in store.iter_manifests()}
    assert set(manifests) == {"good"}, f"only the good node may be committed, found {sorted(manifests)}"
    objects = list(store.iter_objects())
    assert len(objects) == 1 and objects[0].name == manifests["good"]["outputs"]["data"]["digest"]
    assert verify_store(store).problems == []
    assert not any((store.root / "tmp").iterdir()), "scratch space of the failed node was left behind"
    assert not (tmp_path / "build" / "faults" / "bad").exists(), "a failed node's output was materialised"
    assert (tmp_path / "build" / "faults" / "good" / "data.bin").stat().st_size == 3000


def _log_path(output: str, tmp_path: Path) -> Path:
    match = re.search(r"log:\s+(\S+bad\.log)", output)
    assert match, f"the failure message does not name the node's log:\n{output}"
    path = Path(match.group(1))
    return path if path.is_absolute() else tmp_path / path


@pytest.mark.parametrize(("mode", "message"), [
    ("raise", "RuntimeError: faulty stage raised on purpose"),
    ("exit", "the stage process exited with code 7 before reporting a result"),
    ("segfault", "the stage process died of a segmentation fault (SIGSEGV)"),
    ("sys_exit_0", "RuntimeError: stage called sys.exit()"),
])
def test_crashing_stage_leaves_store_consistent_and_names_node_and_log(tmp_path: Path, trtflow, mode: str,
                                                                        message: str) -> None:
    recipe = _write(tmp_path, mode)
    proc = trtflow("run", str(recipe))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert re.search(r"✗ bad\s+failed: " + re.escape(message), output), output
    log = _log_path(output, tmp_path)
    assert log.exists() and "stage faulty 1 starting" in log.read_text()
    if mode == "raise":
        assert "Traceback" in log.read_text(), "the unexpected exception's traceback belongs in the node log"
    assert "resume" in output and "trtflow" in output
    _assert_consistent(tmp_path)

    # Fix the recipe: only the failed node runs; the upstream node is reused from the store.
    proc = trtflow("run", str(recipe), "--set", "nodes.bad.params.mode=ok")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 built, 0 reused, 1 up to date" in proc.stdout
    data = (tmp_path / "build" / "faults" / "bad" / "data.bin").read_bytes()
    assert len(data) == 5000


def test_hung_stage_is_killed_at_its_timeout(tmp_path: Path, trtflow) -> None:
    recipe = _write(tmp_path, "hang", timeout=1.5)
    proc = trtflow("run", str(recipe), timeout=90)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "✗ bad" in output and "timed out after 1.5 s (the recipe's timeout for this node)" in output
    assert "raise the node's `timeout:`" in output
    assert "hanging on purpose" in _log_path(output, tmp_path).read_text()
    _assert_consistent(tmp_path)
    conn = sqlite3.connect(tmp_path / "store" / "trtflow.db")
    (status, error), = conn.execute("SELECT status, error FROM node_runs WHERE node = 'bad'").fetchall()
    assert status == "failed" and "timed out" in error


def test_node_timeout_must_be_positive(tmp_path: Path, trtflow) -> None:
    recipe = _write(tmp_path, "ok", timeout=-1)
    proc = trtflow("plan", str(recipe))
    assert proc.returncode == 2
    assert re.search(r"faults\.yaml:\d+:\d+: nodes\.1\.timeout: Input should be greater than 0", proc.stderr), \
        proc.stderr


def test_keep_going_runs_independent_nodes_after_a_crash(tmp_path: Path, trtflow) -> None:
    recipe = tmp_path / "faults.yaml"
    recipe.write_text("""\
name: faults
nodes:
  - {name: bad, stage: faulty, params: {mode: exit}}
  - {name: after_bad, stage: synth, inputs: {source: bad}}
  - {name: independent, stage: synth, params: {text: independent}}
""")
    proc = trtflow("run", str(recipe), "--keep-going", "-j", "1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"after_bad\s+not run: upstream bad failed", proc.stdout), proc.stdout
    assert (tmp_path / "build" / "faults" / "independent" / "data.bin").exists()
    store = Store(tmp_path / "store")
    assert {m["node"] for _, m in store.iter_manifests()} == {"independent"}
    assert verify_store(store).problems == []


def _namespace_works() -> bool:
    try:
        probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True,
                               timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


needs_mount_namespace = pytest.mark.skipif(not _namespace_works(),
                                           reason="needs `unshare --user --mount` to mount a small tmpfs")


def _in_namespace(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """Run a shell script in a private mount namespace (so it may mount a small tmpfs without root)."""
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "bash", "-euc", script], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=120)


@needs_mount_namespace
def test_disk_full_fails_the_node_cleanly_and_keeps_finished_nodes(tmp_path: Path, plugin_env) -> None:
    """The store lives on a 2 MiB tmpfs: a node whose output does not fit fails, nothing half-committed."""
    recipe = tmp_path / "full.yaml"
    recipe.write_text("""\
name: full
nodes:
  - {name: small, stage: synth, params: {text: small, size: 100000}}
  - {name: huge, stage: synth, params: {text: huge, size: 8000000}, inputs: {source: small}}
""")
    script = f"""
mkdir -p {tmp_path}/mnt
mount -t tmpfs -o size=2m tmpfs {tmp_path}/mnt
set +e
{_cli()} run {recipe} --store {tmp_path}/mnt/store --output-dir {tmp_path}/mnt/build > {tmp_path}/run.out 2>&1
echo "rc=$?" >> {tmp_path}/run.out
{_cli()} verify --store {tmp_path}/mnt/store > {tmp_path}/verify.out 2>&1
echo "rc=$?" >> {tmp_path}/verify.out
{shlex.quote(sys.executable)} -c "import json,sys; from trtflow.storage.store import Store; s=Store(sys.argv[1]); \
print(json.dumps(sorted(m['node'] for _, m in s.iter_manifests())))" {tmp_path}/mnt/store > {tmp_path}/nodes.out
ls -A {tmp_path}/mnt/store/tmp > {tmp_path}/tmp.out
"""
    proc = _in_namespace(script, plugin_env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_out = (tmp_path / "run.out").read_text()
    assert run_out.rstrip().endswith("rc=1"), run_out
    assert re.search(r"✗ huge\s+failed: OSError: \[Errno 28\] No space left on device", run_out), run_out
    assert "log:" in run_out and "Traceback" not in run_out.split("✗ huge")[0]
    assert "internal error" not in run_out
    assert json.loads((tmp_path / "nodes.out").read_text()) == ["small"]
    assert (tmp_path / "verify.out").read_text().rstrip().endswith("clean\nrc=0")
    assert (tmp_path / "tmp.out").read_text().strip() == ""


@needs_mount_namespace
def test_read_only_store_is_a_clear_error(tmp_path: Path, plugin_env) -> None:
    recipe = tmp_path / "ro.yaml"
    recipe.write_text("name: ro\nnodes:\n  - {name: one, stage: synth}\n")
    script = f"""
mkdir -p {tmp_path}/mnt
mount -t tmpfs -o size=4m tmpfs {tmp_path}/mnt
{_cli()} run {recipe} --store {tmp_path}/mnt/store -q > /dev/null
sed -i 's/stage: synth}}/stage: synth, params: {{text: changed}}}}/' {recipe}
mount -o remount,ro {tmp_path}/mnt
set +e
{_cli()} run {recipe} --store {tmp_path}/mnt/store > {tmp_path}/run.out 2>&1
echo "rc=$?" >> {tmp_path}/run.out
"""
    proc = _in_namespace(script, plugin_env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = (tmp_path / "run.out").read_text()
    assert "error:" in out and "is not writable" in out and str(tmp_path / "mnt" / "store") in out, out
    assert "--store" in out  # the hint says how to choose another store
    assert out.rstrip().endswith("rc=4"), out  # 4: the store is busy, damaged, read-only or full
    assert "Traceback" not in out


def _cli() -> str:
    import shlex
    import sys

    script = Path(sys.executable).with_name("trtflow")
    return shlex.quote(str(script)) if script.exists() else f"{shlex.quote(sys.executable)} -m trtflow.cli"


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions (the tmpfs test covers root)")
def test_store_directory_without_write_permission_is_a_clear_error(tmp_path: Path, trtflow) -> None:
    recipe = tmp_path / "ro.yaml"
    recipe.write_text("name: ro\nnodes:\n  - {name: one, stage: synth}\n")
    store = tmp_path / "store"
    assert trtflow("run", str(recipe)).returncode == 0
    before = sorted(p.relative_to(store) for p in store.rglob("*") if "logs" not in p.parts)
    store.chmod(0o555)
    try:
        proc = trtflow("run", str(recipe), "--set", "nodes.one.params.text=changed")
    finally:
        store.chmod(0o755)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"error: the store {store} is not writable" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.relative_to(store) for p in store.rglob("*") if "logs" not in p.parts) == before
