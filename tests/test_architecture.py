"""ARCHITECTURE.md names every module of the engine (`trtflow/`) and the built-in stages (`stages/`) in its room,
so the map stays true: a module added, moved or renamed without its line in the map fails here.

A module is named when the map has, in backticks, its path below its tree (`execution/lifecycle.py`,
`measure/timing/ab.py`) or its dotted name (`measure.timing.ab`); or, on a line that names its folder
(`` `timing/` ``, `` `execution/loop.py` ``), its bare name (`ab`, `scheduler.py`). A module at the top of a tree is
named by its file name (`plan.py`, `export.py`). A package's ``__init__.py`` is named by its folder.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
MAP = ROOT / "ARCHITECTURE.md"


def _modules() -> list[tuple[str, Path]]:
    return [(tree, path.relative_to(ROOT / tree)) for tree in ("trtflow", "stages")
            for path in sorted((ROOT / tree).rglob("*.py")) if "__pycache__" not in path.parts]


def _named(text: str, lines: list[str], tree: str, rel: Path) -> bool:
    ticked = set(re.findall(r"`([^`\n]+)`", text))
    parts = rel.with_suffix("").parts
    if rel.name == "__init__.py":
        folder = "/".join(parts[:-1])
        if not folder or any(t.startswith(f"{folder}/") or t.startswith(f"{tree}/{folder}/") for t in ticked):
            return True
        parts = parts[:-1]
        if len(parts) == 1:
            return False
        return any(re.search(rf"`(.*/)?{re.escape(parts[-2])}/", line) and f"`{parts[-1]}/`" in line for line in lines)
    dotted = ".".join(parts)
    if {rel.as_posix(), f"{tree}/{rel.as_posix()}", dotted} & ticked:
        return True
    if len(parts) == 1:
        return False
    folder, name = parts[-2], parts[-1]
    for line in lines:
        names = set(re.findall(r"`([^`\n]+)`", line))
        in_folder = any(re.match(rf"(.*/)?{re.escape(folder)}/", t) for t in names)
        if in_folder and ({name, f"{name}.py"} & names or any(t.startswith(f"{name}:") for t in names)):
            return True
    return False


def test_every_module_is_named_in_the_architecture_map():
    text = MAP.read_text(encoding="utf-8")
    lines = text.splitlines()
    missing = [f"{tree}/{rel.as_posix()}" for tree, rel in _modules() if not _named(text, lines, tree, rel)]
    assert not missing, "ARCHITECTURE.md does not name: " + ", ".join(missing) + " (add each in its room, one line)"


@pytest.mark.parametrize("spelling", ["`execution/ghost.py`", "`ghost`"])
def test_the_check_finds_an_unnamed_module(spelling):
    text = "| run | `execution/run.py` |\n"
    assert _named(text, text.splitlines(), "trtflow", Path("execution/run.py"))
    assert not _named(text, text.splitlines(), "trtflow", Path("execution/ghost.py"))
    named = text + f"| more | `execution/loop.py`, {spelling} |\n"
    assert _named(named, named.splitlines(), "trtflow", Path("execution/ghost.py"))
