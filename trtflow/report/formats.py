"""Reports of a run: JSON, Markdown, HTML and JUnit XML (for CI dashboards)."""

from __future__ import annotations

import html
import json
import time
from typing import Any
from xml.sax.saxutils import escape as xml_escape

from trtflow.errors import UsageError
from trtflow.storage.journal import Journal

FORMATS = ("json", "markdown", "html", "junit")


def collect(journal: Journal, recipe: str) -> dict[str, Any]:
    """The latest run of the recipe file ``recipe`` (its project-relative path) with every node's state, timing
    and summary (metrics)."""
    runs = journal.runs(1, recipe)
    if not runs:
        raise UsageError(f"no runs of recipe {recipe!r} recorded", hint="run `trtflow run` first")
    recipe_file, recipe = recipe, runs[0]["recipe"] or recipe
    run = runs[0]
    nodes = []
    for row in journal.node_runs(run["id"]):
        summary = json.loads(row["summary"]) if row["summary"] else {}
        if row["status"] == "fresh" and not summary:
            last = journal.last_executed(row["node"], recipe_file)
            if last and last["summary"]:
                summary = json.loads(last["summary"])
        nodes.append({k: row[k] for k in ("node", "stage", "status", "reason", "duration", "log_path", "error",
                                          "key")} | {"summary": summary})
    return {"recipe": recipe, "recipe_file": recipe_file, "run": run, "nodes": nodes}


def render(journal: Journal, recipe: str, fmt: str) -> str:
    data = collect(journal, recipe)
    if fmt == "json":
        return json.dumps(data, indent=1, default=str) + "\n"
    if fmt == "markdown":
        return to_markdown(data)
    if fmt == "html":
        return to_html(data)
    if fmt == "junit":
        return to_junit(data)
    raise UsageError(f"unknown report format {fmt!r}", hint=f"choose one of {', '.join(FORMATS)}")


def _flat_metrics(summary: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    if isinstance(summary, dict):
        for k, v in summary.items():
            out += _flat_metrics(v, f"{prefix}{k}.")
    elif isinstance(summary, list) and all(isinstance(v, dict) for v in summary):
        for i, v in enumerate(summary):
            label = v.get("batch_size", i) if isinstance(v.get("batch_size"), int) else i
            out += _flat_metrics(v, f"{prefix}{'batch' if label != i else ''}{label}.")
    elif isinstance(summary, list):
        out.append((prefix.rstrip("."), ", ".join(str(v) for v in summary)))
    elif isinstance(summary, (int, float, str, bool)) or summary is None:
        out.append((prefix.rstrip("."), summary))
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def to_markdown(data: dict[str, Any]) -> str:
    run = data["run"]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run["started"]))
    lines = [f"# trtflow report: {data['recipe']}", "",
             f"Run `{run['id']}` started {when}, status **{run['status']}**.", "",
             "| node | stage | status | time | detail |", "|---|---|---|---|---|"]
    for n in data["nodes"]:
        duration = f"{n['duration']:.1f}s" if n["duration"] else ""
        detail = (n["error"] or n["reason"] or "").replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {n['node']} | {n['stage']} | {n['status']} | {duration} | {detail} |")
    for n in data["nodes"]:
        metrics = _flat_metrics(n["summary"])
        if metrics:
            lines += ["", f"## {n['node']} ({n['stage']})", "", "| metric | value |", "|---|---|"]
            lines += [f"| {k} | {_fmt(v)} |" for k, v in metrics[:200]]
    return "\n".join(lines) + "\n"


