"""A run says what happened (issue 42): a candidate that fails its gate and that select does not choose is an outcome
of the decision (exit 0, the closing summary says what shipped and what was rejected and why); a gate on what
shipped, a select that chose nothing and a recipe that requires every candidate to pass still fail the run (exit 1).
Through a recipe file and the `trtflow` CLI, on a real model: fp32 and fp16 candidates, the fp16 one held to fp32's
exactness."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import trtflow_cli

REPO = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("run_outcome")]

RECIPE = """\
name: outcome
profiles:
  batch1to4: {input: {min: [1, 16], opt: [2, 16], max: [4, 16]}}
nodes:
  - name: export
    stage: export
    params: {model: 'python:m.py:build', inputs: {input: {shape: [2, 16], dynamic_axes: {0: batch}}}}
  - {name: simplify, stage: simplify, params: {input_shapes: {input: [4, 16]}}}
  - {name: convert, stage: convert, inputs: {model: simplify}, params: {precision: fp16}}
  - name: validate-simplify
    stage: validate
    inputs: {reference: export, candidate: simplify}
    params: {data: {random: {num_samples: 2}}}
  - name: validate-convert        # fp16 held to fp32's exactness: its gate fails
    stage: validate
    inputs: {reference: export, candidate: convert}
    params: {data: {random: {num_samples: 2}}, tolerances: {atol: 0, rtol: 0}}
  - name: benchmark
    stage: benchmark
    matrix: {candidate: [simplify, convert]}
    inputs: {model: "${{ matrix.candidate }}"}
    params: {backend: onnxruntime, shapes: {input: [1, 16]}, batch_sizes: [1], min_duration_s: 0.1,
             max_duration_s: 0.1, warmup_ms: 10}
  - name: select
    stage: select
    inputs: {candidates: [simplify, convert], validations: [validate-simplify, validate-convert], benchmarks: benchmark}
    params: {objective: {goal: min_latency, batch_size: 1}, finalists: {measure: false}}
  - {name: triton, stage: triton, inputs: {model: select}, params: {profile: batch1to4, instance_kind: cpu}}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> tuple[Path, str]:
    """The recipe's first run (everything built), shared by this module's tests; its output."""
    root = tmp_path_factory.mktemp("outcome")
    shutil.copyfile(REPO / "examples" / "models" / "tiny_mlp.py", root / "m.py")
    (root / "r.yaml").write_text(RECIPE)
    proc = trtflow_cli("run", "r.yaml", cwd=root, check=None)
    return root, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def _rejected_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("Rejected: "))


def test_a_candidate_select_rejected_is_an_outcome_exit_0_with_what_shipped(project):
    root, first = project
    assert first.startswith("exit 0\n"), first
    build = root / "build" / "outcome"
    selection = json.loads((build / "select" / "selection.json").read_text())
    assert selection["selected"] == "simplify"
    assert (build / "select" / "model.onnx").is_file() and (build / "triton" / "model" / "config.pbtxt").is_file()
    assert "quality gate failed" in first  # the node's own line, as it ended
    done = next(line for line in first.splitlines() if line.startswith("Done in "))
    assert done.endswith(": 8 built, 0 reused, 0 up to date, 1 candidate rejected."), done
    assert "Fix the problem above" not in first
    shipped = next(line for line in first.splitlines() if line.startswith("Shipped: "))
    assert shipped == ("Shipped: simplify, chosen by select (select: build/outcome/select/model.onnx, "
                       "build/outcome/select/selection.json; triton: build/outcome/triton/model/1/model.onnx, "
                       "build/outcome/triton/model/config.pbtxt)"), shipped
    rejected = _rejected_line(first)
    assert rejected.startswith("Rejected: convert, not chosen by select: excluded: validation failed "
                               "(validate-convert): output: elements exceed both atol 0 and rtol 0"), rejected
    assert ("A rejected candidate is an outcome of the decision and fails nothing by itself; "
            "`require_all_candidates: true` in the recipe fails the run on it.") in first
    # up to date: the same outcome, from the stored results
    again = trtflow_cli("run", "r.yaml", cwd=root)
    assert "1 candidate rejected." in again.stdout and _rejected_line(again.stdout) == rejected
    # CI's JUnit agrees with the exit code: the rejected candidate's validation fails nothing, and is marked
    import xml.etree.ElementTree as ET

    suite = ET.fromstring(trtflow_cli("report", "-f", "junit", "r.yaml", cwd=root).stdout)
    assert suite.get("failures") == "0"
    [case] = [c for c in suite if c.get("name") == "validate-convert"]
    assert case.find("failure") is None and case.find("skipped") is None
    assert {p.get("name"): p.get("value") for p in case.iter("property")} == {"outcome": "rejected"}
    assert "rejected candidate (not chosen; the run passed): its quality gate failed: output: elements exceed" \
        in case.find("system-out").text


