"""A Hugging Face model folder (``save_pretrained``: config.json and weights) as a PyTorch model with declared inputs.

Learnt from Optimum's exporters (``optimum/exporters/tasks.py``, ``onnx/model_configs.py``):
- a *task* picks the model class: the ``task:`` param, else the task whose transformers mapping names the class in
  ``config.architectures`` (so a HuBERT audio classifier is ``audio-classification``, never a text classifier);
- an encoder-decoder model (T5, BART, Whisper) exports as two *parts*: ``encoder`` (its inputs -> its
  ``last_hidden_state``) and ``decoder`` (``input_ids``, ``encoder_hidden_states``, ``encoder_attention_mask`` ->
  ``logits``, without a cache), Optimum's layout and input names;
- a vision-text model (CLIP, SigLIP, ...) exports both towers together (``zero-shot-image-classification``) or one
  tower alone (``image-feature-extraction``: ``pixel_values`` -> ``image_embeds``; ``text-feature-extraction``:
  ``input_ids`` -> ``text_embeds``);
- the inputs follow from the config, per modality, with the dims named ``batch``, ``sequence``,
  ``decoder_sequence``, ``audio_samples``; images and spectrograms have the fixed size the model was made for:
  token ids and masks (int64, ``[batch, sequence]``, ids below the vocabulary), pixels (float32, ``[batch,
  channels, height, width]`` at the config's image size), raw audio (``[batch, audio_samples]``), log-mel features;
- `limits` says how far each dynamic dim may go (positions the model has: RoBERTa's 130 positions less its padding
  offset of 2 are 128 tokens; the audio a feature encoder needs for one frame), so no profile promises more;
- the outputs are the tensors of the model's output object, with their own names (``logits``, ``last_hidden_state``,
  ``pooler_output``, ``start_logits``, ``pred_boxes``...), the cache off.

Nothing is downloaded: the folder is read with ``local_files_only``, and a checkpoint that lacks weights the task
needs (a base model exported with a classification head) is refused rather than exported with random weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.stage import RecipeMismatch, StageFailed

from .generation import TASK as GENERATION_TASK
from .hf_limits import Limit, _sub, audio_limit, decoder_sequence_limit, sequence_limit
from .hf_tasks import _TOWERS, TASKS, _mapping, supported_tasks, task_of
from .seq2seq import TASKS as SEQ2SEQ_TASKS

#: The parts an encoder-decoder model exports as.
PARTS = ("encoder", "decoder")
#: Input names a wrapped model accepts (keyword arguments of the wrapper's forward, in this order).
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids", "pixel_values", "input_features", "input_values",
               "encoder_hidden_states", "encoder_attention_mask")
_SEQUENCE = 16  # sample sizes of the export (the profiles' sizes are checked too)
_DECODER_SEQUENCE = 8
_AUDIO_SAMPLES = 4000
_DROPPED_OUTPUTS = ("past_key_values", "hidden_states", "attentions", "encoder_hidden_states", "cross_attentions",
                    "decoder_hidden_states", "decoder_attentions", "encoder_attentions", "auxiliary_outputs",
                    "loss", "loss_dict")


@dataclass
class HfModel:
    """What the export stage needs: the module, its inputs (as export ``inputs:`` entries) and output names."""

    module: Any
    task: str
    model_type: str
    inputs: dict[str, dict[str, Any]]
    outputs: list[str] = field(default_factory=list)
    part: str | None = None
    limits: dict[str, Limit] = field(default_factory=dict)
    generation: Any = None  # text-generation-with-past: the formats.generation.GenerationModel
    seq2seq: Any = None  # an encoder-decoder with its cache: the formats.seq2seq.Seq2SeqModel


def read_config(folder: Path) -> dict[str, Any]:
    from .detect import read_json_config

    return read_json_config(folder)


def _size(value: Any) -> tuple[int, int]:
    if isinstance(value, dict):
        if "height" in value and "width" in value:
            return int(value["height"]), int(value["width"])
        edge = value.get("shortest_edge") or value.get("longest_edge")
        return (int(edge), int(edge)) if edge else (224, 224)
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[-1])
    return int(value), int(value)


def _image_size(config: Any, preprocessor: dict[str, Any]) -> tuple[int, int]:
    vision = _sub(config, "vision_config")
    for source in (getattr(vision, "image_size", None), getattr(config, "image_size", None),
                   preprocessor.get("crop_size"), preprocessor.get("size")):
        if source:
            return _size(source)
    return 224, 224


def _text_entries(text: Any, accepts: set[str], limit: Limit, names: tuple[str, str] = ("input_ids", "attention_mask"),
                  dim: str = "sequence", sample: int = _SEQUENCE) -> dict[str, dict[str, Any]]:
    vocab = int(getattr(text, "vocab_size", 2) or 2)
    length = min(sample, limit.high) if limit.high else sample
    axes = {0: "batch", 1: dim}
    entries: dict[str, dict[str, Any]] = {}
    if names[0] in accepts:
        entries[names[0]] = {"shape": [2, length], "dtype": "int64", "dynamic_axes": axes, "low": 0, "high": vocab}
    if names[1] in accepts:
        entries[names[1]] = {"shape": [2, length], "dtype": "int64", "dynamic_axes": axes, "low": 1, "high": 2}
    types = int(getattr(text, "type_vocab_size", 0) or 0)
    if "token_type_ids" in accepts and types > 1 and dim == "sequence":
        entries["token_type_ids"] = {"shape": [2, length], "dtype": "int64", "dynamic_axes": axes, "low": 0,
                                     "high": types}
    return entries


def declared_inputs(config: Any, accepts: set[str], part: str | None = None,
                    preprocessor: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Export ``inputs:`` entries (shape, dtype, dynamic_axes, low, high) for a model of this config."""
    model_type = getattr(config, "model_type", "")
    inputs: dict[str, dict[str, Any]] = {}
    if part == "decoder":
        inputs.update(_text_entries(config, accepts, decoder_sequence_limit(config), dim="decoder_sequence",
                                    sample=_DECODER_SEQUENCE))
        hidden = int(getattr(config, "d_model", 0) or getattr(config, "hidden_size", 0))
        if getattr(config, "max_source_positions", None) and hasattr(config, "num_mel_bins"):
            # Whisper: the encoder's output has a fixed length (its input is always 30 s of log-mel frames)
            inputs["encoder_hidden_states"] = {"shape": [2, int(config.max_source_positions), hidden],
                                               "dtype": "float32", "dynamic_axes": {0: "batch"}, "low": -1.0,
                                               "high": 1.0}
        else:
            length = min(_SEQUENCE, sequence_limit(config).high or _SEQUENCE)
            inputs["encoder_hidden_states"] = {"shape": [2, length, hidden], "dtype": "float32",
                                               "dynamic_axes": {0: "batch", 1: "sequence"}, "low": -1.0, "high": 1.0}
            if "encoder_attention_mask" in accepts:
                inputs["encoder_attention_mask"] = {"shape": [2, length], "dtype": "int64",
                                                    "dynamic_axes": {0: "batch", 1: "sequence"}, "low": 1, "high": 2}
        return inputs
    if "input_features" in accepts and hasattr(config, "num_mel_bins"):
        # Whisper-like: [batch, mel bins, frames], and the frames are fixed (the encoder takes 30 s windows)
        frames = 2 * int(getattr(config, "max_source_positions", 1500))
        inputs["input_features"] = {"shape": [2, int(config.num_mel_bins), frames], "dtype": "float32",
                                    "dynamic_axes": {0: "batch"}, "low": -1.0, "high": 1.0}
    elif "input_values" in accepts and hasattr(config, "num_mel_bins") and hasattr(config, "max_length"):
        # an Audio Spectrogram Transformer: [batch, frames, mel bins], fixed by its position embeddings
        inputs["input_values"] = {"shape": [2, int(config.max_length), int(config.num_mel_bins)],
                                  "dtype": "float32", "dynamic_axes": {0: "batch"}, "low": -1.0, "high": 1.0}
    elif "input_values" in accepts and "pixel_values" not in accepts:
        samples = max(_AUDIO_SAMPLES, audio_limit(config).low)
        inputs["input_values"] = {"shape": [2, samples], "dtype": "float32",
                                  "dynamic_axes": {0: "batch", 1: "audio_samples"}, "low": -1.0, "high": 1.0}
    if "pixel_values" in accepts:
        height, width = _image_size(config, preprocessor or {})
        vision = _sub(config, "vision_config")
        channels = int(getattr(vision, "num_channels", getattr(config, "num_channels", 3)) or 3)
        inputs["pixel_values"] = {"shape": [2, channels, height, width], "dtype": "float32",
                                  "dynamic_axes": {0: "batch"}, "low": 0.0, "high": 1.0}
    if "input_ids" in accepts:
        text = _sub(config, "text_config")
        inputs.update(_text_entries(text, accepts, sequence_limit(config)))
    if not inputs:
        raise StageFailed(f"cannot tell the inputs of a {model_type!r} model (its forward() takes none of "
                          f"{', '.join(INPUT_NAMES)})",
                          hint="write a python: factory for it, with inputs: declared in the recipe")
    return inputs


