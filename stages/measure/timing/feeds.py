"""The inputs a benchmark feeds a model: the shapes to run (from the recipe and the model's inputs), the batch
limits of the model and its profile, and one batch of data in exactly those shapes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from trtflow.stage import ProfileSpec, RecipeError, StageFailed

from ...data import DataSource, InputSpec, RandomData, load_arrays


class FeedParams(Protocol):
    """What feeding reads of a benchmark node's params (the benchmark stage's ``Params``)."""

    @property
    def shapes(self) -> Mapping[str, list[int]]: ...

    @property
    def profile(self) -> ProfileSpec | None: ...

    @property
    def data(self) -> DataSource | None: ...


def resolve_shapes(specs: Sequence[InputSpec], params: FeedParams) -> dict[str, list[int]]:
    """A concrete shape per input: ``shapes``, else the profile's opt shapes, else the static shape."""
    known = {s.name for s in specs}
    named = dict(params.profile.shapes) if params.profile else {}
    unknown = sorted((set(params.shapes) | set(named)) - known)
    if unknown:
        raise RecipeError(f"shapes/profile name input(s) {unknown} the model does not have; model inputs: "
                          f"{sorted(known)}", field="shapes")
    shapes: dict[str, list[int]] = {}
    for spec in specs:
        if spec.name in params.shapes:
            shape = list(params.shapes[spec.name])
        elif spec.name in named:
            shape = list(named[spec.name].opt)
        elif not spec.is_dynamic:
            shape = [int(d) for d in spec.shape]  # type: ignore[arg-type]
        else:
            raise RecipeError(f"input {spec.describe()} has dynamic dimensions and no shape to run",
                              field="shapes", hint=f"set shapes: {{{spec.name}: [...]}} or a profile")
        if len(shape) != spec.rank:
            raise RecipeError(f"input {spec.name!r}: shape {shape} has rank {len(shape)}, the model expects "
                              f"{spec.describe()}", field="shapes")
        for axis, (want, got) in enumerate(zip(spec.shape, shape, strict=True)):
            if isinstance(want, int) and want > 0 and want != got:
                raise RecipeError(f"input {spec.name!r}: dimension {axis} is fixed at {want} in the model but "
                                  f"the shape to run is {shape}", field="shapes")
        shapes[spec.name] = shape
    return shapes


def make_feed(specs: Sequence[InputSpec], shapes: Mapping[str, list[int]], params: FeedParams,
              resolve: Callable[[str], Path], log: Any) -> dict[str, Any]:
    """One batch of inputs in exactly ``shapes``: random (default) or the first rows of the data."""
    import numpy as np

    if params.data is None or params.data.random is not None:
        random = params.data.random if params.data is not None else None
        source = DataSource(random=RandomData(
            seed=random.seed if random else 0, num_samples=1,
            ranges=random.ranges if random else {}, shapes=dict(shapes)))
        return load_arrays(source, specs, resolve, log)
    arrays = load_arrays(params.data, specs, resolve, log)
    feed = {}
    for name, shape in shapes.items():
        array = arrays[name]
        if list(array.shape[1:]) != list(shape[1:]):
            raise StageFailed(f"input {name!r}: the data rows have shape {list(array.shape[1:])} but the "
                              f"benchmark runs {shape}", hint="give data in the shapes benchmarked, or none")
        repeats = -(-shape[0] // array.shape[0])
        feed[name] = np.ascontiguousarray(np.concatenate([array] * repeats)[: shape[0]])
    return feed


def with_batch(shapes: Mapping[str, list[int]], batch: int | None) -> dict[str, list[int]]:
    if batch is None:
        return {name: list(shape) for name, shape in shapes.items()}
    return {name: [batch, *shape[1:]] for name, shape in shapes.items()}


def batch_of(shapes: Mapping[str, list[int]]) -> int:
    firsts = {shape[0] for shape in shapes.values() if shape}
    return firsts.pop() if len(firsts) == 1 else 1


def batch_limits(specs: Sequence[InputSpec], profile: Mapping[str, Any] | None) -> tuple[int, int | None]:
    """(smallest, largest) batch the model accepts: the profile's limits on dimension 0 where it gives them,
    a static dimension 0 fixes both, else (1, None: unbounded)."""
    low, high = 1, None
    for spec in specs:
        first = spec.shape[0] if spec.shape else None
        if isinstance(first, int) and first > 0:
            low, high = max(low, first), first if high is None else min(high, first)
    for name, ranges in ((profile or {}).get("shapes") or {}).items():
        if any(spec.name == name for spec in specs):
            low = max(low, int(ranges["min"][0]))
            high = int(ranges["max"][0]) if high is None else min(high, int(ranges["max"][0]))
    return low, high
