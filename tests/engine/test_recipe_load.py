"""Recipe loading: line marks, interpolation, extends, overrides, safe YAML."""

from __future__ import annotations

import re
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


# ------------------------------------------------------------------------------------- anchors, aliases, merges
def test_aliases_copy_values_and_point_at_the_use_and_the_anchor():
    data, marks = parse_yaml("base: &b {x: 1, y: [2, 3]}\nuse: *b\n", "f.yaml")
    assert data == {"base": {"x": 1, "y": [2, 3]}, "use": {"x": 1, "y": [2, 3]}}
    assert data["use"] is not data["base"] and data["use"]["y"] is not data["base"]["y"]
    assert str(marks.find(("use",))) == "f.yaml:2:6"  # the alias itself
    assert str(marks.find(("use", "y", 1))) == "f.yaml:1:24"  # inside: where the anchored value is written


def test_merge_keys_follow_yaml_rules_own_keys_win_then_earlier_sources():
    text = "a: &a {x: 1, y: 1}\nb: &b {y: 2, z: 2}\nc: {<<: [*a, *b], x: 3}\nd:\n  w: 0\n  <<: *b\n"
    data, marks = parse_yaml(text, "f.yaml")
    assert data["c"] == {"y": 1, "z": 2, "x": 3}
    assert data["d"] == {"y": 2, "z": 2, "w": 0}
    assert str(marks.find(("c", "x"))) == "f.yaml:3:22"  # own key
    assert str(marks.find(("c", "y"))) == "f.yaml:1:17"  # from the first source
    assert str(marks.find(("c", "z"))) == "f.yaml:2:17"  # from the second
    assert str(marks.find_key(("d", "z"))) == "f.yaml:2:14"
    assert not any("<<" in repr(p) for p in marks.by_path)


def test_nested_merges_and_anchored_merge_values():
    text = "a: &a {x: 1}\nb: &b {<<: *a, y: 2}\nc: {<<: &m {<<: *b, z: 3}}\nd: *m\n"
    data, _ = parse_yaml(text, "f.yaml")
    assert data["b"] == {"x": 1, "y": 2}
    assert data["c"] == data["d"] == {"x": 1, "y": 2, "z": 3}


@pytest.mark.parametrize(("text", "message"), [
    ("a: {<<: {x: 1}, <<: {y: 2}}\n", r"f.yaml:1:17: duplicate key '<<'"),
    ("a: &a [1]\nb: {<<: *a}\n", r"f.yaml:2:9: a merge key '<<' takes a mapping"),
    ("a: &a x\nb: &a y\n", r"f.yaml:2:4: anchor &a is defined twice"),
    ("a: &a {b: *a}\n", r"f.yaml:1:11: alias \*a is used inside the node it names"),
    ("? [a]\n: 1\n", r"f.yaml:1:3: a mapping key must be a plain value"),
    ("a: &a [1]\n*a : 2\n", r"f.yaml:2:1: a mapping key must be a plain value"),
])
def test_bad_anchor_alias_and_merge_use_is_located(text, message):
    with pytest.raises(RecipeError, match=message):
        parse_yaml(text, "f.yaml")


def test_plain_words_yaml_1_1_would_turn_into_dates_stay_text():
    data, _ = parse_yaml("a: 2024-01-31\nb: =\nc: <<\nd: !!str 12\ne: 0x1F\nf: 1_000\n", "f.yaml")
    assert data == {"a": "2024-01-31", "b": "=", "c": "<<", "d": "12", "e": 31, "f": 1000}


# ------------------------------------------------------------------------------------- limits, counted before expansion
def test_limits_are_shared_by_a_recipe_its_bases_and_its_set_values():
    from trtflow.recipe.yaml_data import Budget, Limits

    budget = Budget(Limits(max_values=10))
    parse_yaml("[1, 2, 3, 4]", "a.yaml", budget)
    with pytest.raises(RecipeError, match=r"b.yaml:1:14: the recipe holds more than 10 values"):
        parse_yaml("[1, 2, 3, 4, 5, 6]", "b.yaml", budget)


def test_a_big_recipe_without_aliases_is_accepted_whatever_its_number_of_values():
    nodes = "".join(f"  - {{name: n{i}, stage: source, params: {{value: v{i}, precision: fp16}}}}\n"
                    for i in range(20_000))
    data, _ = parse_yaml("name: big\nnodes:\n" + nodes, "big.yaml")
    assert len(data["nodes"]) == 20_000 and data["nodes"][-1]["params"]["value"] == "v19999"


def test_a_recipe_file_that_is_not_regular_or_too_big_is_refused_before_reading(tmp_path, monkeypatch):
    import os

    from trtflow.recipe import load

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # reading it would block forever
    with pytest.raises(RecipeError, match="cannot read recipe .*fifo.yaml: not a regular file"):
        load_recipe(fifo)
    monkeypatch.setattr(load, "MAX_RECIPE_BYTES", 100)
    path = write(tmp_path, "name: demo\ndescription: " + "x" * 100 + "\nnodes: [{name: a, stage: source}]\n")
    with pytest.raises(RecipeError, match=r"^recipe \S*r.yaml is 1\d\d bytes, more than the 100 a recipe may have\n"):
        load_recipe(path)