def limits(config: Any, inputs: dict[str, dict[str, Any]]) -> dict[str, Limit]:
    """The range each dynamic dim of ``inputs`` may take."""
    found: dict[str, Limit] = {}
    dims = {dim for entry in inputs.values() for dim in entry.get("dynamic_axes", {}).values()}
    if "sequence" in dims:
        found["sequence"] = sequence_limit(config)
    if "decoder_sequence" in dims:
        found["decoder_sequence"] = decoder_sequence_limit(config)
    if "audio_samples" in dims:
        found["audio_samples"] = audio_limit(config)
    return found


def default_ranges(found: dict[str, Limit]) -> dict[str, tuple[int, int, int]]:
    """(min, opt, max) that `trtflow init` proposes for each dim other than the batch, within its limit."""
    wanted = {"sequence": (1, 128, 512), "decoder_sequence": (1, 64, 256), "audio_samples": (1600, 16000, 48000)}
    ranges = {}
    for dim, (low, opt, high) in wanted.items():
        if dim not in found:
            continue
        limit = found[dim]
        top = min(high, limit.high) if limit.high else high
        low = max(low, limit.low)
        top = max(top, low)
        ranges[dim] = (low, min(max(opt, low), top), top)
    return ranges


def parts_of(config: Any, task: str) -> tuple[str, ...]:
    """The parts a model exports as: ("encoder", "decoder") for an encoder-decoder, else () (one graph)."""
    if not getattr(config, "is_encoder_decoder", False) or task in _TOWERS:
        return ()
    if task in ("feature-extraction", "text2text-generation", "automatic-speech-recognition", *SEQ2SEQ_TASKS):
        return PARTS
    return ()


