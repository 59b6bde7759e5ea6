"""A causal language model exported for generation with a KV cache, in the layout Hugging Face Optimum uses.

The task ``text-generation-with-past`` (Optimum's name) exports one ONNX model whose inputs are

- ``input_ids`` ``[batch_size, sequence_length]`` (int64, ids below the vocabulary size);
- ``attention_mask`` ``[batch_size, past_sequence_length + sequence_length]`` (int64, 1 = attend);
- ``position_ids`` ``[batch_size, sequence_length]`` (int64), where the model's forward() takes them;
- ``past_key_values.{i}.key`` / ``.value`` ``[batch_size, num_key_value_heads, past_sequence_length, head_dim]``
  per decoder layer ``i`` (grouped-query attention: fewer key/value heads than query heads);

and whose outputs are ``logits`` ``[batch_size, sequence_length, vocab_size]`` and ``present.{i}.key`` / ``.value``
``[batch_size, num_key_value_heads, past_sequence_length + sequence_length, head_dim]``: the cache to feed back.

One model serves both phases of generation: *prefill* runs the prompt with a past of length 0 (an empty tensor),
*decode* runs one token with the past of the steps before. Optimum also offers two graphs (a decoder without past
and one with past) or a merged model that switches between them with an ``If`` node; one graph with an empty past
is the simplest of the three that TensorRT builds well: one copy of the weights, one engine with two
optimization profiles (prefill: long sequences, past 0; decode: sequence 1, long pasts; TensorRT-LLM's context and
generation phases), and no control flow, which TensorRT handles poorly.

transformers 5 keeps the cache in a ``DynamicCache`` object, which an exporter cannot take as an input: the export
wrapper builds one from the flat past tensors (one ``DynamicLayer`` per decoder layer, filled directly, so an empty
past is an empty tensor rather than transformers' uninitialised layer) and returns the updated cache's tensors
flat. Models with a sliding-window attention are exported as full attention, which equals theirs while the whole
sequence fits the window: the context length is capped at the window.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from trtflow.stage import RecipeMismatch, StageFailed

TASK = "text-generation-with-past"
BATCH = "batch_size"
SEQUENCE = "sequence_length"
PAST = "past_sequence_length"
TOTAL = f"{PAST} + {SEQUENCE}"
PREFILL, DECODE = "prefill", "decode"
KINDS = ("key", "value")
T = TypeVar("T")
_PAST_NAME = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
#: The sample the model is traced at: sizes of 2 or more (a size of 1 hides broadcasting from the tracer), a past
#: and a sequence of different lengths (a mix-up of the two shows).
SAMPLE_BATCH, SAMPLE_SEQUENCE, SAMPLE_PAST = 2, 4, 3


def past_name(layer: int, kind: str) -> str:
    return f"past_key_values.{layer}.{kind}"


def present_name(layer: int, kind: str) -> str:
    return f"present.{layer}.{kind}"


@dataclass(frozen=True)
class KvLayout:
    """The shape of a model's cache and what its inputs are: enough to feed it and to size its profiles."""

    layers: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int  # positions the model can attend over (past + sequence)
    position_ids: bool = True
    dtype: str = "float32"  # of the past inputs

    @property
    def past_names(self) -> list[str]:
        return [past_name(i, k) for i in range(self.layers) for k in KINDS]

    @property
    def present_names(self) -> list[str]:
        return [present_name(i, k) for i in range(self.layers) for k in KINDS]

    @property
    def input_names(self) -> list[str]:
        return ["input_ids", "attention_mask", *(["position_ids"] if self.position_ids else []), *self.past_names]

    @property
    def output_names(self) -> list[str]:
        return ["logits", *self.present_names]

    def input_entries(self, batch: int = SAMPLE_BATCH, sequence: int = SAMPLE_SEQUENCE,
                      past: int = SAMPLE_PAST) -> dict[str, dict[str, Any]]:
        """Export ``inputs:`` entries (shape, dtype, dynamic_axes, low, high) with this sample."""
        text = {0: BATCH, 1: SEQUENCE}
        entries: dict[str, dict[str, Any]] = {
            "input_ids": {"shape": [batch, sequence], "dtype": "int64", "dynamic_axes": text, "low": 0,
                          "high": self.vocab_size},
            "attention_mask": {"shape": [batch, past + sequence], "dtype": "int64",
                               "dynamic_axes": {0: BATCH, 1: TOTAL}, "low": 1, "high": 2},
        }
        if self.position_ids:
            entries["position_ids"] = {"shape": [batch, sequence], "dtype": "int64", "dynamic_axes": text,
                                       "low": 0, "high": self.context_length}
        for name in self.past_names:
            entries[name] = {"shape": [batch, self.kv_heads, past, self.head_dim], "dtype": self.dtype,
                             "dynamic_axes": {0: BATCH, 2: PAST}, "low": -1.0, "high": 1.0}
        return entries

    def shapes(self, batch: int, sequence: int, past: int) -> dict[str, list[int]]:
        """Every input's shape at these sizes."""
        shapes = {"input_ids": [batch, sequence], "attention_mask": [batch, past + sequence]}
        if self.position_ids:
            shapes["position_ids"] = [batch, sequence]
        shapes.update({name: [batch, self.kv_heads, past, self.head_dim] for name in self.past_names})
        return shapes

    def profiles(self, batch: tuple[int, int, int], context: int, prompt_opt: int,
                 past_opt: int | None = None) -> dict[str, dict[str, dict[str, list[int]]]]:
        """Two optimization profiles in disjoint shape regimes, each with its own opt: ``prefill`` (a prompt of 1 to
        ``context`` tokens, past 0, opt ``prompt_opt``) and ``decode`` (one token after a past of 1 to
        ``context - 1``, opt ``past_opt``, default ``prompt_opt``)."""
        if context < 2 or (self.context_length and context > self.context_length):
            raise StageFailed(f"a context length of {context} does not fit the model: it attends over at most "
                              f"{self.context_length} positions (and generation needs 2 or more)",
                              hint=f"use a context length between 2 and {self.context_length}")
        low, opt, high = batch
        prompt_opt = min(max(prompt_opt, 1), context)
        past_opt = min(max(past_opt if past_opt is not None else prompt_opt, 1), context - 1)
        prefill = {name: {"min": a, "opt": b, "max": c} for name, a, b, c in _zip_shapes(
            self.shapes(low, 1, 0), self.shapes(opt, prompt_opt, 0), self.shapes(high, context, 0))}
        decode = {name: {"min": a, "opt": b, "max": c} for name, a, b, c in _zip_shapes(
            self.shapes(low, 1, 1), self.shapes(opt, 1, past_opt), self.shapes(high, 1, context - 1))}
        return {PREFILL: prefill, DECODE: decode}


