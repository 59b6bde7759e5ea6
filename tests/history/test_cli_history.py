"""`trtflow history` as a user runs it: a real benchmark recorded by `trtflow run`, the trend, the nightly check, the
HTML report's history, and what happens without the change-point detector."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import trtflow_cli, trtflow_in_process

#: one worker (CI: `--dist loadgroup`): the module-scoped project made once per run, not once per worker
pytestmark = pytest.mark.xdist_group("cli_history")

pytest.importorskip("otava.analysis", reason="the history extra (Apache Otava) is not installed")

RECIPE = """\
name: nightly
nodes:
  - name: bench
    stage: benchmark
    params:
      backend: torch
      torch_model: python:tiny.py:build
      shapes: {input: [1, 16]}
      warmup_ms: 5
      min_iterations: 20
      min_duration_s: 0.0
      max_latency_ms_p50: 1000     # a gate: its figure (median latency at batch 1) is the primary one
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("history")
    (cwd / "tiny.py").write_text("import torch\n\n\ndef build():\n    return torch.nn.Linear(16, 4)\n")
    (cwd / "recipe.yaml").write_text(RECIPE)
    trtflow_cli("run", "recipe.yaml", cwd=cwd)
    return cwd


def _add_series(cwd: Path, figure: str, values: list[float]) -> None:
    """Earlier nightly runs of the recipe's node, as the journal keeps them."""
    conn = sqlite3.connect(cwd / "store" / "trtflow.db")
    try:
        recipe_id = conn.execute("SELECT recipe_id FROM history LIMIT 1").fetchone()[0]
        start = time.time() - 86400 * (len(values) + 1)
        conn.executemany(
            "INSERT INTO history (recipe_id, node, figure, measurement, run_id, recorded, stage, key, value, low, "
            "high, n, unit, better, is_primary, facts, context) VALUES (?, 'bench', ?, ?, ?, ?, 'benchmark', 'k', ?, "
            "?, ?, 500, 'ms', 'lower', 1, '{\"gpu\": \"H100\"}', '{}')",
            [(recipe_id, figure, f"m{i}", f"night{i:02d}", start + 86400 * i, v, v * 0.98, v * 1.02)
             for i, v in enumerate(values)])
        conn.commit()
    finally:
        conn.close()


def test_a_run_records_its_benchmark_figures_and_history_shows_them(project: Path) -> None:
    proc = trtflow_in_process("history", "recipe.yaml", cwd=project)
    assert "bench (benchmark): p50 latency, batch 1 [ms, lower is better, primary]: 1 run(s)" in proc.stdout
    assert "95% interval" in proc.stdout and "change points: none" in proc.stdout
    assert "p50 latency, batch 1" in trtflow_in_process("history", "recipe.yaml", "bench", cwd=project).stdout
    assert "matches" in trtflow_in_process("history", "recipe.yaml", "--figure", "nothing-like-it", cwd=project).stdout
    every = json.loads(trtflow_in_process("history", "recipe.yaml", "--all", "--json", cwd=project).stdout)
    figures = {s["figure"]: s for s in every["series"]}
    assert {"p50 latency, batch 1", "p99 latency, batch 1", "throughput, batch 1"} <= set(figures)
    point = figures["p50 latency, batch 1"]["points"][0]
    assert point["low"] <= point["value"] <= point["high"] and point["n"] >= 20 and point["key"]
    assert point["facts"]["backend"] == "torch" and "others_cpu_percent" in point["facts"]
    again = trtflow_cli("run", "recipe.yaml", cwd=project)  # up to date: the same measurement, no new point
    assert again.returncode == 0

    def points() -> list[dict]:
        shown = trtflow_in_process("history", "recipe.yaml", "--json", cwd=project)
        return json.loads(shown.stdout)["series"][0]["points"]

    assert len(points()) == 1
    nightly = trtflow_cli("run", "recipe.yaml", "--rerun", "bench", cwd=project)  # what a nightly job runs
    assert "run again as asked (--rerun)" in nightly.stdout, nightly.stdout
    measured = points()
    assert len(measured) == 2 and measured[0]["key"] == measured[1]["key"], "measured again under the same key"
    unknown = trtflow_cli("run", "recipe.yaml", "--rerun", "bnech", cwd=project, check=2)
    assert "--rerun bnech: no such node" in unknown.stdout + unknown.stderr