def _check_part(task: str, part: str | None, parts: tuple[str, ...]) -> str | None:
    if part is None:
        return parts[0] if parts else None
    if part not in PARTS:
        raise StageFailed(f"part {part!r} is not one of {', '.join(PARTS)}")
    if not parts:
        raise RecipeMismatch(f"part: {part} is for encoder-decoder models; this model exports as one graph for task "
                          f"{task}", hint="leave part out")
    return part


# ---------------------------------------------------------------------------------------------------------
# The wrapped model


def _accepted(function: Any) -> set[str]:
    import inspect

    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return set()
    return {name for name in INPUT_NAMES if name in parameters}


def _wrapper_class() -> Any:
    import torch

    class HfWrapper(torch.nn.Module):
        """The model with named tensor inputs and a tuple of named tensor outputs (no cache, no dicts).

        ``kind``: "model" (the model's forward), "decoder" (an encoder-decoder's decoder and head, fed the
        encoder's hidden states), or a tower ("image-feature-extraction", "text-feature-extraction").
        """

        def __init__(self, model: Any, kind: str, options: dict[str, Any]) -> None:
            super().__init__()
            self.model = model
            self.kind = kind
            self.options = options
            self.output_names: list[str] = []

        def named_outputs(self, given: dict[str, Any]) -> dict[str, Any]:
            given = {k: v for k, v in given.items() if v is not None}
            if self.kind == "decoder":
                mask = given.get("encoder_attention_mask")
                ids = given["input_ids"]
                # a decoder mask of ones: without one, transformers looks for packed sequences (aten::diff)
                result = self.model(decoder_input_ids=ids, decoder_attention_mask=torch.ones_like(ids),
                                    encoder_outputs=(given["encoder_hidden_states"],),
                                    **({"attention_mask": mask} if mask is not None else {}), **self.options)
                drop = {"encoder_last_hidden_state"}
            elif self.kind in _TOWERS:
                method, name, _ = _TOWERS[self.kind]
                result = getattr(self.model, method)(**given)
                if isinstance(result, torch.Tensor):
                    result = {name: result}
                else:  # transformers 5: the tower's output, its pooler_output projected
                    result = {name: result["pooler_output"], "last_hidden_state": result["last_hidden_state"]}
                drop = set()
            else:
                result = self.model(**given, **self.options)
                drop = set()
            return {k: v for k, v in result.items() if isinstance(v, torch.Tensor) and k not in _DROPPED_OUTPUTS
                    and k not in drop}

        def forward(self, input_ids: Any = None, attention_mask: Any = None, token_type_ids: Any = None,
                    pixel_values: Any = None, input_features: Any = None, input_values: Any = None,
                    encoder_hidden_states: Any = None, encoder_attention_mask: Any = None) -> Any:
            outputs = self.named_outputs({
                "input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
                "pixel_values": pixel_values, "input_features": input_features, "input_values": input_values,
                "encoder_hidden_states": encoder_hidden_states, "encoder_attention_mask": encoder_attention_mask})
            return tuple(outputs[name] for name in self.output_names)

    return HfWrapper


