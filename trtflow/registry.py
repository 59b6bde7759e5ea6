"""Stage discovery through the ``trtflow.stages`` entry-point group (built-in and third-party alike)."""

from __future__ import annotations

import functools
from importlib import metadata

from trtflow.errors import EnvironmentUnavailable, InternalError, RecipeError, did_you_mean
from trtflow.stage import Stage

GROUP = "trtflow.stages"


@functools.lru_cache(maxsize=1)
def stage_entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=GROUP)}


def stage_names(builtin_only: bool = False) -> list[str]:
    """Installed stage names; ``builtin_only`` keeps those that ship with trtflow itself."""
    eps = stage_entry_points()
    if builtin_only:
        return sorted(n for n, ep in eps.items() if ep.dist is not None and ep.dist.name == "trtflow")
    return sorted(eps)


@functools.cache
def get_stage(name: str) -> Stage:
    """Load a stage by name; an unknown name is a recipe error with a suggestion."""
    eps = stage_entry_points()
    if name not in eps:
        hint = did_you_mean(name, list(eps))
        raise RecipeError(
            f"unknown stage {name!r}; installed stages: {', '.join(sorted(eps)) or 'none'}",
            hint=hint or "install the package that provides it (it registers under the "
            f"'{GROUP}' entry-point group)",
        )
    try:
        stage = eps[name].load()
    except Exception as exc:  # a broken or half-removed plugin package: say which, never a traceback
        dist = eps[name].dist
        package = dist.name if dist is not None else "the package that registers it"
        raise EnvironmentUnavailable(
            f"stage {name!r} is registered ({eps[name].value}) but cannot be imported: "
            f"{type(exc).__name__}: {exc}",
            hint=f"reinstall {package} (pip install --force-reinstall {package}) or uninstall it") from None
    if not isinstance(stage, Stage):
        raise InternalError(f"entry point {eps[name].value!r} for stage {name!r} is not a trtflow Stage")
    if stage.name != name:
        raise InternalError(f"entry point {name!r} loads a stage that calls itself {stage.name!r}")
    return stage
