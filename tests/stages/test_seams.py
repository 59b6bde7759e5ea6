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


STAGE_MODULES = {"export", "simplify", "quantize", "convert", "build", "validate", "benchmark", "select", "triton"}
LIBRARIES = ("accuracy", "data", "decision", "exporting", "formats", "measure", "precision", "runtimes")


def _library_modules() -> list[Path]:
    return [path for package in LIBRARIES for path in sorted((STAGES / package).rglob("*.py"))]


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` in ``path`` (a module of trtflow_stages) names."""
    if not node.level:
        return node.module or ""
    package = ["trtflow_stages", *path.relative_to(STAGES).parent.parts]
    base = package[:len(package) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def test_libraries_take_params_by_a_declared_type_and_import_no_stage() -> None:
    """The convention for library parameters (ARCHITECTURE.md): a library types the params it reads by a type it
    declares (a Protocol, or the field group it owns), never ``Any``; it imports no stage, not even for annotations
    (import-linter leaves TYPE_CHECKING imports out, so this test looks at them)."""
    found = []
    for path in _library_modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = path.relative_to(STAGES)
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and node.arg == "params" and node.annotation is not None \
                    and ast.unparse(node.annotation) in ("Any", "'Any'", "typing.Any"):
                found.append(f"{where}:{node.lineno}: params: Any")
            if isinstance(node, ast.Assign) and ast.unparse(node.value) == "Any":
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)} (an alias of Any)")
            if isinstance(node, ast.ImportFrom):
                imported = {_absolute(path, node)} | {f"{_absolute(path, node)}.{alias.name}" for alias in node.names}
                if imported & {f"trtflow_stages.{stage}" for stage in STAGE_MODULES}:
                    found.append(f"{where}:{node.lineno}: imports a stage: {ast.unparse(node)}")
    assert not found, found


def _protocol_members(protocol: type) -> set[str]:
    names: set[str] = set()
    for cls in protocol.__mro__:
        if getattr(cls, "_is_protocol", False) and cls.__module__ != "typing":
            names |= {name for name in (*vars(cls).get("__annotations__", {}), *vars(cls)) if not name.startswith("_")}
    return names


def _declared(cls: type) -> set[str]:
    """The fields of a pydantic model or a dataclass."""
    import dataclasses

    return set(getattr(cls, "model_fields", {})) | ({f.name for f in dataclasses.fields(cls)}
                                                     if dataclasses.is_dataclass(cls) else set())


def test_every_params_protocol_is_met_by_the_stage_params_it_names() -> None:
    """Each Protocol a library declares for a stage's params names only what that stage's Params has (a field, a
    property or a method): renaming a field in a stage fails here, not in a run."""
    from trtflow_stages import benchmark, build, convert, export, quantize, validate
    from trtflow_stages.accuracy.calibration import CalibrationParams
    from trtflow_stages.accuracy.compare import AccuracyParams
    from trtflow_stages.exporting.params import ExportParams
    from trtflow_stages.formats.torch_check import CheckParams
    from trtflow_stages.formats.torch_source import SampleInput, TorchSourceParams
    from trtflow_stages.measure.serving.measurements import ServingParams
    from trtflow_stages.measure.timing.feeds import FeedParams
    from trtflow_stages.precision.autocast import AutocastParams
    from trtflow_stages.precision.modelopt import ModeloptParams
    from trtflow_stages.precision.onnx_ptq import PlacementLike, PtqParams
    from trtflow_stages.precision.torch_route import TorchQuantizeParams
    from trtflow_stages.runtimes.trt_build import BuilderParams

    pairs = [(AccuracyParams, validate.Params), (FeedParams, benchmark.Params), (ServingParams, benchmark.Params),
             (ModeloptParams, quantize.Params), (ModeloptParams, convert.Params),
             (TorchQuantizeParams, quantize.Params), (BuilderParams, build.Params), (TorchSourceParams, export.Params),
             (CheckParams, export.Params), (ExportParams, export.Params), (SampleInput, export.InputDef),
             (AutocastParams, convert.Params),
             (PtqParams, quantize.Params), (CalibrationParams, quantize.Params), (PlacementLike, quantize.Placement)]
    missing = [f"{protocol.__name__} -> {params.__module__}.{params.__name__}.{name}"
               for protocol, params in pairs for name in sorted(_protocol_members(protocol))
               if name not in _declared(params) and not hasattr(params, name)]
    assert not missing, missing
    assert all(_protocol_members(protocol) for protocol, _ in pairs)


def test_one_import_style_inside_the_stages_package() -> None:
    """Inside `trtflow_stages`, modules import each other relatively (``from .data import ...``), the engine
    absolutely (``from trtflow.stage import ...``): one style, so a module's arrows read the same everywhere."""
    found = [f"{path.relative_to(STAGES)}:{node.lineno}: {ast.unparse(node)}"
             for path in _modules() for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.ImportFrom) and not node.level
             and (node.module or "").split(".")[0] == "trtflow_stages"]
    assert not found, found


def test_tensorrt_build_audits_live_in_one_module() -> None:
    """The precision audit of a build (what the network and the engine compute in, and where that misses the
    request) is defined in `runtimes.trt_audit` and nowhere else."""
    audit = {"audit_network", "audit_engine", "network_precision", "engine_precision", "network_shortfall",
             "engine_shortfall"}
    owner = STAGES / "runtimes" / "trt_audit.py"
    defined = {path: {node.name for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                      if isinstance(node, ast.FunctionDef)} & audit for path in _modules()}
    assert defined[owner] == audit
    assert not {str(path.relative_to(STAGES)): names for path, names in defined.items() if names and path != owner}
