"""Generation with an encoder-decoder's two graphs (`formats.seq2seq`): a decoder for `runtimes.generation.greedy`.

``prefill(source)`` runs the encoder once (the source: token ids ``[batch, length]`` or Whisper's log-mel features
``[batch, mel_bins, frames]``), which returns the cross-attention cache, then the decoder on the start token with an
empty self-attention cache; ``step(tokens, cache)`` runs one decoder step with both caches (the cross-attention one
unchanged). The time to the first token therefore includes the encoder, as a client sees it. Stateless, like every
decoder of `runtimes.generation`: one serves several requests at once.

- `OrtSeq2SeqDecoder`: both graphs through ONNX Runtime sessions (the encoder may be a function instead: the export
  check feeds the PyTorch encoder's cache to the exported decoder).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..formats.seq2seq import START_KEY, Seq2SeqLayout, layout_from_io

_NUMPY_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16",
                "tensor(double)": "float64"}


def _metadata(session: Any) -> dict[str, str]:
    try:
        return dict(session.get_modelmeta().custom_metadata_map)
    except Exception:  # a session without metadata: any exception type of the binding
        return {}


def session_layout(decoder: Any, encoder: Any | None, need_start: bool = True) -> Seq2SeqLayout:
    """The layout of an exported decoder session, with what the graphs' metadata say of the source (the decoder's
    own metadata first; a conversion may drop it: the encoder's, exported alongside, then). ``need_start`` False:
    timing only, any start token will do (0 where neither graph records one)."""
    from trtflow.stage import StageFailed

    meta = {**(_metadata(encoder) if encoder is not None else {}), **_metadata(decoder)}
    if START_KEY not in meta and not need_start:
        meta[START_KEY] = "0"
    if START_KEY not in meta:
        raise StageFailed("neither graph records the decoder's start token (metadata decoder_start_token_id): they "
                          "were not exported by trtflow's encoder-decoder export",
                          hint="export both parts with task: text2text-generation-with-past (or "
                          "automatic-speech-recognition-with-past)")
    inputs = {i.name: list(i.shape) for i in decoder.get_inputs()}
    types = {i.name: _NUMPY_TYPES.get(i.type, "float32") for i in decoder.get_inputs()}
    outputs = {o.name: list(o.shape) for o in decoder.get_outputs()}
    return layout_from_io(inputs, types, outputs, int(meta[START_KEY]),
                          meta.get("trtflow.seq2seq.source", "input_ids"),
                          int(meta.get("trtflow.seq2seq.source_length", 0) or 0),
                          int(meta.get("trtflow.seq2seq.mel_bins", 0) or 0),
                          int(meta.get("trtflow.seq2seq.context_length", 0) or 0))


def ort_encoder(session: Any) -> Callable[[Any], list[Any]]:
    """The encoder session as a function: source -> its outputs (the cross-attention cache, flat)."""
    names = [i.name for i in session.get_inputs()]
    types = {i.name: i.type for i in session.get_inputs()}

    def encode(source: Any) -> list[Any]:
        import numpy as np

        if "input_features" in names:
            feed = {"input_features": source.astype(np.float16 if types["input_features"] == "tensor(float16)"
                                                    else np.float32)}
        else:
            feed = {"input_ids": source.astype(np.int64), "attention_mask": np.ones(source.shape, dtype=np.int64)}
        return list(session.run(None, feed))

    return encode


def synthetic_encoder(layout: Seq2SeqLayout, session: Any, seed: int = 0) -> Callable[[Any], list[Any]]:
    """A stand-in for the encoder when only the decoder ``session`` is timed (select's finalists, time per output
    token): a cross-attention cache of the right shape (the decoder's own fixed length where it has one, as
    Whisper's), random values (a decoder step's time does not depend on them)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    shape = next(list(i.shape) for i in session.get_inputs() if i.name == layout.cross_names[0])
    fixed = shape[2] if isinstance(shape[2], int) else None

    def encode(source: Any) -> list[Any]:
        length = fixed or layout.encoder_length(source.shape[-1])
        shape = (source.shape[0], layout.cross_heads, length, layout.cross_head_dim)
        return [rng.standard_normal(shape).astype(np.float32) for _ in layout.cross_names]

    return encode


