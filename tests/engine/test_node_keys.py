"""What a node key sees: code (the stage's and a `python:` callable's imports), file contents not path spelling,
the device a node runs on, and nothing else (gate thresholds are not part of it)."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

from tests.engine.inline import run_inline
from tests.engine.toystages import get_stage
from trtflow import codehash
from trtflow.environment import Environment, GpuInfo, parse_smi, visible
from trtflow.graph import build_graph
from trtflow.node_keys import KeyContext, key_parts
from trtflow.pipeline import identity_of
from trtflow.plan import make_plan
from trtflow.recipe.expand import expand
from trtflow.recipe.load import load_recipe
from trtflow.storage.store import Store

ENV = Environment({"python": "3.11"})


def _graph(recipe: Path):
    loaded = load_recipe(recipe)
    return loaded, build_graph(expand(loaded, get_stage), get_stage, loaded.recipe.name)


def _plan(recipe: Path, store: Store) -> dict:
    loaded, graph = _graph(recipe)
    steps = make_plan(graph, store, ENV, loaded.directory, recipe_id=identity_of(loaded.path, "").id)
    return {s.node.name: s for s in steps}


def _run(recipe: Path, store: Store):
    loaded, graph = _graph(recipe)
    return run_inline(loaded, graph, store, ENV)[1]


def _project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    return tmp_path


def test_a_moved_recipe_that_spells_its_paths_differently_reuses_everything(tmp_path):
    root = _project(tmp_path)
    (root / "data").mkdir()
    (root / "data" / "x.npz").write_bytes(b"calibration")
    (root / "at_root.yaml").write_text("name: r\nnodes:\n  - {name: read, stage: reader, params: {path: data/x.npz}}\n")
    (root / "sub").mkdir()
    (root / "sub" / "moved.yaml").write_text(
        "name: r\nnodes:\n  - {name: read, stage: reader, params: {path: ../data/x.npz}}\n")
    store = Store(tmp_path / "store")
    assert _run(root / "at_root.yaml", store).ok
    moved = _plan(root / "sub" / "moved.yaml", store)
    assert moved["read"].status == "fresh", moved["read"].reason
    # the recorded params show the path relative to the project, however the recipe spelled it
    assert moved["read"].parts.params["path"] == "data/x.npz"
    # a byte-identical copy under another name is the same input too; different content is not
    (root / "data" / "copy.npz").write_bytes(b"calibration")
    (root / "sub" / "moved.yaml").write_text(
        "name: r\nnodes:\n  - {name: read, stage: reader, params: {path: ../data/copy.npz}}\n")
    assert _plan(root / "sub" / "moved.yaml", store)["read"].status == "fresh"
    (root / "data" / "copy.npz").write_bytes(b"something else")
    step = _plan(root / "sub" / "moved.yaml", store)["read"]
    assert step.status == "stale"


def test_editing_a_module_the_factory_imports_makes_the_node_stale(tmp_path):
    root = _project(tmp_path)
    models = root / "models"
    (models / "helpers").mkdir(parents=True)
    (models / "factory.py").write_text("from helpers.text import greeting\n\ndef build():\n    return greeting()\n")
    (models / "helpers" / "__init__.py").write_text("")
    (models / "helpers" / "text.py").write_text("def greeting():\n    return 'hello'\n")
    recipe = root / "r.yaml"
    recipe.write_text("name: r\nnodes:\n"
                      "  - {name: code, stage: coder, params: {model: 'python:models/factory.py:build'}}\n")
    store = Store(tmp_path / "store")
    summary = _run(recipe, store)
    assert summary.ok and (store.refs.current("r.yaml")["code"])
    parts = _plan(recipe, store)["code"].parts
    assert set(parts.files) == {"models/factory.py"}
    # the modules its code was seen importing while it ran
    assert {d for d in parts.deps if not d.startswith("env:")} == {
        "models/factory.py", "models/helpers/__init__.py", "models/helpers/text.py"}
    (models / "helpers" / "text.py").write_text("def greeting():\n    return 'bonjour'\n")
    step = _plan(recipe, store)["code"]
    assert step.status == "stale" and step.reason == "module models/helpers/text.py changed"


def test_the_stage_code_and_the_helpers_it_imports_are_part_of_the_key(tmp_path, monkeypatch):
    package = tmp_path / "fakestages"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_helper.py").write_text("FACTOR = 2\n")
    (package / "_unused.py").write_text("X = 1\n")
    (package / "mystage.py").write_text(textwrap.dedent("""\
        def run(ctx, inputs, params):
            from ._helper import FACTOR
            return {"factor": FACTOR}
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("fakestages.mystage")
    codehash._STAGE_CODE.clear()
    first = codehash.stage_code("fakestages.mystage")
    assert set(first.files) == {"fakestages/mystage.py", "fakestages/_helper.py"}
    (package / "_unused.py").write_text("X = 2\n")
    codehash._STAGE_CODE.clear()
    assert codehash.stage_code("fakestages.mystage").digest == first.digest  # not imported: not in the key
    (package / "_helper.py").write_text("FACTOR = 3\n")
    codehash._STAGE_CODE.clear()
    assert codehash.stage_code("fakestages.mystage").digest != first.digest
    codehash._STAGE_CODE.clear()
    sys.modules.pop("fakestages.mystage", None)


