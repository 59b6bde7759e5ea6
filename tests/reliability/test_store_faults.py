"""Faults around the store: gc beside runs, a damaged journal, a read-only store, a full disk, a hostile working
directory, a second Ctrl-C. Never an internal error (exit 70), never a hang, never a neighbour's run broken."""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

from trtflow.storage.store import Store
from trtflow.storage.verify import verify_store

from .test_stage_faults import _cli, _in_namespace, needs_mount_namespace


def _wide_recipe(path: Path, nodes: int = 40, sleep: float = 0.05) -> Path:
    lines = ["name: wide", "nodes:"]
    for i in range(nodes):
        source = f", inputs: {{source: n{i // 2}}}" if i else ""
        lines.append(f"  - {{name: n{i}, stage: synth, params: {{text: t{i}, size: 4000, sleep: {sleep}}}{source}}}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _no_internal_error(proc: subprocess.CompletedProcess) -> None:
    text = proc.stdout + proc.stderr
    assert proc.returncode != 70 and "internal error" not in text and "Traceback" not in text, text


def _cmd(trtflow_args: list[str], store: Path) -> list[str]:
    return [*_cli().split(), *trtflow_args, "--store", str(store)]


def test_gc_in_a_tight_loop_beside_a_40_node_run(tmp_path: Path, plugin_env: dict[str, str]) -> None:
    recipe = _wide_recipe(tmp_path / "wide.yaml")
    store = tmp_path / "store"
    run = subprocess.Popen(_cmd(["run", str(recipe), "-q"], store), cwd=tmp_path, env=plugin_env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    gcs = []
    while run.poll() is None:
        gc = subprocess.run(_cmd(["gc", "--wait", "0"], store), cwd=tmp_path, env=plugin_env, capture_output=True,
                            text=True, timeout=120)
        _no_internal_error(gc)
        assert gc.returncode in (0, 4), gc.stdout + gc.stderr  # 4: store busy, said so
        if gc.returncode == 4:
            assert "store" in gc.stderr and "in use" in gc.stderr, gc.stderr
        gcs.append(gc.returncode)
    output = run.communicate()[0]
    assert run.returncode == 0, output
    assert 4 in gcs, "gc never met the run: the test did not test anything"
    final = subprocess.run(_cmd(["gc"], store), cwd=tmp_path, env=plugin_env, capture_output=True, text=True)
    assert final.returncode == 0, final.stdout + final.stderr
    assert verify_store(Store(store)).problems == []
    plan = subprocess.run(_cmd(["plan", str(recipe)], store), cwd=tmp_path, env=plugin_env, capture_output=True,
                          text=True)
    assert "40 nodes: 40 fresh, 0 stale" in plan.stdout, plan.stdout


def test_two_gcs_and_a_verify_at_once(tmp_path: Path, plugin_env: dict[str, str]) -> None:
    recipe = _wide_recipe(tmp_path / "wide.yaml", nodes=12, sleep=0)
    store = tmp_path / "store"
    for extra in ([], ["--set", "nodes.n0.params.text=changed"], []):
        subprocess.run(_cmd(["run", str(recipe), "-q", *extra], store), cwd=tmp_path, env=plugin_env, check=True,
                       capture_output=True)
    procs = [subprocess.Popen(_cmd(args, store), cwd=tmp_path, env=plugin_env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for args in (["gc"], ["gc"], ["verify"], ["gc"], ["verify"])]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        _no_internal_error(done)
        assert proc.returncode == 0, out + err
        assert "damaged" not in out, out
    assert verify_store(Store(store)).problems == []


def test_a_damaged_journal_gives_clear_messages_and_verify_fix_resets_it(tmp_path: Path, trtflow) -> None:
    recipe = _wide_recipe(tmp_path / "wide.yaml", nodes=3, sleep=0)
    assert trtflow("run", str(recipe)).returncode == 0
    db = tmp_path / "store" / "trtflow.db"
    with open(db, "r+b") as f:
        f.write(b"this is not an SQLite header, not at all" * 3)
    for wal in db.parent.glob("trtflow.db-*"):
        wal.unlink()
    for args, code in ((["run", str(recipe)], 4), (["status"], 4), (["report", str(recipe)], 4),
                       (["plan", str(recipe)], 0), (["gc", "--dry-run"], 0), (["show", str(recipe), "n1"], 0)):
        proc = trtflow(*args)
        _no_internal_error(proc)
        assert proc.returncode == code, (args, proc.stdout, proc.stderr)
        if code == 4:
            assert "journal" in proc.stderr and "damaged" in proc.stderr and "verify --fix" in proc.stderr
    verify = trtflow("verify")
    assert verify.returncode == 1 and "journal trtflow.db is damaged" in verify.stdout, verify.stdout
    fixed = trtflow("verify", "--fix")
    assert fixed.returncode == 0 and "journal reset" in fixed.stdout, fixed.stdout
    again = trtflow("run", str(recipe))
    assert again.returncode == 0 and "Nothing to do" in again.stdout, again.stdout  # results survived
    assert list(db.parent.glob("trtflow.db.damaged-*")), "the damaged journal is kept for inspection"


@needs_mount_namespace
def test_every_command_on_a_read_only_store(tmp_path: Path, plugin_env: dict[str, str]) -> None:
    recipe = _wide_recipe(tmp_path / "wide.yaml", nodes=3, sleep=0)
    mnt = tmp_path / "mnt"
    commands = {
        "plan": f"plan {recipe}", "status": "status", "show": f"show {recipe} n1", "report": f"report {recipe}",
        "gc": "gc", "gcdry": "gc --dry-run", "verify": "verify", "run": f"run {recipe} --set nodes.n2.params.text=x",
    }
    lines = [f"mkdir -p {mnt}", f"mount -t tmpfs -o size=8m tmpfs {mnt}",
             f"{_cli()} run {recipe} --store {mnt}/store -q > /dev/null", f"mount -o remount,ro {mnt}", "set +e"]
    for name, args in commands.items():
        lines.append(f"{_cli()} {args} --store {mnt}/store > {tmp_path}/{name}.out 2>&1; "
                     f"echo \"rc=$?\" >> {tmp_path}/{name}.out")
    proc = _in_namespace("\n".join(lines), plugin_env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = {"plan": 0, "status": 0, "show": 0, "report": 0, "gc": 4, "gcdry": 0, "verify": 0, "run": 4}
    for name, code in expected.items():
        out = (tmp_path / f"{name}.out").read_text()
        assert "Traceback" not in out and "internal error" not in out, (name, out)
        assert out.rstrip().endswith(f"rc={code}"), (name, out)
    assert "3 nodes: 3 fresh, 0 stale" in (tmp_path / "plan.out").read_text()
    assert "clean" in (tmp_path / "verify.out").read_text()


@needs_mount_namespace
def test_a_full_disk_at_the_journal_fails_cleanly_and_the_next_run_resumes(tmp_path: Path,
                                                                          plugin_env: dict[str, str]) -> None:
    recipe = _wide_recipe(tmp_path / "wide.yaml", nodes=6, sleep=0)
    mnt = tmp_path / "mnt"
    script = f"""
mkdir -p {mnt}
mount -t tmpfs -o size=4m tmpfs {mnt}
{_cli()} run {recipe} --store {mnt}/store --output-dir {mnt}/build -q > /dev/null
set +e
dd if=/dev/zero of={mnt}/filler bs=4k > /dev/null 2>&1
{_cli()} run {recipe} --store {mnt}/store --output-dir {mnt}/build --set nodes.n5.params.text=new \
  > {tmp_path}/full.out 2>&1
echo "rc=$?" >> {tmp_path}/full.out
rm {mnt}/filler
{_cli()} run {recipe} --store {mnt}/store --output-dir {mnt}/build --set nodes.n5.params.text=new \
  > {tmp_path}/resume.out 2>&1
echo "rc=$?" >> {tmp_path}/resume.out
{_cli()} verify --store {mnt}/store > {tmp_path}/verify.out 2>&1
cp {mnt}/store/trtflow.db {tmp_path}/journal.db
"""
    proc = _in_namespace(script, plugin_env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    full = (tmp_path / "full.out").read_text()
    assert "Traceback" not in full and "internal error" not in full, full
    assert re.search(r"rc=(1|4)$", full.rstrip()), full
    assert re.search(r"[Nn]o space left", full), full
    resume = (tmp_path / "resume.out").read_text()
    assert resume.rstrip().endswith("rc=0"), resume
    assert "clean" in (tmp_path / "verify.out").read_text()
    statuses = [r[0] for r in sqlite3.connect(tmp_path / "journal.db").execute("SELECT status FROM runs")]
    assert "running" not in statuses, statuses


def test_modules_in_the_working_directory_shadow_nothing(tmp_path: Path, plugin_env: dict[str, str]) -> None:
    recipe = _wide_recipe(tmp_path / "wide.yaml", nodes=3, sleep=0)
    work = tmp_path / "work"
    (work / "trtflow").mkdir(parents=True)
    (work / "trtflow" / "__init__.py").write_text("raise SystemExit('the cwd trtflow/ was imported')\n")
    (work / "logging.py").write_text("raise SystemExit('the cwd logging.py was imported')\n")
    (work / "json.py").write_text("raise SystemExit('the cwd json.py was imported')\n")
    proc = subprocess.run([*_cli().split(), "run", str(recipe), "--store", str(tmp_path / "store")], cwd=work,
                          env=plugin_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 built" in proc.stdout


def test_a_second_ctrl_c_still_exits_130_and_records_the_run_as_interrupted(tmp_path: Path,
                                                                          plugin_env: dict[str, str]) -> None:
    recipe = tmp_path / "slow.yaml"
    recipe.write_text("name: slow\nnodes:\n  - {name: a, stage: synth, params: {sleep: 30}}\n")
    store = tmp_path / "store"
    proc = subprocess.Popen(_cmd(["run", str(recipe)], store), cwd=tmp_path, env=plugin_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and log is None:
        found = list((store / "logs").glob("*/a.log")) if (store / "logs").exists() else []
        if found and "sleeping" in found[0].read_text():
            log = found[0]
        time.sleep(0.02)
    assert log is not None, "the node never started"
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, output
    assert "interrupted" in output and "Resume with" in output, output
    conn = sqlite3.connect(store / "trtflow.db")
    assert [r[0] for r in conn.execute("SELECT status FROM runs")] == ["interrupted"]
    assert not any((store / "tmp").iterdir())
