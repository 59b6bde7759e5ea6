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