def test_facts_come_from_the_device_a_node_runs_on(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nnodes:\n  - {name: a, stage: source}\n")
    _, graph = _graph(recipe)
    node = graph.nodes["a"]
    stage = graph.stages["source"]
    object.__setattr__(stage, "environment", ("python", "gpu", "driver"))
    try:
        kctx = KeyContext.for_recipe(tmp_path, Environment({"python": "3.11"}))
        a100 = GpuInfo(0, "NVIDIA A100-SXM4-80GB", "8.0", "550.54", 81920, uuid="GPU-a")
        h100 = GpuInfo(1, "NVIDIA H100 80GB HBM3", "9.0", "550.54", 81559, uuid="GPU-b")
        on_a100 = key_parts(graph, node, {}, kctx, a100)
        on_h100 = key_parts(graph, node, {}, kctx, h100)
        assert on_a100.facts["gpu"] == "NVIDIA A100-SXM4-80GB (sm80)"
        assert on_h100.facts["gpu"] == "NVIDIA H100 80GB HBM3 (sm90)"
        assert on_a100.key != on_h100.key
    finally:
        object.__setattr__(stage, "environment", ("python",))


def test_cuda_visible_devices_with_indices_uuids_and_mig_ids():
    query = ("0, GPU-aaaa1111, NVIDIA A100-SXM4-80GB, 8.0, 550.54, 81920\n"
             "1, GPU-bbbb2222, NVIDIA H100 80GB HBM3, 9.0, 550.54, 81559\n")
    listing = ("GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-aaaa1111)\n"
               "  MIG 1g.10gb     Device  0: (UUID: MIG-cccc3333)\n"
               "  MIG 3g.40gb     Device  1: (UUID: MIG-dddd4444)\n"
               "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb2222)\n")
    devices = parse_smi(query, listing)

    def labels(env):
        return [(g.index, g.label) for g in visible(devices, env)]

    assert labels("1") == [(0, "NVIDIA H100 80GB HBM3 (sm90)")]
    assert labels("GPU-bbbb2222") == labels("GPU-bbbb") == labels("1")
    assert labels("MIG-dddd4444") == [(0, "NVIDIA A100-SXM4-80GB MIG 3g.40gb (sm80)")]
    assert labels("1,MIG-cccc3333") == [(0, "NVIDIA H100 80GB HBM3 (sm90)"),
                                         (1, "NVIDIA A100-SXM4-80GB MIG 1g.10gb (sm80)")]
    assert labels("") == [] and labels("7") == [] and labels("1,7,0") == labels("1")  # CUDA stops at a bad one
    assert [g.visible_id for g in visible(devices, None)] == ["MIG-cccc3333", "MIG-dddd4444", "GPU-bbbb2222"]


def test_gate_thresholds_are_not_part_of_the_key(tmp_path):
    from dataclasses import replace

    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nnodes:\n  - {name: a, stage: source, params: {value: v, precision: fp16}}\n")
    _, graph = _graph(recipe)
    node = graph.nodes["a"]
    kctx = KeyContext.for_recipe(tmp_path, ENV)
    keyed = key_parts(graph, node, {}, kctx).key
    graph.stages["source"] = replace(graph.stages["source"], gate_params=("precision",))
    assert key_parts(graph, node, {}, kctx).key != keyed
    other = build_graph(expand(load_recipe(recipe), get_stage), get_stage, "r")
    other.stages["source"] = graph.stages["source"]
    recipe.write_text("name: r\nnodes:\n  - {name: a, stage: source, params: {value: v, precision: int8}}\n")
    changed = build_graph(expand(load_recipe(recipe), get_stage), get_stage, "r")
    changed.stages["source"] = graph.stages["source"]
    assert key_parts(changed, changed.nodes["a"], {}, kctx).key == key_parts(other, other.nodes["a"], {}, kctx).key