def _zip_shapes(*shapes: Mapping[str, list[int]]) -> list[tuple[str, list[int], list[int], list[int]]]:
    return [(name, shapes[0][name], shapes[1][name], shapes[2][name]) for name in shapes[0]]


#: What to do with a model whose cache this layout cannot hold.
NO_CACHE_HINT = ("export the plain forward pass instead: task: text-generation (no cache; `trtflow init FOLDER "
                 "--task text-generation` writes that recipe)")
#: The config fields that bound the positions a model attends over (a position table, RoPE's trained length).
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "max_seq_len", "n_ctx",
                  "seq_length")
#: transformers' cache layers that hold one key and one value tensor per decoder layer ([batch, heads, positions,
#: head_dim]): what this layout exports. Others (state-space, linear-attention and hybrid layers, indexers) are not.
ATTENTION_LAYERS = ("DynamicLayer", "DynamicSlidingWindowLayer")


def context_limit(config: Any) -> int:
    """Positions the model attends over: its position table (or RoPE's trained length), capped by a sliding
    window (exported as full attention, which equals the window's while the sequence fits in it); 0 where the config
    sets no bound (ALiBi models such as BLOOM have no position table: the recipe's profiles set the context)."""
    limit = next((getattr(config, key) for key in CONTEXT_FIELDS if isinstance(getattr(config, key, None), int)
                  and getattr(config, key) > 0), 0)
    window = getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", True) is False:
        window = None
    if isinstance(window, int) and window > 0:
        limit = min(int(limit), window) if limit else window
    return int(limit)


