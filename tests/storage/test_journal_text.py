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


def test_the_stat_cache_and_batches_take_such_text_too(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.ensure()
    name = os.fsdecode(b"/data/caf\xe9.bin")
    journal = Journal(store.db_path)
    try:
        journal.put(name, (1, 2, 3, 4), "abc123")
        assert journal.get(name, (1, 2, 3, 4)) == "abc123"
        journal.start_run("r1", "recipe", "r.yaml", "trtflow run")
        journal.record_nodes([("r1", "n", "copy", "k", "fresh", f"up to date: {name}", None)])
        assert journal.node_runs("r1")[0]["reason"] == "up to date: /data/caf\\udce9.bin"
    finally:
        journal.close()


def test_every_statement_binds_its_parameters_through_one_function() -> None:
    """A statement of the journal that binds parameters (`execute`, `executemany` with a second argument) passes
    them through `_bound`, which makes any text storable: none goes around it."""
    import ast

    import trtflow.storage.journal as module

    tree = ast.parse(Path(module.__file__).read_text())
    bound = []
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                and call.func.attr in ("execute", "executemany") and len(call.args) >= 2:
            values = call.args[1]
            through = (isinstance(values, ast.Call) and getattr(values.func, "id", "") == "_bound") or (
                isinstance(values, ast.ListComp) and isinstance(values.elt, ast.Call)
                and getattr(values.elt.func, "id", "") == "_bound")
            bound.append((call.lineno, through))
    assert bound and all(through for _, through in bound), [line for line, ok in bound if not ok]
