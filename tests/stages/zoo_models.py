"""A model zoo for the slow tests: small random-weight Hugging Face models of different families, saved as
``save_pretrained`` folders (no download), and a recipe that takes each through export, fp16 (convert), int8
(quantize), validation of both against the exported model, and a TensorRT-RTX build of both.

Run it alone (prints the table README shows)::

    python -m tests.stages.zoo_models /tmp/zoo      # writes the folders and zoo.yaml, runs it, prints the table
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: name -> (family, transformers config class, model class, config kwargs)
ZOO: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "bert": ("encoder transformer (text classification)", "BertConfig", "BertForSequenceClassification",
             {"vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 64, "max_position_embeddings": 32, "num_labels": 3}),
    "gpt2": ("decoder transformer (causal LM)", "GPT2Config", "GPT2LMHeadModel",
             {"vocab_size": 128, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32}),
    "t5": ("encoder of an encoder-decoder transformer", "T5Config", "T5Model",
           {"vocab_size": 128, "d_model": 32, "d_kv": 16, "d_ff": 64, "num_layers": 1, "num_heads": 2,
            "num_decoder_layers": 1}),
    "vit": ("vision transformer", "ViTConfig", "ViTForImageClassification",
            {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
             "image_size": 32, "patch_size": 8, "num_labels": 5}),
    "swin": ("vision transformer with shifted windows", "SwinConfig", "SwinForImageClassification",
             {"image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [1, 1], "num_heads": [1, 2],
              "window_size": 4, "num_labels": 5}),
    "convnext": ("convnet", "ConvNextConfig", "ConvNextForImageClassification",
                 {"image_size": 32, "num_stages": 2, "hidden_sizes": [8, 16], "depths": [1, 1], "num_labels": 5}),
    "yolos": ("detection head (boxes and classes)", "YolosConfig", "YolosForObjectDetection",
              {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
               "image_size": [32, 32], "patch_size": 8, "num_detection_tokens": 4, "num_labels": 3}),
    "whisper": ("audio encoder (log-mel spectrogram)", "WhisperConfig", "WhisperForConditionalGeneration",
                {"vocab_size": 128, "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
                 "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64,
                 "decoder_ffn_dim": 64, "num_mel_bins": 16, "max_source_positions": 16,
                 "max_target_positions": 16, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                 "decoder_start_token_id": 1}),
    "wav2vec2": ("audio encoder (raw waveform, CTC)", "Wav2Vec2Config", "Wav2Vec2ForCTC",
                 {"vocab_size": 16, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                  "intermediate_size": 64, "conv_dim": [16, 16], "conv_kernel": [10, 3], "conv_stride": [5, 2],
                  "num_conv_pos_embeddings": 8, "num_conv_pos_embedding_groups": 2, "do_stable_layer_norm": True}),
}
STAGES = ("export", "convert", "quantize", "validate-fp16", "validate-int8", "build-fp16", "build-int8")


def save_models(folder: Path, names: list[str] | None = None) -> None:
    import torch
    import transformers

    for name in names or list(ZOO):
        _, config_class, model_class, kwargs = ZOO[name]
        torch.manual_seed(0)
        config = getattr(transformers, config_class)(**kwargs)
        getattr(transformers, model_class)(config).eval().save_pretrained(folder / name)


def _profile_and_data(folder: Path, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A build profile (batch 1..4, sequence 4..16) and random data in the opt shapes, from the declared inputs."""
    from trtflow_stages.formats.describe import huggingface_inputs

    declared, _ = huggingface_inputs(folder / name, None)
    sizes = {"batch": (1, 2, 4), "sequence": (4, 16, 16), "samples": (2000, 4000, 4000)}
    profile: dict[str, Any] = {}
    shapes: dict[str, list[int]] = {}
    ranges: dict[str, list[float]] = {}
    for spec in declared:
        pick = {i: [d if isinstance(d, int) else sizes[d][i] for d in spec.dims] for i in range(3)}
        profile[spec.name] = {"min": pick[0], "opt": pick[1], "max": pick[2]}
        shapes[spec.name] = [1, *pick[1][1:]]
        if spec.value_range:
            ranges[spec.name] = list(spec.value_range)
    data = {"random": {"seed": 0, "num_samples": 4, "shapes": shapes, **({"ranges": ranges} if ranges else {})}}
    return profile, data


def write_recipe(folder: Path, names: list[str] | None = None) -> Path:
    import yaml

    nodes: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    for name in names or list(ZOO):
        profile, data = _profile_and_data(folder, name)
        profiles[name] = profile
        nodes += [
            {"name": f"export-{name}", "stage": "export", "params": {"model": name}},
            {"name": f"convert-{name}", "stage": "convert", "inputs": {"model": f"export-{name}"},
             "params": {"precision": "fp16", "calibration_data": data}},
            {"name": f"quantize-{name}", "stage": "quantize", "inputs": {"model": f"export-{name}"},
             "params": {"mode": "int8", "calibration_data": data}},
        ]
        for precision, source in (("fp16", "convert"), ("int8", "quantize")):
            nodes.append({"name": f"validate-{precision}-{name}", "stage": "validate",
                          "inputs": {"reference": f"export-{name}", "candidate": f"{source}-{name}"},
                          "params": {"data": data, "batch_size": 1, "expect": precision}})
            nodes.append({"name": f"build-{precision}-{name}", "stage": "build",
                          "inputs": {"model": f"{source}-{name}"},
                          "params": {"backend": "tensorrt-rtx", "profile": name}})
    recipe = folder / "zoo.yaml"
    recipe.write_text(yaml.safe_dump({"name": "zoo", "profiles": profiles, "nodes": nodes}, sort_keys=False))
    return recipe


def run_zoo(folder: Path, jobs: int = 2) -> tuple[dict[str, dict[str, str]], float, subprocess.CompletedProcess]:
    """Run the recipe (--keep-going); per model, per stage: ok, gate failed (validate), failed or not run."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRTFLOW_STORE=str(folder / "store"), COLUMNS="200")
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "trtflow.cli", "run", "zoo.yaml", "-j", str(jobs), "--keep-going"],
                          cwd=folder, capture_output=True, text=True, env=env, timeout=3600)
    seconds = time.perf_counter() - started
    status = subprocess.run([sys.executable, "-m", "trtflow.cli", "status", "zoo.yaml", "--json"], cwd=folder,
                            capture_output=True, text=True, env=env, check=True)
    nodes = {n["node"]: n for n in json.loads(status.stdout)["nodes"]}
    table: dict[str, dict[str, str]] = {}
    for name in ZOO:
        if f"export-{name}" not in nodes:
            continue
        row = {}
        for stage in STAGES:
            node = nodes.get(f"{stage}-{name}")
            state = node["status"] if node else "absent"
            row[stage] = {"fresh": "ok", "done": "ok", "cached": "ok", "gate_failed": "gate failed"}.get(state, state)
        table[name] = row
    return table, seconds, proc


def markdown(table: dict[str, dict[str, str]]) -> str:
    lines = ["| model | family | " + " | ".join(STAGES) + " |", "|---|---|" + "---|" * len(STAGES)]
    for name, row in table.items():
        lines.append(f"| {name} | {ZOO[name][0]} | " + " | ".join(row[s] for s in STAGES) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    (target / "pyproject.toml").touch()
    save_models(target)
    write_recipe(target)
    result, seconds, proc = run_zoo(target)
    print(proc.stdout[-3000:])
    print(markdown(result))
    print(f"{len(result)} models, {seconds:.0f} s")
