"""Model sources (formats/): every format a recipe's `model:` may name, each made small in the test (no download),
exported and checked against its framework; damaged and unknown files; input mistakes explained."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch
from torch import nn

from trtflow.fingerprint import hash_path
from trtflow.stage import RecipeMismatch, StageFailed
from trtflow.testing import run_stage
from trtflow_stages import export

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(features).relu()


def _export(tmp_path: Path, **params):
    return run_stage(export.stage, params, workdir=tmp_path / "work", recipe_dir=tmp_path)


def _inputs(path: Path) -> dict[str, list]:
    model = onnx.load(str(path), load_external_data=False)
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}


# ---------------------------------------------------------------------------------------------------------
# PyTorch archives


def test_torchscript_archive_exports_with_the_recipe_shapes(tmp_path):
    torch.jit.save(torch.jit.script(Mlp().eval()), tmp_path / "mlp.pt")
    result = _export(tmp_path, model="mlp.pt", inputs={"features": {"shape": [2, 8], "dynamic_axes": {0: "batch"}}},
                     outputs=["scores"])
    assert result.summary["format"] == "torchscript"
    assert result.summary["exporter"] == "torchscript" and result.summary["checked"] is True
    assert _inputs(result.outputs["model"]) == {"features": ["batch", 8]}
    assert len(result.summary["checked_at"]) == 2  # the sample and another batch size


def test_torchscript_archive_without_inputs_is_a_recipe_error(tmp_path):
    with pytest.raises(ValueError, match="'inputs' is required"):
        export.Params(model="mlp.pt")


def test_pt2_program_declares_its_inputs(tmp_path):
    batch = torch.export.Dim("batch")
    program = torch.export.export(Mlp().eval(), (torch.randn(3, 8),), dynamic_shapes=({0: batch},))
    torch.export.save(program, tmp_path / "mlp.pt2")
    result = _export(tmp_path, model="mlp.pt2")
    summary = result.summary
    assert summary["format"] == "exported_program" and summary["exporter"] == "dynamo"
    (dims,) = _inputs(result.outputs["model"]).values()
    assert isinstance(dims[0], str) and dims[1] == 8  # the program's symbolic batch stays dynamic
    assert summary["checked"] is True and summary["max_abs_diff_vs_torch"] < 1e-5


def test_state_dict_named_pt_is_not_taken_for_torchscript(tmp_path):
    torch.save(Mlp().state_dict(), tmp_path / "weights.pt")
    with pytest.raises(StageFailed) as info:
        _export(tmp_path, model="weights.pt", inputs={"features": {"shape": [2, 8]}})
    assert "torch.save pickle" in info.value.message and "checkpoint" in info.value.hint


def test_truncated_pt2_is_named_damaged(tmp_path):
    program = torch.export.export(Mlp().eval(), (torch.randn(2, 8),))
    torch.export.save(program, tmp_path / "full.pt2")
    data = (tmp_path / "full.pt2").read_bytes()
    (tmp_path / "cut.pt2").write_bytes(data[: len(data) // 2])
    with pytest.raises(StageFailed) as info:
        _export(tmp_path, model="cut.pt2")
    assert "not a torch.export program" in info.value.message or "not a zip" in info.value.message


def test_unknown_file_and_folder_say_what_is_accepted(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"\0" * 16)
    with pytest.raises(StageFailed, match="cannot tell the format") as info:
        _export(tmp_path, model="model.bin")
    assert "Hugging Face" in info.value.hint
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "readme.txt").write_text("x")
    with pytest.raises(StageFailed, match="neither a Hugging Face"):
        _export(tmp_path, model="folder")


# ---------------------------------------------------------------------------------------------------------
# Hugging Face folders


def _bert_folder(path: Path, head: str = "BertForSequenceClassification", labels: int = 3) -> Path:
    import transformers

    config = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64, num_labels=labels)
    getattr(transformers, head)(config).save_pretrained(path)
    return path


def test_hugging_face_folder_task_and_inputs_from_its_config(tmp_path):
    _bert_folder(tmp_path / "bert")
    result = _export(tmp_path, model="bert")
    summary = result.summary
    assert summary["format"] == "huggingface" and summary["task"] == "text-classification"
    assert _inputs(result.outputs["model"]) == {name: ["batch", "sequence"] for name in
                                                ("input_ids", "attention_mask", "token_type_ids")}
    assert list(summary["outputs"]) == ["logits"]
    assert summary["checked"] is True and len(summary["checked_at"]) == 3  # sample, other batch, other sequence


def test_hugging_face_task_param_picks_the_head(tmp_path):
    _bert_folder(tmp_path / "bert")
    result = _export(tmp_path, model="bert", task="feature-extraction")
    assert result.summary["task"] == "feature-extraction"
    assert "last_hidden_state" in result.summary["outputs"]


def test_vision_folder_gets_pixel_values(tmp_path):
    import transformers

    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                    image_size=32, patch_size=8, num_labels=5)
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path / "vit")
    result = _export(tmp_path, model="vit")
    assert _inputs(result.outputs["model"]) == {"pixel_values": ["batch", 3, 32, 32]}
    assert result.summary["task"] == "image-classification" and result.summary["checked"] is True


def test_hugging_face_folder_without_weights_or_model_type(tmp_path):
    folder = _bert_folder(tmp_path / "bert")
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(StageFailed, match="no weights"):
        _export(tmp_path, model="bert")
    (folder / "config.json").write_text("{\"hidden_size\": 3}")
    with pytest.raises(StageFailed, match="no model_type"):
        _export(tmp_path, model="bert")


def test_the_key_covers_every_file_of_a_folder(tmp_path):
    folder = _bert_folder(tmp_path / "bert")
    params = export.Params(model="bert")
    assert export.stage.files_for(params) == ("bert",)
    before = hash_path(folder)
    weights = next(folder.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert hash_path(folder) != before


# ---------------------------------------------------------------------------------------------------------
# TensorFlow


def _keras_model(folder: Path) -> None:
    code = f"""
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import keras
inputs = keras.Input(shape=(8,), name="features")
hidden = keras.layers.Dense(16, activation="relu")(inputs)
model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
model.save({str(folder / 'model.keras')!r})
model.export({str(folder / 'saved')!r}, verbose=False)
"""
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=600)


@pytest.fixture(scope="module")
def keras_files(tmp_path_factory) -> Path:
    pytest.importorskip("tf2onnx")
    folder = tmp_path_factory.mktemp("keras")
    _keras_model(folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize(("model", "fmt"), [("saved", "tensorflow"), ("model.keras", "keras")])
def test_tensorflow_models_through_tf2onnx(keras_files, tmp_path, model, fmt):
    result = run_stage(export.stage, {"model": model}, workdir=tmp_path, recipe_dir=keras_files)
    summary = result.summary
    assert summary["format"] == fmt and summary["exporter"] == "tf2onnx"
    assert _inputs(result.outputs["model"]) == {"features": ["batch", 8]}
    assert summary["checked"] is True and summary["max_abs_diff_vs_tensorflow"] < 1e-4
    assert len(summary["checked_shapes"]) == 2


def test_damaged_keras_file(tmp_path):
    (tmp_path / "model.keras").write_bytes(b"PK\3\4 not really")
    with pytest.raises(StageFailed, match="not a Keras file"):
        _export(tmp_path, model="model.keras")


# ---------------------------------------------------------------------------------------------------------
# Input mistakes and what was checked


class TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids).mean(dim=1)


class Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.conv(image)


class OnlyTraced(nn.Module):
    """Runs only under the tracer (as some exporter-specific code paths do): eager PyTorch raises."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_tracing():
            raise RuntimeError("this code path runs only when traced")
        return x * 2