def test_a_recipe_that_requires_every_candidate_to_pass_fails_on_a_rejected_one(project):
    root, _ = project
    (root / "strict.yaml").write_text("require_all_candidates: true\n" + RECIPE)
    proc = trtflow_cli("run", "strict.yaml", cwd=root, check=1)
    assert "Failed in " in proc.stdout and "1 failed." in proc.stdout
    assert _rejected_line(proc.stdout).startswith("Rejected: convert, not chosen by select")
    assert "Rejected candidates fail this run: the recipe sets require_all_candidates: true" in proc.stdout
    assert "Fix the problem above" in proc.stdout


def test_a_gate_on_the_shipped_model_still_fails_the_run(project):
    """A validation of what select shipped that fails its gate fails the run (exit 1), beside the rejected
    candidate: the CI gate on the shipped model."""
    root, _ = project
    # the reference is an fp16 conversion of its own, not the candidate convert: a node taking the rejected
    # candidate as its reference is a path from it to something other than a chooser, and fails the run by itself
    (root / "shipped.yaml").write_text(RECIPE + (
        "  - {name: convert-ref, stage: convert, inputs: {model: simplify}, params: {precision: fp16}}\n"
        "  - name: validate-shipped      # the pick (fp32) against an fp16 conversion, exactly: fails\n"
        "    stage: validate\n"
        "    inputs: {reference: convert-ref, candidate: select}\n"
        "    params: {data: {random: {num_samples: 2}}, tolerances: {atol: 0, rtol: 0}}\n"))
    proc = trtflow_cli("run", "shipped.yaml", cwd=root, check=1)
    assert "validate-shipped quality gate failed" in " ".join(proc.stdout.split())
    assert "Failed in " in proc.stdout and "1 failed, 1 candidate rejected." in proc.stdout
    assert "Shipped: simplify, chosen by select" in proc.stdout
    assert _rejected_line(proc.stdout).startswith("Rejected: convert, not chosen by select")
    assert "Fix the problem above" in proc.stdout


def test_a_failed_gate_of_what_select_chose_is_never_a_rejection(project):
    """The rule over every way a failed gate meets a chooser, on the run's real selection (select chose simplify):
    only an evaluation whose every consumer is a chooser that succeeded and chose another candidate is a rejection."""
    from trtflow.execution.outcome import rejections
    from trtflow.execution.results import NodeResult
    from trtflow.pipeline import load_pipeline

    root, _ = project
    graph = load_pipeline(root / "r.yaml").graph
    selection = json.loads((root / "build" / "outcome" / "select" / "selection.json").read_text())

    def judged(failed: str, select_status: str = "done", **extra: str) -> dict:
        results = {name: NodeResult(name, node.stage, "done") for name, node in graph.nodes.items()}
        results[failed] = NodeResult(failed, graph.nodes[failed].stage, "gate_failed", error="too slow")
        results["select"] = NodeResult("select", "select", select_status, summary=selection)
        results.update({name: NodeResult(name, graph.nodes[name].stage, status) for name, status in extra.items()})
        return rejections(graph, results)

    [convert] = judged("benchmark-convert")["benchmark-convert"]
    assert (convert.node, convert.candidate, convert.chooser) == ("benchmark-convert", "convert", "select")
    assert convert.reason.startswith("excluded: validation failed (validate-convert)")
    assert judged("validate-convert")["validate-convert"][0].candidate == "convert"
    assert judged("benchmark-simplify") == {}, "the shipped candidate's failed gate fails the run"
    assert judged("validate-simplify") == {}
    assert judged("benchmark-convert", "gate_failed") == {}, "a select that failed rejects nothing"
    assert judged("convert") == {}, "a candidate's own gate feeds more than a chooser"
    chose_nothing = dict(selection, selected=None)
    assert rejections(graph, {"validate-convert": NodeResult("validate-convert", "validate", "gate_failed"),
                              "select": NodeResult("select", "select", "done", summary=chose_nothing)}) == {}


