"""An encoder-decoder model (T5, BART, Marian, Whisper, ...) exported for generation with a decoder KV cache.

Two graphs, in Optimum's names:

- the **encoder**: the source (``input_ids`` and ``attention_mask`` ``[batch_size, encoder_sequence_length]``, or
  Whisper's log-mel ``input_features`` ``[batch_size, mel_bins, frames]``) -> ``present.{i}.encoder.key`` /
  ``.value`` ``[batch_size, heads, encoder_sequence_length, head_dim]`` per decoder layer ``i``: the
  cross-attention keys and values, computed once per request;
- the **decoder**: ``input_ids`` ``[batch_size, sequence_length]``, ``encoder_attention_mask`` (text sources),
  ``past_key_values.{i}.decoder.key`` / ``.value`` (the self-attention cache, ``[batch_size, heads,
  past_sequence_length, head_dim]``, empty on the first step) and ``past_key_values.{i}.encoder.key`` / ``.value``
  (the cross-attention cache the encoder returned, constant over the steps) -> ``logits`` and
  ``present.{i}.decoder.key`` / ``.value`` (the self-attention cache grown by the new tokens).

Why this layout rather than Optimum's three graphs (encoder, decoder, decoder with past) or its merged decoder (an
``If`` on ``use_cache_branch``): it is the one `formats.generation` chose for decoder-only models, for the same
reasons. One decoder graph with an empty past on the first step holds one copy of the decoder's weights, builds into
one engine with two optimization profiles (prefill, decode), and has no control flow, which TensorRT handles poorly.
The cross-attention keys and values, which Optimum's decoder-without-past computes on the first step, are computed
by the encoder graph instead (ONNX Runtime's Whisper export does the same, ``WhisperEncoderDecoderInit``): they
depend only on the encoder's output, so the decoder never needs ``encoder_hidden_states`` and never recomputes them.

Both graphs are traced through transformers' own code and cache classes: the encoder runs the model's encoder and
one decoder call on an empty ``EncoderDecoderCache`` (the cross-attention layers fill its cross-attention cache;
the decoder's other work has no output and is dropped from the graph), the decoder gets an ``EncoderDecoderCache``
whose cross-attention cache is filled (transformers then reuses it rather than projecting the encoder's output). The
sizes (layers, heads, head_dim of both caches) are read from the cache the model's own forward() returns.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtflow.stage import StageFailed

from .generation import BATCH, DECODE, PAST, PREFILL, SEQUENCE, TOTAL, cache_keyword, cache_tensors, dynamic_cache

#: Optimum's task names: text sources (T5, BART, Marian, ...), audio sources (Whisper).
TEXT_TASK, SPEECH_TASK = "text2text-generation-with-past", "automatic-speech-recognition-with-past"
TASKS = (TEXT_TASK, SPEECH_TASK)
ENCODER_SEQUENCE = "encoder_sequence_length"
KINDS = ("key", "value")
SIDES = ("decoder", "encoder")  # the self-attention cache, the cross-attention cache (Optimum's names)
_PAST_NAME = re.compile(r"^past_key_values\.(\d+)\.(decoder|encoder)\.(key|value)$")
#: Recorded in both graphs' metadata: the token the decoder starts from.
START_KEY = "decoder_start_token_id"
#: What to do with an encoder-decoder this layout cannot export.
NO_CACHE_HINT = ("export it without a cache: task: text2text-generation (or automatic-speech-recognition), whose "
                 "decoder recomputes the prefix at every step")
#: The sample the graphs are traced at (sizes of 2 or more; past and source of different lengths).
SAMPLE_BATCH, SAMPLE_SEQUENCE, SAMPLE_PAST, SAMPLE_SOURCE = 2, 3, 4, 5


def past_name(layer: int, side: str, kind: str) -> str:
    return f"past_key_values.{layer}.{side}.{kind}"


def present_name(layer: int, side: str, kind: str) -> str:
    return f"present.{layer}.{side}.{kind}"


@dataclass(frozen=True)
class Seq2SeqLayout:
    """The two caches of an encoder-decoder and its source: enough to feed both graphs and size their profiles."""

    layers: int  # decoder layers
    kv_heads: int  # self-attention cache
    head_dim: int
    cross_heads: int  # cross-attention cache
    cross_head_dim: int
    vocab_size: int
    context_length: int  # decoder positions (0: relative positions, no bound)
    source: str  # "input_ids" or "input_features"
    source_length: int  # encoder positions (0: no bound); Whisper: the fixed frames
    mel_bins: int = 0  # input_features only
    encoder_mask: bool = True  # the decoder takes encoder_attention_mask
    decoder_start: int = 0
    dtype: str = "float32"
    seq2seq: bool = True

    @property
    def speech(self) -> bool:
        return self.source == "input_features"

    @property
    def self_names(self) -> list[str]:
        return [past_name(i, "decoder", k) for i in range(self.layers) for k in KINDS]

    @property
    def cross_names(self) -> list[str]:
        return [past_name(i, "encoder", k) for i in range(self.layers) for k in KINDS]

    @property
    def past_names(self) -> list[str]:
        return self.self_names + self.cross_names

    @property
    def present_names(self) -> list[str]:
        return [present_name(i, "decoder", k) for i in range(self.layers) for k in KINDS]

    @property
    def encoder_outputs(self) -> list[str]:
        return [present_name(i, "encoder", k) for i in range(self.layers) for k in KINDS]

    @property
    def encoder_inputs(self) -> list[str]:
        return ["input_features"] if self.speech else ["input_ids", "attention_mask"]

    @property
    def input_names(self) -> list[str]:
        return ["input_ids", *(["encoder_attention_mask"] if self.encoder_mask else []), *self.past_names]

    @property
    def output_names(self) -> list[str]:
        return ["logits", *self.present_names]

    def fixed_source(self) -> int | None:
        """The source length when the encoder takes a fixed one (Whisper's frames), else None."""
        return self.source_length if self.speech else None

    def encoder_length(self, source: int) -> int:
        """The cross-attention cache's length for a source of this length (Whisper's convolutions halve it)."""
        return self.source_length // 2 if self.speech else source

    def encoder_shapes(self, batch: int, source: int) -> dict[str, list[int]]:
        if self.speech:
            return {"input_features": [batch, self.mel_bins, self.source_length]}
        return {"input_ids": [batch, source], "attention_mask": [batch, source]}

    def shapes(self, batch: int, sequence: int, past: int, source: int = SAMPLE_SOURCE) -> dict[str, list[int]]:
        """Every decoder input's shape at these sizes (``source``: the encoder's input length)."""
        encoded = self.encoder_length(source)
        shapes = {"input_ids": [batch, sequence]}
        if self.encoder_mask:
            shapes["encoder_attention_mask"] = [batch, encoded]
        shapes.update({name: [batch, self.kv_heads, past, self.head_dim] for name in self.self_names})
        shapes.update({name: [batch, self.cross_heads, encoded, self.cross_head_dim] for name in self.cross_names})
        return shapes

    def encoder_entries(self, batch: int = SAMPLE_BATCH, source: int = SAMPLE_SOURCE) -> dict[str, dict[str, Any]]:
        """Export ``inputs:`` entries of the encoder graph."""
        if self.speech:
            return {"input_features": {"shape": [batch, self.mel_bins, self.source_length], "dtype": "float32",
                                       "dynamic_axes": {0: BATCH}, "low": -1.0, "high": 1.0}}
        axes = {0: BATCH, 1: ENCODER_SEQUENCE}
        return {"input_ids": {"shape": [batch, source], "dtype": "int64", "dynamic_axes": axes, "low": 0,
                              "high": self.vocab_size},
                "attention_mask": {"shape": [batch, source], "dtype": "int64", "dynamic_axes": axes, "low": 1,
                                   "high": 2}}

    def decoder_entries(self, batch: int = SAMPLE_BATCH, sequence: int = SAMPLE_SEQUENCE, past: int = SAMPLE_PAST,
                        source: int = SAMPLE_SOURCE) -> dict[str, dict[str, Any]]:
        """Export ``inputs:`` entries of the decoder graph."""
        encoded_axes = {0: BATCH} if self.speech else {0: BATCH, 2: ENCODER_SEQUENCE}
        entries: dict[str, dict[str, Any]] = {}
        for name, shape in self.shapes(batch, sequence, past, source).items():
            if name == "input_ids":
                entries[name] = {"shape": shape, "dtype": "int64", "dynamic_axes": {0: BATCH, 1: SEQUENCE},
                                 "low": 0, "high": self.vocab_size}
            elif name == "encoder_attention_mask":
                entries[name] = {"shape": shape, "dtype": "int64", "dynamic_axes": {0: BATCH, 1: ENCODER_SEQUENCE},
                                 "low": 1, "high": 2}
            else:
                axes = {0: BATCH, 2: PAST} if ".decoder." in name else encoded_axes
                entries[name] = {"shape": shape, "dtype": self.dtype, "dynamic_axes": axes, "low": -1.0, "high": 1.0}
        return entries

    def profiles(self, batch: tuple[int, int, int], context: int, prompt_opt: int, source: tuple[int, int, int],
                 past_opt: int | None = None) -> dict[str, dict[str, dict[str, list[int]]]]:
        """The decoder's two optimization profiles (``prefill``: 1 to ``context`` tokens, past 0; ``decode``: one
        token after a past of 1 to ``context - 1``) and the encoder's (``encoder``: sources of ``source`` lengths)."""
        if context < 2 or (self.context_length and context > self.context_length):
            raise StageFailed(f"a decoder context of {context} does not fit the model: it has at most "
                              f"{self.context_length} decoder positions (and generation needs 2 or more)",
                              hint=f"use a context length between 2 and {self.context_length}")
        low, opt, high = batch
        prompt_opt = min(max(prompt_opt, 1), context)
        past_opt = min(max(past_opt if past_opt is not None else prompt_opt, 1), context - 1)

        def profile(*corners: dict[str, list[int]]) -> dict[str, dict[str, list[int]]]:
            return {name: {"min": corners[0][name], "opt": corners[1][name], "max": corners[2][name]}
                    for name in corners[0]}

        return {PREFILL: profile(self.shapes(low, 1, 0, source[0]), self.shapes(opt, prompt_opt, 0, source[1]),
                                 self.shapes(high, context, 0, source[2])),
                DECODE: profile(self.shapes(low, 1, 1, source[0]), self.shapes(opt, 1, past_opt, source[1]),
                                self.shapes(high, 1, context - 1, source[2])),
                "encoder": profile(self.encoder_shapes(low, source[0]), self.encoder_shapes(opt, source[1]),
                                   self.encoder_shapes(high, source[2]))}

    def sources(self, count: int, length: int, seed: int) -> list[Any]:
        """``count`` random sources from ``seed``: ``length`` token ids below the vocabulary, or (Whisper) log-mel
        frames of the fixed length, standard normal (what a feature extractor's normalised output looks like)."""
        import numpy as np

        rng = np.random.default_rng(seed)
        if self.speech:
            return [rng.standard_normal((self.mel_bins, self.source_length)).astype(np.float32)
                    for _ in range(count)]
        return [rng.integers(0, self.vocab_size, size=length, dtype=np.int64) for _ in range(count)]


def _config_int(config: Any, *names: str) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def _model_type(config: Any) -> str:
    return str(getattr(config, "model_type", "?"))


def _source_of(model: Any) -> str:
    import inspect

    parameters = inspect.signature(model.forward).parameters
    if "input_features" in parameters:
        return "input_features"
    if "input_ids" in parameters:
        return "input_ids"
    raise StageFailed(f"the {_model_type(model.config)!r} encoder-decoder takes neither input_ids nor "
                      "input_features (its source is another kind of input)", hint=NO_CACHE_HINT)


def sample_source(model: Any, source: str, batch: int, length: int) -> dict[str, Any]:
    """A source for the model's encoder: token ids (and mask), or Whisper's fixed-length log-mel features."""
    import torch

    config = model.config
    if source == "input_features":
        frames = 2 * _config_int(config, "max_source_positions")
        bins = _config_int(config, "num_mel_bins")
        if not frames or not bins:
            raise StageFailed(f"the {_model_type(config)!r} model's config gives no num_mel_bins or "
                              "max_source_positions: its input features' size is unknown", hint=NO_CACHE_HINT)
        return {"input_features": torch.zeros((batch, bins, frames)).uniform_(-1, 1)}
    ids = torch.ones((batch, length), dtype=torch.long)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def decoder_start(model: Any) -> int | None:
    """The token generation starts the decoder from, as transformers' generate picks it: the generation config's
    ``decoder_start_token_id``, else its ``bos_token_id`` (then the model config's, for a model without one)."""
    for source in (getattr(model, "generation_config", None), model.config):
        for key in (START_KEY, "bos_token_id"):
            value = getattr(source, key, None)
            if isinstance(value, int):
                return value
    return None


def check_encoder_decoder(config: Any) -> None:
    """Refuses, by name, a config that is no encoder-decoder (the seq2seq mappings also hold decoder-only LMs with
    an audio tower)."""
    if not getattr(config, "is_encoder_decoder", False):
        raise StageFailed(f"a {_model_type(config)!r} model is not an encoder-decoder (config.is_encoder_decoder is "
                          f"not set): {TEXT_TASK} exports encoder-decoders",
                          hint="a decoder-only LM: task: text-generation-with-past")


def layout_of(model: Any) -> Seq2SeqLayout:
    """The layout of an encoder-decoder from the cache its own forward() returns (an ``EncoderDecoderCache`` of one
    key and one value per layer in both its caches); refuses any other model by name."""
    import torch

    config = model.config
    check_encoder_decoder(config)
    source = _source_of(model)
    feed = sample_source(model, source, 1, SAMPLE_SOURCE)
    try:
        with torch.no_grad():
            result = model(**feed, decoder_input_ids=torch.zeros((1, 2), dtype=torch.long), use_cache=True,
                           return_dict=True)
    except Exception as error:  # the model's own code: any exception type
        raise StageFailed(f"the {_model_type(config)!r} encoder-decoder fails on a sample source "
                          f"({', '.join(f'{k}{list(v.shape)}' for k, v in feed.items())}): "
                          f"{type(error).__name__}: {' '.join(str(error).split())[:200]}", hint=NO_CACHE_HINT) from None
    cache = result.get("past_key_values", result.get("cache"))
    if type(cache).__name__ != "EncoderDecoderCache":
        raise StageFailed(f"the {_model_type(config)!r} encoder-decoder returns no EncoderDecoderCache (a "
                          f"self-attention and a cross-attention cache) but {type(cache).__name__}",
                          hint=NO_CACHE_HINT)
    shapes = []
    for part in (cache.self_attention_cache, cache.cross_attention_cache):
        layers = list(getattr(part, "layers", []))
        kinds = {type(layer).__name__ for layer in layers}
        found = {(tuple(layer.keys.shape[1::2]), tuple(layer.values.shape[1::2])) for layer in layers
                 if getattr(layer, "keys", None) is not None and layer.keys.ndim == 4}
        if kinds != {"DynamicLayer"} or len(found) != 1:
            raise StageFailed(f"the {_model_type(config)!r} encoder-decoder's cache is not one key and one value "
                              f"of one shape per layer (layers {sorted(kinds)}, shapes {sorted(found)[:3]})",
                              hint=NO_CACHE_HINT)
        (key, value), = found
        if key != value:
            raise StageFailed(f"the {_model_type(config)!r} encoder-decoder caches keys {key} and values {value} "
                              "of different heads or head_dim", hint=NO_CACHE_HINT)
        shapes.append((len(layers), *key))
    (layers, heads, head_dim), (cross_layers, cross_heads, cross_dim) = shapes
    if layers != cross_layers:
        raise StageFailed(f"the {_model_type(config)!r} encoder-decoder has {layers} self-attention and "
                          f"{cross_layers} cross-attention cache layers", hint=NO_CACHE_HINT)
    decoder = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    vocab = int(result["logits"].shape[-1])
    start = decoder_start(model)
    if start is None:
        raise StageFailed(f"the {_model_type(config)!r} model's config gives no decoder_start_token_id or "
                          "bos_token_id (one token the decoder starts from)",
                          hint="set decoder_start_token_id in config.json or generation_config.json")
    if source == "input_features":
        length = 2 * _config_int(config, "max_source_positions")
        mask = False
    else:
        from .hf_limits import sequence_limit

        length = sequence_limit(config).high or 0
        mask = True
    context = _config_int(decoder, "max_target_positions", "max_position_embeddings", "n_positions")
    layout = Seq2SeqLayout(int(layers), int(heads), int(head_dim), int(cross_heads), int(cross_dim), vocab, context,
                           source, int(length), _config_int(config, "num_mel_bins"), mask, int(start))
    _probe_graphs(model, layout, feed)
    return layout


def _probe_graphs(model: Any, layout: Seq2SeqLayout, feed: Mapping[str, Any]) -> None:
    """Both wrapped graphs run once (the encoder, then a decoder step on its cache): a family whose model code
    does not take the layout's inputs (an output object of its own, a cache it keeps elsewhere) is refused here,
    by name, rather than failing inside the exporter."""
    import torch

    encoder_class, decoder_class = wrapper_classes()
    try:
        with torch.no_grad():
            cross = encoder_class(model, layout)(*feed.values())
            own = [torch.zeros((1, layout.kv_heads, 0, layout.head_dim))] * len(layout.self_names)
            mask = [torch.ones((1, cross[0].shape[2]), dtype=torch.long)] if layout.encoder_mask else []
            decoder_class(model, layout)(torch.zeros((1, 1), dtype=torch.long), *mask, *own, *cross)
    except Exception as error:  # the model's own code: any exception type
        raise StageFailed(f"the {_model_type(model.config)!r} encoder-decoder does not run with its caches as "
                          f"inputs: {type(error).__name__}: {' '.join(str(error).split())[:200]}",
                          hint=NO_CACHE_HINT) from None


def layout_from_io(decoder_inputs: Mapping[str, Sequence[Any]], input_types: Mapping[str, str],
                   outputs: Mapping[str, Sequence[Any]], start: int, source: str, source_length: int = 0,
                   mel_bins: int = 0, context_length: int = 0) -> Seq2SeqLayout:
    """The layout of an exported decoder from its inputs' and outputs' names and shapes (ints, or names for dynamic
    dims, as ONNX Runtime reports them) and what the encoder graph says of the source."""
    found = {(int(m.group(1)), m.group(2), m.group(3)) for name in decoder_inputs if (m := _PAST_NAME.match(name))}
    layers = sorted({layer for layer, _, _ in found})
    if not layers or "input_ids" not in decoder_inputs or "logits" not in outputs:
        shown = ", ".join(list(decoder_inputs)[:6]) + (", ..." if len(decoder_inputs) > 6 else "")
        raise StageFailed(f"the model is not an encoder-decoder's decoder exported with its cache (inputs: {shown}); "
                          "it needs input_ids, past_key_values.{i}.decoder/encoder.key/value in and logits, "
                          "present.{i}.decoder.key/value out", hint=f"export the Hugging Face folder with task: "
                          f"{TEXT_TASK} (or {SPEECH_TASK}) and part: decoder")
    missing = [past_name(i, s, k) for i in range(len(layers)) for s in SIDES for k in KINDS
               if (i, s, k) not in found]
    if layers != list(range(len(layers))) or missing:
        raise StageFailed(f"the decoder's past inputs are incomplete (missing {', '.join(missing[:4])})")
    own = list(decoder_inputs[past_name(0, "decoder", "key")])
    cross = list(decoder_inputs[past_name(0, "encoder", "key")])
    if len(own) != 4 or len(cross) != 4 or not all(isinstance(d, int) for d in (own[1], own[3], cross[1], cross[3])):
        raise StageFailed(f"the decoder's past key shapes {own} and {cross} are not [batch, heads, positions, "
                          "head_dim] with fixed heads and head_dim")
    vocab = list(outputs["logits"])[-1]
    if not isinstance(vocab, int):
        raise StageFailed("the logits output has no fixed vocabulary dimension")
    return Seq2SeqLayout(len(layers), int(own[1]), int(own[3]), int(cross[1]), int(cross[3]), int(vocab),
                         context_length, source, source_length, mel_bins, "encoder_attention_mask" in decoder_inputs,
                         start, input_types.get(past_name(0, "decoder", "key"), "float32"))


# ---------------------------------------------------------------------------------------------------------
# The PyTorch side: the two graphs wrapped for export


def encoder_decoder_cache(own: Sequence[Any], cross: Sequence[Any]) -> Any:
    """An ``EncoderDecoderCache`` of a self-attention cache ``own`` and a filled cross-attention cache ``cross``
    (key, value per layer, flat); transformers marks each cross-attention layer as computed, so it is reused."""
    from transformers import EncoderDecoderCache

    return EncoderDecoderCache(dynamic_cache(own), dynamic_cache(cross))


def wrapper_classes() -> tuple[Any, Any]:
    import torch
    from transformers.modeling_outputs import BaseModelOutput

    class EncoderWrapper(torch.nn.Module):
        """forward(source...) -> (cross key, cross value, ... per decoder layer)."""

        def __init__(self, model: Any, layout: Seq2SeqLayout) -> None:
            super().__init__()
            self.model = model
            self.layout = layout
            self.keyword = cache_keyword(model)

        def forward(self, *tensors: Any) -> Any:
            from transformers import DynamicCache, EncoderDecoderCache

            feed = dict(zip(self.layout.encoder_inputs, tensors, strict=True))
            encoded = self.model.get_encoder()(**feed, return_dict=True)[0]
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            start = torch.zeros((encoded.shape[0], 1), dtype=torch.long, device=encoded.device)
            options = {"attention_mask": feed["attention_mask"]} if "attention_mask" in feed else {}
            # one decoder step on an empty cache: its cross-attention layers fill the cross-attention cache (what
            # the graph returns); the step's other work reaches no output and is dropped from the graph
            self.model(encoder_outputs=BaseModelOutput(last_hidden_state=encoded), decoder_input_ids=start,
                       decoder_attention_mask=torch.ones_like(start), use_cache=True, return_dict=True,
                       **{self.keyword: cache}, **options)
            return tuple(cache_tensors(cache.cross_attention_cache))

    class DecoderWrapper(torch.nn.Module):
        """forward(input_ids, [encoder_attention_mask,] self past..., cross past...) -> (logits, self present...)."""

        def __init__(self, model: Any, layout: Seq2SeqLayout) -> None:
            super().__init__()
            self.model = model
            self.layout = layout
            self.keyword = cache_keyword(model)
            self.hidden = _config_int(model.config, "d_model", "hidden_size")

        def forward(self, *tensors: Any) -> Any:
            ids, rest = tensors[0], tensors[1:]
            options: dict[str, Any] = {}
            if self.layout.encoder_mask:
                options["attention_mask"], rest = rest[0], rest[1:]
            count = 2 * self.layout.layers
            own, cross = rest[:count], rest[count:]
            # the encoder's output is not read (the cross-attention cache is), only its batch and length
            encoded = cross[0].new_zeros((cross[0].shape[0], cross[0].shape[2], self.hidden))
            past = own[0].shape[2]
            mask = torch.ones((ids.shape[0], past + ids.shape[1]), dtype=torch.long, device=ids.device)
            result = self.model(decoder_input_ids=ids, decoder_attention_mask=mask,
                                encoder_outputs=BaseModelOutput(last_hidden_state=encoded),
                                use_cache=True, return_dict=True,
                                **{self.keyword: encoder_decoder_cache(own, cross)}, **options)
            cache = result.get("past_key_values", result.get("cache"))
            return (result["logits"], *cache_tensors(cache.self_attention_cache))

    return EncoderWrapper, DecoderWrapper


@dataclass
class Seq2SeqModel:
    """One wrapped graph (``part``: encoder or decoder), the Hugging Face model (the reference) and the layout."""

    module: Any
    model: Any
    layout: Seq2SeqLayout
    part: str
    inputs: dict[str, dict[str, Any]]
    outputs: list[str]

    @property
    def metadata(self) -> dict[str, str]:
        """What both graphs record in their ONNX metadata (read back by `runtimes.seq2seq`)."""
        layout = self.layout
        return {START_KEY: str(layout.decoder_start), "trtflow.seq2seq.source": layout.source,
                "trtflow.seq2seq.source_length": str(layout.source_length),
                "trtflow.seq2seq.mel_bins": str(layout.mel_bins),
                "trtflow.seq2seq.context_length": str(layout.context_length)}


def wrap(model: Any, part: str | None, layout: Seq2SeqLayout | None = None) -> Seq2SeqModel:
    """The encoder-decoder ``model`` wrapped as one of its two graphs (default: the encoder)."""
    layout = layout or layout_of(model)
    encoder_class, decoder_class = wrapper_classes()
    if part in (None, "encoder"):
        return Seq2SeqModel(encoder_class(model, layout).eval(), model, layout, "encoder", layout.encoder_entries(),
                            layout.encoder_outputs)
    return Seq2SeqModel(decoder_class(model, layout).eval(), model, layout, "decoder", layout.decoder_entries(),
                        layout.output_names)


def name_output_dims(path: Any, wrapped: Seq2SeqModel) -> None:
    """Name the exported outputs' dynamic dims as Optimum does, and record the metadata (`Seq2SeqModel.metadata`)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    layout = wrapped.layout
    encoded = None if layout.speech else ENCODER_SEQUENCE
    names: dict[str, tuple[str | None, ...]] = {"logits": (BATCH, SEQUENCE, None)}
    names.update({name: (BATCH, None, TOTAL, None) for name in layout.present_names})
    names.update({name: (BATCH, None, encoded, None) for name in layout.encoder_outputs})
    for output in model.graph.output:
        for dim, name in zip(output.type.tensor_type.shape.dim, names.get(output.name, ()), strict=False):
            if name is not None and not dim.HasField("dim_value"):
                dim.dim_param = name
    kept = {p.key: p.value for p in model.metadata_props if p.key not in wrapped.metadata}
    del model.metadata_props[:]
    for key, value in {**kept, **wrapped.metadata}.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))