def test_the_nightly_check_fails_on_a_step_and_the_report_draws_it(project: Path) -> None:
    nights = [2.0, 2.04, 1.97, 2.01, 1.99, 2.03, 1.98, 2.0, 2.02, 1.96, 2.01, 1.99, 2.0, 2.03, 1.98,
              2.3, 2.34, 2.28]  # +15% for the last three nights
    _add_series(project, "p99 latency, batch 8", nights)
    proc = trtflow_in_process("history", "recipe.yaml", "--check", "--threshold", "10", cwd=project, check=1)
    assert "history check FAILED: 1 regression(s) beyond 10%" in proc.stdout
    assert "bench: p99 latency, batch 8: +15" in proc.stdout and "night15" in proc.stdout
    shown = trtflow_in_process("history", "recipe.yaml", "--figure", "p99", "--runs", cwd=project).stdout
    assert "change point at run night15" in shown and "regression" in shown and "<- change" in shown
    # the project's own figures have a run or two: too few for the check to pass (undecided, exit 5) until --min-runs
    short = trtflow_in_process("history", "recipe.yaml", "--check", "--threshold", "20", cwd=project, check=5).stdout
    assert "history check undecided" in short and "p50 latency, batch 1 (" in short and "passed" not in short
    assert "history check passed" in trtflow_in_process("history", "recipe.yaml", "--check", "--threshold", "20",
                                                 "--min-runs", "1", cwd=project).stdout
    assert trtflow_in_process("history", "recipe.yaml", "--check", "--latest", "2", "--min-runs", "1",
                       cwd=project).returncode == 0
    usage = trtflow_in_process("history", "recipe.yaml", "--check", "--latest", "1", cwd=project, check=2)
    assert "--runs-after 2 exceeds --latest 1" in usage.stdout + usage.stderr
    data = json.loads(trtflow_in_process("history", "recipe.yaml", "--check", "--json", cwd=project, check=1).stdout)
    assert not data["check"]["passed"] and "night15" in data["check"]["regressions"][0]
    html = trtflow_in_process("report", "recipe.yaml", "-f", "html", cwd=project).stdout
    assert "<h2>History</h2>" in html and "history of bench: p99 latency, batch 8" in html
    assert "night15" in html and "+15" in html and html.count("<svg") >= 1


def test_without_the_detector_history_shows_the_trend_and_the_check_refuses(project: Path,
                                                                            tmp_path: Path) -> None:
    hidden = tmp_path / "hide"
    (hidden / "otava").mkdir(parents=True)
    (hidden / "otava" / "__init__.py").write_text("raise ImportError('Apache Otava hidden for this test')\n")
    env = dict(os.environ, COLUMNS="200", TRTFLOW_STORE=str(project / "store"),
               PYTHONPATH=os.pathsep.join([str(hidden), os.environ.get("PYTHONPATH", "")]))

    def history(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trtflow.cli", "history", "recipe.yaml", *args], cwd=project,
                              capture_output=True, text=True, env=env, timeout=600)

    shown = history()
    assert shown.returncode == 0 and "p50 latency, batch 1" in shown.stdout
    assert "change points not computed" in shown.stdout and "pip install 'trtflow[history]'" in shown.stdout
    refused = history("--check")
    assert refused.returncode == 3, refused
    assert "change points need Apache Otava" in refused.stdout + refused.stderr
    assert "trtflow[history]" in refused.stdout + refused.stderr


def test_history_of_a_recipe_never_run_says_so(tmp_path: Path) -> None:
    (tmp_path / "recipe.yaml").write_text(textwrap.dedent(RECIPE))
    proc = trtflow_in_process("history", "recipe.yaml", cwd=tmp_path, check=1)
    assert "no runs recorded" in proc.stdout + proc.stderr
