"""Generation on PyTorch: a Hugging Face causal LM with a static KV cache, its decode step replayed as a CUDA graph.

`StaticDecoder` is a `runtimes.generation.Decoder` (prefill, step, pick, numpy) over the model itself, in the dtype
it was loaded in (fp32, fp16, bf16), on the CPU or a CUDA GPU:

- **static cache**: each request writes its keys and values into a ``StaticCache`` (transformers' own) of
  ``max_length`` positions allocated once, so every decode step has the same shapes and addresses;
- **the mask**: a ``[batch, max_length]`` padding mask (1 up to the current position) built on the device from the
  step's position, from which transformers builds the model's own attention mask (causal, sliding windows); with a
  static cache transformers never reads the mask's values on the host for a decode step, so a step makes no host
  synchronisation (`host_syncs` counts them; a test holds every family to zero);
- **CUDA graphs** (on a CUDA device, ``cuda_graphs=True``): the decode step of each cache slot is captured once
  (`torch.cuda.CUDAGraph`) and replayed; a step is then one graph launch instead of hundreds of kernel launches from
  Python, so time per token no longer depends on the host. Capture is tried per slot; a model whose step cannot be
  captured (an operation that waits for the host) runs the same step eagerly, and `describe` says why.

Why a hand-captured graph rather than ``torch.compile(mode="reduce-overhead")``: compiling takes tens of seconds per
model and dtype (Inductor and Triton on the benchmark's machine) and its guards recompile on new shapes; the
capture takes one warm-up step, replays exactly the eager kernels (the figures are the model's, not a compiler's),
and fails loudly where the model synchronises, which is the thing a benchmark should know.

Requests in flight at once each need their own cache: the decoder keeps a pool of *slots* per batch size (a cache,
the step's input buffers, its graph); `prefill` takes a free slot (or makes one) and the request's state gives it
back when it is dropped (its last reference, at the end of `runtimes.generation.greedy`). `warm` makes and captures
the slots a benchmark needs before it is timed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.stage import StageFailed

from ..formats.generation import KvLayout

#: The dtypes a PyTorch generation backend runs in (the recipe's names).
DTYPES = ("float32", "float16", "bfloat16")
#: Operators that make the host wait for the device (a value read back): none may run in a decode step.
SYNC_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.is_nonzero", "aten.equal", "aten.item")
#: Eager steps run on a side stream before a capture (what torch.cuda.graphs asks for: lazy initialisations).
WARMUP_STEPS = 2


def torch_dtype(name: str) -> Any:
    import torch

    if name not in DTYPES:
        raise StageFailed(f"torch_dtype {name!r} is not one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def load_causal_lm(folder: Path, dtype: str, device: str, shown: str) -> Any:
    """The causal LM of a Hugging Face folder (weights from the folder, nothing downloaded, no code of its own run)
    in ``dtype`` on ``device``, with PyTorch's scaled-dot-product attention where transformers has it for this
    model (else its eager attention)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    def load(attention: str) -> Any:
        return transformers.AutoModelForCausalLM.from_pretrained(
            str(folder), local_files_only=True, dtype=torch_dtype(dtype), attn_implementation=attention,
            trust_remote_code=False)

    from ..formats.generation import sdpa_else_eager

    try:
        model = sdpa_else_eager(load)
    except (ValueError, KeyError, OSError, RuntimeError) as error:
        raise StageFailed(f"transformers cannot load {shown!r} as a causal LM: {' '.join(str(error).split())[:400]}",
                          hint="give a Hugging Face folder of a decoder-only model (config.json and safetensors "
                          "weights, as save_pretrained writes them)") from error
    return model.to(device=device, dtype=torch_dtype(dtype)).eval()  # transformers 4 reads `dtype` as torch_dtype


def prepare_model(model: Any, dtype: str, device: str) -> Any:
    """A model from a ``python:`` factory, moved to ``dtype`` and ``device``; refused unless it is a transformers
    causal LM (a ``config`` and a forward() that takes a cache)."""
    from ..formats.generation import cache_keyword

    if not hasattr(model, "config") or cache_keyword(model) not in _parameters(model):
        raise StageFailed(f"the torch_model factory returned a {type(model).__name__}, not a Hugging Face causal LM "
                          "whose forward() takes a cache (past_key_values)",
                          hint="return e.g. transformers.AutoModelForCausalLM.from_config(config), or give hf_model: "
                          "a Hugging Face folder")
    return model.to(device=device, dtype=torch_dtype(dtype)).eval()


def _parameters(model: Any) -> set[str]:
    import inspect

    return set(inspect.signature(model.forward).parameters)


@dataclass
class _Slot:
    """One request's room: its cache, the decode step's input buffers and, once captured, the step's graph."""

    batch: int
    cache: Any
    ids: Any        # [batch, 1] int64: the token fed to the decode step
    position: Any   # [1] int64: the position it is written at
    graph: Any = None
    logits: Any = None  # the graph's output buffer
    eager_reason: str | None = None


