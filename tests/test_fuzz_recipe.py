"""Fuzz the recipe loader: no input may produce a traceback or an internal error, only a recipe error.

Hypothesis generates recipes near the real schema (right and wrong keys, types, references, matrices,
profiles, overrides) and mutates the text of valid recipes (deleted, inserted and swapped characters and
lines, YAML punctuation, tabs, anchors, tags), as many as a stated CPU budget allows (GENERATED, MUTATED). Each
input goes through what `trtflow plan` does before touching the store: load_recipe (with --set overrides),
expand, build_graph and make_plan. The only exception allowed out is RecipeError with exit code 2. Runs
derandomized, so CI is reproducible.

Then mutants of the shipped recipes (pipelines/*.yaml, in a copy of the project) with hostile YAML (deep
nesting, huge numbers and strings, alias and merge-key bombs, tags, several documents), hostile values
(paths out of the project, to devices, pipes, link loops, the project itself; code references) and hostile
--set overrides go through the `trtflow plan` command itself: in-process in CI (300 mutants, each its own
test with a time limit, so a hang fails the mutant that hangs), and as real processes in a slow test. Run
this file as a script for the same check at any scale, each mutant a `trtflow plan` process given 10 s:

    python tests/test_fuzz_recipe.py 1000
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import shutil
import subprocess
import sys
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

# Examples per run, sized by a budget of about 8 s of CPU for each of the two tests on one idle CI core (measured
# 2026-11-27: 3.8 s per 500 generated recipes, most of it Hypothesis drawing them; 1.3 s per 500 mutated texts).
# Derandomized, so CI checks the same examples every run; TRTFLOW_FUZZ_SCALE=N checks N times as many (a deeper
# run by hand, e.g. before a release: TRTFLOW_FUZZ_SCALE=10 python -m pytest tests/test_fuzz_recipe.py -k yaml).
_SCALE = float(os.environ.get("TRTFLOW_FUZZ_SCALE", "1"))
GENERATED, MUTATED = int(1000 * _SCALE), int(3000 * _SCALE)
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
# The strategies the composites below draw from, made once here: a strategy made inside a composite is made and
# validated again at every draw (most of the generated test's time, for the same examples).
param_dicts = st.dictionaries(st.sampled_from(PARAM_KEYS), values, max_size=4)
node_params = st.one_of(param_dicts, values)
node_matrix = st.one_of(st.dictionaries(st.sampled_from(["size", "text", "precision", "sise", "profile", "bs"]),
                                        st.lists(scalars, max_size=3), max_size=2), values)
stage_defaults = st.dictionaries(st.sampled_from(STAGES), values, max_size=2)


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
        spec["params"] = draw(node_params)
    if draw(st.booleans()):
        ref = st.one_of(st.sampled_from(names), st.sampled_from([f"{n}.data" for n in names] + ["a.model", "q"]))
        spec["inputs"] = draw(st.one_of(
            st.dictionaries(st.sampled_from(["source", "model", "sauce", "calibration", "engine"]),
                            st.one_of(ref, st.lists(ref, max_size=3)), max_size=2), values))
    if draw(st.integers(0, 3)) == 0:
        spec["matrix"] = draw(node_matrix)
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
        recipe["defaults"] = draw(stage_defaults)
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



# ---------------------------------------------------------------------------------------------------------
# Mutants of the shipped recipes through the `trtflow plan` command.

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "pipelines").glob("*.yaml"))
SHIPPED_MUTANTS = 300


def shipped_project(root: Path) -> Path:
    """The shipped pipelines and the examples they use, copied as a project of their own, with traps beside
    them: named pipes (opening one blocks), a symbolic link loop and a link out of the project."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text("")
    shutil.copytree(REPO / "pipelines", root / "pipelines")
    for sub in ("models", "data"):
        shutil.copytree(REPO / "examples" / sub, root / "examples" / sub)
    traps = root / "pipelines"
    os.mkfifo(traps / "fifo")
    (traps / "loop").symlink_to(traps / "loop")
    (traps / "out").symlink_to("/etc")
    os.mkfifo(root / "examples" / "data" / "pipe.npz")  # inside a folder a recipe may point at
    return traps