def _quiet_transformers() -> Any:
    """transformers with its progress bars and load reports (ANSI-coloured tables) off: we say what matters."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError as error:
        from trtflow.errors import EnvironmentUnavailable

        raise EnvironmentUnavailable("a Hugging Face model folder needs the transformers package, which is not "
                                     "installed here", hint="pip install 'trtflow[huggingface]'") from error
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _preprocessor(folder: Path) -> dict[str, Any]:
    from .detect import read_json_config

    try:
        return read_json_config(folder, "preprocessor_config.json")
    except (OSError, StageFailed):
        return {}


def _auto_for(transformers: Any, config: Any, task: str) -> Any:
    """The Auto class of ``task`` that knows this config's model type; StageFailed naming the tasks it can do."""
    model_type = str(getattr(config, "model_type", ""))
    for auto, constant in TASKS[task].autos:
        if model_type in _mapping(constant):
            return getattr(transformers, auto)
    tasks = supported_tasks(config.to_dict())
    raise RecipeMismatch(f"a {model_type!r} model cannot do task {task!r} (transformers has no {task} model for it)",
                      hint=f"tasks a {model_type!r} model can do: {', '.join(tasks) or 'none that export knows'}")


def _towers_of(model: Any, task: str) -> str:
    """The wrapper kind of a tower task: the tower's method when the model has two towers, else the whole model."""
    method = _TOWERS[task][0]
    return task if hasattr(model, method) and hasattr(model, "get_text_features") else "model"


def _describe(config: Any, model: Any, task: str, part: str | None, preprocessor: dict[str, Any]) -> tuple[
        Any, str, dict[str, dict[str, Any]]]:
    """(the module to wrap, the wrapper kind, its inputs) for a built model."""
    if part == "encoder":
        model = model.get_encoder()
        kind = "model"
        accepts = _accepted(model.forward)
    elif part == "decoder":
        kind = "decoder"
        accepts = {"input_ids", "encoder_hidden_states"}
        if getattr(config, "model_type", "") != "whisper" and "attention_mask" in _accepted(model.forward):
            accepts.add("encoder_attention_mask")
    elif task in _TOWERS:
        kind = _towers_of(model, task)
        accepts = set(_TOWERS[task][2]) if kind != "model" else _accepted(model.forward)
        if kind != "model" and task == "text-feature-extraction":
            accepts &= _accepted(getattr(model, _TOWERS[task][0])) | {"input_ids"}
    else:
        kind = "model"
        accepts = _accepted(model.forward)
    return model, kind, declared_inputs(config, accepts, part, preprocessor)


def describe_folder(folder: Path, task: str | None, part: str | None = None) -> tuple[
        dict[str, dict[str, Any]], dict[str, Limit], str, tuple[str, ...]]:
    """(inputs, limits, task, parts) of a folder's model, built on the meta device (no weights read)."""
    import torch

    _, config, chosen, auto, parts, part = _resolve(folder, task, part)
    with torch.device("meta"):
        model = auto.from_config(config, trust_remote_code=False, attn_implementation="eager")
    _, _, inputs = _describe(config, model, chosen, part, _preprocessor(folder))
    return inputs, limits(config, inputs), chosen, parts


