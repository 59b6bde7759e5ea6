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

#: Random prompts when ``path`` is not given: count, length, seed.
RANDOM = {"count": 4, "length": 8, "seed": 0}


class Prompts(StageParams):
    """Where the prompts come from: ``path`` (a file of token ids), else random ids from ``seed``.

    ``count``, ``length`` and ``seed`` default to None, "not given": random prompts take `RANDOM` for those not
    given (written out, a node's prompts say them), prompts from a file keep them null. Which is which rests on the
    values, not on which fields a recipe wrote (`trtflow.params`): ``path`` with ``count: 4`` written is refused."""

    path: str | None = Field(None, description="A file of token-id prompts, relative to the recipe: .json (a list "
                             "of lists of ids), .npy (a 2-D integer array, one prompt per row) or .npz (an array "
                             "named input_ids). Without it, random ids are drawn (count, length, seed).")
    count: int | None = Field(None, ge=1, le=10_000, description="Random prompts: how many (without path: 4 "
                              "unless given; with path: not given).")
    length: int | None = Field(None, ge=1, description="Random prompts: ids per prompt (without path: 8 unless "
                               "given; with path: not given).")
    seed: int | None = Field(None, description="Random prompts: seed of the generator (without path: 0 unless "
                             "given; with path: not given).")

    @model_validator(mode="before")
    @classmethod
    def _random_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("path") is None:
            return {**data, **{key: value for key, value in RANDOM.items() if data.get(key) is None}}
        return data

    @model_validator(mode="after")
    def _one_source(self) -> Prompts:
        if self.path is not None and (self.count, self.length, self.seed) != (None, None, None):
            raise ValueError("give either path (prompts from a file) or count/length/seed (random prompts)")
        return self

    @property
    def random(self) -> tuple[int, int, int]:
        """count, length, seed of random prompts (those of `RANDOM` for prompts from a file, which has none)."""
        return (self.count or RANDOM["count"], self.length or RANDOM["length"],
                RANDOM["seed"] if self.seed is None else self.seed)

    def describe(self) -> str:
        if self.path is not None:
            return f"prompts from {self.path}"
        count, length, seed = self.random
        return f"{count} random prompt(s) of {length} token ids (seed {seed})"

    def files(self) -> list[str]:
        return [self.path] if self.path is not None else []


def load_prompts(spec: Prompts, vocab_size: int, resolve: Callable[[str], Path] | None = None) -> list[Any]:
    """The prompts as int64 arrays (one per prompt); ids outside the vocabulary are an error naming the prompt."""
    import numpy as np

    if spec.path is None:
        count, length, seed = spec.random
        rng = np.random.default_rng(seed)
        return [rng.integers(0, vocab_size, size=length, dtype=np.int64) for _ in range(count)]
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
