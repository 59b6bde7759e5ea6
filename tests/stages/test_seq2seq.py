"""An encoder-decoder for generation through the stages (`formats.seq2seq`): a tiny random-weight Whisper (its
encoder takes log-mel features, not token ids) exported as its two graphs by the export stage (the decoder checked
by greedy generation against transformers' generate), then validated by greedy generation and benchmarked with the
exported encoder as their `encoder` input. T5 goes through `trtflow init` and `trtflow run` in the zoo
(tests/stages/test_zoo.py); every family of transformers' seq2seq mappings in test_seq2seq_families.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
import yaml

from trtflow.stage import StageFailed
from trtflow.testing import run_stage
from trtflow_stages import benchmark, export, validate
from trtflow_stages.formats.seq2seq import SPEECH_TASK

WHISPER = {"vocab_size": 96, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
           "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "num_mel_bins": 8,
           "max_source_positions": 16, "max_target_positions": 32, "pad_token_id": 1, "bos_token_id": 0,
           "eos_token_id": 2, "decoder_start_token_id": 3}
CHECK = {"prompts": {"count": 1, "seed": 0}, "new_tokens": 4}


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Any:
    """Tiny models: one thread (a pool of threads only thrashes a shared host), restored after the module."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def whisper(tmp_path_factory) -> dict[str, Path]:
    """The tiny Whisper's folder and its two exported graphs (the export stage, in this process)."""
    import torch
    import transformers

    folder = tmp_path_factory.mktemp("whisper")
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**WHISPER)).eval()
    for parameter in model.parameters():
        parameter.data.normal_(0, 0.3)
    model.save_pretrained(folder / "whisper")
    graphs = {"folder": folder / "whisper"}
    for part in ("encoder", "decoder"):
        params = {"model": "whisper", "task": SPEECH_TASK, "part": part,
                  **({"generation": CHECK} if part == "decoder" else {})}
        run = run_stage(export.stage, params, workdir=folder / part, recipe_dir=folder)
        graphs[part] = run.outputs["model"]
        graphs[f"{part}_summary"] = run.summary  # type: ignore[assignment]
    return graphs


def _dims(values) -> dict[str, list]:
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}


def test_whisper_exports_the_encoder_cache_and_a_decoder_that_takes_both_caches(whisper):
    encoder = onnx.load(str(whisper["encoder"]), load_external_data=False)
    assert _dims(encoder.graph.input) == {"input_features": ["batch_size", 8, 32]}
    assert _dims(encoder.graph.output)["present.1.encoder.value"] == ["batch_size", 2, 16, 16]  # the decoder's heads
    decoder = onnx.load(str(whisper["decoder"]), load_external_data=False)
    inputs = _dims(decoder.graph.input)
    assert "encoder_hidden_states" not in inputs and "encoder_attention_mask" not in inputs  # the cache instead
    assert inputs["past_key_values.0.decoder.key"] == ["batch_size", 2, "past_sequence_length", 16]
    assert inputs["past_key_values.0.encoder.key"] == ["batch_size", 2, 16, 16]  # 16 frames after the convolutions
    assert _dims(decoder.graph.output)["present.1.decoder.value"] == [
        "batch_size", 2, "past_sequence_length + sequence_length", 16]
    assert {p.key: p.value for p in decoder.metadata_props}["decoder_start_token_id"] == "3"
    # the decoder's greedy generation equals transformers' generate, from random log-mel features
    check = whisper["decoder_summary"]["generation_check"]
    assert check["tokens_matched"] == [4] and check["max_abs_logit_error"] < 1e-4
    assert check["prompts_from"] == "1 random log-mel input(s) of 8 bins x 32 frames (seed 0)"


