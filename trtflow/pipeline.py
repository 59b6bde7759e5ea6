"""Load a recipe into a checked graph: the shared first step of `run`, `plan`, `show`, `status` and `report`.

The recipe schema, the stages and the graph are imported when a recipe is loaded, not with this module, so that
commands that decide without them (the no-op shortcut of `trtflow run`) never pay for them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trtflow.fsutil import recipe_id
from trtflow.storage.refs import RecipeIdentity
from trtflow.storage.store import Store

if TYPE_CHECKING:
    from trtflow.graph import Graph
    from trtflow.recipe.load import LoadedRecipe


@dataclass
class Pipeline:
    loaded: LoadedRecipe
    graph: Graph  # the nodes asked for (and what they need)
    recipe_nodes: list[str] = field(default_factory=list)  # every node of the recipe

    @property
    def name(self) -> str:
        return self.loaded.recipe.name

    @property
    def identity(self) -> RecipeIdentity:
        return identity_of(self.loaded.path, self.name)


def identity_of(path: Path, name: str) -> RecipeIdentity:
    """A recipe file's identity (its path relative to its project root) — refs, status and reports use it."""
    return RecipeIdentity(recipe_id(path), name, Path(path).resolve())


def load_pipeline(recipe: str | Path, overrides: Sequence[str] = (), targets: Sequence[str] = ()) -> Pipeline:
    from trtflow.graph import build_graph
    from trtflow.recipe.expand import expand
    from trtflow.recipe.load import load_recipe
    from trtflow.registry import get_stage

    loaded = load_recipe(recipe, overrides)
    nodes = expand(loaded, get_stage)
    graph = build_graph(nodes, get_stage, loaded.recipe.name)
    everything = list(graph.nodes)
    if targets:
        graph = graph.select(list(targets))
    return Pipeline(loaded, graph, everything)


def default_store(store: str | Path | None = None) -> Store:
    """The store the user named (``store``, else ``TRTFLOW_STORE``; its path may be a link, their choice), or
    ``.trtflow`` in the working folder, which must be a real folder (a cloned repository may carry a link there)."""
    named = store or os.environ.get("TRTFLOW_STORE")
    return Store(Path(named), follow_root=True) if named else Store(Path(".trtflow"), follow_root=False)
