"""The arguments and options several `trtflow` commands share."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

RecipeArg = Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)]
TargetsArg = Annotated[list[str] | None, typer.Argument(help="Only these nodes (and what they need).")]
StoreOpt = Annotated[str | None, typer.Option("--store", help="Store directory (env TRTFLOW_STORE; default .trtflow)")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a recipe value: nodes.NAME.params.KEY=VALUE")]
WaitOpt = Annotated[float, typer.Option("--wait", help="Seconds to wait for runs holding the store, then give up "
                                                      "(exit 4, store busy).")]

