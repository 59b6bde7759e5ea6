"""Reports that decide: the chooser's table first (Markdown and HTML), charts as inline SVG, no network; the HTML
rendered by a real headless Chromium is not blank."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from trtflow.report.documents import to_html, to_markdown
from trtflow_stages.decision.candidates import Candidate
from trtflow_stages.decision.params import Params
from trtflow_stages.decision.selection import decide


def _bench(node: str, points, load=()):
    return {"node": node, "backend": "onnxruntime", "device": "cpu",
            "points": [{"batch_size": b, "latency_ms": {"p50": ms, "p99": ms * 1.4}, "throughput_qps": b / ms * 1e3,
                        "flags": []} for b, ms in points],
            "load": [{"concurrency": c, "latency_ms": {"p50": ms, "p99": ms * 1.4}, "throughput_qps": qps}
                     for c, ms, qps in load]}


def _valid(node: str, cosine: float, passed: bool = True):
    return {"node": node, "passed": passed, "cosine_similarity": cosine, "mean_abs_error": 1 - cosine,
            "max_abs_error": 1 - cosine, "task_metrics": {}, "failures": [] if passed else ["logits: too far"],
            "uncalibrated_data": False}


def run_data(with_load: bool = True) -> dict:
    """The journal data of a run (formats.collect's shape) with a select node among three candidates."""
    load = [(1, 1.0, 900.0), (4, 3.0, 2400.0), (8, 7.0, 2900.0)] if with_load else ()
    candidates = [
        Candidate("simplify", "onnx", 316_000, "fp32", validation=_valid("validate-simplify", 1.0),
                  benchmark=_bench("benchmark-simplify", [(1, 1.0), (4, 2.5), (8, 4.5)], load)),
        Candidate("convert", "onnx", 164_000, "fp16", validation=_valid("validate-convert", 0.99999),
                  benchmark=_bench("benchmark-convert", [(1, 0.8), (4, 2.0), (8, 3.0)], load[:2])),
        Candidate("quantize", "onnx", 183_000, "int8", validation=_valid("validate-quantize", 0.95, passed=False),
                  benchmark=_bench("benchmark-quantize", [(1, 0.5), (4, 1.0), (8, 2.0)])),
    ]
    params = Params.model_validate({"objective": {"percentile": "p99", "batch_size": 8}, "baseline": "simplify"})
    selection = decide(candidates, params, {"name": "simplify", **candidates[0].benchmark})
    node = {"status": "done", "reason": "never built", "duration": 1.5, "log_path": None, "error": None, "key": "k"}
    return {"recipe": "quickstart", "run": {"id": "run-1", "status": "ok", "started": 0.0},
            "nodes": [dict(node, node="export", stage="export", summary={"nodes": 12, "checked": True}),
                      dict(node, node="benchmark-simplify", stage="benchmark",
                           summary={"backend": "onnxruntime", "device": "cpu", "repeats": 1,
                                    "points": [{"batch_size": 8, "streams": 1, "median_ms": 4.5, "p99_ms": 6.3,
                                                "latency_ms": {"p50": 4.5, "p99": 6.3}, "throughput_qps": 1777.0,
                                                "flags": []}]}),
                      dict(node, node="select", stage="select", summary=selection)]}


def test_markdown_leads_with_the_decision_table():
    text = to_markdown(run_data())
    assert text.index("## Decision") < text.index("## Nodes") < text.index("## export (export)")
    assert "**Selected: convert**: lowest p99 latency at batch 8, among candidates with validation passed." in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    header = rows[0]
    assert "batch 1: p50 / p99 (ms)" in header and "speed-up vs simplify" in header and "| Pareto |" in header
    convert = next(r for r in rows if r.startswith("| **convert**"))
    assert "| 0.164 |" in convert and "| pass |" in convert and "1.50x" in convert and "selected" in convert
    quantize = next(r for r in rows if r.startswith("| quantize"))
    assert "excluded: validation failed (validate-quantize): logits: too far" in quantize
    assert "## select" not in text  # the chooser's summary is the table, not a metric dump
    assert re.search(r"\n\nBenchmarked on onnxruntime cpu", text)  # a paragraph, not a table row


def test_html_is_self_contained_with_decision_charts():
    page = to_html(run_data())
    assert page.index("<h2>Decision</h2>") < page.index("<h2>Nodes</h2>")
    assert page.count("<svg") == 4  # accuracy/latency, latency/batch, throughput/batch, load curves
    for label in ("accuracy against latency", "latency against batch size", "throughput against batch size",
                  "load curves"):
        assert f'aria-label="{label}"' in page
    assert "<script" not in page
    urls = set(re.findall(r"https?://[^\"'\s)]+", page))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls
    assert "Selected <b>convert</b>" in page and 'class="excluded"' in page


def test_html_without_a_chooser_still_draws_benchmarks():
    data = run_data()
    data["nodes"] = data["nodes"][:2]
    page = to_html(data)
    assert "<h2>Decision</h2>" not in page and "<h2>Benchmarks</h2>" in page and page.count("<svg") == 2


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(_chromium() is None, reason="no Chromium installed (apt-get install -y chromium)")
def test_html_report_renders_in_headless_chromium(tmp_path: Path):
    from PIL import Image

    page = tmp_path / "report.html"
    page.write_text(to_html(run_data()), encoding="utf-8")
    shot = tmp_path / "shot.png"
    command = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,1400",
               f"--screenshot={shot}", page.as_uri()]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert shot.is_file(), proc.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1400, 1400)
    colors = image.getcolors(maxcolors=1 << 20) or []
    white = sum(count for count, rgb in colors if rgb == (255, 255, 255))
    assert white < 0.97 * image.size[0] * image.size[1]  # text, tables and charts drew something
    assert len(colors) > 50  # anti-aliased text and coloured chart marks, not a flat page
    # the decision's green (selected row and banner) is on screen: the page is the report, not an error page
    assert any(g > r + 10 and g > b + 5 for _, (r, g, b) in colors)


