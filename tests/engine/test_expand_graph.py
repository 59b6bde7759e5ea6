"""Matrix expansion, profile resolution, input references and graph checks, on toy stages."""

from __future__ import annotations

import textwrap

import pytest

from tests.engine.toystages import get_stage
from trtflow.errors import RecipeError
from trtflow.graph import build_graph
from trtflow.recipe.expand import expand
from trtflow.recipe.load import load_recipe


def graph_of(tmp_path, text: str):
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(text))
    loaded = load_recipe(path)
    return build_graph(expand(loaded, get_stage), get_stage, loaded.recipe.name)


def test_matrix_fans_out_and_matches_variants(tmp_path):
    graph = graph_of(tmp_path, """\
        name: m
        profiles:
          bs1: {input: {min: [1, 3], opt: [1, 3], max: [1, 3]}}
          bs8: {input: {min: [1, 3], opt: [8, 3], max: [8, 3]}}
        nodes:
          - name: src
            stage: source
            matrix: {precision: [fp16, int8], profile: [bs1, bs8]}
            params: {value: "v-${{ matrix.precision }}"}
          - name: use
            stage: consume
            matrix: {precision: [fp16, int8], profile: [bs1, bs8]}
        """)
    assert list(graph.nodes) == ["src-fp16-bs1", "src-fp16-bs8", "src-int8-bs1", "src-int8-bs8",
                                 "use-fp16-bs1", "use-fp16-bs8", "use-int8-bs1", "use-int8-bs8"]
    src = graph.nodes["src-int8-bs8"]
    assert src.params["value"] == "v-int8" and src.params["precision"] == "int8"
    assert src.params["profile"] == {"name": "bs8", "shapes": {"input": {"min": [1, 3], "opt": [8, 3],
                                                                          "max": [8, 3]}}}
    assert graph.nodes["use-int8-bs8"].upstream == {"model": [("src-int8-bs8", "out")]}


def test_ambiguous_default_input_is_an_error(tmp_path):
    with pytest.raises(RecipeError, match="ambiguous") as err:
        graph_of(tmp_path, """\
            name: m
            nodes:
              - {name: src, stage: source, matrix: {precision: [fp16, int8]}}
              - {name: use, stage: consume}
            """)
    assert "r.yaml:4:" in str(err.value)


def test_unknown_reference_suggests_a_name(tmp_path):
    with pytest.raises(RecipeError) as err:
        graph_of(tmp_path, """\
            name: m
            nodes:
              - {name: export, stage: source}
              - {name: use, stage: consume, inputs: {model: exprot}}
            """)
    assert "unknown node 'exprot'" in str(err.value) and "did you mean 'export'" in (err.value.hint or "")


def test_cycle_is_reported_with_its_path(tmp_path):
    with pytest.raises(RecipeError, match=r"cycle: a -> b -> a|cycle: b -> a -> b"):
        graph_of(tmp_path, """\
            name: m
            nodes:
              - {name: a, stage: consume, inputs: {model: b}}
              - {name: b, stage: consume, inputs: {model: a}}
            """)


def test_duplicate_names_and_unknown_stage(tmp_path):
    with pytest.raises(RecipeError, match="duplicate node name 'a'"):
        graph_of(tmp_path, """\
            name: m
            nodes:
              - {name: a, stage: source}
              - {name: a, stage: source}
            """)
    with pytest.raises(RecipeError) as err:
        graph_of(tmp_path, "name: m\nnodes:\n  - {name: a, stage: sourse}\n")
    assert "r.yaml:3:" in str(err.value) and "did you mean 'source'" in (err.value.hint or "")


def test_kind_mismatch_and_missing_output(tmp_path):
    with pytest.raises(RecipeError, match="takes onnx but 'r' .* produces none"):
        graph_of(tmp_path, """\
            name: m
            nodes:
              - {name: s, stage: source}
              - {name: r, stage: reporter}
              - {name: c, stage: consume, inputs: {model: r}}
            """)
    with pytest.raises(RecipeError, match="has no output 'outt'"):
        graph_of(tmp_path, """\
            name: m
            nodes:
              - {name: s, stage: source}
              - {name: c, stage: consume, inputs: {model: s.outt}}
            """)