def _latency_rows(data: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(label, median ms, p99 ms) for every benchmark point in the run."""
    rows = []
    for n in data["nodes"]:
        for point in n["summary"].get("points", []) if isinstance(n["summary"], dict) else []:
            if isinstance(point, dict) and isinstance(point.get("median_ms"), (int, float)):
                label = f"{n['node']} (batch {point.get('batch_size', '?')})"
                rows.append((label, float(point["median_ms"]), float(point.get("p99_ms") or point["median_ms"])))
    return rows


def latency_chart_svg(rows: list[tuple[str, float, float]]) -> str:
    """A horizontal bar chart of median (dark) and p99 (light) latency per benchmark point, as inline SVG."""
    if not rows:
        return ""
    label_w, bar_w, row_h = 260, 420, 26
    top = max(p99 for _, _, p99 in rows) or 1.0
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{label_w + bar_w + 120}' "
             f"height='{row_h * len(rows) + 30}' font-family='sans-serif' font-size='12'>"]
    for i, (label, median, p99) in enumerate(rows):
        y = 10 + i * row_h
        parts.append(f"<text x='{label_w - 6}' y='{y + 15}' text-anchor='end'>{html.escape(label)}</text>")
        parts.append(f"<rect x='{label_w}' y='{y + 2}' width='{bar_w * p99 / top:.1f}' height='18' fill='#9ecae1'/>")
        parts.append(f"<rect x='{label_w}' y='{y + 2}' width='{bar_w * median / top:.1f}' height='18' fill='#3182bd'/>")
        parts.append(f"<text x='{label_w + bar_w * p99 / top + 6:.1f}' y='{y + 15}'>{median:.3g} / {p99:.3g} ms</text>")
    parts.append(f"<text x='{label_w}' y='{row_h * len(rows) + 25}'>median (dark) and p99 (light) latency</text>")
    return "".join(parts) + "</svg>"


def to_html(data: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr class='{html.escape(n['status'])}'><td>{html.escape(n['node'])}</td><td>{html.escape(n['stage'])}</td>"
        f"<td>{html.escape(n['status'])}</td><td>{(n['duration'] or 0):.1f}s</td>"
        f"<td>{html.escape(n['error'] or n['reason'] or '')}</td></tr>"
        for n in data["nodes"]
    )
    chart = latency_chart_svg(_latency_rows(data))
    sections = f"<h2>latency</h2>{chart}" if chart else ""
    for n in data["nodes"]:
        metrics = _flat_metrics(n["summary"])
        if metrics:
            body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(_fmt(v))}</td></tr>" for k, v in metrics)
            sections += f"<h2>{html.escape(n['node'])}</h2><table>{body}</table>"
    return (
        "<!doctype html><meta charset='utf-8'><title>trtflow report</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:4px 8px}.failed,.gate_failed{background:#fdd}.skipped,.blocked{background:#ffd}</style>"
        f"<h1>trtflow report: {html.escape(data['recipe'])}</h1><p>run {html.escape(data['run']['id'])}: "
        f"{html.escape(data['run']['status'])}</p><table><tr><th>node</th><th>stage</th><th>status</th>"
        f"<th>time</th><th>detail</th></tr>{rows}</table>{sections}\n"
    )


def to_junit(data: dict[str, Any]) -> str:
    """One test case per node: failed and gate-failed nodes are failures, skipped ones are skipped."""
    cases = []
    failures = skipped = 0
    for n in data["nodes"]:
        name = xml_escape(n["node"])
        attrs = f'classname="trtflow.{xml_escape(data["recipe"])}.{xml_escape(n["stage"])}" name="{name}" ' \
                f'time="{(n["duration"] or 0):.3f}"'
        message = xml_escape(n["error"] or n["reason"] or "", {'"': "&quot;"})
        if n["status"] in ("failed", "gate_failed"):
            failures += 1
            body = f'<failure message="{message}">log: {xml_escape(n["log_path"] or "")}</failure>'
        elif n["status"] in ("skipped", "blocked", "interrupted"):
            skipped += 1
            body = f'<skipped message="{message}"/>'
        else:
            body = ""
        cases.append(f"  <testcase {attrs}>{body}</testcase>")
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<testsuite name="trtflow.{xml_escape(data["recipe"])}" tests="{len(cases)}" failures="{failures}" '
        f'skipped="{skipped}">\n' + "\n".join(cases) + "\n</testsuite>\n"
    )