@dataclass
class _Request:
    """What `StaticDecoder.prefill` hands out as the cache: a slot, held until this object is dropped."""

    decoder: StaticDecoder
    slot: _Slot
    length: int
    released: bool = field(default=False)

    def __del__(self) -> None:
        if not self.released:
            self.released = True
            self.decoder._release(self.slot)


class StaticDecoder:
    """A Hugging Face causal LM on ``device`` with a static cache of ``max_length`` positions; on CUDA with
    ``cuda_graphs``, each decode step replayed as a CUDA graph. A `runtimes.generation.Decoder`."""

    def __init__(self, model: Any, layout: KvLayout, device: str, max_length: int, cuda_graphs: bool = True) -> None:
        import torch

        from ..formats.generation import cache_keyword

        if max_length < 2:
            raise StageFailed(f"a static cache of {max_length} position(s) cannot hold a prompt and a token")
        if layout.context_length and max_length > layout.context_length:
            raise StageFailed(f"a static cache of {max_length} positions exceeds the model's context of "
                              f"{layout.context_length}", hint=f"keep context_length + new_tokens <= "
                              f"{layout.context_length}")
        self.model = model.eval()
        self.layout = layout
        self.device = device
        self.max_length = max_length
        self.dtype = next(model.parameters()).dtype
        self.graphs_asked = cuda_graphs
        self.cuda_graphs = cuda_graphs and device.startswith("cuda")
        self.keyword = cache_keyword(model)
        accepted = _parameters(model)
        self.takes = {name for name in ("position_ids", "cache_position", "logits_to_keep") if name in accepted}
        self.attention = str(getattr(model.config, "_attn_implementation", None) or "eager")
        self._arange = torch.arange(max_length, device=device)
        self._free: dict[int, list[_Slot]] = {}
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()

    # -- the Decoder protocol ------------------------------------------------------------------------------
    def prefill(self, ids: Any) -> tuple[Any, Any]:
        import torch

        tensor = torch.as_tensor(ids, dtype=torch.int64).to(self.device)
        batch, length = tensor.shape
        if length + 1 > self.max_length:
            raise StageFailed(f"a prompt of {length} tokens leaves no room for a new token in a static cache of "
                              f"{self.max_length} positions")
        slot = self._take(batch)
        logits = self._prefill(slot, tensor)
        return logits, _Request(self, slot, length)

    def step(self, tokens: Any, cache: Any) -> tuple[Any, Any]:
        import torch

        request: _Request = cache
        slot = request.slot
        if request.length + 1 > self.max_length:
            raise StageFailed(f"the static cache of {self.max_length} positions is full",
                              hint="give the decoder a max_length of the prompt's length + new tokens")
        host = torch.as_tensor(tokens, dtype=torch.int64).reshape(slot.batch, 1)
        slot.ids.copy_(host, non_blocking=False)
        slot.position.fill_(request.length)
        if slot.graph is None and self.cuda_graphs and slot.eager_reason is None:
            self._capture(slot)
        if slot.graph is not None:
            slot.graph.replay()
            logits = slot.logits
        else:
            with torch.inference_mode():
                logits = self._decode(slot)
        request.length += 1
        return logits, request

    def pick(self, logits: Any) -> Any:
        return logits.argmax(dim=-1).cpu().numpy()  # the copy to the host waits for the GPU

    def numpy(self, logits: Any) -> Any:
        return logits.float().cpu().numpy()

    # -- slots ---------------------------------------------------------------------------------------------
    def warm(self, count: int, batch: int = 1) -> None:
        """Make ``count`` slots of ``batch`` and capture their decode steps now (a benchmark does this before it
        times, so no capture lands in a timed request): a short prompt is run once on each."""
        import numpy as np

        held = []
        prompt = np.zeros((batch, 1), dtype=np.int64)
        for _ in range(count):
            logits, request = self.prefill(prompt)
            self.step(self.pick(logits), request)
            held.append(request)  # held, so that the next prefill makes another slot
        del held

    def describe(self) -> dict[str, Any]:
        """How this decoder runs: dtype, attention, cache, CUDA graphs and why not where they are off."""
        reasons = sorted({s.eager_reason for s in self._slots if s.eager_reason})
        captured = sum(s.graph is not None for s in self._slots)
        info: dict[str, Any] = {"dtype": str(self.dtype).removeprefix("torch."), "device": self.device,
                                "attention": self.attention, "cache": f"static ({self.max_length} positions)",
                                "cuda_graphs": bool(self.cuda_graphs and captured and not reasons),
                                "slots": len(self._slots), "captured_slots": captured}
        if not self.cuda_graphs:
            info["cuda_graphs_off"] = "not asked" if not self.graphs_asked else "not on a CUDA device"
        elif reasons:
            info["cuda_graphs_off"] = "; ".join(reasons)
        return info

    def _take(self, batch: int) -> _Slot:
        with self._lock:
            free = self._free.setdefault(batch, [])
            if free:
                return free.pop()
        import inspect

        import torch
        from transformers import StaticCache

        sizes: dict[str, Any] = {}
        if "max_batch_size" in inspect.signature(StaticCache.__init__).parameters:  # transformers 4 allocates eagerly
            sizes = {"max_batch_size": batch, "device": self.device, "dtype": self.dtype}
        cache = StaticCache(config=self.model.config, max_cache_len=self.max_length, **sizes)
        slot = _Slot(batch, cache, torch.zeros((batch, 1), dtype=torch.int64, device=self.device),
                     torch.zeros((1,), dtype=torch.int64, device=self.device))
        with self._lock:
            self._slots.append(slot)
        return slot

    def _release(self, slot: _Slot) -> None:
        with self._lock:
            self._free.setdefault(slot.batch, []).append(slot)

    # -- the model's calls ---------------------------------------------------------------------------------
    def _call(self, slot: _Slot, ids: Any, positions: Any, mask: Any) -> Any:
        options: dict[str, Any] = {self.keyword: slot.cache}
        if "position_ids" in self.takes:
            options["position_ids"] = positions.unsqueeze(0).expand(slot.batch, -1)
        if "cache_position" in self.takes:
            options["cache_position"] = positions
        if "logits_to_keep" in self.takes:
            options["logits_to_keep"] = 1
        result = self.model(input_ids=ids, attention_mask=mask, use_cache=True, return_dict=True, **options)
        return result["logits"][:, -1, :]

    def _prefill(self, slot: _Slot, ids: Any) -> Any:
        import torch

        length = ids.shape[1]
        with torch.inference_mode():
            slot.cache.reset()  # the layers' own write positions back to 0 (the old values are masked and overwritten)
            mask = (self._arange < length).to(torch.int64).unsqueeze(0).expand(slot.batch, -1)
            return self._call(slot, ids, self._arange[:length], mask)

    def _decode(self, slot: _Slot) -> Any:
        """One decode step from the slot's buffers: everything on the device, nothing read back (capturable)."""
        import torch

        mask = (self._arange <= slot.position).to(torch.int64).unsqueeze(0).expand(slot.batch, -1)
        return self._call(slot, slot.ids, slot.position, mask)

    def _capture(self, slot: _Slot) -> None:
        """Capture the slot's decode step as a CUDA graph; on failure the slot steps eagerly and says why. The
        warm-up steps write the cache past the request's position (masked, overwritten by the real steps), and the
        layers' write positions are put back before the first replay."""
        import torch

        counters = _write_positions(slot.cache)
        saved = [c.clone() for c in counters]
        position = slot.position.clone()
        try:
            with torch.inference_mode():
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(WARMUP_STEPS):
                        self._decode(slot)
                torch.cuda.current_stream().wait_stream(side)
                for counter, value in zip(counters, saved, strict=True):
                    counter.copy_(value)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    logits = self._decode(slot)
            slot.graph, slot.logits = graph, logits
        except Exception as error:  # the model's code during capture: any exception type
            slot.graph = None
            slot.eager_reason = f"capture failed: {type(error).__name__}: {' '.join(str(error).split())[:200]}"
            torch.cuda.synchronize()
        finally:
            with torch.inference_mode():  # the cache's tensors were made in inference mode
                for counter, value in zip(counters, saved, strict=True):
                    counter.copy_(value)
            slot.position.copy_(position)


