"""Fuzz the recipe loader: no input may produce a traceback or an internal error, only a recipe error.

Hypothesis generates recipes near the real schema (right and wrong keys, types, references, matrices,
profiles, overrides) and mutates the text of valid recipes (deleted, inserted and swapped characters and
lines, YAML punctuation, tabs, anchors, tags). Each input goes through what `trtflow plan` does before
touching the store: load_recipe (with --set overrides), expand, build_graph and make_plan. The only
exception allowed out is RecipeError with exit code 2. Runs derandomized, so CI is reproducible.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability.plugins import activate_in_process, write_plugin_distribution

from trtflow.environment import Environment
from trtflow.errors import EXIT_USAGE, RecipeError
from trtflow.pipeline import load_pipeline
from trtflow.plan import make_plan
from trtflow.storage.store import Store

GENERATED, MUTATED = 2500, 6000  # examples per run (about 20 s and 14 s on one CI core)
FUZZ = settings(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

# ---------------------------------------------------------------------------------------------------- setup
WORKDIR = Path(tempfile.mkdtemp(prefix="trtflow-fuzz-"))
STORE = Store(WORKDIR / "store")
ENV = Environment({})  # no facts probed: the planner only reads them
(WORKDIR / "m.onnx").write_bytes(b"not read by the loader, only hashed by the planner")
(WORKDIR / "base.yaml").write_text("name: base\nnodes:\n  - {name: a, stage: synth, params: {text: base}}\n")
(WORKDIR / "calib.npz").write_bytes(b"hashed only")
CHECKED = {"count": 0}


@pytest.fixture(scope="module", autouse=True)
def _plugins_and_cwd() -> Any:
    activate_in_process(write_plugin_distribution(WORKDIR / "plugins"))
    previous = Path.cwd()
    os.chdir(WORKDIR)
    yield
    os.chdir(previous)


def check(text: str, overrides: tuple[str, ...] = ()) -> None:
    """Load, expand, graph and plan ``text``; anything but a RecipeError (exit code 2) fails the test."""
    path = WORKDIR / "recipe.yaml"
    path.write_bytes(text.encode("utf-8", "replace"))
    CHECKED["count"] += 1
    try:
        pipeline = load_pipeline(path, overrides)
        make_plan(pipeline.graph, STORE, ENV, pipeline.loaded.directory)
    except RecipeError as exc:
        assert exc.exit_code == EXIT_USAGE
        assert isinstance(exc.message, str) and exc.message.strip()
        assert "Traceback" not in str(exc)


# ---------------------------------------------------------------------------------------------------- strategies
STAGES = ["synth", "export", "simplify", "build", "quantize", "convert", "validate", "benchmark", "faulty",
          "synht", "", "Build"]
PARAM_KEYS = ["text", "size", "sleep", "fail", "mode", "model", "inputs", "outputs", "opset", "profile",
              "profiles", "precision", "backend", "workspace", "calibration_data", "check_n", "input_shapes",
              "szie", "path", "shapes", "min", "opt", "max", "timeout"]
NAMES = ["a", "b", "c", "src", "export", "build", "a.b", "x-y", "a-a", "1bad", "with space", "", "a" * 80]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(NAMES + ["${HOME}", "${UNSET_FUZZ_VAR}", "${X:-d}", "$${x}", "${{ matrix.size }}",
                             "${{ matrix.nope }}", "python:m.py:build", "m.onnx", "../../etc/passwd",
                             "/etc/passwd", "random:", "os:system", "fp16", "int8", "tensorrt-rtx", "auto"]),
    st.text(max_size=12),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.one_of(st.sampled_from(PARAM_KEYS),
                                                                                 st.text(max_size=6)),
                                                                       inner, max_size=4)), max_leaves=12)
shape = st.lists(st.integers(-2, 64), min_size=0, max_size=4)
shape_range = st.fixed_dictionaries({}, optional={"min": shape, "opt": shape, "max": shape, "mid": shape})
profiles = st.dictionaries(st.sampled_from(["bs1", "bs8", "p"]),
                           st.one_of(st.dictionaries(st.sampled_from(["input", "images"]), shape_range, max_size=2),
                                     values), max_size=2)


@st.composite
def wellformed_node(draw: st.DrawFn, names: list[str]) -> Any:
    """A node that passes the schema, so the graph checks (references, cycles, matrices) get exercised."""
    spec: dict[str, Any] = {"name": draw(st.sampled_from(names)), "stage": "synth",
                            "params": {"text": draw(st.sampled_from(["a", "b", "${{ matrix.text }}"])),
                                       "size": draw(st.integers(0, 100))}}
    if draw(st.booleans()):
        target = draw(st.sampled_from(names))
        spec["inputs"] = {"source": draw(st.sampled_from([target, f"{target}.data", f"{target}-a", f"{target}.x"]))}
    if draw(st.booleans()):
        spec["matrix"] = draw(st.dictionaries(st.sampled_from(["size", "text", "sise"]),
                                              st.lists(st.sampled_from(["a", "b", 1, 2, "a b", "a_b"]), max_size=3),
                                              max_size=2))
    return spec


@st.composite
def node(draw: st.DrawFn, names: list[str]) -> Any:
    if draw(st.booleans()):
        return draw(wellformed_node(names))
    if draw(st.integers(0, 20)) == 0:
        return draw(values)  # not even a mapping
    spec: dict[Any, Any] = {}
    if draw(st.integers(0, 9)):
        spec["name"] = draw(st.sampled_from(names))
    if draw(st.integers(0, 9)):
        spec["stage"] = draw(st.sampled_from(STAGES))
    if draw(st.booleans()):
        spec["params"] = draw(st.one_of(st.dictionaries(st.sampled_from(PARAM_KEYS), values, max_size=4), values))
    if draw(st.booleans()):
        ref = st.one_of(st.sampled_from(names), st.sampled_from([f"{n}.data" for n in names] + ["a.model", "q"]))
        spec["inputs"] = draw(st.one_of(
            st.dictionaries(st.sampled_from(["source", "model", "sauce", "calibration", "engine"]),
                            st.one_of(ref, st.lists(ref, max_size=3)), max_size=2), values))
    if draw(st.integers(0, 3)) == 0:
        spec["matrix"] = draw(st.one_of(
            st.dictionaries(st.sampled_from(["size", "text", "precision", "sise", "profile", "bs"]),
                            st.lists(scalars, max_size=3), max_size=2), values))
    if draw(st.integers(0, 5)) == 0:
        spec["timeout"] = draw(scalars)
    if draw(st.integers(0, 5)) == 0:
        spec["enabled"] = draw(scalars)
    if draw(st.integers(0, 8)) == 0:
        spec[draw(st.sampled_from(["parmas", "input", "description", "needs"]))] = draw(values)
    return spec


@st.composite
def recipes(draw: st.DrawFn) -> Any:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=5, unique=True))
    if draw(st.integers(0, 4)) < 2:  # schema-valid: reaches matrix expansion, the graph checks and the planner
        good = [n for n in names if n and " " not in n and not n[0].isdigit()] or ["a"]
        return {"name": "r", "nodes": draw(st.lists(wellformed_node(good), min_size=1, max_size=5))}
    recipe: dict[Any, Any] = {}
    if draw(st.integers(0, 9)):
        recipe["name"] = draw(st.one_of(st.sampled_from(["r", "fuzz", "r", "bad name", ""]), scalars))
    if draw(st.integers(0, 12)):
        recipe["nodes"] = draw(st.lists(node(names), max_size=5))
    if draw(st.integers(0, 3)) == 0:
        recipe["profiles"] = draw(profiles)
    if draw(st.integers(0, 4)) == 0:
        recipe["defaults"] = draw(st.dictionaries(st.sampled_from(STAGES), values, max_size=2))
    if draw(st.integers(0, 8)) == 0:
        recipe["extends"] = draw(st.sampled_from(["base.yaml", "missing.yaml", "recipe.yaml", "/etc/passwd"]))
    if draw(st.integers(0, 8)) == 0:
        recipe["version"] = draw(scalars)
    if draw(st.integers(0, 10)) == 0:
        recipe[draw(st.sampled_from(["node", "stages", "profile"]))] = draw(values)
    return recipe


overrides = st.lists(st.one_of(
    st.sampled_from(["nodes.a.params.size=3", "nodes.a.params.size=big", "nodes.zz.params.x=1", "name=other",
                     "nodes=3", "name.x=1", "noequals", "=3", ".=", "nodes.a=[1, 2]", "nodes.a.stage=export",
                     "profiles.bs1.input.min=[1]", "nodes.a.params={a: [}"]),
    st.text(max_size=20)), max_size=2)


@settings(FUZZ, max_examples=GENERATED)
@given(recipe=recipes(), sets=overrides)
def _generated_recipe(recipe: Any, sets: list[str]) -> None:
    check(yaml.safe_dump(recipe, allow_unicode=True, sort_keys=False), tuple(sets))


def test_generated_recipes_give_only_recipe_errors() -> None:
    before = CHECKED["count"]
    _generated_recipe()
    assert CHECKED["count"] - before >= GENERATED


SEEDS = [
    """\
