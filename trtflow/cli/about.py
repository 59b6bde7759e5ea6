"""`trtflow schema` and `trtflow doctor`: what this installation accepts and what this machine can run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from trtflow.cli.console import emit, rich_console


def schema(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the schema to this file.")] = None,
    builtin: Annotated[bool, typer.Option("--builtin", help="Only the stages that ship with trtflow.")] = False,
) -> None:
    """Print the recipe JSON Schema (with every installed stage's parameters)."""
    from trtflow.schema_export import recipe_json_schema

    text = json.dumps(recipe_json_schema(builtin_only=builtin), indent=2) + "\n"
    emit(text, output)


def doctor(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """What this machine has: Python, libraries, TensorRT flavours, GPUs, and which backends build/run here."""
    from trtflow.doctor import diagnose

    info = diagnose()
    if as_json:
        print(json.dumps(info, indent=1))
        return
    from rich.table import Table

    console = rich_console()
    facts = Table(title="environment", box=None, header_style="bold", show_header=False)
    facts.add_column("what")
    facts.add_column("value", overflow="fold")
    for k, v in info["facts"].items():
        facts.add_row(k, str(v))
    console.print(facts)
    backends = Table(title="backends", box=None, header_style="bold")
    for col in ("backend", "build", "run", "why"):
        backends.add_column(col, overflow="fold")
    for b in info["backends"]:
        backends.add_row(b["backend"], "yes" if b["build"] else "no", "yes" if b["run"] else "no", b["why"])
    console.print(backends)
    console.print("stages: " + ", ".join(f"{s['name']} ({s['version']})" for s in info["stages"]))

