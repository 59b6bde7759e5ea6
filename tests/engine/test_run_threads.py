"""The runner's threads: state that several of them touch has one owner, by design (issue 19).

A cold run of 500 cheap nodes at ``-j 2`` once ended with ``RuntimeError: dictionary changed size during
iteration`` in the memory estimate: the scheduling loop iterated the output sizes while node threads added to
them. These tests provoke that interleaving: many tiny nodes, several slots, thread switches forced every
microsecond, and a CPU-bound neighbour thread competing for the interpreter.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine.inline import run_inline
from tests.engine.toystages import get_stage
from trtflow.environment import Environment
from trtflow.execution.results import RunOptions
from trtflow.graph import build_graph
from trtflow.recipe.expand import expand
from trtflow.recipe.load import load_recipe
from trtflow.storage.store import Store

WIDE = 400


@pytest.fixture
def contended() -> Iterator[None]:
    """Switch threads as often as the interpreter allows, with a busy neighbour thread beside the run."""
    previous = sys.getswitchinterval()
    stop = threading.Event()

    def neighbour() -> None:
        n = 0
        while not stop.is_set():
            n = (n * 31 + 7) % 1_000_003

    thread = threading.Thread(target=neighbour, daemon=True)
    sys.setswitchinterval(1e-6)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        sys.setswitchinterval(previous)
        thread.join()


def _wide_recipe(tmp_path: Path, width: int) -> Path:
    """One source feeding ``width`` consumers: every consumer is ready at once, and each one's memory need is
    estimated from the sizes of outputs that the others are committing meanwhile."""
    lines = ["name: wide", "nodes:", "  - {name: root, stage: source, params: {value: r}}"]
    lines += [f"  - {{name: c{i:03d}, stage: consume, inputs: {{model: root}}, params: {{suffix: '{i}'}}}}"
              for i in range(width)]
    path = tmp_path / "wide.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("jobs", [2, 4])
def test_many_tiny_nodes_on_several_slots_finish_without_an_internal_error(tmp_path: Path, contended: None,
                                                                           jobs: int) -> None:
    loaded = load_recipe(_wide_recipe(tmp_path, WIDE))
    graph = build_graph(expand(loaded, get_stage), get_stage, loaded.recipe.name)
    store = Store(tmp_path / "store")
    _, summary = run_inline(loaded, graph, store, Environment({"python": "3.11"}),
                            RunOptions(jobs=jobs, output_dir=tmp_path / "build"))
    assert summary.ok, [(r.node, r.status, r.error) for r in summary.results.values() if r.status != "done"]
    assert summary.count("done") == WIDE + 1
    assert (tmp_path / "build" / f"c{WIDE - 1:03d}" / "out.txt").read_text() == f"r{WIDE - 1}"
