"""`trtflow debug`: accuracy debugging of a recipe's low-precision models (registered as a trtflow.commands plugin).

- ``trtflow debug precision RECIPE NODE``: the nodes to keep in higher precision so the candidate passes its
  accuracy gate, found by bisection with each step validated like the validate node; the recipe change to make.
- ``trtflow debug layers RECIPE NODE``: the reference and the candidate compared tensor by tensor on ONNX
  Runtime: where the error starts and which layers add the most.

NODE is a validate node, or the convert/quantize node it checks.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(
    name="debug",
    help="Debug a low-precision model's accuracy: nodes to keep in higher precision, layer-by-layer errors.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

RecipeArg = Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)]
NodeArg = Annotated[str, typer.Argument(help="A validate node, or the convert/quantize node it checks.",
                                        show_default=False)]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a recipe value: nodes.NAME.params.KEY=VALUE")]
StoreOpt = Annotated[str | None, typer.Option("--store", help="Store directory (env TRTFLOW_STORE; default .trtflow)")]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="Where to write the JSON report (default: "
                                                               "build/<recipe>/debug/<node>-<command>.json).")]
RowsOpt = Annotated[int | None, typer.Option("--rows", min=1, help="Use only the first N rows of the validate "
                                                                   "node's data (default: all).")]


def _console() -> Any:
    from trtflow.terminal import console

    return console(highlight=False, soft_wrap=True)


def _write_json(data: dict[str, Any], path: Path, under_build: bool) -> None:
    """Write the report: below the working folder for the default build/<recipe>/debug/ (no link under it is
    followed: a cloned repository may carry build/), else where the user said (--json; replaced, not written
    through a link)."""
    from trtflow.storage.confined.tree import locate

    tree, rel = locate(path, Path.cwd() if under_build else None)
    tree.write_text(rel, json.dumps(data, indent=2, default=float) + "\n")


def _layer_table(title: str, rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    from trtflow.digits import distinct

    table = Table(title=title, title_justify="left")
    for column in ("#", "node", "op", "rel. error", "inputs' rel. error", "added", "max abs error", "cosine"):
        is_node = column == "node"
        table.add_column(column, justify="left" if column in ("node", "op") else "right",
                         overflow="fold" if is_node else "ellipsis", min_width=12 if is_node else None)
    for row in rows:
        table.add_row(str(row["position"]), row["node"], row["op_type"], f"{row['rel_error']:.3g}",
                      f"{row['input_rel_error']:.3g}", f"{row['added_rel_error']:.3g}",
                      f"{row['max_abs_error']:.3g}", distinct(row["cosine"], [1.0], least=6))
    return table


@app.command("layers")
def layers(recipe: RecipeArg, node: NodeArg, set_: SetOpt = None, store: StoreOpt = None,
           rows: Annotated[int, typer.Option("--rows", min=1, help="Rows of the data to run (one batch).")] = 4,
           top: Annotated[int, typer.Option("--top", min=1, help="Layers listed per table.")] = 10,
           threshold: Annotated[float, typer.Option("--threshold", min=0.0,
                                                    help="Relative error (||c-r||/||r||) that counts as large.")]
           = 0.01,
           json_out: JsonOpt = None) -> None:
    """Compare the candidate with its fp32 model tensor by tensor: where the error starts and grows."""
    from ..accuracy.precision_debug import layer_errors, layer_report, load_batches, resolve_target

    console = _console()
    target = resolve_target(recipe, node, set_ or [], store, say=console.print)
    scratch = Path(tempfile.mkdtemp(prefix="trtflow-debug-"))
    try:
        batch = load_batches(target, scratch, rows)[0]
        console.print(f"comparing {target.candidate_model} with {target.fp32_model} on "
                      f"{', '.join(f'{k}{list(v.shape)}' for k, v in batch.items())}, every tensor marked as output")
        report = layer_report(layer_errors(target.fp32_model, target.candidate_model, batch), threshold, top)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report.update(reference=str(target.fp32_model), candidate=str(target.candidate_model),
                  node=target.producer.name)
    console.print(_layer_table(f"first layers above {threshold:g} relative error", report["first_above_threshold"]))
    console.print(_layer_table("layers that add the most error", report["largest_added_error"]))
    path = json_out or Path("build") / target.name / "debug" / f"{target.producer.name}-layers.json"
    _write_json(report, path, json_out is None)
    console.print(f"{report['tensors_compared']} tensors compared; all of them in {path}")


def _accuracy_table(before: Any, after: Any) -> Any:
    """The accuracy before and after the change found; before alone when there is no change (the candidate
    already passes, or nothing was tried): no column of figures that were never measured."""
    from rich.table import Table

    from trtflow.digits import distinct

    table = Table(title="accuracy against the reference (the validate node's data and tolerances)",
                  title_justify="left")
    columns = ["output", "max abs error", "cosine", "passes"] if after is None else \
        ["output", "before: max abs error", "before: cosine", "after: max abs error", "after: cosine", "passes"]
    for column in columns:  # output names whole (a terminal too narrow folds the figures, not the names)
        table.add_column(column, no_wrap=column == "output",
                         min_width=max(map(len, before.outputs), default=6) if column == "output" else None)
    for name, entry in before.outputs.items():
        cosine = entry["cosine_similarity"]
        if after is None:
            table.add_row(name, f"{entry['max_abs_error']:.4g}", distinct(cosine, [1.0], least=6),
                          "yes" if entry.get("passed") else "no")
            continue
        later = after.outputs.get(name, {})
        later_cosine = later.get("cosine_similarity")
        table.add_row(name, f"{entry['max_abs_error']:.4g}", distinct(cosine, [later_cosine, 1.0], least=6),
                      f"{later['max_abs_error']:.4g}" if "max_abs_error" in later else "-",
                      distinct(later_cosine, [cosine, 1.0], least=6) if later_cosine is not None else "-",
                      "yes" if later.get("passed") else "no")
    return table


@app.command("precision")
def precision(recipe: RecipeArg, node: NodeArg, set_: SetOpt = None, store: StoreOpt = None, rows: RowsOpt = None,
              max_steps: Annotated[int, typer.Option("--max-steps", min=2,
                                                     help="Most re-conversions/re-quantizations to try.")] = 40,
              json_out: JsonOpt = None) -> None:
    """Find a small set of ONNX nodes to keep in higher precision so the candidate passes its accuracy gate."""
    from ..accuracy.precision_debug import (
        DEBUGGABLE,
        KEEP,
        Evaluator,
        find_nodes_to_keep,
        layer_errors,
        load_batches,
        lowered_nodes,
        resolve_target,
    )

    console = _console()
    target = resolve_target(recipe, node, set_ or [], store, say=console.print)
    if target.via_engine:
        console.print("the candidate is an engine: debugging its ONNX model on ONNX Runtime (TensorRT's strongly "
                      "typed networks take each layer's precision from the ONNX model)")
    scratch = Path(tempfile.mkdtemp(prefix="trtflow-debug-"))
    try:
        batches = load_batches(target, scratch, rows)
        lowered = lowered_nodes(target.stage, target.candidate_model, target.fp32_model)
        console.print(f"{target.producer.name} ({target.stage}) lowered {len(lowered)} nodes; validating each step "
                      f"like {target.validate.name} on {sum(len(next(iter(b.values()))) for b in batches)} rows")
        errors = layer_errors(target.fp32_model, target.candidate_model, batches[0])
        order = [e.node for e in sorted(errors, key=lambda e: e.added, reverse=True)]
        evaluator = Evaluator(target, scratch, batches, say=console.print)
        result = find_nodes_to_keep(evaluator, lowered, order, max_steps)
        base = evaluator.base_patterns()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    console.print(_accuracy_table(result.before, result.after))
    if result.message:
        console.print(result.message)
    if result.nodes or result.extra_params:
        console.print(f"{len(result.nodes)} node(s) {KEEP[target.stage]}: " + ", ".join(result.nodes))
        if result.op_types:
            console.print(f"(at the op-type level, `op_types_to_exclude: {json.dumps(result.op_types)}` also passes, "
                          f"with every node of those types {DEBUGGABLE[target.stage]})")
        console.print(f"recipe change (node {result.producer}, {result.steps} steps):")
        console.print(result.recipe_change(base), markup=False)
    report = {
        "validate": target.validate.name, "producer": result.producer, "stage": result.stage,
        "passed_before": result.before.passed, "passed_after": bool(result.after and result.after.passed),
        "accuracy_before": result.before.brief(), "accuracy_after": result.after.brief() if result.after else None,
        "failures_before": result.before.failures,
        "failures_after": result.after.failures if result.after else None,
        "nodes_to_exclude": result.nodes, "op_types": result.op_types, "params": result.extra_params,
        "recipe_change": result.recipe_change(base) if (result.nodes or result.extra_params) else None,
        "steps": result.steps, "message": result.message,
        "layers_adding_most_error": [e.record() for e in sorted(errors, key=lambda e: e.added, reverse=True)[:10]],
    }
    path = json_out or Path("build") / target.name / "debug" / f"{target.validate.name}-precision.json"
    _write_json(report, path, json_out is None)
    console.print(f"report: {path}")
    if not (result.after and result.after.passed) and not result.before.passed:
        raise typer.Exit(1)
