"""Reports of a run: JSON, Markdown, HTML and JUnit XML (for CI dashboards)."""

from __future__ import annotations

import functools
import json
import time
from typing import Any
from xml.sax.saxutils import escape as xml_escape

from trtflow.errors import UsageError
from trtflow.storage import records
from trtflow.storage.journal import Journal
from trtflow.terminal import visible

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
        summary = records.summary_of(row["summary"], f"of node {row['node']!r} in {journal.path}") or {}
        if row["status"] == "fresh" and not summary:
            last = journal.last_executed(row["node"], recipe_file)
            if last and last["summary"]:
                summary = records.summary_of(last["summary"], f"of node {row['node']!r} in {journal.path}") or {}
        node = {k: row[k] for k in ("node", "stage", "status", "reason", "duration", "log_path", "error", "key")}
        nodes.append(node | {"summary": summary, "run_duration": row["duration"], **_origin(journal, row)})
    return {"recipe": recipe, "recipe_file": recipe_file, "run": run, "nodes": nodes}


def _origin(journal: Journal, row: dict[str, Any]) -> dict[str, Any]:
    """Where a result this run reused (up to date, or taken from the cache) was built: ``built_in_run`` and, as
    ``duration``, the time that build took (the time the result cost, not the 0 s of reusing it); nothing for a
    node this run executed, or whose build the journal no longer holds."""
    if row["status"] not in ("fresh", "cached") or not row["key"]:
        return {}
    built = journal.built(row["key"])
    if built is None or built["run_id"] == row["run_id"]:
        return {}
    return {"built_in_run": built["run_id"], "duration": built["duration"]}


def render(journal: Journal, recipe: str, fmt: str) -> str:
    """The report of ``recipe``'s latest run as ``fmt``. JSON keeps control characters escaped (``\\u001b``); the
    other documents show each as a visible escape (`terminal.visible`), in a file as on a terminal."""
    data = collect(journal, recipe)
    if fmt == "json":
        return json.dumps(data, indent=1, default=str, ensure_ascii=True) + "\n"
    if fmt == "markdown":
        return visible(to_markdown(data))
    if fmt == "html":
        from trtflow.report.history import load as load_history

        return visible(to_html(data, load_history(journal, recipe)))
    if fmt == "junit":
        return visible(to_junit(data))
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


def _node_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Nodes with their flattened metrics (a chooser's summary is the decision table instead)."""
    from trtflow.storage.records import selection_of

    return [dict(n, detail=_detail(n), metrics=[] if selection_of(n["summary"]) is not None
                 else [(k, _fmt(v)) for k, v in _flat_metrics(n["summary"])]) for n in data["nodes"]]


def _detail(node: dict[str, Any]) -> str:
    """A node's error or reason; for a reused result, the run that built it (its time is that build's)."""
    text = node["error"] or node["reason"] or ""
    if node.get("built_in_run"):
        text += f" (reused from run {node['built_in_run']}, which took the time shown)"
    return text


@functools.cache
def _template(name: str, autoescape: bool) -> Any:
    """The report template, compiled once per process (a new environment per call compiled it for every
    report rendered in process: 60 ms for Markdown, 200 ms for HTML)."""
    try:
        import jinja2
    except ImportError:
        raise UsageError("Markdown and HTML reports need jinja2", hint="pip install 'trtflow[report]'") from None
    env = jinja2.Environment(loader=jinja2.PackageLoader("trtflow.report", "templates"), autoescape=autoescape,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    env.filters["cell"] = lambda text: str(text).replace("|", "\\|").replace("\n", " ")
    env.globals.update(fmt=_maybe, pair=_latency_pair, ci=_with_interval)
    return env.get_template(name)


def _maybe(value: Any, spec: str) -> str:
    """A number formatted with ``spec``, or "-" when there is none."""
    return spec % value if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _with_interval(value: Any, interval: Any) -> str:
    """A figure and its 95% interval: "2.41 (2.38-2.45)"."""
    shown = _maybe(value, "%.4g")
    if isinstance(interval, (list, tuple)) and len(interval) == 2 and shown != "-" and interval[0] != interval[1]:
        return f"{shown} ({_maybe(interval[0], '%.4g')}-{_maybe(interval[1], '%.4g')})"
    return shown


def _latency_pair(latency: dict[str, Any], stat: str, intervals: dict[str, Any] | None = None) -> str:
    """"p50 / p99" (or p50 / the judged percentile) of one benchmark point, each with its 95% interval."""
    other = stat if stat != "p50" else "p99"
    if not latency:
        return "-"
    intervals = intervals or {}
    return f"{_with_interval(latency.get('p50'), intervals.get('p50'))} / " \
           f"{_with_interval(latency.get(other), intervals.get(other))}"


def _context(data: dict[str, Any]) -> dict[str, Any]:
    from collections import Counter

    from trtflow.report.decision import decisions, gate_notes
    from trtflow.report.kernels import context as kernel_context

    run = data["run"]
    counts = Counter(n["status"] for n in data["nodes"])
    return {
        "recipe": data["recipe"], "run": run,
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run["started"])),
        "counts": ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "no nodes",
        "decisions": decisions(data), "nodes": _node_rows(data), "benchmark_charts": [],
        "gate_notes": gate_notes(data["nodes"]),
        **kernel_context(data),
    }


