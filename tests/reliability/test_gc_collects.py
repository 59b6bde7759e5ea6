"""gc collects what runs leave beside results: the Ray transfer area of runs that ended (or were killed), and
no-op records that can no longer hold or that no run has written for a long time (issue 24, item 8)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from trtflow.storage.gc import NOOP_RECORD_DAYS, collect_garbage
from trtflow.storage.store import NOOP, TRANSFER, Store

CHAIN = """\
name: chain
nodes:
  - {name: a, stage: synth, params: {text: a, size: 5000}}
  - {name: b, stage: synth, params: {text: b}, inputs: {source: a}}
"""


@pytest.fixture
def built(tmp_path: Path, trtflow) -> Store:
    (tmp_path / "chain.yaml").write_text(CHAIN)
    for _ in range(2):  # the second run plans, finds everything up to date and leaves the no-op record
        proc = trtflow("run", "chain.yaml")
        assert proc.returncode == 0, proc.stdout + proc.stderr
    store = Store(tmp_path / "store")
    assert len(list((store.root / NOOP).iterdir())) == 1
    return store


def test_the_transfer_area_a_killed_run_left_is_collected(built: Store, trtflow) -> None:
    left = built.root / TRANSFER / "20240101-000000-abcdef"
    (left / "objects" / "ab").mkdir(parents=True)
    (left / "objects" / "ab" / ("ab" * 16)).write_bytes(b"x" * 1000)
    (left / "nodes" / "cd").mkdir(parents=True)
    (left / "nodes" / "cd" / ("cd" * 16 + ".json")).write_text("{}")
    dry = trtflow("gc", "--dry-run")
    assert dry.returncode == 0 and "transfer" in dry.stdout and left.is_dir(), dry.stdout
    proc = trtflow("gc")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list((built.root / TRANSFER).iterdir()) == []


def test_noop_records_that_cannot_hold_or_are_old_are_collected_a_current_one_is_kept(built: Store,
                                                                                      trtflow) -> None:
    folder = built.root / NOOP
    (current,) = folder.iterdir()
    envelope = json.loads(current.read_text())
    stale = dict(envelope, keys=[*envelope["keys"], "0" * 32])  # rests on a result that is not stored
    (folder / "stale.json").write_text(json.dumps(stale))
    (folder / "old.json").write_text(current.read_text())
    old = time.time() - (NOOP_RECORD_DAYS + 1) * 86400
    os.utime(folder / "old.json", (old, old))
    (folder / "unreadable.json").write_text("{not json")
    report = collect_garbage(built)
    removed = {r.node: r.why for r in report.removals if r.what == "no-op record"}
    assert set(removed) == {"stale.json", "old.json", "unreadable.json"}, removed
    assert "no longer stored" in removed["stale.json"] and "days" in removed["old.json"]
    assert sorted(p.name for p in folder.iterdir()) == [current.name]
    proc = trtflow("run", "chain.yaml")
    assert proc.returncode == 0 and "Nothing to do" in proc.stdout, proc.stdout


def test_a_noop_record_is_collected_with_the_result_it_rests_on(built: Store, trtflow) -> None:
    proc = trtflow("run", "chain.yaml", "--set", "nodes.a.params.text=other")  # the old results are superseded
    assert proc.returncode == 0, proc.stdout + proc.stderr
    before = {p.name for p in (built.root / NOOP).iterdir()}
    report = collect_garbage(built)
    removed = [r for r in report.removals if r.what == "no-op record"]
    assert len(removed) == 1 and removed[0].node in before and "no longer stored" in removed[0].why