def _factory_file(tmp_path: Path, cls: type) -> str:
    (tmp_path / "models.py").write_text("import torch\nfrom torch import nn\n\n\n" + _class_source(cls)
                                        + f"\n\ndef build():\n    return {cls.__name__}()\n")
    return "python:models.py:build"


def _class_source(cls: type) -> str:
    import inspect

    return inspect.getsource(cls)


def test_ids_given_as_floats_say_dtype_int64_and_the_range(tmp_path):
    model = _factory_file(tmp_path, TokenModel)
    with pytest.raises(StageFailed) as info:
        _export(tmp_path, model=model, inputs={"ids": {"shape": [2, 6]}})
    assert "'ids'" in info.value.message and "as indices" in info.value.message
    assert "dtype: int64" in info.value.hint and "high: 50" in info.value.hint


def test_ids_past_the_vocabulary_say_the_range(tmp_path):
    model = _factory_file(tmp_path, TokenModel)
    with pytest.raises(StageFailed) as info:
        _export(tmp_path, model=model, inputs={"ids": {"shape": [2, 6], "dtype": "int64", "high": 500}})
    assert "high: 50" in info.value.hint


def test_wrong_rank_says_the_rank_the_model_takes(tmp_path):
    model = _factory_file(tmp_path, Conv)
    with pytest.raises(StageFailed) as info:
        _export(tmp_path, model=model, inputs={"image": {"shape": [3, 16]}})
    assert "rank 2" in info.value.message and "rank 4" in info.value.hint


