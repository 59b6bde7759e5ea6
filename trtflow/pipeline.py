"""Load a recipe into a checked graph: the shared first step of `run`, `plan` and `show`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trtflow.graph import Graph, build_graph
from trtflow.recipe.expand import expand
from trtflow.recipe.load import LoadedRecipe, load_recipe
from trtflow.registry import get_stage
from trtflow.storage.store import Store


@dataclass
class Pipeline:
    loaded: LoadedRecipe
    graph: Graph

    @property
    def name(self) -> str:
        return self.loaded.recipe.name


def load_pipeline(recipe: str | Path, overrides: Sequence[str] = (), targets: Sequence[str] = ()) -> Pipeline:
    loaded = load_recipe(recipe, overrides)
    nodes = expand(loaded)
    graph = build_graph(nodes, get_stage, loaded.recipe.name)
    if targets:
        graph = graph.select(list(targets))
    return Pipeline(loaded, graph)


def default_store(store: str | Path | None = None) -> Store:
    root = store or os.environ.get("TRTFLOW_STORE") or ".trtflow"
    return Store(Path(root))
