"""Recipe loading: line marks, interpolation, extends, overrides, safe YAML."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from trtflow.errors import RecipeError
from trtflow.recipe.load import load_recipe, parse_yaml


def write(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_marks_point_at_line_and_column():
    data, marks = parse_yaml("a: 1\nb:\n  - x: 2\n    y: [1, 2]\n", "f.yaml")
    assert data == {"a": 1, "b": [{"x": 2, "y": [1, 2]}]}
    loc = marks.find(("b", 0, "y", 1))
    assert (loc.file, loc.line, loc.column) == ("f.yaml", 4, 12)
    assert str(marks.find(("b", 0, "x"))) == "f.yaml:3:8"
    assert str(marks.find_key(("b", 0, "x"))) == "f.yaml:3:5"


def test_unknown_top_level_key_suggests_fix(tmp_path):
    path = write(tmp_path, """\
        name: demo
        nodse: []
        """)
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    text = str(err.value)
    assert "r.yaml:2:1" in text and "unknown key 'nodse'" in text and "did you mean 'nodes'" in text


def test_wrong_type_names_field_and_line(tmp_path):
    path = write(tmp_path, """\
        name: demo
        nodes:
          - name: a
            stage: source
            timeout: soon
        """)
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert "r.yaml:5:" in str(err.value) and "nodes.0.timeout" in str(err.value)
    assert err.value.exit_code == 2


def test_yaml_syntax_error_has_location(tmp_path):
    path = write(tmp_path, "name: demo\nnodes: [\n  {name: a\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert "YAML syntax error" in str(err.value) and "r.yaml:" in str(err.value)


def test_duplicate_key_is_an_error(tmp_path):
    path = write(tmp_path, "name: a\nname: b\nnodes: [{name: x, stage: s}]\n")
    with pytest.raises(RecipeError, match=r"r.yaml:2:1: duplicate key 'name'"):
        load_recipe(path)


def test_object_constructing_tags_are_refused(tmp_path):
    path = write(tmp_path, "name: !!python/object/apply:os.system ['echo pwned']\nnodes: []\n")
    with pytest.raises(RecipeError, match="tag .* is not allowed"):
        load_recipe(path)


def test_environment_interpolation(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTFLOW_TEST_VALUE", "hello")
    monkeypatch.delenv("TRTFLOW_TEST_UNSET", raising=False)
    path = write(tmp_path, """\
        name: demo
        nodes:
          - name: a
            stage: source
            params: {value: "${TRTFLOW_TEST_VALUE}-${TRTFLOW_TEST_UNSET:-dflt}-$${LITERAL}"}
        """)
    recipe = load_recipe(path).recipe
    assert recipe.nodes[0].params["value"] == "hello-dflt-${LITERAL}"


def test_unset_environment_variable_is_located(tmp_path, monkeypatch):
    monkeypatch.delenv("TRTFLOW_TEST_UNSET", raising=False)
    path = write(tmp_path, "name: demo\nnodes:\n  - name: a\n    stage: ${TRTFLOW_TEST_UNSET}\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert "r.yaml:4:12" in str(err.value) and "TRTFLOW_TEST_UNSET" in str(err.value)
    assert "export TRTFLOW_TEST_UNSET" in (err.value.hint or "")


def test_extends_merges_nodes_by_name(tmp_path):
    write(tmp_path, """\
        name: base
        defaults: {source: {value: base}}
        nodes:
          - {name: a, stage: source, params: {value: one, precision: fp16}}
          - {name: b, stage: consume}
        """, "base.yaml")
    child = write(tmp_path, """\
        extends: base.yaml
        name: child
        nodes:
          - {name: a, params: {value: two}}
          - {name: c, stage: consume, inputs: {model: a}}
        """)
    loaded = load_recipe(child)
    recipe = loaded.recipe
    assert recipe.name == "child"
    assert [n.name for n in recipe.nodes] == ["a", "b", "c"]
    assert recipe.nodes[0].params == {"value": "two", "precision": "fp16"}
    assert recipe.defaults == {"source": {"value": "base"}}
    assert loaded.location("nodes", 0, "params", "value").file.endswith("r.yaml")
    assert loaded.location("nodes", 1).file.endswith("base.yaml")


def test_extends_cycle_is_reported(tmp_path):
    write(tmp_path, "extends: b.yaml\nname: a\nnodes: [{name: x, stage: s}]\n", "a.yaml")
    write(tmp_path, "extends: a.yaml\nname: b\nnodes: [{name: x, stage: s}]\n", "b.yaml")
    with pytest.raises(RecipeError, match="cycle"):
        load_recipe(tmp_path / "a.yaml")


def test_set_overrides_address_nodes_by_name(tmp_path):
    path = write(tmp_path, "name: demo\nnodes:\n  - {name: a, stage: source, params: {value: one}}\n")
    recipe = load_recipe(path, ["nodes.a.params.value=two", "nodes.a.timeout=5", "description=x y"]).recipe
    assert recipe.nodes[0].params["value"] == "two"
    assert recipe.nodes[0].timeout == 5
    assert recipe.description == "x y"
    with pytest.raises(RecipeError, match="no node named 'b'"):
        load_recipe(path, ["nodes.b.params.value=1"])
    with pytest.raises(RecipeError, match="--set nodes.a.timeout=-1"):
        load_recipe(path, ["nodes.a.timeout=-1"])


def test_missing_file_and_empty_file(tmp_path):
    with pytest.raises(RecipeError, match="not found"):
        load_recipe(tmp_path / "nope.yaml")
    with pytest.raises(RecipeError, match="empty"):
        load_recipe(write(tmp_path, ""))