def test_a_model_that_fails_at_its_sample_fails_the_node_before_exporting(tmp_path):
    """Issue 20.8 reported every shape skipped as `checked: true`; issue 25: a shape the recipe declares that the
    model cannot run fails the node with the reason (never a pass with nothing compared)."""
    model = _factory_file(tmp_path, OnlyTraced)
    with pytest.raises(StageFailed) as info:
        _export(tmp_path, model=model, inputs={"x": {"shape": [2, 3], "dynamic_axes": {0: "batch"}}})
    assert "the model fails on the sample inputs (x: float32[2, 3])" in info.value.message
    assert "this code path runs only when traced" in info.value.message


@pytest.mark.slow
def test_damaged_saved_model(tmp_path):
    pytest.importorskip("tf2onnx")
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "saved_model.pb").write_bytes(b"not a protobuf of a SavedModel")
    with pytest.raises(StageFailed) as info:
        _export(tmp_path, model="saved")
    assert "TensorFlow cannot load the SavedModel" in info.value.message


# -- issue 25: the model's own names, limits per modality, tasks per architecture --------------------------------

def _outputs(path: Path) -> dict[str, list]:
    model = onnx.load(str(path), load_external_data=False)
    return {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output}


def _roberta_folder(path: Path, head: str = "RobertaForMaskedLM") -> Path:
    import transformers

    config = transformers.RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=64, max_position_embeddings=18)  # 16 tokens
    getattr(transformers, head)(config).save_pretrained(path)
    return path


def test_hugging_face_outputs_and_their_dims_are_named_like_the_model(tmp_path):
    _bert_folder(tmp_path / "bert", "BertForQuestionAnswering", labels=2)
    result = _export(tmp_path, model="bert")
    assert _outputs(result.outputs["model"]) == {"start_logits": ["batch", "sequence"],
                                                 "end_logits": ["batch", "sequence"]}


def test_a_profile_beyond_the_positions_is_refused_and_one_within_is_checked_at_its_ends(tmp_path):
    _roberta_folder(tmp_path / "roberta")
    profile = {"input_ids": {"min": [1, 1], "opt": [2, 8], "max": [4, 18]},
               "attention_mask": {"min": [1, 1], "opt": [2, 8], "max": [4, 18]},
               "token_type_ids": {"min": [1, 1], "opt": [2, 8], "max": [4, 18]}}
    with pytest.raises(RecipeMismatch, match=r"profile 'p' asks 'sequence' up to 18 .* takes at most 16: "
                       r"max_position_embeddings 18 less the padding offset 2"):
        _export(tmp_path, model="roberta", profiles=[{"name": "p", "shapes": profile}])
    within = {name: {"min": [1, 1], "opt": [2, 8], "max": [4, 16]} for name in profile}
    result = _export(tmp_path, model="roberta", profiles=[{"name": "p", "shapes": within}])
    checked = {(c.get("dim"), c.get("size"), c["status"]) for c in result.summary["checked_shapes"]}
    assert {("sequence", 1, "ok"), ("batch", 4, "ok"), ("batch", 1, "ok")} <= checked
    assert result.summary["checked_shapes"][0]["shapes"]["input_ids"] == [2, 16]  # the sample: the max itself
    assert _outputs(result.outputs["model"]) == {"logits": ["batch", "sequence", 100]}


def test_a_shape_the_model_cannot_run_fails_the_node_not_skipped(tmp_path):
    """A recipe's own inputs beyond RoBERTa's positions (no limit can be read from a hand-written input): the
    check at the profile's max fails naming PyTorch's error, never a skipped tick."""
    _roberta_folder(tmp_path / "roberta")
    inputs = {name: {"shape": [2, 8], "dtype": "int64", "dynamic_axes": {0: "batch", 1: "tokens"}, "low": 0,
                     "high": 2 if name != "input_ids" else 100} for name in ("input_ids", "attention_mask")}
    shapes = {name: {"min": [1, 4], "opt": [2, 8], "max": [2, 20]} for name in inputs}
    with pytest.raises(RecipeMismatch, match=r"the model cannot run at tokens = 20 \(profile max\).*which the recipe "
                       r"declares: PyTorch itself fails at this shape"):
        _export(tmp_path, model="roberta", inputs=inputs, profiles=[{"name": "p", "shapes": shapes}])


def test_weights_without_the_tasks_head_and_a_task_the_model_cannot_do_are_named(tmp_path):
    _bert_folder(tmp_path / "bert", "BertModel")
    with pytest.raises(RecipeMismatch, match=r"lack .* that task token-classification needs \(classifier\.bias, "
                       r"classifier\.weight\): exported, they would hold random values") as info:
        _export(tmp_path, model="bert", task="token-classification")
    assert "architectures: BertModel" in info.value.hint
    with pytest.raises(RecipeMismatch, match=r"a 'bert' model cannot do task 'object-detection'") as info:
        _export(tmp_path, model="bert", task="object-detection")
    assert "fill-mask, text-classification" in info.value.hint