def _laughs(name: str, depth: int) -> str:
    lines = [f"{name}0: &{name}0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"{name}{i}: &{name}{i} [" + ", ".join([f"*{name}{i - 1}"] * 9) + "]" for i in range(1, depth)]
    return "\n".join(lines) + "\n"


MERGE_BOMB = "".join(f"m{i}: &m{i} {{<<: [" + ", ".join([f"*m{i - 1}"] * 9) + f"], k{i}: v}}\n" if i
                     else "m0: &m0 {k0: v}\n" for i in range(9))
HOSTILE_VALUES = [
    "[" * 65 + "]" * 65, "[" * 100_000 + "]" * 100_000, "{a: " * 70 + "1" + "}" * 70, "7" * 5000,
    ":".join(["59"] * 3000), "1e999999", "-.inf", ".nan", "0x" + "f" * 300, "0b" + "1" * 150, "0o17", "-0",
    "'" + "a" * ((1 << 20) + 1) + "'", "!!python/object/apply:os.system ['true']", "!!python/name:os.system",
    "!!binary aGk=", "!!set {a: null}", "!!omap [{a: 1}]", "!!timestamp 2020-01-01", "!!float x", "!!int ''",
    "!!bool maybe", "!custom x", "!!str 5", "!!map {}", "!!seq []", "2020-01-01", "=", "<<", "~", "null", "[]",
    "{}", "''", '"\\0"', '"\\ud800"', '"\\x85\\u2028"', '"\\e[31mred"', "&a x", "*undefined", "&a [*a]",
    "..", ".", "/", "../..", "../", "./.", "/dev/zero", "/dev/stdin", "/proc/self/mem", "fifo", "loop", "loop/x",
    "out/passwd", "../examples/data", "../examples/data/pipe.npz", "~", "~nosuchuser/x", "$HOME", "${HOME}",
    "${UNSET_FUZZ_VAR}", "${UNSET_FUZZ_VAR:-..}", "$${x}", "a" * 5000 + ".onnx", "x/" * 3000, "../pipelines",
    "python:os:system", "python:os.path:join", "python:../examples/models/tiny_cnn.py:nope", "python:/etc/passwd:x",
    "python:fifo:x", "python:loop:x", "python:..:x", "python:.py:x", "python:a:b:c", "python:", "python:sys:exit",
    "python:" + "a." * 3000 + "b:c", "python:trtflow.cli.main:main", "python:out/passwd:x", "${{ matrix.x }}",
    "${{ matrix." + "a" * 1000 + " }}", "-1", "0", "1e308", str(10**30), "true", "no", "[1, [2, [3]]]",
    "{min: [1], opt: [2], max: [1]}", "[" + ", ".join(str(i) for i in range(3000)) + "]",
]
HOSTILE_TOP = [
    _laughs("l", 9), MERGE_BOMB, "loop: &r [a, *r]\n", "a: &d x\nb: &d y\n", "c: {<<: *undefined}\n",
    "matrixbomb: &mb [" + ", ".join(str(i) for i in range(250)) + "]\n",
    "extends: quickstart.yaml\n", "extends: /dev/zero\n", "extends: fifo\n", "extends: loop\n", "extends: ..\n",
    "extends: ../pipelines\n", "extends: out/passwd\n", "extends: " + "[" * 200 + "]" * 200 + "\n",
    "extends: *undefined\n", "version: 2\n", "version: " + "9" * 400 + "\n", "name: " + "n" * 100_000 + "\n",
]
HOSTILE_SETS = [
    "nodes.export.params.opset=" + "9" * 5000, "nodes.export.params.model=" + "[" * 100_000,
    "nodes.export.params.model=..", "nodes.export.params.model=/dev/zero", "nodes.export.params.model=fifo",
    "nodes.quantize.params.calibration_data.path=../examples/data",
    "nodes.quantize.params.calibration_data.path=../examples/data/pipe.npz",
    "nodes.build.matrix={a: [" + ", ".join(map(str, range(400))) + "], b: [" + ", ".join(map(str, range(400))) + "]}",
    "nodes.build.matrix.precision=[fp16, int8, fp8, fp4, int4, best, strongly-typed]",
    "nodes.export.params.text=" + "[&a [x, x, x, x, x, x, x, x, x, x], " + ", ".join(
        f"&{c} [" + ", ".join([f"*{p}"] * 10) + "]" for p, c in zip("abcdef", "bcdefg", strict=True)) + "]",
    "a." * 70 + "b=1", "name=" + "a" * 10_000, "nodes=[]", "nodes={}", "nodes.0.name=x", "=1", "a..b=1", ".=",
    "nodes.export=", "profiles={x: {input: {min: [1], opt: [1], max: [0]}}}", "extends=/etc/passwd",
    "defaults.export.model=fifo", "nodes.export.stage=" + "e" * 10_000, "nodes.export.params=!!python/name:os.system",
]
VALUE_IN_FLOW = re.compile(r"(?<=[{,] )([A-Za-z_]\w*): ([^,{}\[\]\n]+)")
VALUE_ON_LINE = re.compile(r"^(\s*(?:- )?[A-Za-z_][\w.-]*:[ ]+)(\S.*)$", re.M)


def mutate(text: str, rng: random.Random) -> tuple[str, list[str]]:
    """One to three random mutations of a recipe's text, and the --set overrides to plan it with."""
    overrides: list[str] = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(9)
        if kind <= 2:  # a hostile value in place of one written on its own line or inside {...}
            pattern = VALUE_ON_LINE if kind < 2 else VALUE_IN_FLOW
            spots = list(pattern.finditer(text))
            if spots:
                spot = rng.choice(spots)
                text = text[:spot.start(2)] + rng.choice(HOSTILE_VALUES) + text[spot.end(2):]
        elif kind == 3:  # hostile top-level lines, sometimes used by a node
            block = rng.choice(HOSTILE_TOP)
            at = text.find("\nnodes:")
            text = text[:at + 1] + block + text[at + 1:] if at >= 0 else block + text
            alias = re.match(r"^(?:\w+): &(\w+)", block.split("\n")[-2] if block.count("\n") > 1 else block)
            spots = list(VALUE_ON_LINE.finditer(text))
            if alias and spots and rng.random() < 0.7:
                spot = rng.choice(spots)
                text = text[:spot.start(2)] + "*" + alias.group(1) + text[spot.end(2):]
        elif kind == 4:
            overrides.append(rng.choice(HOSTILE_SETS))
        elif kind == 5:  # several documents, directives
            text = rng.choice(["%YAML 1.1\n---\n", "%TAG !e! tag:example.com,2000:\n---\n", "--- !!map\n"]) + text
            if rng.random() < 0.5:
                text += "\n---\nname: other\n"
        else:  # the text mutations of the generated recipes above
            at = rng.randrange(len(text) + 1)
            lines = text.split("\n")
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            if kind == 6:
                text = text[:at] + text[at + rng.randint(1, 12):]
            elif kind == 7:
                text = text[:at] + rng.choice(PUNCTUATION) + text[at:]
            else:
                lines[i], lines[j] = lines[j], " " * rng.randrange(7) + lines[i].lstrip()
                text = "\n".join(lines)
    return text, overrides


def plan_in_process(recipe: Path, overrides: list[str], store: Path) -> tuple[int, str]:
    """Run `trtflow plan` as its console script does, in this process: (exit code, what it printed)."""
    from trtflow.cli.main import main

    argv = ["trtflow", "plan", str(recipe), "--store", str(store), *(a for o in overrides for a in ("--set", o))]
    out = io.StringIO()
    code: Any = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), _argv(argv):
        try:
            main()
        except SystemExit as exc:
            code = exc.code
    return (code if isinstance(code, int) else 1), out.getvalue()


