"""A small project run in this process with the toy stages as a plugin: for the tests of "up to date" (the planner,
the no-op shortcut, the stat caches). Runs use the inline executor; between runs the project's modules are dropped
from ``sys.modules``, as a new worker process would start without them."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.engine.toystages import register
from tests.reliability.plugins import activate_in_process
from trtflow import api
from trtflow.execution.results import RunOptions


@contextmanager
def toy_plugin(folder: Path) -> Iterator[list[str]]:
    """The toy stages registered as a plugin distribution for as long as the block runs."""
    from trtflow import registry

    paths = register(folder)
    added = [p for p in paths if p not in sys.path]
    activate_in_process(paths)
    try:
        yield paths
    finally:
        for p in added:
            if p in sys.path:
                sys.path.remove(p)
        registry.stage_entry_points.cache_clear()
        registry.get_stage.cache_clear()


@contextmanager
def fresh_modules(folder: Path) -> Iterator[None]:
    """Modules imported from ``folder`` (a test project's helper, blocks, ...) are gone after the block: another
    test's project may have modules of the same names."""
    try:
        yield
    finally:
        forget_modules(folder)


_ELSEWHERE: dict[str, set[str]] = {}  # per project: names of modules known to come from elsewhere


def forget_modules(project: Path) -> None:
    """Drop the modules imported from ``project`` (a new worker process would import them afresh)."""
    roots = (str(project.resolve()), str(project))
    elsewhere = _ELSEWHERE.setdefault(roots[0], set())
    for name in sys.modules.keys() - elsewhere:
        module = sys.modules[name]
        file = getattr(module, "__dict__", {}).get("__file__")  # not getattr: a module's __getattr__ may be slow
        if isinstance(file, str) and file.startswith(roots):
            del sys.modules[name]
        else:
            elsewhere.add(name)


def backdate(folder: Path, exclude: Sequence[Path] = ()) -> None:
    old = time.time_ns() - 10_000_000_000
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink() and not any(e in path.parents for e in exclude):
            os.utime(path, ns=(old, old))


def options() -> RunOptions:
    return RunOptions(jobs=1, executor="inline")


class Project:
    """A recipe in a project folder, with its store beside it."""

    def __init__(self, root: Path, name: str = "r", recipe: str = "recipe.yaml") -> None:
        self.root = root
        self.name = name
        self.recipe = root / recipe
        self.store = root / ".store"

    def run(self, overrides: Sequence[str] = ()) -> dict[str, str]:
        forget_modules(self.root)
        _, _, summary = api.run(self.recipe, overrides=overrides, store=self.store, options=options())
        assert summary.ok, [(r.node, r.error) for r in summary.results.values()]
        return {n: r.status for n, r in summary.results.items()}

    def shortcut(self, overrides: Sequence[str] = ()) -> bool:
        """Whether the no-op shortcut answers "nothing to do" (and records the run, as `trtflow run` does)."""
        summary = api.run_unchanged(self.recipe, overrides=overrides, store=self.store, options=options())
        if summary is not None:
            assert summary.ok and {r.status for r in summary.results.values()} == {"fresh"}, summary.results
        return summary is not None

    def plan(self, overrides: Sequence[str] = ()) -> dict[str, Any]:
        return {s.node.name: s for s in api.plan(self.recipe, overrides=overrides, store=self.store)}

    def output(self, node: str, filename: str = "out.bin") -> bytes:
        """A node's output as delivered under build/ (runs are made from the project folder)."""
        return (self.root / "build" / self.name / node / filename).read_bytes()

    def settled_with_record(self) -> None:
        """Bring everything up to date and leave the no-op record; the shortcut then answers. The project's files
        are dated 10 s back first, as files edited a while ago are (their ctime stays: it cannot be set back)."""
        backdate(self.root, exclude=(self.store, self.root / "build"))
        self.run()
        again = self.run()
        assert set(again.values()) == {"fresh"}, {n: s.reason for n, s in self.plan().items() if s.status != "fresh"}
        assert self.shortcut(), "nothing changed, yet the shortcut did not answer"