def test_a_select_that_chose_nothing_has_nothing_to_ship_and_fails(project):
    root, _ = project
    proc = trtflow_cli("run", "r.yaml", "--set", "nodes.select.params.constraints.max_size_mb=0.000001", cwd=root,
                       check=1)
    assert "select quality gate failed: no candidate qualifies" in " ".join(proc.stdout.split())
    assert "Nothing to ship: select chose no candidate" in proc.stdout
    assert "Shipped: " not in proc.stdout and "Rejected: " not in proc.stdout
    assert "Fix the problem above" in proc.stdout


def test_history_check_reports_a_newly_failing_candidate_and_a_changed_pick(project, tmp_path):
    """Night 1: every candidate passes and select (smallest) picks fp16; night 2: fp16 fails its gate, select picks
    fp32 and the run exits 0. `history --check` fails on the newly failing candidate and reports the pick."""
    root, _ = project
    night = tmp_path / "night"
    shutil.copytree(root, night, ignore=shutil.ignore_patterns("build"))
    smallest = ("--set", "nodes.select.params.objective.goal=min_size")
    loose = ("--set", "nodes.validate-convert.params.tolerances.atol=1", "--set",
             "nodes.validate-convert.params.tolerances.rtol=1")
    passed = trtflow_cli("run", "r.yaml", *smallest, *loose, cwd=night)
    assert "select: chose convert" in passed.stdout and "Rejected: " not in passed.stdout, passed.stdout
    rejected = trtflow_cli("run", "r.yaml", *smallest, cwd=night)
    assert "select: chose simplify" in rejected.stdout and "1 candidate rejected." in rejected.stdout
    check = trtflow_cli("history", "r.yaml", "--check", cwd=night, check=1)
    lines = check.stdout.splitlines()
    newly = next(line for line in lines if line.startswith("history check FAILED: candidate convert"))
    assert newly.startswith("history check FAILED: candidate convert (validate-convert): newly failing its gate "
                            "(run "), newly
    assert "elements exceed both atol 0 and rtol 0" in newly
    assert any(line.startswith("history check note: select: the pick changed from convert to simplify (run ")
               for line in lines), check.stdout
    data = json.loads(trtflow_cli("history", "r.yaml", "--check", "--json", cwd=night, check=1).stdout)["check"]
    assert data["passed"] is False and len(data["newly_failing"]) == 1 and len(data["pick_changes"]) == 1


TRITON_CONVERT = """\
  - {name: triton-convert, stage: triton, inputs: {model: convert}, params: {profile: batch1to4, instance_kind: cpu}}
"""
SELECT_SMALL = """\
  - name: select-small
    stage: select
    inputs: {candidates: [export, convert]}
    params: {objective: {goal: min_size}, constraints: {validation: not_required}, finalists: {measure: false}}
  - {name: triton-small, stage: triton, inputs: {model: select-small}, params: {profile: batch1to4, instance_kind: cpu}}
"""


@pytest.mark.parametrize("extra, shipped", [(TRITON_CONVERT, None), (SELECT_SMALL, "select-small")],
                         ids=["triton-on-the-candidate", "another-select-chose-it"])
def test_a_gate_failed_candidate_that_ships_another_way_fails_the_run(project, extra, shipped):
    """The candidate whose gate failed and that select did not choose also reaches a triton node, or a second select
    that chose it: it ships, so its failed gate fails the run (exit 1), is no rejection, and JUnit counts it."""
    import xml.etree.ElementTree as ET

    root, _ = project
    (root / "ships.yaml").write_text(RECIPE + extra)
    proc = trtflow_cli("run", "ships.yaml", cwd=root, check=1)
    assert "validate-convert quality gate failed" in " ".join(proc.stdout.split())
    assert "Failed in " in proc.stdout and proc.stdout.count("1 failed.") == 1, proc.stdout
    assert "Rejected: " not in proc.stdout and "candidate rejected" not in proc.stdout
    assert "Fix the problem above" in proc.stdout
    if shipped:
        assert json.loads((root / "build" / "outcome" / shipped / "selection.json").read_text())["selected"] \
            == "convert"
    suite = ET.fromstring(trtflow_cli("report", "-f", "junit", "ships.yaml", cwd=root).stdout)
    assert suite.get("failures") == "1"
    [case] = [c for c in suite if c.get("name") == "validate-convert"]
    assert case.find("failure") is not None and "outcome" not in {p.get("name") for p in case.iter("property")}