def test_set_values_go_through_the_same_parser_and_limits(tmp_path):
    path = write(tmp_path, "name: demo\nnodes:\n  - {name: a, stage: source, params: {value: one}}\n")
    loaded = load_recipe(path, ["nodes.a.params.profile={shapes: {x: [1, 2]}}", "description=a: [b"])
    assert loaded.recipe.nodes[0].params["profile"] == {"shapes": {"x": [1, 2]}}
    assert loaded.recipe.description == "a: [b"  # not YAML: taken as text
    assert str(loaded.location("nodes", 0, "params", "profile", "shapes", "x", 1)).startswith(
        "--set nodes.a.params.profile=")
    with pytest.raises(RecipeError, match=r"--set nodes.a.params.value=\[\[.*nested more than 64 levels"):
        load_recipe(path, ["nodes.a.params.value=" + "[" * 70 + "]" * 70])
    with pytest.raises(RecipeError, match=r"a key path of 65 parts"):
        load_recipe(path, ["x." * 64 + "y=1"])


# ------------------------------------------------------------------------------------- limits the parser enforces
PARSERS = ["libyaml", "python"]


@pytest.fixture(params=PARSERS)
def parser(request, monkeypatch):
    """Each test runs with libyaml (PyYAML's CSafeLoader) and with PyYAML's pure-Python parser."""
    import yaml

    from trtflow.recipe import yaml_data

    if request.param == "libyaml" and not hasattr(yaml, "CSafeLoader"):
        pytest.skip("PyYAML was built without libyaml here")
    monkeypatch.setattr(yaml_data, "_LOADER", yaml.CSafeLoader if request.param == "libyaml" else yaml.SafeLoader)
    return request.param


@pytest.mark.parametrize(("line", "column"), [
    ("{k}: 1", 1),
    ("  - {k}: 1", 5),
    ("a: {{x: 1, {k}: 2}}", 11),
    ("a: [{k}: 2]", 5),
    ("'{k}': 1", 1),
    ('a: {{"{k}": 2}}', 5),
])
def test_a_key_over_1024_characters_is_refused_at_its_start_by_every_parser(parser, line, column):
    """YAML allows 1024 characters for a key written without '?': a key of 1024 is read, one more is refused with
    our message wherever it is written (the parsers report a syntax error at the ':', each in its words)."""
    quotes = 2 if "'{k}'" in line or '"{k}"' in line else 0
    data, _ = parse_yaml(line.format(k="k" * (1024 - quotes)), "f.yaml")
    assert "k" * (1024 - quotes) in str(data)
    with pytest.raises(RecipeError) as info:
        parse_yaml(line.format(k="k" * (1025 - quotes)), "f.yaml")
    assert info.value.message == f"f.yaml:1:{column}: a mapping key of 1025 characters (at most 1024)"
    with pytest.raises(RecipeError, match=r"^f.yaml:1:3: a mapping key of 1025 characters"):
        parse_yaml("? " + "k" * 1025 + "\n: 1\n", "f.yaml")  # explicit: the parser allows it, we do not


def test_a_line_longer_than_a_key_may_be_is_not_a_long_key(parser):
    data, _ = parse_yaml("a: " + "v" * 3000 + "\nb: [" + ", ".join(["x"] * 1000) + "]\n", "f.yaml")
    assert len(data["a"]) == 3000 and len(data["b"]) == 1000
    with pytest.raises(RecipeError, match=r"^f.yaml:3:1: YAML syntax error: "):
        parse_yaml("a: 1\nb\nc: 2\n", "f.yaml")  # a key without its ':' is a syntax error, not a long key


@pytest.mark.parametrize("text", ["[" * 5000, "[" * 5000 + "]" * 5000, "- " * 3000 + "x", '{"a": ' * 3000 + "1",
                                  "[\n" * 100])
def test_nesting_is_refused_with_our_message_and_line_whichever_parser_notices(parser, text):
    """libyaml (0.2.6+) refuses the 1001st level of a line before the composer sees the 65th: same message, same
    line (the parser reads ahead within a line only), the column where it noticed."""
    with pytest.raises(RecipeError) as info:
        parse_yaml("name: x\nnodes:\n  " + text + "\n", "f.yaml")
    line = 3 if "\n" not in text else 3 + 63  # the top mapping is the first level
    assert re.fullmatch(rf"f.yaml:{line}:\d+: values nested more than 64 levels deep", info.value.message)


class _Reworded:
    """A parser with its own nesting limit and its own words for it, as a later libyaml may have."""

    def __init__(self, limit: int) -> None:
        import yaml

        class Loader(yaml.SafeLoader):
            depth = 0

            def get_event(self):
                event = super().get_event()
                if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                    self.depth += 1
                    if self.depth > limit:
                        raise yaml.parser.ParserError("while nesting", event.start_mark, "too many levels for me",
                                                      event.start_mark)
                elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                    self.depth -= 1
                return event

        self.loader = Loader


