"""Generation with a KV cache: decoders that run one prefill or decode step, and the greedy loop over them.

A *decoder* runs a model exported with its cache (`formats.generation`'s layout) or a Hugging Face model, one step
at a time, without state of its own: ``prefill(ids)`` runs a prompt with an empty past, ``step(tokens, cache)``
runs one token per sequence after the cache of the steps before; each returns the last position's logits and the
cache to feed back. Being stateless, one decoder serves several requests at once (an ONNX Runtime session's run is
thread-safe). `greedy` runs prompt -> N tokens, each token the argmax of the logits (or a forced token, for
teacher forcing: the candidate is fed the reference's tokens so that its logits stay comparable at every step),
and notes when each token became known on the host (the time a client would see it).

- `OrtDecoder`: an ONNX model through an ONNX Runtime session (its past inputs in their own dtype);
- `TorchDecoder`: a Hugging Face causal LM in PyTorch (CPU or CUDA), its cache a ``DynamicCache``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..formats.generation import KvLayout, layout_from_io

_NUMPY_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16",
                "tensor(double)": "float64"}


class Decoder(Protocol):
    """One prefill or decode step of a causal LM; logits and cache in the decoder's own types."""

    layout: KvLayout

    def prefill(self, ids: Any) -> tuple[Any, Any]: ...

    def step(self, tokens: Any, cache: Any) -> tuple[Any, Any]: ...

    def pick(self, logits: Any) -> Any: ...

    def numpy(self, logits: Any) -> Any: ...


class OrtDecoder:
    """An ONNX model with a KV cache run by an ONNX Runtime session (shared by threads: it keeps no state)."""

    def __init__(self, session: Any, context_length: int | None = None) -> None:
        import numpy as np

        self.session = session
        inputs = {i.name: list(i.shape) for i in session.get_inputs()}
        types = {i.name: _NUMPY_TYPES.get(i.type, "float32") for i in session.get_inputs()}
        outputs = {o.name: list(o.shape) for o in session.get_outputs()}
        self.layout = layout_from_io(inputs, types, outputs, context_length)
        self.past_dtype = np.dtype(self.layout.dtype) if self.layout.dtype != "bfloat16" else np.dtype("float32")
        self.output_names = self.layout.output_names
        self.int_type = {i.name: i.type for i in session.get_inputs()}

    def _run(self, ids: Any, past: Sequence[Any], past_length: int) -> tuple[Any, Any]:
        import numpy as np

        batch, sequence = ids.shape
        feed = {"input_ids": ids.astype(self._int("input_ids")),
                "attention_mask": np.ones((batch, past_length + sequence), dtype=self._int("attention_mask"))}
        if self.layout.position_ids:
            positions = np.arange(past_length, past_length + sequence, dtype=self._int("position_ids"))
            feed["position_ids"] = np.broadcast_to(positions, (batch, sequence)).copy()
        feed.update(zip(self.layout.past_names, past, strict=True))
        logits, *present = self.session.run(self.output_names, feed)
        return logits[:, -1, :], (present, past_length + sequence)

    def _int(self, name: str) -> str:
        return "int32" if self.int_type.get(name) == "tensor(int32)" else "int64"

    def prefill(self, ids: Any) -> tuple[Any, Any]:
        import numpy as np

        empty = np.zeros((ids.shape[0], self.layout.kv_heads, 0, self.layout.head_dim), dtype=self.past_dtype)
        return self._run(ids, [empty] * len(self.layout.past_names), 0)

    def step(self, tokens: Any, cache: Any) -> tuple[Any, Any]:
        past, length = cache
        return self._run(tokens.reshape(-1, 1), past, length)

    def pick(self, logits: Any) -> Any:
        return logits.argmax(axis=-1)

    def numpy(self, logits: Any) -> Any:
        return logits.astype("float32")


class TorchDecoder:
    """A Hugging Face causal LM in PyTorch, on ``device``; its cache a ``DynamicCache`` (transformers' own)."""

    def __init__(self, model: Any, layout: KvLayout, device: str = "cpu") -> None:
        from ..formats.generation import cache_keyword

        self.model = model.to(device).eval()
        self.layout = layout
        self.device = device
        self.keyword = cache_keyword(model)

    def _run(self, ids: Any, cache: Any, past_length: int) -> tuple[Any, Any]:
        import torch

        batch, sequence = ids.shape
        options: dict[str, Any] = {self.keyword: cache}
        if self.layout.position_ids:
            positions = torch.arange(past_length, past_length + sequence, device=self.device)
            options["position_ids"] = positions.unsqueeze(0).expand(batch, sequence)
        mask = torch.ones((batch, past_length + sequence), dtype=torch.int64, device=self.device)
        with torch.inference_mode():
            result = self.model(input_ids=ids, attention_mask=mask, use_cache=True, return_dict=True, **options)
        new_cache = result.get("past_key_values", result.get("cache"))
        return result["logits"][:, -1, :], (new_cache, past_length + sequence)

    def prefill(self, ids: Any) -> tuple[Any, Any]:
        import torch
        from transformers import DynamicCache

        tensor = torch.as_tensor(ids, dtype=torch.int64, device=self.device)
        return self._run(tensor, DynamicCache(), 0)

    def step(self, tokens: Any, cache: Any) -> tuple[Any, Any]:
        import torch

        past, length = cache
        tensor = torch.as_tensor(tokens, dtype=torch.int64, device=self.device).reshape(-1, 1)
        return self._run(tensor, past, length)

    def pick(self, logits: Any) -> Any:
        return logits.argmax(dim=-1).cpu().numpy()  # the copy to the host waits for the GPU

    def numpy(self, logits: Any) -> Any:
        return logits.float().cpu().numpy()


@dataclass
class GreedyRun:
    """One greedy generation: the tokens (``[batch, new_tokens]``), the logits each was chosen from (``[batch,
    new_tokens, vocab]``, when kept) and when each token was known on the host (ms from the start)."""

    tokens: Any
    logits: Any | None
    token_times_ms: list[float] = field(default_factory=list)

    @property
    def first_token_ms(self) -> float:
        return self.token_times_ms[0]

    @property
    def per_token_ms(self) -> float | None:
        """Mean time per output token after the first (None with one token)."""
        times = self.token_times_ms
        return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None


def greedy(decoder: Decoder, prompt: Any, new_tokens: int, forced: Any = None, keep_logits: bool = True,
           clock: Callable[[], int] = time.perf_counter_ns) -> GreedyRun:
    """``new_tokens`` tokens after ``prompt`` (``[batch, length]`` int ids), each the argmax of the last logits; with
    ``forced`` (``[batch, new_tokens]``) each step is fed the forced token instead (teacher forcing) while the
    argmax is still recorded."""
    import numpy as np

    if new_tokens < 1:
        raise ValueError("new_tokens must be >= 1")
    start = clock()
    logits, cache = decoder.prefill(prompt)
    tokens: list[Any] = []
    kept: list[Any] = []
    times: list[float] = []
    for index in range(new_tokens):
        chosen = decoder.pick(logits)
        times.append((clock() - start) / 1e6)
        tokens.append(chosen)
        if keep_logits:
            kept.append(decoder.numpy(logits))
        if index + 1 == new_tokens:
            break
        feed = forced[:, index] if forced is not None else chosen
        logits, cache = decoder.step(np.asarray(feed, dtype=np.int64), cache)
    return GreedyRun(np.stack(tokens, axis=1), np.stack(kept, axis=1) if keep_logits else None, times)