@contextlib.contextmanager
def _argv(argv: list[str]) -> Any:
    saved = sys.argv
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = saved


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shipped_project(tmp_path_factory.mktemp("shipped"))


def _write_mutant(folder: Path, seed: int) -> tuple[Path, list[str]]:
    rng = random.Random(seed)
    source = rng.choice(SHIPPED)
    text, overrides = mutate(source.read_text(), rng)
    recipe = folder / f"mutant-{seed}-{source.name}"
    recipe.write_bytes(text.encode("utf-8", "surrogatepass"))
    return recipe, overrides


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", range(SHIPPED_MUTANTS))
def test_a_mutant_of_a_shipped_recipe_plans_or_is_refused_clearly(seed: int, shipped: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(shipped.parent)
    monkeypatch.delenv("TRTFLOW_ALLOWED_PATHS", raising=False)
    monkeypatch.delenv("UNSET_FUZZ_VAR", raising=False)
    recipe, overrides = _write_mutant(shipped, seed)
    try:
        code, printed = plan_in_process(recipe, overrides, shipped.parent / "store")
    finally:
        recipe.unlink()
    assert code in (0, 2), f"exit code {code} for {recipe.name} {overrides}:\n{printed[-3000:]}"
    assert "Traceback" not in printed and "internal error" not in printed, printed[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1000, 1016))