name: fuzz
profiles:
  bs1: {input: {min: [1, 16], opt: [1, 16], max: [4, 16]}}
defaults:
  synth: {size: 64}
nodes:
  - {name: a, stage: synth, params: {text: "${X:-x}"}}
  - name: b
    stage: synth
    matrix: {size: [1, 2], text: [p, q]}
    inputs: {source: a}
  - {name: c, stage: synth, inputs: {source: b-1-p.data}, timeout: 5}
""",
    """\
name: onnx
nodes:
  - name: export
    stage: export
    params:
      model: m.onnx
  - name: simplify
    stage: simplify
    params: {input_shapes: {input: [4, 16]}}
  - name: build
    stage: build
    matrix:
      profile: [bs1]
    params: {backend: tensorrt-rtx, precision: strongly-typed}
profiles:
  bs1: {input: {min: [1, 16], opt: [2, 16], max: [4, 16]}}
""",
    """\
extends: base.yaml
name: child
nodes:
  - name: a
    params: {size: 3}
  - &n {name: d, stage: synth, inputs: {source: a}}
  - {<<: *n, name: e}
  - {name: ex, stage: export, params: {model: m.onnx}}
  - name: q
    stage: quantize
    params: {mode: int8, calibration_data: {path: calib.npz}}
    inputs: {model: ex}