def test_bad_params_are_located_with_suggestion(tmp_path):
    with pytest.raises(RecipeError) as err:
        graph_of(tmp_path, """\
            name: m
            nodes:
              - name: s
                stage: source
                params:
                  valeu: 3
            """)
    text = str(err.value)
    assert "r.yaml:6:7" in text and "unknown key 'valeu'" in text and "did you mean 'value'" in text


def test_unknown_profile_and_matrix_placeholder(tmp_path):
    with pytest.raises(RecipeError, match="unknown profile 'bs2'"):
        graph_of(tmp_path, """\
            name: m
            profiles: {bs1: {input: {min: [1], opt: [1], max: [1]}}}
            nodes:
              - {name: s, stage: source, params: {profile: bs2}}
            """)
    with pytest.raises(RecipeError, match=r"matrix\.precison"):
        graph_of(tmp_path, """\
            name: m
            nodes:
              - {name: s, stage: source, matrix: {precision: [a]}, params: {value: "${{ matrix.precison }}"}}
            """)


def test_select_keeps_upstream_only(tmp_path):
    graph = graph_of(tmp_path, """\
        name: m
        nodes:
          - {name: a, stage: source}
          - {name: b, stage: consume}
          - {name: c, stage: consume, inputs: {model: a}}
        """)
    assert list(graph.select(["b"]).nodes) == ["a", "b"]
    with pytest.raises(RecipeError, match="no node named 'x'"):
        graph.select(["x"])


def test_a_list_of_references_offers_alternatives_matched_by_matrix(tmp_path):
    graph = graph_of(tmp_path, """\
        name: m
        nodes:
          - {name: base, stage: source}
          - {name: half, stage: consume, matrix: {dtype: [fp16]}, inputs: {model: base}}
          - {name: quant, stage: consume, matrix: {dtype: [int8, fp8]}, inputs: {model: base}}
          - name: use
            stage: consume
            matrix: {dtype: [fp16, int8, fp8]}
            inputs: {model: [half, quant]}
        """)
    assert graph.nodes["use-fp16"].upstream == {"model": [("half-fp16", "out")]}
    assert graph.nodes["use-fp8"].upstream == {"model": [("quant-fp8", "out")]}
    with pytest.raises(RecipeError, match="none of half, quant has a variant"):
        graph_of(tmp_path, """\
            name: m
            nodes:
              - {name: base, stage: source}
              - {name: half, stage: consume, matrix: {dtype: [fp16]}, inputs: {model: base}}
              - {name: quant, stage: consume, matrix: {dtype: [int8]}, inputs: {model: base}}
              - {name: use, stage: consume, matrix: {dtype: [bf16]}, inputs: {model: [half, quant]}}
            """)


def test_order_is_by_dependency_then_recipe_order_and_cycles_are_named_from_the_first_node(tmp_path):
    graph = graph_of(tmp_path, """\
        name: m
        nodes:
          - {name: late, stage: consume, inputs: {model: b}}
          - {name: a, stage: source}
          - {name: b, stage: consume, inputs: {model: a}}
          - {name: c, stage: source}
        """)
    assert list(graph.nodes) == ["a", "c", "b", "late"]
    assert graph.downstream("a") == ["b"] and graph.downstream("b") == ["late"] and graph.downstream("late") == []
    assert graph.upstream("late") == ["b"]
    with pytest.raises(RecipeError) as err:
        graph_of(tmp_path, """\
            name: m
            nodes:
              - {name: z, stage: source}
              - {name: y, stage: consume, inputs: {model: w}}
              - {name: x, stage: consume, inputs: {model: y}}
              - {name: w, stage: consume, inputs: {model: x}}
            """)
    assert "r.yaml:4:" in str(err.value) and "the nodes form a cycle: y -> w -> x -> y" in str(err.value)


def test_a_matrix_node_name_stands_for_all_its_variants(tmp_path):
    graph = graph_of(tmp_path, """\
        name: m
        nodes:
          - {name: s, stage: source, matrix: {precision: [fp16, int8]}}
          - {name: u, stage: consume, matrix: {precision: [fp16, int8]}}
        """)
    assert graph.resolve_targets(["u", "s-int8", "u-fp16"]) == ["u-fp16", "u-int8", "s-int8"]
    assert sorted(graph.select(["u-int8"]).nodes) == ["s-int8", "u-int8"]
    with pytest.raises(RecipeError, match="no node named 'uu'") as err:
        graph.resolve_targets(["uu"])
    assert err.value.exit_code == 2 and "did you mean" in (err.value.hint or "")


