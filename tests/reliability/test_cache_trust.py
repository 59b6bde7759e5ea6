"""The cache's promise through the real CLI: gc never loses what a recipe file's latest run uses, recipes are
identified by their file, formats are versioned, and copies under build/ are not aliases of the store."""

from __future__ import annotations

import json
import re
from pathlib import Path

from trtflow.storage.store import Store

CHAIN = """\
name: {name}
nodes:
  - {{name: a, stage: synth, params: {{text: a{suffix}, size: 20000}}}}
  - {{name: b, stage: synth, params: {{text: b, size: 10000}}, inputs: {{source: a}}}}
  - {{name: c, stage: synth, params: {{text: c, size: 5000}}, inputs: {{source: b}}}}
"""


def _recipe(folder: Path, name: str = "chain", suffix: str = "", file: str = "chain.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file
    path.write_text(CHAIN.format(name=name, suffix=suffix))
    return path


def _all_fresh(proc) -> bool:
    return proc.returncode == 0 and re.search(r"\d+ nodes: (\d+) fresh, 0 stale", proc.stdout) is not None


def test_gc_after_a_set_override_and_a_noop_run_keeps_what_the_latest_run_uses(tmp_path, trtflow):
    recipe = _recipe(tmp_path)
    assert trtflow("run", str(recipe)).returncode == 0
    assert trtflow("run", str(recipe), "--set", "nodes.a.params.text=other").returncode == 0
    noop = trtflow("run", str(recipe))
    assert "Nothing to do" in noop.stdout, noop.stdout  # nothing rebuilt, and yet its refs are rewritten
    gc = trtflow("gc")
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert "removed 3 results" in gc.stdout, gc.stdout
    plan = trtflow("plan", str(recipe))
    assert _all_fresh(plan), plan.stdout


def test_gc_dry_run_lists_what_it_would_remove_and_why(tmp_path, trtflow):
    recipe = _recipe(tmp_path)
    trtflow("run", str(recipe))
    trtflow("run", str(recipe), "--set", "nodes.c.params.text=c2")
    dry = trtflow("gc", "--dry-run")
    assert dry.returncode == 0
    line = next(line for line in dry.stdout.splitlines() if line.lstrip().startswith("result"))
    assert "chain.yaml" in line and " c " in f" {line} " and "superseded:" in line and "now uses" in line, dry.stdout
    assert re.search(r"\d+(\.\d)? (B|MB|kB)", line) and "min" in line  # size and age
    assert "would remove 1 results" in dry.stdout
    assert len(list(Store(tmp_path / "store").iter_manifests())) == 4  # nothing removed


def test_two_recipe_files_with_one_name_keep_their_own_refs(tmp_path, trtflow):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    first = _recipe(tmp_path / "team_a", name="shared", suffix="-a")
    second = _recipe(tmp_path / "team_b", name="shared", suffix="-b")
    assert trtflow("run", str(first)).returncode == 0
    assert trtflow("run", str(second)).returncode == 0
    assert trtflow("gc").returncode == 0
    for recipe in (first, second):
        plan = trtflow("plan", str(recipe))
        assert _all_fresh(plan), plan.stdout
    status = trtflow("status", str(first), "--json")
    runs = json.loads(status.stdout)["runs"]
    assert runs and {r["recipe_id"] for r in runs} == {"team_a/chain.yaml"}
    store = Store(tmp_path / "store")
    assert store.refs.current("team_a/chain.yaml")["a"] != store.refs.current("team_b/chain.yaml")["a"]
    assert store.refs.current("team_a/chain.yaml")["b"] != store.refs.current("team_b/chain.yaml")["b"]


def test_gc_forgets_deleted_nodes_and_recipes_and_cleans_locks_and_old_logs(tmp_path, trtflow):
    keep = _recipe(tmp_path / "keep")
    gone = _recipe(tmp_path / "gone", suffix="-gone")
    trtflow("run", str(keep))
    trtflow("run", str(gone))
    keep.write_text(CHAIN.format(name="chain", suffix="").split("  - {name: c")[0])  # node c deleted
    trtflow("run", str(keep))
    gone.unlink()
    gc = trtflow("gc", "--dry-run", "--forget-missing-after", "0")
    assert "node c is no longer in" in gc.stdout and "no longer exists" in gc.stdout, gc.stdout
    assert trtflow("gc", "--forget-missing-after", "0").returncode == 0
    store = Store(tmp_path / "store")
    assert {r.recipe_id for r in store.refs.recipes()} == {str(keep)}
    assert not any((store.root / "locks").iterdir())
    assert len(list((store.root / "logs").iterdir())) <= 2  # the latest run of each recipe that remains
    assert _all_fresh(trtflow("plan", str(keep)))


def test_gc_keeps_the_results_of_a_recipe_file_that_is_briefly_missing(tmp_path, trtflow):
    """A branch switch or a rename in progress must not cost every result of a recipe: its refs are forgotten only
    after it has been missing for the grace period (7 days by default), counted from the first gc that saw it
    missing."""
    recipe = _recipe(tmp_path / "project")
    assert trtflow("run", str(recipe)).returncode == 0
    store = Store(tmp_path / "store")
    results = len(list(store.iter_manifests()))
    text = recipe.read_text()
    recipe.unlink()
    gc = trtflow("gc")
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert "removed 0 results" in gc.stdout, gc.stdout
    assert re.search(r"kept the results of 1 recipe file missing since .* \(forgotten after 7 days missing", gc.stdout)
    assert len(list(store.iter_manifests())) == results
    recipe.write_text(text)  # back (the branch switched back)
    assert _all_fresh(trtflow("plan", str(recipe)))

    recipe.unlink()
    assert "removed 0 results" in trtflow("gc").stdout
    (refs,) = list(store.refs.recipes())
    marker = refs.folder / ".missing"
    marker.write_text(json.dumps({"since": json.loads(marker.read_text())["since"] - 8 * 86400}))  # 8 days later
    later = trtflow("gc")
    assert f"removed {results} results" in later.stdout, later.stdout
    assert list(store.refs.recipes()) == []


def test_a_store_of_a_newer_format_is_refused_and_an_older_one_migrated(tmp_path, trtflow):
    recipe = _recipe(tmp_path)
    store = tmp_path / "store"
    store.mkdir()
    (store / "format.json").write_text('{"format": 99, "written_by": "9.9"}')
    for command in (["run", str(recipe)], ["plan", str(recipe)], ["gc"], ["verify"]):
        proc = trtflow(*command)
        assert proc.returncode == 4, (command, proc.stdout, proc.stderr)
        assert "has format 99" in proc.stderr and "upgrade trtflow" in proc.stderr

    # a first-release store: no format file, refs keyed by recipe name
    old = tmp_path / "old"
    assert trtflow("run", str(recipe), "--store", str(old)).returncode == 0
    (old / "format.json").unlink()
    legacy_key = Store(old).refs.current(str(recipe))["a"]  # outside a project: the recipe's absolute path
    import shutil

    shutil.rmtree(old / "refs")
    (old / "refs" / "chain").mkdir(parents=True)
    (old / "refs" / "chain" / "a").write_text(legacy_key + "\n")
    assert trtflow("gc", "--store", str(old)).returncode == 0  # migrates; keeps the legacy ref as a root
    assert Store(old).read_manifest(legacy_key) is not None
    assert json.loads((old / "format.json").read_text())["format"] == 2
    proc = trtflow("run", str(recipe), "--store", str(old))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (old / "refs" / "legacy-chain").exists()  # a run of that recipe name took over


def test_editing_a_materialised_output_cannot_change_the_store(tmp_path, trtflow):
    recipe = _recipe(tmp_path)
    trtflow("run", str(recipe))
    output = tmp_path / "build" / "chain" / "a" / "data.bin"
    original = output.read_bytes()
    output.write_bytes(b"edited by hand")
    verify = trtflow("verify")
    assert verify.returncode == 0 and "clean" in verify.stdout
    again = trtflow("run", str(recipe))
    assert "Nothing to do" in again.stdout
    assert output.read_bytes() == original  # the copy under build/ is restored from the store


def test_a_skipped_node_does_not_keep_a_recipe_from_reaching_nothing_to_do(tmp_path, trtflow):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    recipe = tmp_path / "gpu.yaml"
    recipe.write_text("name: gpu\nnodes:\n  - {name: a, stage: export, params: {model: m.onnx}}\n"
                      "  - {name: engine, stage: build, params: {backend: tensorrt}, inputs: {model: a}}\n")
    plan = trtflow("plan", str(recipe))
    assert re.search(r"engine\s+build\s+skipped\s+.*not run here", plan.stdout), plan.stdout
    first = trtflow("run", str(recipe))
    assert first.returncode == 0, first.stdout + first.stderr
    second = trtflow("run", str(recipe))
    assert "Nothing to do: 1 nodes are up to date and 1 cannot run here" in second.stdout, second.stdout
    assert "engine" in second.stdout and "needs" in second.stdout
    strict = trtflow("run", str(recipe), "--require-gpu")
    assert strict.returncode == 3, strict.stdout


def test_help_shows_no_markup_escapes_and_one_default_per_option(tmp_path, trtflow):
    proc = trtflow("run", "--help")
    assert "\\[" not in proc.stdout and "required" in proc.stdout
    jobs = [line for line in proc.stdout.splitlines() if "--jobs" in line or "CPUs" in line]
    assert sum(line.count("default") for line in jobs) <= 1, jobs


def test_show_accepts_a_matrix_node_name_and_an_unknown_node_is_a_usage_error(tmp_path, trtflow):
    recipe = tmp_path / "m.yaml"
    recipe.write_text("name: m\nnodes:\n  - {name: a, stage: synth, matrix: {text: [x, y]}}\n")
    trtflow("run", str(recipe))
    shown = trtflow("show", str(recipe), "a", "--json")
    assert shown.returncode == 0, shown.stderr
    assert [n["node"] for n in json.loads(shown.stdout)] == ["a-x", "a-y"]
    assert trtflow("show", str(recipe), "b").returncode == 2


def test_status_names_the_run_that_built_each_up_to_date_node(tmp_path, trtflow):
    recipe = _recipe(tmp_path)
    trtflow("run", str(recipe))
    trtflow("run", str(recipe), "--set", "nodes.c.params.text=c2")
    trtflow("run", str(recipe))  # c goes back to the first run's result: "built in" must name that run
    nodes = {n["node"]: n for n in json.loads(trtflow("status", "--json").stdout)["nodes"]}
    runs = json.loads(trtflow("status", "--json", "--runs", "5").stdout)["runs"]
    first_run = runs[-1]["id"]
    assert nodes["c"]["status"] == "fresh" and nodes["c"]["built_in_run"] == first_run
