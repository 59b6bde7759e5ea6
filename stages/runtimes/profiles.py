"""Optimization profiles checked against a model's inputs before a build or a deployment."""

from __future__ import annotations

from collections.abc import Mapping

from trtflow.stage import ProfileSpec, StageFailed


def check_profiles(profiles: list[ProfileSpec], inputs: Mapping[str, list[int | None] | None]) -> None:
    """Every profile must name real inputs with matching rank and static dims, and cover every dynamic input."""
    from trtflow.errors import did_you_mean

    dynamic = sorted(name for name, dims in inputs.items() if dims is None or any(d is None for d in dims))
    if not profiles and dynamic:
        shapes = ", ".join(f"{n}{_show_dims(inputs[n])}" for n in dynamic)
        raise StageFailed(
            f"the model has dynamic inputs ({shapes}) but no optimization profile was given",
            hint="add 'profile' (or 'profiles') with min/opt/max shapes for " + ", ".join(repr(n) for n in dynamic),
        )
    for spec in profiles:
        for input_name, shape in spec.shapes.items():
            if input_name not in inputs:
                suggestion = did_you_mean(input_name, list(inputs))
                raise StageFailed(
                    f"profile {spec.name!r} gives shapes for {input_name!r}, which is not an input of the model"
                    + (f"; {suggestion}" if suggestion else ""),
                    hint=f"the model's inputs are: {', '.join(f'{n}{_show_dims(d)}' for n, d in inputs.items())}",
                )
            dims = inputs[input_name]
            if dims is None:
                continue
            if len(shape.min) != len(dims):
                raise StageFailed(
                    f"profile {spec.name!r}, input {input_name!r}: the profile has rank {len(shape.min)} "
                    f"(min={shape.min}) but the model input has rank {len(dims)} {_show_dims(dims)}",
                    hint=f"give {len(dims)} dimensions for {input_name!r} in min, opt and max",
                )
            for axis, model_dim in enumerate(dims):
                if model_dim is None:
                    continue
                given = {shape.min[axis], shape.opt[axis], shape.max[axis]}
                if given != {model_dim}:
                    raise StageFailed(
                        f"profile {spec.name!r}, input {input_name!r}: dimension {axis} is fixed to {model_dim} in "
                        f"the model {_show_dims(dims)} but the profile asks min={shape.min[axis]}, "
                        f"opt={shape.opt[axis]}, max={shape.max[axis]}",
                        hint=f"use {model_dim} for dimension {axis}, or export the model with that axis dynamic",
                    )
        missing = [name for name in dynamic if name not in spec.shapes]
        if missing:
            raise StageFailed(
                f"profile {spec.name!r} gives no shapes for dynamic input(s) "
                + ", ".join(f"{n}{_show_dims(inputs[n])}" for n in missing),
                hint="every profile needs min/opt/max for every input with a dynamic dimension",
            )


def _show_dims(dims: list[int | None] | None) -> str:
    if dims is None:
        return "[unknown rank]"
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