def test_a_failed_gate_is_a_rejection_only_where_every_path_from_its_candidate_ends_at_a_chooser_that_did_not_pick_it(
        project):
    """The rule over the paths from the candidate (convert), on the run's real selection (select chose simplify):
    a second chooser over it that picked another candidate keeps the rejection; one that picked it, failed or did
    not run, a triton on it, or a node taking it as its reference (it evaluates another model) makes the failed gate
    a failure."""
    from trtflow.execution.outcome import rejections
    from trtflow.execution.results import NodeResult
    from trtflow.pipeline import load_pipeline

    root, _ = project
    selection = json.loads((root / "build" / "outcome" / "select" / "selection.json").read_text())

    def small(selected: str) -> dict:  # select-small's selection over [export, convert]
        rows = [dict(row, name="export" if row["name"] == "simplify" else row["name"], validation=None,
                     benchmark=None) for row in selection["candidates"]]
        return dict(selection, candidates=rows, selected=selected)

    def judged(extra: str, **chooser: tuple[str, dict | None]) -> dict:
        (root / "paths.yaml").write_text(RECIPE + extra)
        graph = load_pipeline(root / "paths.yaml").graph
        results = {name: NodeResult(name, node.stage, "done") for name, node in graph.nodes.items()}
        results["validate-convert"] = NodeResult("validate-convert", "validate", "gate_failed", error="too far")
        results["select"] = NodeResult("select", "select", "done", summary=selection)
        for name, (status, summary) in chooser.items():
            results[name.replace("_", "-")] = NodeResult(name.replace("_", "-"), "select", status,
                                                         summary=summary or {})
        if "select_small" in chooser and chooser["select_small"][0] == "absent":
            del results["select-small"], results["triton-small"]
        return rejections(graph, results)

    [kept] = judged(SELECT_SMALL, select_small=("done", small("export")))["validate-convert"]
    assert (kept.candidate, kept.chooser) == ("convert", "select")
    assert judged("")["validate-convert"][0].candidate == "convert"
    assert judged(SELECT_SMALL, select_small=("done", small("convert"))) == {}, "another chooser shipped it"
    assert judged(SELECT_SMALL, select_small=("gate_failed", small("export"))) == {}, "a chooser that failed"
    assert judged(SELECT_SMALL, select_small=("absent", None)) == {}, "a chooser that did not run"
    assert judged(TRITON_CONVERT) == {}, "a triton on the candidate"
    assert judged(TRITON_CONVERT + SELECT_SMALL, select_small=("done", small("export"))) == {}
    assert judged("  - name: validate-against-convert\n    stage: validate\n"
                  "    inputs: {reference: convert, candidate: simplify}\n"
                  "    params: {data: {random: {num_samples: 2}}}\n") == {}, "the candidate as a reference"


def test_a_gate_that_takes_a_candidate_only_as_its_reference_is_not_that_candidates(project):
    """validate-hidden compares export (not a candidate) against convert: its failed gate is export's, never
    convert's. Wired as select's validation, select refuses it with the fix, and nothing is called rejected."""
    root, _ = project
    hidden = RECIPE.replace("validations: [validate-simplify, validate-convert]",
                            "validations: [validate-simplify, validate-hidden]") + (
        "  - name: validate-hidden\n"
        "    stage: validate\n"
        "    inputs: {reference: convert, candidate: export}\n"
        "    params: {data: {random: {num_samples: 2}}, tolerances: {atol: 0, rtol: 0}}\n")
    (root / "hidden.yaml").write_text(hidden)
    proc = trtflow_cli("run", "hidden.yaml", cwd=root, check=1)
    out = " ".join(proc.stdout.split())
    assert ("select failed: evaluated_slots: node 'validate-hidden' (in validations) took candidate 'convert' "
            "(reference: convert, candidate: export) and none through evaluated_slots ['candidate', 'model']") in out
    assert "wire the candidate into that node's evaluated slot (validate: candidate, benchmark: model)" in out
    assert "Rejected: " not in proc.stdout and "candidate rejected" not in proc.stdout