""",
]
PUNCTUATION = list(":{}[]-,&*!|>'\"#%@?`\t\n ") + ["\n  ", "- ", ": ", "!!python/name:os.system ", "*a",
                                                   "&a ", "<<: ", "${", "${{", "\\", "\x00", "\ufeff", "é"]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.integers(0, 5))
        at = draw(st.integers(0, len(text)))
        if kind == 0:  # delete a span
            text = text[:at] + text[at + draw(st.integers(1, 12)):]
        elif kind == 1:  # insert YAML punctuation
            text = text[:at] + draw(st.sampled_from(PUNCTUATION)) + text[at:]
        elif kind == 2:  # insert arbitrary text
            text = text[:at] + draw(st.text(max_size=6)) + text[at:]
        elif kind == 3:  # duplicate or drop a line
            lines = text.split("\n")
            i = draw(st.integers(0, len(lines) - 1))
            lines[i:i + 1] = [lines[i]] * draw(st.integers(0, 2))
            text = "\n".join(lines)
        elif kind == 4:  # swap two lines
            lines = text.split("\n")
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
        else:  # re-indent a line
            lines = text.split("\n")
            i = draw(st.integers(0, len(lines) - 1))
            lines[i] = " " * draw(st.integers(0, 6)) + lines[i].lstrip()
            text = "\n".join(lines)
    return text


@settings(FUZZ, max_examples=MUTATED)
@given(text=mutated())
def _mutated_recipe(text: str) -> None:
    check(text)


def test_mutated_yaml_gives_only_recipe_errors() -> None:
    before = CHECKED["count"]
    _mutated_recipe()
    assert CHECKED["count"] - before >= MUTATED


def test_seed_recipes_are_valid() -> None:
    """The mutation seeds themselves load and plan cleanly (so mutations start from valid recipes)."""
    for seed in SEEDS:
        path = WORKDIR / "seed.yaml"
        path.write_text(seed)
        pipeline = load_pipeline(path)
        assert make_plan(pipeline.graph, STORE, ENV, pipeline.loaded.directory)
