"""Report charts: Vega-Lite specifications built with altair, rendered to inline SVG by vl-convert.

vl-convert renders offline (it bundles Vega), so a report stays one self-contained file that opens without a
network. Each function returns SVG text, or "" when there is nothing to draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trtflow.errors import UsageError

STATUS_COLORS = {"selected": "#1a9850", "eligible": "#3182bd", "excluded": "#969696"}
WIDTH, HEIGHT = 420, 260


def _altair() -> Any:
    try:
        import altair
        import vl_convert  # noqa: F401  (renders the SVG)
    except ImportError as exc:
        raise UsageError(f"the HTML report's charts need altair and vl-convert-python ({exc.name} is missing)",
                         hint="pip install 'trtflow[report]'") from None
    return altair


def render_svg(chart: Any) -> str:
    import vl_convert

    return vl_convert.vegalite_to_svg(chart.to_dict())


def _status_color(alt: Any) -> Any:
    return alt.Color("status:N", title="candidate",
                     scale=alt.Scale(domain=list(STATUS_COLORS), range=list(STATUS_COLORS.values())))


def accuracy_latency(rows: Sequence[dict[str, Any]], latency_title: str) -> str:
    """Accuracy (cosine similarity to the reference) against latency, the Pareto front joined by a line."""
    chart = accuracy_latency_chart(rows, latency_title)
    return render_svg(chart) if chart is not None else ""


def accuracy_latency_chart(rows: Sequence[dict[str, Any]], latency_title: str) -> Any:
    """The chart of `accuracy_latency` (None: nothing to draw). The selected candidate is drawn last, as a larger
    ringed marker: candidates with the same figures (fp32 and fp16 both at cosine 1) never hide it."""
    points = [{"candidate": r["name"], "status": r["status"], "latency_ms": r["operating_latency"],
               "cosine": r["cosine"], "pareto": r["pareto"], **_bounds(r.get("operating_latency_ci"),
                                                                      r["operating_latency"])}
              for r in rows if r["operating_latency"] is not None and r["cosine"] is not None]
    if not points:
        return None
    for i, point in enumerate(sorted(points, key=lambda p: p["latency_ms"])):
        point["above"] = i % 2 == 0  # neighbours' labels go above and below: close points stay legible
    points.sort(key=lambda p: p["status"] == "selected")  # drawn in order: the selected one last, on top
    alt = _altair()
    data = alt.Data(values=points)
    x = alt.X("latency_ms:Q", title=latency_title, scale=alt.Scale(zero=False, nice=True))
    y = alt.Y("cosine:Q", title="cosine similarity to the reference", scale=alt.Scale(zero=False, nice=True))
    front = alt.Chart(alt.Data(values=sorted((p for p in points if p["pareto"]), key=lambda p: p["latency_ms"]))) \
        .mark_line(strokeDash=[6, 3], color="#fd8d3c", interpolate="step-after").encode(x=x, y=y)
    shape = alt.Shape("pareto:N", title="Pareto front", scale=alt.Scale(domain=[True, False],
                                                                        range=["diamond", "circle"]))
    others = alt.Chart(data).transform_filter(alt.datum.status != "selected").mark_point(filled=True, size=120) \
        .encode(x=x, y=y, color=_status_color(alt), shape=shape)
    selected = alt.Chart(data).transform_filter(alt.datum.status == "selected") \
        .mark_point(filled=True, size=220, stroke="#000000", strokeWidth=1.5, opacity=1) \
        .encode(x=x, y=y, color=_status_color(alt), shape=shape)
    labels = [alt.Chart(data).transform_filter(alt.datum.above == above)
              .mark_text(align="left", dx=8, dy=-9 if above else 13, fontSize=11)
              .encode(x=x, y=y, text="candidate:N") for above in (True, False)]
    bars = alt.Chart(data).mark_errorbar(ticks=True).encode(x=alt.X("low:Q", title=latency_title), x2="high:Q", y=y,
                                                              color=_status_color(alt))
    return alt.layer(front, bars, others, *labels, selected).properties(
        width=WIDTH, height=HEIGHT, title="accuracy against latency (bars: 95% intervals; dashed: Pareto front; "
        "ringed: selected)")


def _batch_axis(alt: Any, points: Sequence[dict[str, Any]]) -> Any:
    """Batch sizes on a log2 scale, ticked at the measured sizes only."""
    measured = sorted({p["batch_size"] for p in points})
    return alt.X("batch_size:Q", title="batch size", scale=alt.Scale(type="log", base=2),
                 axis=alt.Axis(values=measured, format="d"))


def _bounds(interval: Any, value: float) -> dict[str, float]:
    """``low``/``high`` of a 95% interval (the value itself where there is none), for error bars."""
    if isinstance(interval, (list, tuple)) and len(interval) == 2 and \
            all(isinstance(v, (int, float)) for v in interval):
        return {"low": float(interval[0]), "high": float(interval[1])}
    return {"low": value, "high": value}


def latency_batch(series: Sequence[dict[str, Any]], stat: str) -> str:
    """Latency (p50 solid, the judged percentile dashed) against batch size, one line per candidate, with the 95%
    interval of each figure as an error bar."""
    stats = ["p50"] if stat == "p50" else ["p50", stat]
    points = [{"candidate": s["candidate"], "batch_size": s["batch_size"], "statistic": name, "latency_ms": s[name],
               **_bounds((s.get("intervals") or {}).get(name), s[name])}
              for s in series for name in stats if s.get(name) is not None and s.get("batch_size") is not None]
    if not points:
        return ""
    alt = _altair()
    base = alt.Chart(alt.Data(values=points))
    lines = base.mark_line(point=True).encode(
        x=_batch_axis(alt, points),
        y=alt.Y("latency_ms:Q", title="latency (ms)"),
        color=alt.Color("candidate:N"),
        strokeDash=alt.StrokeDash("statistic:N", title="statistic", sort=stats),
    )
    bars = base.mark_errorbar(ticks=True).encode(
        x=_batch_axis(alt, points), y=alt.Y("low:Q", title="latency (ms)"), y2="high:Q", color=alt.Color("candidate:N"))
    chart = alt.layer(bars, lines).properties(width=WIDTH, height=HEIGHT,
                                              title="latency against batch size (bars: 95% intervals)")
    return render_svg(chart)


def throughput_batch(series: Sequence[dict[str, Any]]) -> str:
    """Throughput against batch size, one line per candidate, with each figure's 95% interval as an error bar."""
    chart = throughput_batch_chart(series)
    return render_svg(chart) if chart is not None else ""