def _field(config: Any, name: str) -> Any:
    """A config field, or None where the config has none (or answers only per layer)."""
    try:
        return getattr(config, name, None)
    except Exception:  # transformers' heterogeneous configs raise their own error for a per-layer field
        return None


def _model_type(config: Any) -> str:
    return str(getattr(config, "model_type", "?"))


def cache_layer_kinds(config: Any) -> set[str]:
    """The kinds of cache layer transformers builds for this config (``DynamicCache(config=...)``, the cache
    generate() makes): one per decoder layer."""
    from transformers import DynamicCache

    try:
        return {type(layer).__name__ for layer in DynamicCache(config=config).layers}
    except Exception as error:  # a config transformers' cache cannot read: any exception type
        raise StageFailed(f"transformers cannot build the cache of this {_model_type(config)!r} model: "
                          f"{type(error).__name__}: {' '.join(str(error).split())[:200]}",
                          hint=NO_CACHE_HINT) from None


def kv_heads_of(text: Any) -> int:
    """Key/value heads the cache holds by the config's rule (a cross-check of `model_layout`, which reads them from
    the model). Falcon's flags: its new decoder architecture caches its ``num_kv_heads`` (transformers 5.25; 5.24
    broadcast them to every query head first), and ``multi_query`` (the older architecture, and GPTBigCode's) caches
    one, ``multi_query: false`` one per query head (Falcon: its ``num_kv_heads``); elsewhere transformers'
    ``num_key_value_heads`` (grouped-query attention; 1 is multi-query), else one per query head."""
    heads = int(text.num_attention_heads)
    if _field(text, "new_decoder_architecture"):
        kv = _field(text, "num_kv_heads")
        return kv if isinstance(kv, int) and kv > 0 else heads
    if isinstance(_field(text, "multi_query"), bool):  # Falcon's older architecture, GPTBigCode
        kv = _field(text, "num_kv_heads")
        return 1 if text.multi_query else kv if isinstance(kv, int) and kv > 0 else heads
    kv = _field(text, "num_key_value_heads")
    return kv if isinstance(kv, int) and kv > 0 else heads


def head_dims_of(text: Any) -> tuple[int, int]:
    """The key's and the value's head_dim: the config's ``head_dim`` (a field, or a property such as Falcon's), else
    hidden_size / heads; multi-head latent attention (DeepSeek-V2/V3, MiniCPM3) caches keys of ``qk_nope_head_dim +
    qk_rope_head_dim`` and values of ``v_head_dim``."""
    key = _field(text, "head_dim") or _field(text, "dim_head") or text.hidden_size // text.num_attention_heads
    if isinstance(_field(text, "qk_rope_head_dim"), int):
        key = int(_field(text, "qk_nope_head_dim") or 0) + int(text.qk_rope_head_dim)
    value = _field(text, "v_head_dim") or key
    return int(key), int(value)