def test_the_decision_headline_names_the_choice_its_reason_and_the_flagged_benchmarks():
    from trtflow.report.decision import decision, headline

    data = run_data(with_load=False)
    selection = data["nodes"][-1]["summary"]
    assert headline("select", selection) == f"select: chose convert: {by_reason(selection, 'convert')}"
    flagged = json.loads(json.dumps(selection))
    rows = {c["name"]: c for c in flagged["candidates"]}
    rows["simplify"]["benchmark"]["points"][2]["flags"] = ["busy-host", "not-converged"]
    rows["quantize"]["benchmark"]["points"][0]["flags"] = ["not-converged"]
    assert headline("select", flagged).endswith(
        "; benchmarks flagged: benchmark-simplify busy-host (batch 8), not-converged (batch 8); "
        "benchmark-quantize not-converged (batch 1)")
    none = dict(flagged, selected=None)
    assert headline("pick", none).startswith("pick: no candidate qualifies for lowest p99 latency at batch 8")
    assert decision("select", selection).cosine_format == "%.6f"  # 1 and 0.99999 differ at 6 decimals


def by_reason(selection: dict, name: str) -> str:
    return next(c["reason"] for c in selection["candidates"] if c["name"] == name).removeprefix("selected: ")


def test_cosine_similarities_that_differ_never_print_alike():
    data = run_data(with_load=False)
    for candidate in data["nodes"][-1]["summary"]["candidates"]:
        if candidate["name"] == "convert":
            candidate["validation"]["cosine_similarity"] = 0.99999994  # fp16 against fp32's exact 1
    text = to_markdown(data)
    assert "| 1.0000000 |" in text and "| 0.9999999 |" in text and "1.000000 |" not in text


def test_the_throughput_chart_has_error_bars_and_the_selected_point_is_drawn_on_top():
    from trtflow.report import charts
    from trtflow.report.decision import decision

    data = run_data(with_load=False)
    selection = data["nodes"][-1]["summary"]
    for candidate in selection["candidates"]:
        for point in candidate["benchmark"]["points"]:
            point["throughput_ci_qps"] = [point["throughput_qps"] * 0.9, point["throughput_qps"] * 1.1]
    d = decision("select", selection)
    spec = charts.throughput_batch_chart(d.series).to_dict()
    bars, line = spec["layer"]
    assert bars["mark"]["type"] == "errorbar" and bars["encoding"]["y"]["field"] == "low"
    values = spec["data"]["values"] if "data" in spec else bars["data"]["values"]
    assert all(v["low"] == pytest.approx(v["throughput_qps"] * 0.9) for v in values)
    assert values[-1]["candidate"] == "convert" and line["mark"]["type"] == "line"  # the selected line drawn last
    accuracy = charts.accuracy_latency_chart(d.rows, "p99 latency (ms)").to_dict()
    top = accuracy["layer"][-1]
    assert top["mark"]["size"] > accuracy["layer"][2]["mark"]["size"] and top["mark"]["stroke"]
    assert top["transform"] == [{"filter": "(datum.status === 'selected')"}]
    assert charts.throughput_batch(d.series).startswith("<svg")


def test_a_generation_decision_shows_first_token_and_per_token_times_tokens_matched_and_flags():
    """A generation recipe's decision: time to first token and per output token with their intervals, output
    tokens per second and tokens matched, in the table (HTML and Markdown) and a chart; the benchmarks' flags in the
    decision box; no inferences per second."""
    from trtflow.report.decision import decision
    from trtflow.report.documents import to_html, to_markdown

    data = run_data(with_load=False)  # judged at p99
    selection = data["nodes"][-1]["summary"]
    for index, c in enumerate(selection["candidates"]):
        c["benchmark"]["points"], c["benchmark"]["load"] = [], []
        c["benchmark"]["generation"] = [{
            "concurrency": 1, "ttft_ms": {"p99": 2.0 + index, "ci": {"p99": [1.9 + index, 2.1 + index]}},
            "tpot_ms": {"p99": 0.5 + index, "ci": {"p99": [0.45 + index, 0.55 + index]}},
            "output_tokens_per_s": 1000.0 / (0.5 + index), "flags": ["busy-host"] if index == 0 else []}]
        c.setdefault("validation", {}).update(tokens_matched=16.0, tokens_until_difference=12.5)
    made = decision("select", selection)
    assert made.generation and made.rows[0]["ttft_ci"] == [1.9, 2.1] and made.rows[0]["tokens_per_s"] == 2000.0
    page = to_html(data)
    assert "time to first token p99 (ms)" in page and "output tokens/s" in page and "throughput (inf/s)" not in page
    assert "2 (1.9-2.1)" in page and "tokens matched (mean per prompt)" in page
    assert '<td class="num">12.5</td>' in page  # tokens until the first divergence
    assert "<b>Benchmarks flagged</b>" in page and "busy-host (concurrency 1)" in page
    assert 'aria-label="generation times"' in page
    markdown = to_markdown(data)
    assert "| time to first token p99 (ms) | time per output token p99 (ms) | output tokens/s |" in markdown
    assert "**Benchmarks flagged**" in markdown