def test_a_mutant_through_the_real_command(seed: int, shipped: Path) -> None:
    recipe, overrides = _write_mutant(shipped, seed)
    proc = run_plan_process(recipe, overrides, shipped.parent / "store", timeout=120)
    assert proc.returncode in (0, 2), proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr[-3000:]


def run_plan_process(recipe: Path, overrides: list[str], store: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRTFLOW_ALLOWED_PATHS", "UNSET_FUZZ_VAR")}
    argv = [sys.executable, "-m", "trtflow.cli", "plan", recipe.name, "--store", str(store),
            *(a for o in overrides for a in ("--set", o))]
    return subprocess.run(argv, cwd=recipe.parent, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def main(count: int, first: int = 0, limit: float = 10.0) -> int:
    """Plan ``count`` mutants as real `trtflow plan` processes; print and keep every one that fails."""
    import time

    work = Path(tempfile.mkdtemp(prefix="trtflow-fuzz-plan-"))
    folder = shipped_project(work / "project")
    kept = work / "failures"
    failures = 0
    slowest = (0.0, -1)
    for seed in range(first, first + count):
        recipe, overrides = _write_mutant(folder, seed)
        start = time.perf_counter()
        try:
            proc = run_plan_process(recipe, overrides, work / "store", timeout=limit)
            problem = (f"exit {proc.returncode}" if proc.returncode not in (0, 2)
                       else "traceback" if "Traceback" in proc.stderr or "internal error" in proc.stderr else None)
            detail = proc.stderr[-1500:]
        except subprocess.TimeoutExpired:
            problem, detail = f"no answer in {limit:.0f} s", ""
        took = time.perf_counter() - start
        slowest = max(slowest, (took, seed))
        if problem:
            failures += 1
            kept.mkdir(exist_ok=True)
            shutil.copy(recipe, kept / recipe.name)
            print(f"seed {seed} ({recipe.name}, --set {overrides}): {problem}\n{detail}", flush=True)
        recipe.unlink()
    print(f"{count} mutants, {failures} failures, slowest {slowest[0]:.1f} s (seed {slowest[1]})"
          + (f"; failing mutants kept in {kept}" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 300,
                          int(sys.argv[2]) if len(sys.argv) > 2 else 0))