def test_validate_and_benchmark_run_the_decoder_with_its_encoder(whisper, tmp_path):
    model, encoder = whisper["decoder"], whisper["encoder"]
    params = {"generation": CHECK}
    same = run_stage(validate.stage, params, {"reference": model, "encoder": encoder, "candidate": model},
                     workdir=tmp_path / "validate")
    assert same.summary["passed"], same.summary["failures"]
    assert same.summary["generation"]["tokens_matched"] == [4]
    assert same.summary["generation"]["free_running"]["tokens_until_difference"] == [4]
    assert same.summary["data"] == "1 random log-mel input(s) of 8 bins x 32 frames (seed 0)"
    from trtflow_stages.runtimes.ort import create_session
    from trtflow_stages.runtimes.seq2seq import open_decoder

    with pytest.raises(StageFailed, match="needs its encoder"):  # the decoder alone cannot generate
        open_decoder(create_session(model))
    timed = run_stage(benchmark.stage, {"backend": "onnxruntime", "generation": {"context_length": 4,
                                                                                "new_tokens": 4},
                                        "min_duration_s": 0.05, "max_duration_s": 0.2, "repeats": 3,
                                        "min_iterations": 3},
                      {"model": model, "encoder": encoder}, workdir=tmp_path / "benchmark")
    level = timed.summary["generation"][0]
    first, per = level["ttft_ms"], level["tpot_ms"]
    assert first["n"] == per["n"] == level["requests"] >= 3
    assert first["ci"]["p50"][0] <= first["p50"] <= first["ci"]["p50"][1]
    assert per["p50"] > 0 and level["output_tokens_per_s"] > 0


def _exit(result: Any) -> tuple[int, str]:
    """The exit code the CLI gives (a TrtflowError's own; CliRunner leaves it raised) and the message."""
    error = result.exception
    code = getattr(error, "exit_code", result.exit_code) if error is not None else result.exit_code
    return code, f"{getattr(error, 'message', error)} / hint: {getattr(error, 'hint', '')}" if error else result.output


def _init(folder: Path, *arguments: str) -> Any:
    """``trtflow init`` in this process (transformers is imported already)."""
    import os

    from typer.testing import CliRunner

    from trtflow.cli.app import add_plugin_commands, app

    add_plugin_commands(["init"])
    previous = Path.cwd()
    os.chdir(folder)
    try:
        return CliRunner().invoke(app, ["init", *arguments])
    finally:
        os.chdir(previous)


def test_init_writes_the_encoder_decoder_recipe_and_refuses_a_family_by_name(whisper, tmp_path):
    import torch
    import transformers

    project = whisper["folder"].parent
    (project / "pyproject.toml").touch()
    result = _init(project, "whisper", "-o", "whisper.yaml", "--force", "--batch", "1:1:2")
    assert _exit(result)[0] == 0, _exit(result)
    recipe = yaml.safe_load((project / "whisper.yaml").read_text())
    nodes = {node["name"]: node for node in recipe["nodes"]}
    assert list(nodes) == ["export-encoder", "export", "simplify", "convert", "quantize", "validate", "benchmark",
                           "select", "build", "build-encoder"]
    assert nodes["export"]["params"]["task"] == SPEECH_TASK and nodes["export"]["params"]["part"] == "decoder"
    assert nodes["validate"]["inputs"]["encoder"] == nodes["benchmark"]["inputs"]["encoder"] == "export-encoder"
    assert recipe["profiles"]["encoder"]["input_features"]["max"] == [2, 8, 32]  # fixed frames
    assert recipe["profiles"]["decode"]["past_key_values.1.decoder.key"]["max"] == [2, 2, 31, 16]
    wrong = _init(project, "whisper", "-o", "w2.yaml", "--dim", "encoder_sequence_length=1:8:16")
    code, message = _exit(wrong)
    assert code == 2 and "a speech encoder takes a fixed 32 frames" in message, message
    # a family whose model code does not run with its caches as inputs: refused by name, exit 2, the hint applies
    config = transformers.AutoConfig.for_model("nllb-moe", d_model=32, encoder_layers=1, decoder_layers=1,
                                               encoder_attention_heads=2, decoder_attention_heads=2, vocab_size=64,
                                               encoder_ffn_dim=32, decoder_ffn_dim=32, num_experts=2,
                                               decoder_start_token_id=2)
    torch.manual_seed(0)
    transformers.AutoModelForSeq2SeqLM.from_config(config).save_pretrained(project / "nllb")
    code, message = _exit(_init(project, "nllb", "-o", "nllb.yaml"))
    assert code == 2, message
    assert "'nllb-moe' encoder-decoder does not run with its caches as inputs" in message
    assert "hint: export it without a cache: task: text2text-generation" in message
