"""A run killed (kill -9) right after a node committed: gc keeps that result (issue 20.10).

The run's refs are gc's roots. A committed result is recorded in them (appended and fsynced) before the run moves
on, so however soon after the commit the process dies, `trtflow gc` keeps the result and the next run reuses it.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

from .conftest import TRTFLOW

EARLIER = "name: r\nnodes:\n  - {name: z, stage: synth, params: {text: earlier}}\n"
RECIPE = EARLIER + ("  - {name: a, stage: synth, params: {text: a}}\n"
                    "  - {name: b, stage: faulty, params: {mode: hang}, inputs: {source: a}}\n")


def _running(db: Path, node: str) -> bool:
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            return conn.execute("SELECT 1 FROM node_runs WHERE node = ? AND status = 'running'",
                                (node,)).fetchone() is not None
    except sqlite3.Error:
        return False


def test_a_result_committed_just_before_kill_9_survives_gc(tmp_path: Path, trtflow, plugin_env) -> None:
    recipe = tmp_path / "r.yaml"
    store = tmp_path / "store"
    recipe.write_text(EARLIER)
    assert trtflow("run", str(recipe)).returncode == 0  # z is up to date in the next run
    recipe.write_text(RECIPE)
    proc = subprocess.Popen([*TRTFLOW, "run", str(recipe), "--store", str(store)], cwd=tmp_path, env=plugin_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120  # a guard only: the kill follows b's start as soon as it is seen
        while not _running(store / "trtflow.db", "b"):
            assert proc.poll() is None, "the run ended before b started"
            assert time.monotonic() < deadline, "b never started"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)  # the run and the node it runs, as a machine losing power would
    finally:
        proc.wait()
    gc = trtflow("gc")
    assert gc.returncode == 0, gc.stdout + gc.stderr
    plan = trtflow("plan", str(recipe), "--json")
    steps = {s["node"]: s["status"] for s in json.loads(plan.stdout)}
    assert steps["a"] == "fresh", "gc removed the result a committed just before the run was killed"
    assert steps["z"] == "fresh"