@pytest.mark.parametrize("name", ["bert", "roberta", "t5", "bart", "clip", "hubert", "whisper", "ast", "detr",
                                  "wav2vec2", "segformer", "dpt", "llama"])
def test_hugging_face_configs_describe_tasks_parts_inputs_and_limits(tmp_path, name):
    """From config.json alone (the model built on the meta device): the task, the parts, the inputs by modality
    and the proposed ranges within the model's limits."""
    import transformers

    from tests.stages.zoo_models import PREPROCESSOR_SIZE, ZOO
    from trtflow_stages.formats.describe import huggingface_parts

    _, config_class, model_class, kwargs, _ = ZOO[name]
    config = getattr(transformers, config_class)(**kwargs)
    config.architectures = [model_class]
    config.save_pretrained(tmp_path / name)
    if name in PREPROCESSOR_SIZE:
        (tmp_path / name / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 64, "width": 64}}))
    parts = huggingface_parts(tmp_path / name, None)
    found = [(p.task, p.part, {i.name: i.dims for i in p.inputs}, p.ranges) for p in parts]
    expected = {
        "bert": [("text-classification", None, {n: ("batch", "sequence") for n in
                                                ("input_ids", "attention_mask", "token_type_ids")},
                  {"sequence": (1, 64, 64)})],
        "roberta": [("fill-mask", None, {n: ("batch", "sequence") for n in
                                         ("input_ids", "attention_mask", "token_type_ids")},
                     {"sequence": (1, 32, 32)})],  # 34 positions less the padding offset
        "t5": [("text2text-generation", "encoder", {"input_ids": ("batch", "sequence"),
                                                    "attention_mask": ("batch", "sequence")},
                {"sequence": (1, 128, 512)}),
               ("text2text-generation", "decoder", {"input_ids": ("batch", "decoder_sequence"),
                                                    "encoder_hidden_states": ("batch", "sequence", 32),
                                                    "encoder_attention_mask": ("batch", "sequence")},
                {"sequence": (1, 128, 512), "decoder_sequence": (1, 64, 256)})],
        "clip": [("zero-shot-image-classification", None, {"pixel_values": ("batch", 3, 32, 32),
                                                           "input_ids": ("batch", "sequence"),
                                                           "attention_mask": ("batch", "sequence")},
                  {"sequence": (1, 32, 32)})],
        "hubert": [("audio-classification", None, {"input_values": ("batch", "audio_samples")},
                    {"audio_samples": (1600, 16000, 48000)})],
        "whisper": [("automatic-speech-recognition", "encoder", {"input_features": ("batch", 16, 32)}, {}),
                    ("automatic-speech-recognition", "decoder", {"input_ids": ("batch", "decoder_sequence"),
                                                                 "encoder_hidden_states": ("batch", 16, 32)},
                     {"decoder_sequence": (1, 16, 16)})],
        "ast": [("audio-classification", None, {"input_values": ("batch", 64, 16)}, {})],
        "detr": [("object-detection", None, {"pixel_values": ("batch", 3, 64, 64)}, {})],
        "wav2vec2": [("automatic-speech-recognition", None, {"input_values": ("batch", "audio_samples")},
                      {"audio_samples": (1600, 16000, 48000)})],
        "segformer": [("semantic-segmentation", None, {"pixel_values": ("batch", 3, 64, 64)}, {})],
        "dpt": [("depth-estimation", None, {"pixel_values": ("batch", 3, 32, 32)}, {})],
        "llama": [("text-generation", None, {"input_ids": ("batch", "sequence"),
                                             "attention_mask": ("batch", "sequence")}, {"sequence": (1, 64, 64)})],
    }
    if name == "bart":
        assert [(p.task, p.part) for p in parts] == [("text2text-generation", "encoder"),
                                                     ("text2text-generation", "decoder")]
        return
    assert found == expected[name]


def test_the_audio_limit_is_the_feature_encoders_receptive_field():
    from types import SimpleNamespace

    from trtflow_stages.formats.hf_limits import audio_limit, sequence_limit

    usual = SimpleNamespace(conv_kernel=[10, 3, 3, 3, 3, 2, 2], conv_stride=[5, 2, 2, 2, 2, 2, 2])
    assert audio_limit(usual).low == 400  # wav2vec2-base: 25 ms at 16 kHz
    assert sequence_limit(SimpleNamespace(model_type="roberta", max_position_embeddings=514, pad_token_id=1)).high \
        == 512
    assert sequence_limit(SimpleNamespace(model_type="gpt2", n_positions=1024)).high == 1024
    assert sequence_limit(SimpleNamespace(model_type="t5")).high is None