def test_a_parser_limit_in_other_words_and_below_ours_is_still_our_error(monkeypatch):
    """The parser's wording is learned from the parser (provoked once), never written here; a limit below ours
    is reported as the parser's number, so the message stays true."""
    from trtflow.recipe import yaml_data

    monkeypatch.setattr(yaml_data, "_LOADER", _Reworded(40).loader)
    assert parse_yaml("a: " + "[" * 39 + "]" * 39, "f.yaml")[0]["a"]  # 40 levels with the top mapping
    with pytest.raises(RecipeError, match=r"^f.yaml:2:43: values nested more than 40 levels deep"):
        parse_yaml("a: 1\nb: " + "[" * 41 + "]" * 41, "f.yaml")
    with pytest.raises(RecipeError, match=r"^f.yaml:1:4: YAML syntax error: did not find|^f.yaml:2:1: YAML syntax"):
        parse_yaml("a: [1, 2\n", "f.yaml")  # its other errors stay syntax errors


def test_a_control_character_is_located_by_characters_whichever_parser(parser):
    with pytest.raises(RecipeError, match=r"^f.yaml:2:8: YAML error: character #x0007 is not allowed in YAML text "
                                          r"\(a control character\)$"):
        parse_yaml("a: café\nb: été \x07\n", "f.yaml")


# ------------------------------------------------------------------------------------- project root and paths
def test_project_root_is_the_nearest_folder_with_git_or_pyproject_else_the_recipe_folder(tmp_path):
    from trtflow.fsutil import project_root_of, recipe_id

    (tmp_path / "repo" / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "repo" / ".git").write_text("gitdir: elsewhere\n")  # a worktree's .git is a file
    recipe = tmp_path / "repo" / "sub" / "deeper" / "r.yaml"
    recipe.write_text("")
    assert project_root_of(recipe) == tmp_path / "repo"
    assert recipe_id(recipe) == "sub/deeper/r.yaml"
    (tmp_path / "repo" / "sub" / "pyproject.toml").write_text("")
    assert project_root_of(recipe) == tmp_path / "repo" / "sub"
    assert recipe_id(recipe) == "deeper/r.yaml"
    loose = tmp_path / "loose" / "r.yaml"
    loose.parent.mkdir()
    loose.write_text("")
    if not any((p / m).exists() for p in loose.parents for m in (".git", "pyproject.toml")):
        assert project_root_of(loose) == loose.parent
        assert recipe_id(loose) == loose.as_posix()  # outside any project: two loose r.yaml never share an id
    link = tmp_path / "link.yaml"
    link.symlink_to(recipe)
    assert recipe_id(link) == "deeper/r.yaml"  # the file's identity, however it is reached


def test_extends_obeys_the_project_rule_and_the_escape_hatch(tmp_path, monkeypatch):
    project, shared = tmp_path / "project", tmp_path / "shared"
    project.mkdir()
    shared.mkdir()
    (project / "pyproject.toml").write_text("")
    write(shared, "name: base\nnodes: [{name: a, stage: source}]\n", "base.yaml")
    child = write(project, "extends: ../shared/base.yaml\nname: child\n")
    monkeypatch.delenv("TRTFLOW_ALLOWED_PATHS", raising=False)
    for cwd in (project, tmp_path, Path("/")):  # the working directory never widens what a recipe may read
        monkeypatch.chdir(cwd)
        with pytest.raises(RecipeError, match=r"r.yaml:1:10: extends: path '../shared/base.yaml' resolves to"):
            load_recipe(child)
    monkeypatch.setenv("TRTFLOW_ALLOWED_PATHS", str(shared))
    assert [n.name for n in load_recipe(child).recipe.nodes] == ["a"]


def test_a_folder_a_recipe_points_at_must_hold_only_regular_files_of_the_project(tmp_path):
    import os

    from trtflow.errors import TrtflowError
    from trtflow.fsutil import check_folder

    project = tmp_path / "project"
    (project / "data" / "sub").mkdir(parents=True)
    (project / "data" / "a.npz").write_text("a")
    (project / "data" / "sub" / "b.npz").write_text("b")
    (project / "data" / "inside").symlink_to(project / "data" / "a.npz")
    (tmp_path / "secret").write_text("s")
    check_folder(project / "data", [project])
    os.mkfifo(project / "data" / "sub" / "pipe")  # hashing the folder would block on it
    with pytest.raises(TrtflowError, match=r"data/sub/pipe in folder .* is not a regular file"):
        check_folder(project / "data", [project])
    (project / "data" / "sub" / "pipe").unlink()
    (project / "data" / "leak").symlink_to(tmp_path / "secret")
    with pytest.raises(TrtflowError, match=r"data/leak in folder .* links to .*/secret, outside the allowed"):
        check_folder(project / "data", [project])
    check_folder(project / "data", [project, tmp_path])