def _write_positions(cache: Any) -> list[Any]:
    """The tensors in which a static cache's layers keep their next write position (transformers 5), if any."""
    import torch

    found = []
    for layer in getattr(cache, "layers", []):
        counter = getattr(layer, "cumulative_length", None)
        if isinstance(counter, torch.Tensor):
            found.append(counter)
    return found


@contextmanager
def counting_syncs() -> Iterator[dict[str, int]]:
    """Counts the operators run inside the block that make the host wait for the device (`SYNC_OPS`), by name; the
    check that a decode step can be captured, on any device (a CPU run counts the same operators)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: dict[str, int] = {}

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = str(func.overloadpacket)
            if name in SYNC_OPS:
                counts[name] = counts.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    with _Count():
        yield counts


def open_decoder(model: Any, device: str, max_length: int, cuda_graphs: bool, slots: int) -> StaticDecoder:
    """A `StaticDecoder` over ``model`` (already in its dtype on ``device``) with ``slots`` cache slots made and,
    on CUDA with ``cuda_graphs``, their decode steps captured: ready to be timed."""
    from ..formats.generation import model_layout

    layout = model_layout(model)[0]
    decoder = StaticDecoder(model, layout, device, max_length, cuda_graphs)
    decoder.warm(slots)
    return decoder