def throughput_batch_chart(series: Sequence[dict[str, Any]]) -> Any:
    """The chart of `throughput_batch` (None: nothing to draw); the selected candidate's line is drawn last."""
    points = [{"candidate": s["candidate"], "status": s.get("status", "eligible"), "batch_size": s["batch_size"],
               "throughput_qps": s["throughput_qps"], **_bounds(s.get("throughput_ci"), s["throughput_qps"])}
              for s in series if s.get("throughput_qps") is not None and s.get("batch_size") is not None]
    if not points:
        return None
    points.sort(key=lambda p: p["status"] == "selected")
    alt = _altair()
    base = alt.Chart(alt.Data(values=points))
    y_title = "throughput (inferences/s)"
    bars = base.mark_errorbar(ticks=True).encode(
        x=_batch_axis(alt, points), y=alt.Y("low:Q", title=y_title), y2="high:Q", color=alt.Color("candidate:N"))
    lines = base.mark_line(point=True).encode(
        x=_batch_axis(alt, points), y=alt.Y("throughput_qps:Q", title=y_title), color=alt.Color("candidate:N"),
        strokeWidth=alt.condition(alt.datum.status == "selected", alt.value(3), alt.value(1.5)))
    return alt.layer(bars, lines).properties(width=WIDTH, height=HEIGHT,
                                             title="throughput against batch size (bars: 95% intervals)")


