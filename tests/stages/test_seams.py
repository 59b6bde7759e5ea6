"""The seams inside `stages/`: one owner per concept, and a test that fails when code goes around it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

STAGES = Path(__file__).resolve().parents[2] / "stages"
LEVEL_MEMBER = re.compile(r"ORT_(ENABLE|DISABLE)_[A-Z]+")


def _modules() -> list[Path]:
    return sorted(STAGES.rglob("*.py"))


def _strings(tree: ast.AST) -> list[str]:
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_one_onnx_runtime_optimisation_level_mapping() -> None:
    """Only `runtimes.ort` names ONNX Runtime's GraphOptimizationLevel members or reads one of them."""
    owner = STAGES / "runtimes" / "ort.py"
    found = []
    for path in _modules():
        if path == owner:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{path.relative_to(STAGES)}: {text!r}" for text in _strings(tree) if LEVEL_MEMBER.search(text)]
        found += [f"{path.relative_to(STAGES)}:{node.lineno}: GraphOptimizationLevel.{node.attr}"
                  for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                  and isinstance(node.value, ast.Attribute) and node.value.attr == "GraphOptimizationLevel"]
    assert not found, f"map recipe levels with runtimes.ort.level_member, not here: {found}"


@pytest.mark.parametrize("level", ["disable", "basic", "extended", "layout", "all"])
def test_every_level_is_a_member_of_the_installed_onnxruntime(level: str) -> None:
    import onnxruntime as ort

    from trtflow_stages.runtimes.ort import OrtOptions, level_member, session_options

    member = level_member(level)  # type: ignore[arg-type]
    assert session_options(OrtOptions(graph_optimization_level=level)).graph_optimization_level == \
        getattr(ort.GraphOptimizationLevel, member)
    if level == "layout" and hasattr(ort.GraphOptimizationLevel, "ORT_ENABLE_LAYOUT"):
        assert member == "ORT_ENABLE_LAYOUT"  # ONNX Runtime's own level, not "all" under another name


def _calls(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
            found.append((node.lineno, name))
    return found


def test_stages_open_candidates_only_through_runtimes_candidate() -> None:
    """A stage module decides kind, flavour and provenance of a model it runs, and opens its engine, through
    `runtimes.candidate.open_candidate` only; no stage enters or leaves a session by hand."""
    by_hand = {"open_engine", "engine_backend", "__enter__", "__exit__"}
    found = [f"{path.name}:{line}: {name}" for path in sorted(STAGES.glob("*.py"))
             for line, name in _calls(ast.parse(path.read_text(encoding="utf-8"))) if name in by_hand]
    assert not found, f"open the model with runtimes.candidate.open_candidate (a with-block): {found}"
    for stage in ("validate.py", "benchmark.py"):
        assert "open_candidate" in {name for _, name in _calls(ast.parse((STAGES / stage).read_text()))}