def layout_of(config: Any, takes_position_ids: bool) -> KvLayout:
    """The config's rule, a cross-check of `model_layout` only (what a model caches is read from its forward()): the
    cache layout of a decoder-only model of this config, from its own fields (transformers' names and the
    aliases its configs map: n_layer, n_head, ...) and the cache transformers builds for it; refuses a model whose
    cache is not one key and one value of the same shape per layer."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    # a heterogeneous config (per-layer heads) answers per layer only: transformers' per_layer_config
    try:
        configs = list(_field(text, "per_layer_config") or []) or [text]
    except Exception:  # a config without num_hidden_layers: refused below
        configs = [text]
    layers = _field(text, "num_hidden_layers")
    heads = _field(configs[0], "num_attention_heads")
    hidden = _field(configs[0], "hidden_size")
    try:
        kinds = cache_layer_kinds(text)
    except StageFailed:
        kinds = set(ATTENTION_LAYERS) if layers and heads and hidden else {"no layer transformers can build"}
    others = sorted(kinds - set(ATTENTION_LAYERS))
    if others:
        raise StageFailed(f"the {_model_type(config)!r} model keeps a cache of {', '.join(others)} (state-space, "
                          "linear-attention or hybrid layers), not one key and one value per layer, the layout "
                          f"{TASK} exports", hint=NO_CACHE_HINT)
    if not (layers and heads and hidden):
        raise StageFailed(f"cannot tell the cache layout of a {_model_type(config)!r} model: its "
                          "config gives no num_hidden_layers, num_attention_heads or hidden_size",
                          hint=NO_CACHE_HINT)
    shapes = {(kv_heads_of(c), *head_dims_of(c)) for c in configs}
    if len(shapes) > 1:
        raise StageFailed(f"the {_model_type(config)!r} model's layers cache keys and values of different shapes "
                          f"({sorted(shapes)}); {TASK} exports one shape for every layer",
                          hint=NO_CACHE_HINT)
    kv_heads, key_dim, value_dim = shapes.pop()
    if key_dim != value_dim or _field(text, "kv_lora_rank"):
        raise StageFailed(f"the {_model_type(config)!r} model caches keys of head_dim {key_dim} and values of "
                          f"{value_dim}, or a compressed latent (multi-head latent attention); {TASK} exports one "
                          "head_dim for both, per key/value head",
                          hint=NO_CACHE_HINT)
    return KvLayout(int(layers), kv_heads, key_dim, int(text.vocab_size), context_limit(text), takes_position_ids)


def sdpa_else_eager(build: Callable[[str], T]) -> T:
    """``build(attention)`` with PyTorch's scaled-dot-product attention, or transformers' eager attention where it
    has no SDPA one for this model type. The attention is always named by trtflow: a config's own choice (a Hub
    kernel) is never fetched."""
    try:
        return build("sdpa")
    except ValueError as error:  # this model type has no SDPA attention in transformers
        if "sdpa" not in str(error).lower() and "scaled_dot_product" not in str(error).lower():
            raise
        return build("eager")


def model_layout(model: Any) -> tuple[KvLayout, str | None]:
    """The cache layout of a decoder-only model as its own forward() returns it for a two-token prompt (on the
    model's device; weights may be uninitialised: only shapes are read): layers, key/value heads and head_dim from
    the cache it returns, the vocabulary from its logits, the context from its config. The config's rule
    (`layout_of`) is a cross-check only: transformers releases change how a family caches (5.25 caches Falcon's
    ``num_kv_heads`` where 5.24 broadcast them to every query head), so where the rule disagrees, the model wins and
    the second value says how they differ (None where they agree). Refuses a model whose cache is not one key and
    one value of one shape per layer."""
    config = model.config
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    takes_position_ids = "position_ids" in inspect.signature(model.forward).parameters
    try:
        rule: KvLayout | str = layout_of(config, takes_position_ids)
    except StageFailed as error:
        if "keeps a cache of" in error.message:  # transformers' own cache for the config says so
            raise
        rule = error.message
    layers, heads, head_dim, vocab = _probe(model, takes_position_ids)
    layout = KvLayout(layers, heads, head_dim, vocab, context_limit(text), takes_position_ids)
    return layout, _disagreement(rule, layout)


def _probe(model: Any, takes_position_ids: bool) -> tuple[int, int, int, int]:
    """(layers, key/value heads, head_dim, vocabulary) of the cache and logits the model's forward() returns."""
    import torch

    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    ids = torch.ones((1, 2), dtype=torch.long, device=device)
    options: dict[str, Any] = {"position_ids": torch.arange(2, device=device).unsqueeze(0)} \
        if takes_position_ids else {}
    try:
        with torch.no_grad():
            result = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, return_dict=True,
                           **options)
    except Exception as error:  # the model's own code: any exception type
        raise StageFailed(f"the {_model_type(model.config)!r} model fails on a two-token prompt: "
                          f"{type(error).__name__}: {' '.join(str(error).split())[:200]}", hint=NO_CACHE_HINT) from None
    cache = result.get("past_key_values", result.get("cache"))
    if cache is not None and not hasattr(cache, "layers") and not isinstance(cache, (tuple, list)):
        raise StageFailed(f"the {_model_type(model.config)!r} model returns a {type(cache).__name__}, not one cache "
                          "of one key and one value per layer (an encoder-decoder's or a decoder's with "
                          "cross-attention)", hint=NO_CACHE_HINT)
    kinds = sorted({type(layer).__name__ for layer in getattr(cache, "layers", [])} - set(ATTENTION_LAYERS))
    if kinds:
        raise StageFailed(f"the {_model_type(model.config)!r} model keeps a cache of {', '.join(kinds)} "
                          "(state-space, linear-attention or hybrid layers), not one key and one value per layer, "
                          f"the layout {TASK} exports", hint=NO_CACHE_HINT)
    tensors = cache_tensors(cache) if cache is not None else []
    shapes = {(t.shape[1], t.shape[3]) if getattr(t, "ndim", 0) == 4 else tuple(getattr(t, "shape", ()))
              for t in tensors}
    if not tensors or len(tensors) % 2 or len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise StageFailed(f"the {_model_type(model.config)!r} model's forward() returns no cache of one key and one "
                          f"value [batch, heads, positions, head_dim] of one shape per layer (shapes "
                          f"{sorted({tuple(getattr(t, 'shape', ())) for t in tensors})[:4]})",
                          hint=NO_CACHE_HINT)
    heads, head_dim = shapes.pop()
    return len(tensors) // 2, int(heads), int(head_dim), int(result["logits"].shape[-1])


