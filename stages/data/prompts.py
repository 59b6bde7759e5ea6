"""Prompts for generation: token-id sequences from a seeded random generator or from a file.

A generation check or benchmark needs prompts, not tensors: each prompt is a sequence of token ids (no tokenizer is
involved: the ids are what a tokenizer would produce). ``random`` prompts are ``count`` sequences of ``length`` ids
drawn uniformly below the vocabulary size from ``seed``; a ``path`` holds real ones: a ``.json`` list of lists of
ids, a ``.npy`` 2-D integer array (one prompt per row) or a ``.npz`` with such an array named ``input_ids``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from trtflow.stage import StageFailed, StageParams


class Prompts(StageParams):
    """Where the prompts come from: ``path`` (a file of token ids), else random ids from ``seed``."""

    path: str | None = Field(None, description="A file of token-id prompts, relative to the recipe: .json (a list "
                             "of lists of ids), .npy (a 2-D integer array, one prompt per row) or .npz (an array "
                             "named input_ids). Without it, random ids are drawn (count, length, seed).")
    count: int = Field(4, ge=1, le=10_000, description="Random prompts: how many.")
    length: int = Field(8, ge=1, description="Random prompts: ids per prompt.")
    seed: int = Field(0, description="Random prompts: seed of the generator.")

    @model_validator(mode="after")
    def _one_source(self) -> Prompts:
        if self.path is not None and {"count", "length", "seed"} & self.model_fields_set:
            raise ValueError("give either path (prompts from a file) or count/length/seed (random prompts)")
        return self

    def describe(self) -> str:
        if self.path is not None:
            return f"prompts from {self.path}"
        return f"{self.count} random prompt(s) of {self.length} token ids (seed {self.seed})"

    def files(self) -> list[str]:
        return [self.path] if self.path is not None else []


def load_prompts(spec: Prompts, vocab_size: int, resolve: Callable[[str], Path] | None = None) -> list[Any]:
    """The prompts as int64 arrays (one per prompt); ids outside the vocabulary are an error naming the prompt."""
    import numpy as np

    if spec.path is None:
        rng = np.random.default_rng(spec.seed)
        return [rng.integers(0, vocab_size, size=spec.length, dtype=np.int64) for _ in range(spec.count)]
    path = resolve(spec.path) if resolve is not None else Path(spec.path)
    try:
        if path.suffix == ".json":
            raw = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(raw, list) or not all(isinstance(p, list) for p in raw):
                raise ValueError("expected a list of lists of token ids")
            prompts = [np.asarray(p, dtype=np.int64) for p in raw]
        elif path.suffix in (".npy", ".npz"):
            loaded = np.load(path, allow_pickle=False)
            if path.suffix == ".npz":
                with loaded:
                    if "input_ids" not in loaded.files:
                        raise ValueError(f"no array named input_ids (it has {', '.join(loaded.files) or 'none'})")
                    array = loaded["input_ids"]
            else:
                array = loaded
            if array.ndim != 2 or array.dtype.kind not in "iu":
                raise ValueError(f"expected a 2-D integer array, got {array.dtype}{list(array.shape)}")
            prompts = [row.astype(np.int64) for row in array]
        else:
            raise ValueError("the file must be .json, .npy or .npz")
    except (OSError, ValueError) as error:
        raise StageFailed(f"cannot read prompts from {spec.path}: {error}",
                          hint="a .json list of lists of token ids, or a .npy/.npz 2-D integer array") from error
    if not prompts:
        raise StageFailed(f"{spec.path} holds no prompts")
    for index, prompt in enumerate(prompts):
        if prompt.size == 0:
            raise StageFailed(f"prompt #{index} in {spec.path} is empty")
        if int(prompt.min()) < 0 or int(prompt.max()) >= vocab_size:
            raise StageFailed(f"prompt #{index} in {spec.path} has token ids outside 0..{vocab_size - 1} (the "
                              f"model's vocabulary): {int(prompt.min())}..{int(prompt.max())}")
    return prompts
