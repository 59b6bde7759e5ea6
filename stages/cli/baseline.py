"""``trtflow baseline``: pin a recipe's latest artifacts and measurements (a ``trtflow.commands`` plugin).

    trtflow baseline pin RECIPE [-o FILE]     pin each benchmark node's artifact in the store (kept by gc while
                                              pinned) and write the baseline file to commit (default:
                                              baselines/<recipe name>.json beside the recipe); `save` is the same
    trtflow baseline show FILE                print what a baseline holds
    trtflow baseline unpin FILE               release the artifacts FILE pins from the store (gc frees them)

Benchmark nodes then compare with it through ``baseline: FILE`` (and ``max_regression_percent``): the pinned
artifact is re-measured beside the candidate in A/B pairs; a validate node compares accuracy figures through its
baseline hook (`measure.judging.baseline.accuracy_gate`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from trtflow.errors import (  # not trtflow.stage (via _baseline): `trtflow --help` imports this module
    TrtflowError,
    UsageError,
)

app = typer.Typer(name="baseline", help="Pin measurements (latency, throughput, accuracy) in a file to commit; "
                  "gates compare with it.", no_args_is_help=True, add_completion=False)


def _latency(point: dict[str, Any], key: str) -> str:
    """A latency statistic of a baseline point with its 95% interval where the point has one."""
    value = (point.get("latency_ms") or {}).get(key, float("nan"))
    interval = (point.get("latency_ci_ms") or {}).get(key)
    around = f" [{interval[0]:.4g}, {interval[1]:.4g}]" if isinstance(interval, list) and len(interval) == 2 else ""
    return f"{value:.4g} ms{around}"


def _describe(name: str, entry: dict[str, Any]) -> list[str]:
    facts = entry.get("facts") or {}
    setup = ", ".join(f"{key} {facts[key]}" for key in ("gpu", "tensorrt", "tensorrt_rtx", "onnxruntime", "torch",
                                                          "cpu") if facts.get(key) not in (None, "none", "unset"))
    lines = [f"{name} ({entry.get('stage')}; {setup or 'no facts recorded'})"]
    artifact = entry.get("artifact") or {}
    if artifact:
        files = [name for slot in (artifact.get("inputs") or {}).values() for name in slot.get("objects", {})]
        files += list(artifact.get("files") or {})
        lines.append(f"  artifact {str(entry.get('identity', ''))[:12]}: {', '.join(files) or 'no files'} (re-measured "
                     "beside the candidate by gated runs)")
    elif entry.get("stage") == "benchmark":
        lines.append("  no artifact pinned (an older baseline): gates compare its stored figures; pin it again")
    for point in entry.get("points", []):
        queries = f" ({point['queries']} queries)" if point.get("queries") else ""
        lines.append(f"  batch {point.get('batch_size')}, {point.get('streams', 1)} stream(s): p50 "
                     f"{_latency(point, 'p50')}, p99 {_latency(point, 'p99')}, "
                     f"{point.get('throughput_qps', float('nan')):.4g} samples/s{queries}")
    for output, values in (entry.get("outputs") or {}).items():
        lines.append(f"  {output}: cosine {values.get('cosine_similarity')}, max abs error "
                     f"{values.get('max_abs_error')}")
    return lines


@app.command("pin")
def pin(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file whose latest results to pin.", show_default=False)],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Baseline file to write (default: "
                                                "baselines/<recipe name>.json beside the recipe).")] = None,
    store: Annotated[str | None, typer.Option("--store", help="Store directory (env TRTFLOW_STORE; default "
                                              ".trtflow)")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a recipe value, as for `run`.")] = None,
) -> None:
    """Pin the artifact each benchmark node of RECIPE measured last (kept in the store while pinned) and write its
    latest benchmark and validate figures, with the pinned artifacts' digests, to a baseline file."""
    from trtflow.api import latest_results, pin_latest
    from trtflow.recipe.load import load_recipe
    from trtflow.userfiles import write_file

    from ..measure.judging.baseline import make_baseline

    loaded = load_recipe(recipe)
    results = latest_results(recipe, set_ or (), store)
    benchmarks = [name for name, result in results.items() if result.get("stage") == "benchmark"]
    artifacts = pin_latest(recipe, benchmarks, set_ or (), store) if benchmarks else {}
    document = make_baseline(loaded.recipe.name, results, artifacts)
    if not document["nodes"]:
        raise TrtflowError(f"no benchmark or validate results of {recipe} in the store",
                           hint=f"run `trtflow run {recipe}` first, then pin the baseline")
    target = output or Path(recipe).parent / "baselines" / f"{loaded.recipe.name}.json"
    write_file(target, json.dumps(document, indent=2, sort_keys=True) + "\n")  # never through a link
    for name, entry in document["nodes"].items():
        typer.echo("\n".join(_describe(name, entry)))
    try:
        shown = target.resolve().relative_to(Path(recipe).resolve().parent)
    except ValueError:
        shown = target.resolve()
    typer.echo(f"wrote {target}: commit it, and point gates at it (benchmark params: `baseline: {shown}`, "
               "`max_regression_percent: 10`); the artifacts stay in this store while the baseline pins them")


app.command("save", help="The same as `pin` (its earlier name).")(pin)


def _existing(file: Path) -> Path:
    """``file``, or a usage error naming where `pin` wrote a baseline of that name: beside its recipe, in a folder
    ``baselines/`` (``pipelines/baselines/quickstart.json``), which ``baselines/quickstart.json`` given from the
    project's root misses."""
    if file.exists() or file.is_absolute():
        return file
    found = sorted(str(p) for p in Path.cwd().glob(f"*/{file.as_posix()}") if p.is_file())
    if found:
        raise UsageError(f"baseline file {file} does not exist",
                         hint=f"`baseline pin` writes it beside the recipe: {' or '.join(found)}")
    return file


@app.command("show")
def show(file: Annotated[Path, typer.Argument(help="A baseline file.", show_default=False)]) -> None:
    """Print the nodes, machine facts and figures a baseline holds."""
    from ..measure.judging.baseline import read_baseline

    document = read_baseline(_existing(file))
    typer.echo(f"baseline of recipe {document.get('recipe')}, saved {document.get('saved')}")
    for name, entry in (document.get("nodes") or {}).items():
        typer.echo("\n".join(_describe(name, entry)))


@app.command("unpin")
def unpin(
    file: Annotated[Path, typer.Argument(help="A baseline file whose pinned artifacts to release.",
                                         show_default=False)],
    store: Annotated[str | None, typer.Option("--store", help="Store directory (env TRTFLOW_STORE; default "
                                              ".trtflow)")] = None,
) -> None:
    """Release the artifacts a baseline file pins in the store; the next `trtflow gc` frees what nothing else keeps.
    Gates on the file then compare its stored figures (and say so) until it is pinned again."""
    from trtflow.api import unpin as release

    from ..measure.judging.baseline import read_baseline

    document = read_baseline(_existing(file))
    identities = sorted({str(entry["identity"]) for entry in (document.get("nodes") or {}).values()
                         if isinstance(entry, dict) and entry.get("identity")})
    removed = release(identities, store)
    for identity in identities:
        typer.echo(f"{identity[:12]}: {'released' if identity in removed else 'not pinned in this store'}")
    if not identities:
        typer.echo(f"{file} pins no artifact")