def _disagreement(rule: KvLayout | str, model: KvLayout) -> str | None:
    """How the config's rule differs from what the model caches, in words; None where they agree."""
    if isinstance(rule, str):
        return f"the config's fields do not give the cache layout ({rule}); it is read from the model"
    fields = [(name, getattr(rule, key), getattr(model, key)) for name, key in
              (("layers", "layers"), ("key/value heads", "kv_heads"), ("head_dim", "head_dim"),
               ("vocabulary", "vocab_size"))]
    differ = [f"{name} {ours} by the config's fields, {theirs} in the model's cache" for name, ours, theirs in fields
              if ours != theirs]
    return "; ".join(differ) or None


def layout_from_io(inputs: Mapping[str, Sequence[Any]], input_types: Mapping[str, str],
                   outputs: Mapping[str, Sequence[Any]], context_length: int | None = None) -> KvLayout:
    """The layout of an exported model from its inputs' and outputs' names and shapes (ints, or names for dynamic
    dims), as ONNX Runtime or onnx report them; refuses a model that is not in this layout."""
    layers = sorted({int(m.group(1)) for name in inputs if (m := _PAST_NAME.match(name))})
    missing = [name for name in ("input_ids", "attention_mask") if name not in inputs]
    if not layers or missing or "logits" not in outputs:
        shown = ", ".join(list(inputs)[:6]) + (", ..." if len(inputs) > 6 else "")
        raise StageFailed(f"the model is not a causal LM exported with a KV cache (inputs: {shown}); generation needs "
                          "input_ids, attention_mask, past_key_values.{i}.key/value in and logits, "
                          "present.{i}.key/value out",
                          hint=f"export the Hugging Face folder with task: {TASK}")
    if layers != list(range(len(layers))):
        raise StageFailed(f"the past inputs number layers {layers}, not 0..{len(layers) - 1}")
    first = list(inputs[past_name(0, "key")])
    if len(first) != 4 or not isinstance(first[1], int) or not isinstance(first[3], int):
        raise StageFailed(f"past_key_values.0.key has shape {first}; expected [batch_size, num_key_value_heads, "
                          "past_sequence_length, head_dim] with fixed heads and head_dim")
    for name in (past_name(i, k) for i in layers for k in KINDS):
        if name not in inputs:
            raise StageFailed(f"the model has no input {name!r}: every layer needs a past key and value")
    vocab = list(outputs["logits"])[-1]
    if not isinstance(vocab, int):
        raise StageFailed("the logits output has no fixed vocabulary dimension")
    dtype = input_types.get(past_name(0, "key"), "float32")
    return KvLayout(len(layers), int(first[1]), int(first[3]), int(vocab), context_length or 0,
                    "position_ids" in inputs, dtype)