def load_curves(load: Sequence[dict[str, Any]], stat: str) -> str:
    """Latency against throughput as the offered load (concurrency) grows, one curve per candidate."""
    if not load:
        return ""
    alt = _altair()
    base = alt.Chart(alt.Data(values=list(load))).encode(
        x=alt.X("throughput_qps:Q", title="throughput (inferences/s)"),
        y=alt.Y("latency_ms:Q", title=f"{stat} latency (ms)"),
        color=alt.Color("candidate:N"),
        order=alt.Order("concurrency:Q"),
    )
    labels = base.mark_text(align="left", dx=6, dy=-6, fontSize=10).encode(text="concurrency:Q")
    chart = (base.mark_line(point=True) + labels).properties(
        width=WIDTH, height=HEIGHT, title="load: latency against throughput (labels: concurrency)")
    return render_svg(chart)


def history_trend(points: Sequence[dict[str, Any]], changes: Sequence[dict[str, Any]], title: str, unit: str) -> str:
    """One figure over the runs that measured it (x: when), its 95% intervals as error bars, and its change points
    as vertical rules (red: a regression, green: an improvement) labelled with the change of the mean."""
    if len(points) < 2:
        return ""
    alt = _altair()
    x = alt.X("when:T", title="run")
    values = [dict(p, **_bounds([p.get("low"), p.get("high")] if p.get("low") is not None and
                                 p.get("high") is not None else None, p["value"])) for p in points]
    base = alt.Chart(alt.Data(values=values))
    line = base.mark_line(point=True, color="#3182bd").encode(x=x, y=alt.Y("value:Q", title=unit,
                                                                          scale=alt.Scale(zero=False)))
    bars = base.mark_errorbar(ticks=True, color="#9ecae1").encode(x=x, y=alt.Y("low:Q", title=unit), y2="high:Q")
    layers = [bars, line]
    if changes:
        marks = alt.Chart(alt.Data(values=list(changes)))
        color = alt.Color("kind:N", title="change", scale=alt.Scale(domain=["regression", "improvement"],
                                                                    range=["#d73027", "#1a9850"]))
        layers += [marks.mark_rule(strokeDash=[5, 3], size=2).encode(x=x, color=color),
                   marks.mark_text(align="left", dx=4, dy=-6, fontSize=11, baseline="top").encode(
                       x=x, y=alt.value(4), text="label:N", color=color)]
    chart = alt.layer(*layers).properties(width=WIDTH, height=HEIGHT, title=title)
    return render_svg(chart)


def generation_times(rows: Sequence[dict[str, Any]], stat: str) -> str:
    """Time to first token and time per output token of each candidate (generation), side by side, each with its
    95% interval as an error bar; the selected candidate in green."""
    points = [{"candidate": r["name"], "status": r["status"], "figure": figure, "ms": r[key],
               **_bounds(r.get(f"{key}_ci"), r[key])}
              for r in rows for key, figure in (("ttft", "time to first token"), ("tpot", "time per output token"))
              if r.get(key) is not None]
    if not points:
        return ""
    alt = _altair()
    base = alt.Chart(alt.Data(values=points)).encode(
        x=alt.X("candidate:N", title=None, sort=[r["name"] for r in rows], axis=alt.Axis(labelAngle=0)))
    dots = base.mark_point(filled=True, size=80).encode(
        y=alt.Y("ms:Q", title=f"{stat} (ms)", scale=alt.Scale(zero=False, nice=True)), color=_status_color(alt),
        tooltip=["candidate:N", "figure:N", "ms:Q", "low:Q", "high:Q"])
    bars = base.mark_rule().encode(y="low:Q", y2="high:Q", color=_status_color(alt))
    chart = (bars + dots).properties(width=WIDTH // 2 - 20, height=HEIGHT).facet(
        column=alt.Column("figure:N", title=None, header=alt.Header(labelFontSize=12, labelLimit=0)),
    ).resolve_scale(y="independent").properties(
        title=alt.TitleParams(f"generation: {stat} times with 95% intervals", anchor="start"))
    return render_svg(chart)