class OrtSeq2SeqDecoder:
    """An exported decoder (ONNX Runtime) fed the cross-attention cache of an encoder (a function of the source)."""

    def __init__(self, session: Any, encode: Callable[[Any], list[Any]], layout: Seq2SeqLayout) -> None:
        import numpy as np

        self.session = session
        self.encode = encode
        self.layout = layout
        self.past_dtype = np.dtype(layout.dtype) if layout.dtype != "bfloat16" else np.dtype("float32")
        self.output_names = layout.output_names

    @classmethod
    def from_sessions(cls, decoder: Any, encoder: Any) -> OrtSeq2SeqDecoder:
        return cls(decoder, ort_encoder(encoder), session_layout(decoder, encoder))

    def _run(self, ids: Any, own: list[Any], cross: list[Any], mask: Any, past: int) -> tuple[Any, Any]:
        feed: dict[str, Any] = {"input_ids": ids.astype("int64")}
        if self.layout.encoder_mask:
            feed["encoder_attention_mask"] = mask
        feed.update(zip(self.layout.self_names, own, strict=True))
        feed.update(zip(self.layout.cross_names, cross, strict=True))
        logits, *present = self.session.run(self.output_names, feed)
        return logits[:, -1, :], (present, cross, mask, past + ids.shape[1])

    def prefill(self, source: Any) -> tuple[Any, Any]:
        import numpy as np

        cross = [np.asarray(t).astype(self.past_dtype) for t in self.encode(source)]
        batch, length = cross[0].shape[0], cross[0].shape[2]
        mask = np.ones((batch, length), dtype=np.int64)
        empty = np.zeros((batch, self.layout.kv_heads, 0, self.layout.head_dim), dtype=self.past_dtype)
        start = np.full((batch, 1), self.layout.decoder_start, dtype=np.int64)
        return self._run(start, [empty] * len(self.layout.self_names), cross, mask, 0)

    def step(self, tokens: Any, cache: Any) -> tuple[Any, Any]:
        own, cross, mask, past = cache
        return self._run(tokens.reshape(-1, 1), own, cross, mask, past)

    def pick(self, logits: Any) -> Any:
        return logits.argmax(axis=-1)

    def numpy(self, logits: Any) -> Any:
        return logits.astype("float32")


def torch_encoder(module: Any) -> Callable[[Any], list[Any]]:
    """The PyTorch encoder graph (`formats.seq2seq` EncoderWrapper) as a function: source -> cross-attention cache."""

    def encode(source: Any) -> list[Any]:
        import numpy as np
        import torch

        if module.layout.speech:
            tensors = [torch.from_numpy(np.asarray(source, dtype=np.float32))]
        else:
            ids = torch.from_numpy(np.asarray(source, dtype=np.int64))
            tensors = [ids, torch.ones_like(ids)]
        with torch.inference_mode():
            return [t.numpy() for t in module(*tensors)]

    return encode


def open_decoder(session: Any, encoder: Any | None = None) -> Any:
    """The decoder of an exported model: an encoder-decoder's (`OrtSeq2SeqDecoder`, fed by the ``encoder`` session)
    or a decoder-only model's (`runtimes.generation.OrtDecoder`); an encoder-decoder's decoder without its encoder
    is refused by name."""
    from trtflow.stage import StageFailed

    from .generation import OrtDecoder

    seq2seq = any(".decoder.key" in i.name for i in session.get_inputs())
    if seq2seq and encoder is None:
        raise StageFailed("the model is an encoder-decoder's decoder: generating with it needs its encoder, which "
                          "computes the cross-attention cache", hint="wire the encoder's export node as the "
                          "`encoder` input (`trtflow init` writes it)")
    if encoder is not None and not seq2seq:
        raise StageFailed("an `encoder` input is wired but the model is no encoder-decoder's decoder (it takes no "
                          "past_key_values.{i}.decoder/encoder inputs)", hint="remove the `encoder` input")
    return OrtSeq2SeqDecoder.from_sessions(session, encoder) if seq2seq else OrtDecoder(session)