def check_profiles(profiles: Sequence[Any], layout: KvLayout | None = None) -> None:
    """Each profile of a KV-cache model must keep ``attention_mask`` as long as past + sequence at min, opt and max,
    and (with ``layout``) stay within the context length. Without ``layout``, profiles that shape no past (another
    kind of model) are left alone."""
    for profile in profiles:
        shapes = profile.shapes
        if layout is None and past_name(0, "key") not in shapes:
            continue
        needed = [n for n in ("input_ids", "attention_mask", past_name(0, "key")) if n not in shapes]
        if needed:
            raise StageFailed(f"profile {profile.name!r} gives no shapes for {', '.join(needed)}",
                              hint="give every input of the model min/opt/max shapes (trtflow init writes them)")
        if layout is not None:
            _check_cache_sizes(profile, layout)
        for pick in ("min", "opt", "max"):
            sequence = getattr(shapes["input_ids"], pick)[1]
            past = getattr(shapes[past_name(0, "key")], pick)[2]
            mask = getattr(shapes["attention_mask"], pick)[1]
            if mask != past + sequence:
                raise StageFailed(
                    f"profile {profile.name!r}: at {pick}, attention_mask is {mask} long but the past ({past}) and "
                    f"the sequence ({sequence}) make {past + sequence}",
                    hint="attention_mask covers the past and the new tokens: its length must be "
                    "past_sequence_length + sequence_length in min, opt and max")
            if layout is not None and layout.context_length and mask > layout.context_length:
                raise StageFailed(
                    f"profile {profile.name!r}: at {pick}, past + sequence = {mask} exceeds the model's context "
                    f"length {layout.context_length}", hint=f"keep past + sequence <= {layout.context_length}")


def _check_cache_sizes(profile: Any, layout: KvLayout) -> None:
    """Every past input of the profile holds the model's key/value heads and head_dim at min, opt and max."""
    for name in layout.past_names:
        for pick in ("min", "opt", "max"):
            shape = list(getattr(profile.shapes[name], pick)) if name in profile.shapes else None
            if shape is not None and (len(shape) != 4 or shape[1] != layout.kv_heads or shape[3] != layout.head_dim):
                raise RecipeMismatch(
                    f"profile {profile.name!r}: {name} at {pick} is {shape}, but the model caches "
                    f"[batch, {layout.kv_heads} key/value heads, positions, head_dim {layout.head_dim}]",
                    hint=f"give {name} {layout.kv_heads} heads and head_dim {layout.head_dim} in every profile "
                    "(`trtflow init` writes them from the model)")


# ---------------------------------------------------------------------------------------------------------
# The PyTorch side: the model wrapped for export


def cache_keyword(model: Any) -> str:
    """The name under which the model's forward() takes the cache (transformers 5.40 renames it to ``cache``)."""
    parameters = inspect.signature(model.forward).parameters
    return "past_key_values" if "past_key_values" in parameters else "cache"


