"""The journal stores any text a run records: a file name's undecodable bytes (``os.fsdecode`` gives them as lone
surrogates, which UTF-8 cannot encode) in a node's reason or error once failed the write, and with it the run (seen
in CI: the freshness differential's `python:` file link)."""

from __future__ import annotations

import os
from pathlib import Path

from trtflow.storage.journal import Journal
from trtflow.storage.store import Store


def test_text_with_a_file_names_undecodable_bytes_is_recorded(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.ensure()
    name = os.fsdecode(b"/data/caf\xe9-\xff.bin")  # Latin-1 bytes: not UTF-8
    journal = Journal(store.db_path)
    try:
        journal.start_run("r1", "recipe", "r.yaml", f"trtflow run {name}")
        journal.node_state("r1", "n", "copy", "k", "failed", reason=f"file read by its code: {name} changed",
                           error=f"cannot read {name}", summary={"path": name})
        [row] = journal.node_runs("r1")
    finally:
        journal.close()
    assert row["reason"] == "file read by its code: /data/caf\\udce9-\\udcff.bin changed"
    assert row["error"] == "cannot read /data/caf\\udce9-\\udcff.bin"