def test_default_inputs_come_from_the_last_earlier_producer(tmp_path):
    graph = graph_of(tmp_path, """\
        name: m
        nodes:
          - {name: a, stage: source}
          - {name: r, stage: reporter}
          - {name: b, stage: consume}
          - {name: c, stage: consume, enabled: false}
          - {name: d, stage: consume}
        """)
    assert graph.nodes["r"].upstream == {"model": [("a", "out")]}  # r's output is metrics: not a model
    assert graph.nodes["b"].upstream == {"model": [("a", "out")]}
    assert graph.nodes["d"].upstream == {"model": [("b", "out")]}  # c is disabled


def test_a_matrix_that_fans_out_to_too_many_nodes_is_refused_before_expansion(tmp_path):
    values = ", ".join(str(i) for i in range(300))
    with pytest.raises(RecipeError, match=r"r.yaml:5:13: nodes\[1\].matrix: the recipe expands to more than 50000"):
        graph_of(tmp_path, f"""\
            name: m
            nodes:
              - {{name: s, stage: source}}
              - name: u
                matrix: {{precision: [{values}], suffix: [{values}]}}
                stage: consume
            """)


@pytest.mark.slow
def test_a_generated_20000_node_recipe_is_accepted(tmp_path):
    nodes = "".join(f"  - {{name: n{i}, stage: {'consume' if i else 'source'}, params: {{precision: p{i}}}"
                    + (f", inputs: {{model: n{(i - 1) // 2}}}}}\n" if i else "}\n") for i in range(20_000))
    graph = graph_of(tmp_path, "name: big\nnodes:\n" + nodes)
    assert len(graph.nodes) == 20_000 and graph.nodes["n19999"].upstream == {"model": [("n9999", "out")]}


def test_every_misspelt_key_of_every_stage_gets_a_suggestion_wherever_it_is_nested():
    """The docs promise a "did you mean" for an unknown parameter: at the top of a stage's parameters and
    inside every nested model (a data source, an input spec, a profile), through dicts, lists and unions."""
    from pydantic import BaseModel, ValidationError

    from trtflow.recipe.load import Marks, _models_at, validation_error
    from trtflow.registry import get_stage, stage_names

    def nested(annotation, loc, seen):
        """(loc, model) for every model reachable from ``annotation`` (a dict key 'k', a list index 0)."""
        from typing import get_args, get_origin

        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation in seen:
                return
            seen = seen | {annotation}
            yield loc, annotation
            for name, info in annotation.model_fields.items():
                yield from nested(info.annotation, (*loc, name), seen)
            return
        origin, args = get_origin(annotation), get_args(annotation)
        if origin is dict and len(args) == 2:
            yield from nested(args[1], (*loc, "k"), seen)
        elif origin in (list, tuple, set, frozenset) and args:
            yield from nested(args[0], (*loc, 0), seen)
        else:
            for arg in args:
                yield from nested(arg, loc, seen)

    def payload(loc, leaf):
        for part in reversed(loc):
            leaf = [leaf] if isinstance(part, int) else {part: leaf}
        return leaf

    checked = 0
    for name in stage_names(builtin_only=True):  # other registered stages depend on what this machine installed
        params = get_stage(name).params
        for loc, model in nested(params, (), frozenset()):
            if model.model_config.get("extra") != "forbid" or not model.model_fields:
                continue
            field = max(model.model_fields, key=len)
            assert model in _models_at(params, loc)
            try:
                params.model_validate(payload(loc, {field + "x": 1}))
            except ValidationError as exc:
                text = validation_error(exc, Marks(), ("params",), params).message
            else:
                raise AssertionError(f"{name}: {loc} accepted an unknown key")
            assert f"unknown key '{field}x'; did you mean '{field}'?" in text, f"{name} at {loc}:\n{text}"
            checked += 1
    assert checked >= 20


def test_long_matrix_values_give_short_distinct_variant_names(tmp_path):
    long_a, long_b = "x" * 60 + "a", "x" * 60 + "b"
    graph = graph_of(tmp_path, f"""\
        name: m
        nodes:
          - {{name: s, stage: source, matrix: {{value: [{long_a}, {long_b}, short]}}}}
        """)
    names = list(graph.nodes)
    assert len(set(names)) == 3 and names[2] == "s-short"
    assert all(len(n) == len("s-") + 40 and n.startswith("s-" + "x" * 31 + "_") for n in names[:2])
