"""A Hugging Face model folder (``save_pretrained``: config.json and weights) as a PyTorch model with declared inputs.

Learnt from Optimum's exporters (``optimum/exporters/tasks.py``, ``onnx/model_configs.py``): a *task* picks the
model class (from ``config.architectures`` or a ``task:`` param), and the model type's *inputs* follow from the
config: token ids and masks (int64, ``[batch, sequence]``, ids below ``vocab_size``) for text models, pixels
(float32, ``[batch, num_channels, height, width]``) for vision models, log-mel features for Whisper's encoder, raw
audio for wav2vec2-like models. Encoder-decoder models (Whisper, T5, BART) export their encoder. The outputs are
the tensors of the model's output object (``last_hidden_state``, ``logits``, ``pred_boxes``...), with the cache off.
Nothing is downloaded: the folder is read with ``local_files_only``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.stage import StageFailed

from .generation import TASK as GENERATION_TASK

#: Task -> transformers Auto class. The encoder of an encoder-decoder model is exported for "feature-extraction".
TASKS = {
    "feature-extraction": "AutoModel",
    "fill-mask": "AutoModelForMaskedLM",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "text-generation": "AutoModelForCausalLM",
    "text-generation-with-past": "AutoModelForCausalLM",  # with a KV cache in and out (formats.generation)
    "image-classification": "AutoModelForImageClassification",
    "object-detection": "AutoModelForObjectDetection",
    "audio-classification": "AutoModelForAudioClassification",
    "automatic-speech-recognition": "AutoModelForCTC",
}
#: Suffix of ``config.architectures[0]`` -> task (first match wins).
_ARCHITECTURE_TASKS = (
    ("ForMaskedLM", "fill-mask"), ("ForSequenceClassification", "text-classification"),
    ("ForTokenClassification", "token-classification"), ("ForQuestionAnswering", "question-answering"),
    ("ForCausalLM", "text-generation"), ("LMHeadModel", "text-generation"),
    ("ForImageClassification", "image-classification"), ("ForObjectDetection", "object-detection"),
    ("ForAudioClassification", "audio-classification"), ("ForCTC", "automatic-speech-recognition"),
    ("ForConditionalGeneration", "feature-extraction"), ("Model", "feature-extraction"),
)
#: Input names a wrapped model accepts (keyword arguments of the wrapper's forward, in this order).
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids", "pixel_values", "input_features", "input_values")
_SEQUENCE = 16
_DROPPED_OUTPUTS = ("past_key_values", "hidden_states", "attentions", "encoder_hidden_states", "cross_attentions")


@dataclass
class HfModel:
    """What the export stage needs: the module, its inputs (as export ``inputs:`` entries) and output names."""

    module: Any
    task: str
    model_type: str
    inputs: dict[str, dict[str, Any]]
    outputs: list[str] = field(default_factory=list)
    encoder_only: bool = False
    generation: Any = None  # text-generation-with-past: the formats.generation.GenerationModel


def read_config(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "config.json").read_text(encoding="utf-8"))


def task_of(config: dict[str, Any], task: str | None) -> str:
    """The task: the ``task:`` param, else the one ``config.architectures`` names, else feature-extraction."""
    if task is not None:
        if task not in TASKS:
            raise StageFailed(f"task {task!r} is not one of {', '.join(TASKS)}",
                              hint="leave task out to take it from config.json's architectures")
        return task
    for architecture in config.get("architectures") or []:
        for suffix, found in _ARCHITECTURE_TASKS:
            if architecture.endswith(suffix):
                return found
    return "feature-extraction"


def _size(value: Any) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[-1])
    return int(value), int(value)


def declared_inputs(config: Any, accepts: set[str]) -> dict[str, dict[str, Any]]:
    """Export ``inputs:`` entries (shape, dtype, dynamic_axes, low, high) for a model of this config."""
    model_type = getattr(config, "model_type", "")
    inputs: dict[str, dict[str, Any]] = {}
    if "input_features" in accepts and hasattr(config, "num_mel_bins"):
        frames = 2 * int(getattr(config, "max_source_positions", 1500))
        inputs["input_features"] = {"shape": [2, int(config.num_mel_bins), frames], "dtype": "float32",
                                    "dynamic_axes": {0: "batch"}, "low": -1.0, "high": 1.0}
    elif "input_values" in accepts and "pixel_values" not in accepts:
        inputs["input_values"] = {"shape": [2, 4000], "dtype": "float32", "dynamic_axes": {0: "batch", 1: "samples"},
                                  "low": -1.0, "high": 1.0}
    elif "pixel_values" in accepts:
        height, width = _size(getattr(config, "image_size", 224))
        channels = int(getattr(config, "num_channels", 3))
        inputs["pixel_values"] = {"shape": [2, channels, height, width], "dtype": "float32",
                                  "dynamic_axes": {0: "batch"}, "low": 0.0, "high": 1.0}
    elif "input_ids" in accepts:
        vocab = int(getattr(config, "vocab_size", 2) or 2)
        limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        sequence = min(_SEQUENCE, int(limit)) if limit else _SEQUENCE
        axes = {0: "batch", 1: "sequence"}
        inputs["input_ids"] = {"shape": [2, sequence], "dtype": "int64", "dynamic_axes": axes, "low": 0,
                               "high": vocab}
        if "attention_mask" in accepts:
            inputs["attention_mask"] = {"shape": [2, sequence], "dtype": "int64", "dynamic_axes": axes, "low": 1,
                                        "high": 2}
        types = int(getattr(config, "type_vocab_size", 0) or 0)
        if "token_type_ids" in accepts and types > 1:
            inputs["token_type_ids"] = {"shape": [2, sequence], "dtype": "int64", "dynamic_axes": axes, "low": 0,
                                        "high": types}
    if not inputs:
        raise StageFailed(f"cannot tell the inputs of a {model_type!r} model (its forward() takes none of "
                          f"{', '.join(INPUT_NAMES)})",
                          hint="write a python: factory for it, with inputs: declared in the recipe")
    return inputs


def _accepted(module: Any) -> set[str]:
    import inspect

    try:
        parameters = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return set()
    return {name for name in INPUT_NAMES if name in parameters}


def _wrapper_class() -> Any:
    import torch

    class HfWrapper(torch.nn.Module):
        """The model with named tensor inputs and a tuple of named tensor outputs (no cache, no dicts)."""

        def __init__(self, model: Any, outputs: list[str], options: dict[str, Any]) -> None:
            super().__init__()
            self.model = model
            self.output_names = outputs
            self.options = options

        def forward(self, input_ids: Any = None, attention_mask: Any = None, token_type_ids: Any = None,
                    pixel_values: Any = None, input_features: Any = None, input_values: Any = None) -> Any:
            given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
                     "pixel_values": pixel_values, "input_features": input_features, "input_values": input_values}
            result = self.model(**{k: v for k, v in given.items() if v is not None}, **self.options)
            return tuple(result[name] for name in self.output_names)

    return HfWrapper


def load_model(folder: Path, task: str | None, shown: str) -> HfModel:
    """The folder's model (weights from the folder, nothing downloaded) wrapped for export, with its inputs."""
    import os
    import pickle

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError as error:
        raise StageFailed("a Hugging Face model folder needs the transformers package",
                          hint="pip install 'trtflow[huggingface]'") from error
    raw = read_config(folder)
    chosen = task_of(raw, task)
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
        auto = getattr(transformers, TASKS[chosen])
        model = auto.from_pretrained(str(folder), local_files_only=True, attn_implementation="eager")
    except pickle.UnpicklingError as error:  # a .bin holding more than tensors: torch's weights_only refuses it
        raise StageFailed(f"{shown!r} holds .bin weights with Python objects other than tensors, which torch's "
                          f"weights_only unpickler refuses to load: {' '.join(str(error).split())[:200]}",
                          hint="save the weights as safetensors (model.save_pretrained(folder) writes them)") from error
    except (ValueError, KeyError, OSError) as error:
        raise StageFailed(f"transformers cannot load {shown!r} for task {chosen}: {' '.join(str(error).split())[:400]}",
                          hint="check config.json's model_type and architectures, or set task: to what the "
                          f"weights are for ({', '.join(TASKS)})") from error
    encoder_only = False
    encoder_decoder = getattr(config, "is_encoder_decoder", False)
    if encoder_decoder and chosen == "feature-extraction" and hasattr(model, "get_encoder"):
        model, encoder_only = model.get_encoder(), True
    model.eval()
    if chosen == GENERATION_TASK:
        from .generation import wrap

        generation = wrap(model, config)
        return HfModel(generation.module, chosen, str(getattr(config, "model_type", "")), generation.inputs,
                       generation.outputs, generation=generation)
    accepts = _accepted(model)
    inputs = declared_inputs(config, accepts)
    options: dict[str, Any] = {"return_dict": True}
    import inspect

    if "use_cache" in inspect.signature(model.forward).parameters:
        options["use_cache"] = False
    outputs = _output_names(model, inputs, options)
    module = _wrapper_class()(model, outputs, options).eval()
    return HfModel(module, chosen, str(getattr(config, "model_type", "")), inputs, outputs, encoder_only)


def _output_names(model: Any, inputs: dict[str, dict[str, Any]], options: dict[str, Any]) -> list[str]:
    """The tensor outputs of one run on the sample (their order in the model's output object)."""
    import numpy as np
    import torch

    rng = np.random.default_rng(0)
    feed = {}
    for name, spec in inputs.items():
        if spec["dtype"] == "int64":
            feed[name] = torch.from_numpy(rng.integers(int(spec["low"]), int(spec["high"]), size=spec["shape"]))
        else:
            feed[name] = torch.from_numpy(rng.uniform(spec["low"], spec["high"], size=spec["shape"]).astype("float32"))
    with torch.no_grad():
        result = model(**feed, **options)
    names = [k for k, v in result.items() if isinstance(v, torch.Tensor) and k not in _DROPPED_OUTPUTS]
    if not names:
        raise StageFailed("the Hugging Face model returned no tensor output on a sample input")
    return names