def _resolve(folder: Path, task: str | None, part: str | None) -> tuple[dict[str, Any], Any, str, Any,
                                                                       tuple[str, ...], str | None]:
    """What a folder's model is, from its config.json: (the raw config, transformers' config, the task, the Auto
    class that builds the task's model, the model's parts, the part chosen)."""
    transformers = _quiet_transformers()
    raw = read_config(folder)
    chosen = task_of(raw, task)
    config = _config(transformers, folder)
    auto = _auto_for(transformers, config, chosen)
    parts = parts_of(config, chosen)
    return raw, config, chosen, auto, parts, _check_part(chosen, part, parts)


def _config(transformers: Any, folder: Path) -> Any:
    try:
        return transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except (ValueError, KeyError, OSError) as error:
        raise StageFailed(f"transformers cannot read {folder.name}/config.json: {' '.join(str(error).split())[:300]}",
                          hint="save the model again with save_pretrained, or upgrade transformers if the model "
                          "type is newer than it") from error


def load_model(folder: Path, task: str | None, shown: str, part: str | None = None) -> HfModel:
    """The folder's model (weights from the folder, nothing downloaded) wrapped for export, with its inputs."""
    raw, config, chosen, auto, _, part = _resolve(folder, task, part)
    try:
        model, info = auto.from_pretrained(str(folder), local_files_only=True, attn_implementation="eager",
                                           trust_remote_code=False,
                                           output_loading_info=True)
    except (ValueError, KeyError, OSError, RuntimeError) as error:
        raise StageFailed(f"transformers cannot load {shown!r} for task {chosen}: {' '.join(str(error).split())[:400]}",
                          hint="check config.json's model_type and architectures, or set task: to what the "
                          f"weights are for ({', '.join(supported_tasks(raw))})") from error
    except Exception as error:  # a .bin holding more than tensors: torch's weights_only unpickler refuses it
        if type(error).__name__ != "UnpicklingError":
            raise
        raise StageFailed(f"{shown!r} holds .bin weights with Python objects other than tensors, which torch's "
                          f"weights_only unpickler refuses to load: {' '.join(str(error).split())[:200]}",
                          hint="save the weights as safetensors (model.save_pretrained(folder) writes them)") from error
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        shown_keys = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise RecipeMismatch(f"the weights in {shown!r} lack {len(missing)} tensor(s) that task {chosen} needs "
                          f"({shown_keys}): exported, they would hold random values",
                          hint=f"set task: to what the weights are for (config.json's architectures: "
                          f"{', '.join(raw.get('architectures') or ['none'])}; tasks this model type can do: "
                          f"{', '.join(supported_tasks(raw))})")
    model.eval()
    if chosen == GENERATION_TASK:
        from .generation import wrap

        generation = wrap(model, config)
        return HfModel(generation.module, chosen, str(getattr(config, "model_type", "")), generation.inputs,
                       generation.outputs, generation=generation)
    if chosen in SEQ2SEQ_TASKS:
        from .seq2seq import wrap as wrap_seq2seq

        wrapped = wrap_seq2seq(model, part)
        return HfModel(wrapped.module, chosen, str(getattr(config, "model_type", "")), wrapped.inputs,
                       wrapped.outputs, wrapped.part, seq2seq=wrapped)
    module, kind, inputs = _describe(config, model, chosen, part, _preprocessor(folder))
    import inspect

    options: dict[str, Any] = {"return_dict": True}
    if kind in ("model", "decoder") and "use_cache" in inspect.signature(module.forward).parameters:
        options["use_cache"] = False
    wrapper = _wrapper_class()(module, kind, options).eval()
    wrapper.output_names = _output_names(wrapper, inputs)
    return HfModel(wrapper, chosen, str(getattr(config, "model_type", "")), inputs, list(wrapper.output_names),
                   part, limits(config, inputs))


def _output_names(wrapper: Any, inputs: dict[str, dict[str, Any]]) -> list[str]:
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
    try:
        with torch.no_grad():
            names = list(wrapper.named_outputs(feed))
    except Exception as error:  # the model's own code: any exception type
        shapes = ", ".join(f"{n}{s['shape']}" for n, s in inputs.items())
        raise StageFailed(f"the Hugging Face model fails on a sample input ({shapes}): "
                          f"{type(error).__name__}: {' '.join(str(error).split())[:300]}",
                          hint="give inputs: in the recipe with shapes the model takes") from error
    if not names:
        raise StageFailed("the Hugging Face model returned no tensor output on a sample input")
    return names
