"""`trtflow gc` and `trtflow verify`: keep the store small and intact."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer

from trtflow.cli.console import rich_console
from trtflow.cli.options import StoreOpt, WaitOpt
from trtflow.errors import (
    EXIT_FAILED,
)


def gc(
    store: StoreOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be removed, and why; remove nothing.")
                       ] = False,
    keep_days: Annotated[float, typer.Option(
        "--keep-days", help="Also keep what runs of the last N days used (env TRTFLOW_GC_KEEP_DAYS; default 0: "
        "only what each recipe file's latest run uses).", show_default=False)] = -1.0,
    forget_missing_after: Annotated[float, typer.Option(
        "--forget-missing-after", help="Forget a recipe file that no longer exists (and drop its results) only after "
        "gc has seen it missing for N days (env TRTFLOW_GC_FORGET_MISSING_DAYS; default 7; 0: now).",
        show_default=False)] = -1.0,
    wait: WaitOpt = 60.0,
) -> None:
    """Remove stored results no recipe file's latest run uses (and old logs, scratch space, refs of recipe files
    missing for a week). gc never runs beside a `trtflow run`: it waits for them, and new runs wait for it."""
    from trtflow.pipeline import default_store
    from trtflow.storage.gc import FORGET_MISSING_DAYS, collect_garbage

    if keep_days < 0:
        keep_days = float(os.environ.get("TRTFLOW_GC_KEEP_DAYS", "0") or 0)
    if forget_missing_after < 0:
        forget_missing_after = float(os.environ.get("TRTFLOW_GC_FORGET_MISSING_DAYS", "") or FORGET_MISSING_DAYS)
    console = rich_console()
    report_ = collect_garbage(default_store(store), keep_days=keep_days, dry_run=dry_run, wait_s=wait,
                              on_wait=lambda msg: rich_console(stderr=True).print(msg),
                              forget_missing_days=forget_missing_after)
    verb = "would remove" if dry_run else "removed"
    if report_.removals and (dry_run or len(report_.removals) <= 50):
        rows = [(r.what, r.recipe, r.node, _size(r.size), _age(r.age_s), r.why) for r in report_.removals]
        header = ("what", "recipe", "node", "size", "age", "why")
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header[:-1])]
        for row in [header, *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1])
    results, result_bytes = report_.total("result")
    objects, object_bytes = report_.total("object")
    logs, _ = report_.total("log")
    scratch, _ = report_.total("scratch")
    console.print(f"{verb} {results} results ({_size(result_bytes)}), {objects} other objects "
                  f"({_size(object_bytes)}), {logs} log folders, {scratch} scratch folders; kept "
                  f"{report_.kept_results} results ({report_.kept_objects} objects)")
    if report_.missing:
        first = min(m.since for m in report_.missing)
        paths = ", ".join(m.path or m.recipe for m in report_.missing[:3]) + (", ..." if len(report_.missing) > 3
                                                                               else "")
        console.print(f"kept the results of {len(report_.missing)} recipe file{'s' * (len(report_.missing) > 1)} "
                      f"missing since {time.strftime('%Y-%m-%d %H:%M', time.localtime(first))} ({paths}) "
                      f"(forgotten after {forget_missing_after:g} days missing; --forget-missing-after 0 forgets "
                      "them now)", markup=False, highlight=False)


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n} B"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} d"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def verify(
    store: StoreOpt = None,
    fix: Annotated[
        bool,
        typer.Option(
            "--fix", help="Remove damaged objects and the manifests that use them (the next run rebuilds them), "
            "unreadable refs, and reset a damaged journal."
        ),
    ] = False,
    wait: WaitOpt = 60.0,
    provenance: Annotated[Path | None, typer.Option(
        "--provenance", help="Check this signed provenance (`trtflow provenance`) instead of the store: signed by a "
        "trusted key, and (--artifact) that each file is one of its subjects.")] = None,
    artifact: Annotated[list[Path] | None, typer.Option("--artifact", help="A file that must be a subject of "
                                                                          "--provenance (repeatable).")] = None,
) -> None:
    """Re-hash every stored object, check manifests, refs and the journal; exit 1 if anything is damaged."""
    from trtflow.keys import policy_here  # results by signer (trtflow/keys.py, storage/signing.py)
    from trtflow.pipeline import default_store
    from trtflow.storage.verify import verify_store

    policy = policy_here()
    if provenance is not None:
        from trtflow.provenance import check

        stmt, signer = check(provenance, policy, list(artifact or []))
        print(f"{provenance}: signed by {signer} ({policy.describe(signer)}), trusted; "
              f"{len(stmt['subject'])} subjects" + (f", {len(artifact or [])} artifacts among them" if artifact
                                                     else ""))
        return
    st = default_store(store)
    report_ = verify_store(st, fix=fix, wait_s=wait, on_wait=lambda msg: rich_console(stderr=True).print(msg),
                           policy=policy)
    console = rich_console()
    for signer, count in sorted(report_.signers.items()):
        print(f"signed by {signer}: {count} results")
    for problem in report_.problems:
        console.print(f"[red]damaged[/]: {problem}")
    for fixed in report_.fixed:
        console.print(f"[green]fixed[/]: {fixed}")
    console.print(
        f"checked {report_.objects} objects and {report_.manifests} manifests, refs and the journal: "
        + (
            "clean"
            if not report_.problems
            else f"{len(report_.problems)} problems"
            + (" (fixed: the next run rebuilds what was damaged)" if fix else " (run `trtflow verify --fix`)")
        )
    )
    if report_.problems and not fix:
        raise typer.Exit(EXIT_FAILED)

