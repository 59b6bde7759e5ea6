"""How far a Hugging Face model's dynamic dims may go: tokens (its position table, less RoBERTa's padding offset),
decoder tokens, raw audio (a convolutional feature encoder's receptive field). `formats.huggingface` proposes and
checks profiles with them; `formats.seq2seq` bounds an encoder-decoder's source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Model types whose position ids start after the padding index (RoBERTa's ``create_position_ids_from_input_ids``):
#: they take ``max_position_embeddings - pad_token_id - 1`` tokens.
_PADDING_OFFSET_TYPES = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text", "longformer",
                         "ibert", "luke", "mpnet", "markuplm", "roberta-prelayernorm", "xmod", "bridgetower",
                         "lilt", "layoutlmv3", "ernie_m", "esm", "clap")


@dataclass(frozen=True)
class Limit:
    """How small and how large a dynamic dim may be, and why (for a message)."""

    low: int
    high: int | None
    why: str


def _sub(config: Any, name: str) -> Any:
    """A sub-config (``text_config``, ``vision_config``) if the model has one, else the config itself."""
    sub = getattr(config, name, None)
    return sub if sub is not None and not isinstance(sub, dict) else config


def sequence_limit(config: Any) -> Limit:
    """How many tokens a text model takes: its position embeddings (less RoBERTa's padding offset), if any."""
    text = _sub(config, "text_config")
    model_type = str(getattr(text, "model_type", "") or getattr(config, "model_type", ""))
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "n_ctx"):
        value = getattr(text, key, None)
        if isinstance(value, int) and value > 0:
            if model_type in _PADDING_OFFSET_TYPES:
                offset = int(getattr(text, "pad_token_id", 1) or 0) + 1
                return Limit(1, value - offset, f"{key} {value} less the padding offset {offset} (position ids "
                             "start after the padding index)")
            return Limit(1, value, f"{key} {value}")
    return Limit(1, None, "relative positions: no fixed limit")


def decoder_sequence_limit(config: Any) -> Limit:
    for key in ("max_target_positions", "max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return Limit(1, value, f"{key} {value}")
    return Limit(1, None, "relative positions: no fixed limit")


def audio_limit(config: Any) -> Limit:
    """The shortest raw audio a convolutional feature encoder (wav2vec2, HuBERT, WavLM...) turns into one frame."""
    kernels = getattr(config, "conv_kernel", None)
    strides = getattr(config, "conv_stride", None)
    if not kernels or not strides:
        return Limit(1, None, "no feature encoder")
    field_size, step = 1, 1
    for kernel, stride in zip(kernels, strides, strict=False):
        field_size += (int(kernel) - 1) * step
        step *= int(stride)
    return Limit(field_size, None, f"the feature encoder's receptive field (conv_kernel {list(kernels)}, "
                 f"conv_stride {list(strides)}) is {field_size} samples")
