"""What the export library reads of an export node's params (the export stage's ``Params``), and the profiles' ranges
per input axis."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

from trtflow.stage import ProfileSpec

from ..accuracy.generation import GenerationCheck
from ..formats.torch_check import CheckParams
from ..formats.torch_source import SampleInput


class ExportParams(CheckParams, Protocol):
    """The export stage's ``Params`` as its library reads them (a pydantic model: copied with ``model_copy``, dumped
    with ``model_dump``, made anew with ``model_validate``)."""

    @property
    def model(self) -> str: ...

    @property
    def task(self) -> str | None: ...

    @property
    def part(self) -> str | None: ...

    @property
    def factory_args(self) -> dict[str, Any]: ...

    @property
    def checkpoint(self) -> str | None: ...

    @property
    def outputs(self) -> list[str] | None: ...

    @property
    def opset(self) -> int: ...

    @property
    def dynamo(self) -> bool: ...

    @property
    def check(self) -> bool: ...

    @property
    def profiles(self) -> list[ProfileSpec]: ...

    @property
    def atol(self) -> float: ...

    @property
    def rtol(self) -> float: ...

    @property
    def generation(self) -> GenerationCheck | None: ...

    @property
    def inputs(self) -> Mapping[str, SampleInput]: ...

    @property
    def dynamic_axes(self) -> dict[str, dict[int, str]]: ...

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Any: ...

    def model_dump(self, *, mode: Literal["json", "python"] | str = ...) -> dict[str, Any]: ...

    @classmethod
    def model_validate(cls, obj: Any) -> Any: ...


def profile_ranges(params: ExportParams) -> dict[str, dict[int, tuple[int, int, int]]]:
    """input -> axis -> (min, opt, max) over the profiles, for a model whose inputs export does not know yet."""
    ranges: dict[str, dict[int, tuple[int, int, int]]] = {}
    for profile in params.profiles:
        for name, shape in profile.shapes.items():
            for axis, (low, opt, high) in enumerate(zip(shape.min, shape.opt, shape.max, strict=True)):
                if low == high:
                    continue
                old = ranges.setdefault(name, {}).get(axis)
                ranges[name][axis] = (min(low, old[0]), old[1], max(high, old[2])) if old else (low, opt, high)
    return ranges
