"""`trtflow init` on a causal LM folder: a generation recipe (export with a KV cache, prefill/decode profiles,
candidates validated by greedy generation, TTFT/TPOT benchmarks, select, build, triton) that runs unedited."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import short_benchmarks, trtflow_in_process
from tests.conftest import trtflow_cli as trtflow
from tests.stages.test_generation import save_family
from trtflow.errors import TrtflowError
from trtflow_stages.cli.init import TASK_NAMES
from trtflow_stages.formats.hf_tasks import TASKS

#: one worker (CI: `--dist loadgroup`): the module-scoped project made once per run, not once per worker
pytestmark = pytest.mark.xdist_group("init_generation")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("project")
    (folder / "pyproject.toml").write_text("")
    save_family(folder, "llama")
    return folder


@pytest.fixture(scope="module")
def generation_init(project):
    """`trtflow init llama` once for this module: its message and recipe are checked by one test and run,
    unedited, by another."""
    return trtflow_in_process("init", "llama", "-o", "recipe.yaml", "--force", cwd=project)


def test_the_task_list_is_the_exporters():
    assert tuple(TASKS) == TASK_NAMES  # init's help lists what export takes, without importing it


@pytest.mark.slow  # two `trtflow init` (the first shared with the run below)
def test_a_causal_lm_gets_a_generation_recipe(project, generation_init):
    proc = generation_init
    assert "generation with a KV cache (2 layers, 2 key/value heads of 8); context 64" in proc.stderr
    assert "profile 'decode': one token after a past of 1..63 (opt 32), batch 1..4" in proc.stderr
    recipe = yaml.safe_load((project / "recipe.yaml").read_text())
    nodes = {node["name"]: node for node in recipe["nodes"]}
    assert list(nodes) == ["export", "simplify", "convert", "quantize", "validate", "benchmark", "select", "build",
                           "triton"]
    assert nodes["export"]["params"]["task"] == "text-generation-with-past"
    assert nodes["export"]["params"]["profiles"] == ["prefill", "decode"]
    prefill, decode = recipe["profiles"]["prefill"], recipe["profiles"]["decode"]
    assert prefill["input_ids"] == {"min": [1, 1], "opt": [1, 32], "max": [4, 64]}
    assert prefill["past_key_values.1.value"]["max"] == [4, 2, 0, 8]
    assert decode["past_key_values.0.key"] == {"min": [1, 2, 1, 8], "opt": [1, 2, 32, 8], "max": [4, 2, 63, 8]}
    check = nodes["export"]["params"]["generation"]
    # the candidates see the export's prompts; a near tie (two logits closer than the logits' atol) counts
    assert nodes["validate"]["params"]["generation"] == {**check, "allow_near_ties": True}
    assert nodes["benchmark"]["params"]["onnxruntime"] == {"intra_op_threads": 1}  # as every init recipe
    assert check["new_tokens"] + check["prompts"]["length"] <= 64
    assert nodes["benchmark"]["params"]["generation"] == {"context_length": 32, "new_tokens": 32, "concurrency": [1]}
    assert nodes["select"]["params"]["objective"] == {"goal": "min_time_per_token", "percentile": "p50"}
    assert nodes["build"]["params"]["profiles"] == nodes["triton"]["params"]["profiles"] == ["prefill", "decode"]
    assert nodes["triton"]["params"]["max_batch_size"] == 0
    # the plain forward pass is still one --task away
    trtflow_in_process("init", "llama", "--task", "text-generation", "-o", "plain.yaml", "--force", cwd=project)
    plain = yaml.safe_load((project / "plain.yaml").read_text())
    assert plain["nodes"][0]["params"]["task"] == "text-generation" and "prefill" not in plain.get("profiles", {})


def test_generation_ranges_and_prompts_from_the_options(project):
    from trtflow_stages.cli.init_generation import scaffold
    from trtflow_stages.cli.init_recipe import flow

    plan = scaffold(project / "llama", "llama", "llama", "llama", (1, 2, 8),
                    {"sequence_length": (1, 16, 48), "past_sequence_length": (1, 24, 47)}, "prompts.json")
    recipe = yaml.safe_load(plan.render("schema.json", flow))
    assert recipe["profiles"]["prefill"]["input_ids"] == {"min": [1, 1], "opt": [2, 16], "max": [8, 48]}
    assert recipe["profiles"]["decode"]["attention_mask"] == {"min": [1, 2], "opt": [2, 25], "max": [8, 48]}
    assert recipe["nodes"][0]["params"]["generation"]["prompts"] == {"path": "prompts.json"}
    for dims, message in (
            ({"sequence_length": (1, 16, 65)}, "a context of 65 does not fit the model, which attends over 64"),
            ({"seq": (1, 2, 3)}, "--dim names no dimension of a generation recipe: seq"),
            ({"past_sequence_length": (1, 2, 64)}, "a past of 64 leaves no room for the next token")):
        with pytest.raises(TrtflowError, match=message):
            scaffold(project / "llama", "llama", "llama", "llama", (1, 1, 4), dims, None)


@pytest.mark.slow
def test_generation_mistakes_on_the_command_line_name_the_option(project):
    for args, message in (
            (["--task", "text-generation-with-pas"], "--task 'text-generation-with-pas' is not a task export knows"),
            (["--data", "pyproject.toml"], "a generation recipe takes prompts")):
        proc = trtflow_in_process("init", "llama", "-o", "bad.yaml", "--force", *args, cwd=project, check=None)
        assert proc.returncode not in (0, 70) and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_a_model_that_is_no_causal_lm_is_refused_for_the_task(tmp_path):
    import transformers

    config = transformers.ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=32, image_size=16, patch_size=8)
    transformers.ViTModel(config).save_pretrained(tmp_path / "vit")
    from trtflow_stages.cli.init_generation import read_layout

    with pytest.raises(TrtflowError, match="transformers cannot build a causal LM from .*vit/config.json"):
        read_layout(tmp_path / "vit")


@pytest.mark.slow
def test_the_generation_recipe_runs_unedited(project, generation_init):
    """export -> fp32/fp16/int8 candidates -> validated by generation, TTFT/TPOT on ONNX Runtime -> select -> an
    engine with both profiles (TensorRT-RTX on the CPU) and a Triton repository, the benchmarks shortened with --set
    (tests/conftest.py SHORT_BENCHMARK)."""
    run = trtflow("run", "recipe.yaml", *short_benchmarks(project / "recipe.yaml"), cwd=project, timeout=1800)
    assert "Done" in run.stdout
    build = project / "build" / "llama"
    for candidate in ("simplify", "convert", "quantize"):
        verdict = json.loads((build / f"validate-{candidate}" / "validate.json").read_text())
        assert verdict["passed"], (candidate, verdict["failures"])
        assert verdict["generation"]["tokens_matched"] == [16, 16, 16, 16]
        levels = json.loads((build / f"benchmark-{candidate}" / "benchmark.json").read_text())["generation"]
        assert levels[0]["ttft_ms"]["n"] >= 10 and levels[0]["tpot_ms"]["ci"]["p50"][0] > 0
    selection = json.loads((build / "select" / "selection.json").read_text())
    chosen = next(row for row in selection["candidates"] if row["name"] == selection["selected"])
    assert chosen["reason"].startswith("selected: ") and "time to first token" in chosen["reason"]
    engine = json.loads((build / "build" / "engine.json").read_text())
    assert [p["name"] for p in engine["profiles"]] == ["prefill", "decode"]
    assert (build / "triton" / "model" / "config.pbtxt").is_file()