def dynamic_cache(past: Sequence[Any]) -> Any:
    """A ``DynamicCache`` holding ``past`` (key, value, key, value, ... per layer), an empty past included."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache()
    layers = []
    for index in range(0, len(past), 2):
        layer = DynamicLayer()
        layer.keys, layer.values = past[index], past[index + 1]
        layer.device, layer.dtype, layer.is_initialized = past[index].device, past[index].dtype, True
        layers.append(layer)
    cache.layers = layers
    return cache


def cache_tensors(cache: Any) -> list[Any]:
    """The tensors of a cache object (a ``DynamicCache`` or a legacy tuple of pairs), flat: key, value per layer."""
    if hasattr(cache, "layers"):
        return [t for layer in cache.layers for t in (layer.keys, layer.values)]
    return [t for pair in cache for t in pair[:2]]


def wrapper_class() -> Any:
    import torch

    class KvWrapper(torch.nn.Module):
        """forward(input_ids, attention_mask, [position_ids,] past key, past value, ...) -> (logits, present key,
        present value, ...): flat tensors in and out, the cache object built and taken apart inside."""

        def __init__(self, model: Any, layout: KvLayout) -> None:
            super().__init__()
            self.model = model
            self.layout = layout
            self.cache_keyword = cache_keyword(model)

        def forward(self, *tensors: Any) -> Any:
            ids, mask = tensors[0], tensors[1]
            rest = tensors[2:]
            options: dict[str, Any] = {}
            if self.layout.position_ids:
                options["position_ids"], rest = rest[0], rest[1:]
            options[self.cache_keyword] = dynamic_cache(rest)
            result = self.model(input_ids=ids, attention_mask=mask, use_cache=True, return_dict=True, **options)
            cache = result.get("past_key_values", result.get("cache"))
            return (result["logits"], *cache_tensors(cache))

    return KvWrapper


@dataclass
class GenerationModel:
    """The wrapped model, its layout, and the Hugging Face model itself (the reference for greedy generation)."""

    module: Any
    model: Any
    layout: KvLayout
    inputs: dict[str, dict[str, Any]]
    outputs: list[str]
    rule_disagrees: str | None = None  # how the config's rule differs from the model's cache (`model_layout`)


def wrap(model: Any, config: Any) -> GenerationModel:
    """The causal LM ``model`` wrapped for export with its cache as flat inputs and outputs."""
    parameters = inspect.signature(model.forward).parameters
    if "past_key_values" not in parameters and "cache" not in parameters:
        raise StageFailed(f"the {getattr(config, 'model_type', '?')!r} model's forward() takes no cache "
                          "(past_key_values)", hint=NO_CACHE_HINT)
    if getattr(config, "is_encoder_decoder", False):
        raise StageFailed(f"{TASK} exports decoder-only models; this {config.model_type!r} model is an "
                          "encoder-decoder", hint="task: text2text-generation-with-past (Whisper and other speech "
                          "models: automatic-speech-recognition-with-past) exports its encoder and its decoder with "
                          "the KV cache")
    layout, disagrees = model_layout(model)
    module = wrapper_class()(model, layout).eval()
    return GenerationModel(module, model, layout, layout.input_entries(), layout.output_names, disagrees)


def name_output_dims(path: Any, layout: KvLayout) -> None:
    """Name the exported outputs' dynamic dims as Optimum does (the TorchScript exporter names only the inputs' and
    makes up the outputs', e.g. ``MatMullogits_dim_0``): logits ``[batch_size, sequence_length, vocab]``, each present
    ``[batch_size, heads, past_sequence_length + sequence_length, head_dim]``."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    names: dict[str, tuple[str | None, ...]] = {"logits": (BATCH, SEQUENCE, None)}
    names.update({name: (BATCH, None, TOTAL, None) for name in layout.present_names})
    for output in model.graph.output:
        wanted = names.get(output.name)
        if wanted is None:
            continue
        for dim, name in zip(output.type.tensor_type.shape.dim, wanted, strict=False):
            if name is not None and not dim.HasField("dim_value"):
                dim.dim_param = name
    onnx.save(model, str(path))


def export_checks(sample: Mapping[str, Sequence[int]], profiles: Sequence[Any], layout: KvLayout) -> list[Any]:
    """The shapes an exported KV-cache model is checked at: the sample's, then each profile's min, opt and max (its
    sizes move together: attention_mask stays past + sequence); without profiles, a prompt with an empty past and
    a one-token step after a past (the two phases of generation)."""
    from .torch_check import CheckShape

    checks = [CheckShape({name: list(shape) for name, shape in sample.items()})]
    seen = [checks[0].shapes]
    for profile in profiles:
        for pick in ("min", "opt", "max"):
            shapes = {name: list(getattr(profile.shapes[name], pick)) for name in sample if name in profile.shapes}
            if shapes not in seen:
                seen.append(shapes)
                checks.append(CheckShape(shapes, origin=f"profile {profile.name} {pick}"))
    if not profiles:
        prefill = layout.shapes(1, SAMPLE_SEQUENCE, 0)
        decode = layout.shapes(1, 1, min(SAMPLE_SEQUENCE + 1, max(layout.context_length - 1, 1)))
        checks += [CheckShape(prefill, origin="prefill (past 0)"), CheckShape(decode, origin="decode (one token)")]
    return checks