def to_markdown(data: dict[str, Any]) -> str:
    """The decision table of every chooser node first, then the nodes and their metrics."""
    return _template("report.md.j2", autoescape=False).render(**_context(data))


def to_html(data: dict[str, Any], history: Any = None) -> str:
    """One self-contained page (inline SVG charts, no script, no network): the decision, then the nodes; with the
    recipe's `history.History`, the trend of each primary figure and its change points."""
    from trtflow.report import charts
    from trtflow.report.decision import benchmark_series
    from trtflow.report.history import html_sections

    context = _context(data)
    context["history"] = html_sections(history) if history is not None else []
    context["history_note"] = history.note if history is not None else ""
    for d in context["decisions"]:
        latency_title = f"{d.percentile} time per output token (ms)" if d.generation else \
            f"{d.percentile} latency (ms) at the operating point"
        d.charts = [(title, svg) for title, svg in (
            ("generation times", charts.generation_times(d.rows, d.percentile) if d.generation else ""),
            ("accuracy against latency", charts.accuracy_latency(d.rows, latency_title)),
            ("latency against batch size", charts.latency_batch(d.series, d.percentile)),
            ("throughput against batch size", charts.throughput_batch(d.series)),
            ("load curves", charts.load_curves(d.load, d.percentile)),
        ) if svg]
    if not context["decisions"]:
        series = benchmark_series(data["nodes"])
        context["benchmark_charts"] = [(title, svg) for title, svg in (
            ("latency against batch size", charts.latency_batch(series, "p99")),
            ("throughput against batch size", charts.throughput_batch(series)),
        ) if svg]
    return _template("report.html.j2", autoescape=True).render(**context)


def to_junit(data: dict[str, Any]) -> str:
    """One test case per node: failed and gate-failed nodes are failures (a gate that could not decide under
    ``on_inconclusive: fail`` is a ``<failure type="inconclusive">``), skipped ones are skipped; a primary gate
    that could not decide under ``on_inconclusive: warn`` fails nothing but is marked (a ``gate`` property
    "inconclusive" and the verdict in system-out): never silently green. A gate-failed node of a run that ended ok
    is a candidate select rejected (`execution.outcome`: the only gate failure an ok run holds): it fails nothing
    and is marked (an ``outcome`` property "rejected" and its gate's message in system-out)."""
    from trtflow.verdicts import failures as blocking
    from trtflow.verdicts import only_inconclusive, recorded

    run_ok = (data.get("run") or {}).get("status") == "ok"

    cases = []
    failures = skipped = 0
    for n in data["nodes"]:
        name = xml_escape(n["node"])
        attrs = f'classname="trtflow.{xml_escape(data["recipe"])}.{xml_escape(n["stage"])}" name="{name}" ' \
                f'time="{(n["duration"] or 0):.3f}"'
        message = xml_escape(n["error"] or n["reason"] or "", {'"': "&quot;"})
        verdicts = recorded(n.get("summary"))
        rejected = run_ok and n["status"] == "gate_failed"
        if n["status"] in ("failed", "gate_failed") and not rejected:
            failures += 1
            kind = ' type="inconclusive"' if n["status"] == "gate_failed" and only_inconclusive(verdicts) else ""
            body = f'<failure message="{message}"{kind}>log: {xml_escape(n["log_path"] or "")}</failure>'
        elif n["status"] in ("skipped", "blocked", "interrupted"):
            skipped += 1
            body = f'<skipped message="{message}"/>'
        else:
            body = ""
        properties, out = [], []
        if rejected:
            properties.append(("outcome", "rejected"))
            why = n["error"] or "; ".join(blocking(verdicts))  # an up-to-date node's: its recorded verdicts'
            out.append(f"rejected candidate (not chosen; the run passed): its quality gate failed: {why}")
        warned = [v.reason for v in verdicts if v.primary and v.outcome == "inconclusive" and not v.blocking]
        if warned:
            properties.append(("gate", "inconclusive"))
            out += [f"gate inconclusive (on_inconclusive: warn): {m}" for m in warned]
        if n.get("built_in_run"):  # time= is what the result cost when it was built, not the 0 s of reusing it
            properties.append(("reused_from_run", n["built_in_run"]))
            out.append(f"reused: the result of run {n['built_in_run']} (built in {(n['duration'] or 0):.3f}s)")
        if properties:
            quote = {'"': "&quot;"}
            body = "<properties>" + "".join(f'<property name="{xml_escape(k, quote)}" value="{xml_escape(v, quote)}"/>'
                                            for k, v in properties) + "</properties>" + body
        if out:
            body += f"<system-out>{xml_escape(chr(10).join(out))}</system-out>"
        cases.append(f"  <testcase {attrs}>{body}</testcase>")
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<testsuite name="trtflow.{xml_escape(data["recipe"])}" tests="{len(cases)}" failures="{failures}" '
        f'skipped="{skipped}">\n' + "\n".join(cases) + "\n</testsuite>\n"
    )
