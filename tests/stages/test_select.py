"""The select stage: objectives, constraints, ties and reasons on measured figures; gathering real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtflow.errors import RecipeError
from trtflow_stages.decision.candidates import Candidate
from trtflow_stages.decision.params import Params
from trtflow_stages.decision.reasons import table
from trtflow_stages.decision.selection import decide, pareto_front
from trtflow_stages.select import gate, gather


def bench(node: str, points: list[tuple[int, float]], load: list[tuple[int, float, float]] = ()) -> dict:
    """A benchmark result: (batch, p50 ms) points (p99 = 1.5 x p50) and optional (concurrency, p99, qps) load."""
    return {"node": node, "backend": "onnxruntime", "device": "cpu",
            "points": [{"batch_size": b, "latency_ms": {"p50": ms, "p99": ms * 1.5}, "throughput_qps": b / ms * 1e3,
                        "flags": []} for b, ms in points],
            "load": [{"concurrency": c, "batch_size": 1, "latency_ms": {"p99": p99}, "throughput_qps": qps}
                     for c, p99, qps in load]}


def valid(node: str, cosine: float, passed: bool = True) -> dict:
    return {"node": node, "passed": passed, "cosine_similarity": cosine, "mean_abs_error": 1 - cosine,
            "max_abs_error": 1 - cosine, "task_metrics": {}, "failures": [] if passed else ["logits: mean error 0.2"],
            "uncalibrated_data": False}


def candidates() -> list[Candidate]:
    return [
        Candidate("fp32", "onnx", 4_000_000, "fp32", validation=valid("v-fp32", 1.0),
                  benchmark=bench("b-fp32", [(1, 1.0), (8, 4.0)])),
        Candidate("int8", "onnx", 1_000_000, "int8", validation=valid("v-int8", 0.997),
                  benchmark=bench("b-int8", [(1, 0.99), (8, 2.0)])),
        Candidate("fp16", "onnx", 2_000_000, "fp16", validation=valid("v-fp16", 0.9999, passed=False),
                  benchmark=bench("b-fp16", [(1, 0.5), (8, 1.0)])),
    ]


def by_name(selection: dict) -> dict[str, dict]:
    return {c["name"]: c for c in selection["candidates"]}


def test_min_latency_excludes_failed_validation_and_explains_every_loser():
    params = Params.model_validate({"objective": {"percentile": "p99", "batch_size": 8}, "baseline": "fp32"})
    fp32 = candidates()[0]
    selection = decide(candidates(), params, {"name": "fp32", **fp32.benchmark})
    rows = by_name(selection)
    assert selection["selected"] == "int8"
    assert rows["fp16"]["eligible"] is False and "validation failed (v-fp16)" in rows["fp16"]["reason"]
    assert rows["fp32"]["reason"] == "lowest p99 latency at batch 8: 6 ms vs 3 ms for int8 (2x slower)"
    assert rows["int8"]["speedup"] == pytest.approx(2.0) and rows["fp32"]["speedup"] == pytest.approx(1.0)
    assert selection["objective"]["description"] == "lowest p99 latency at batch 8"
    assert selection["constraints"] == [{"name": "validation", "limit": "passed", "text": "validation passed"}]
    assert "SELECTED" in table(selection).splitlines()[2]


def test_ties_within_tolerance_go_to_the_tie_breakers():
    # at batch 1, int8 (0.99 ms) and fp32 (1.0 ms) are within 2%: accuracy first picks fp32, size first int8
    accurate = decide(candidates(), Params.model_validate({"objective": {"batch_size": 1}}))
    assert accurate["selected"] == "fp32"
    assert "lost the tie-break on accuracy: mean abs error 0.003 vs 0, max abs error 0.003 vs 0, cosine similarity " \
        "0.997 vs 1 for fp32" in by_name(accurate)["int8"]["reason"]
    small = decide(candidates(), Params.model_validate(
        {"objective": {"batch_size": 1}, "tie_breakers": {"order": ["size"]}}))
    assert small["selected"] == "int8" and "chosen by size: 1 MB vs 4 MB for fp32" in by_name(small)["int8"]["reason"]
    # 1% apart: within the host's run-to-run allowance even with no tolerance; with neither, int8 wins
    allowed = decide(candidates(), Params.model_validate(
        {"objective": {"batch_size": 1}, "tie_breakers": {"tolerance_percent": 0}}))
    assert allowed["selected"] == "fp32"
    assert "no difference beyond the 0% preference band and the host's 15% run-to-run variation (stored figures)" \
        in by_name(allowed)["fp32"]["reason"]
    strict = decide(candidates(), Params.model_validate(
        {"objective": {"batch_size": 1}, "tie_breakers": {"tolerance_percent": 0, "run_to_run_percent": 0}}))
    assert strict["selected"] == "int8"


def test_default_batch_is_the_smallest_every_candidate_measured():
    selection = decide(candidates(), Params())
    assert selection["objective"]["batch_size"] == 1
    assert selection["objective"]["description"] == "lowest p50 latency at batch 1"


def test_throughput_objectives_and_the_load_sweep():
    best = decide(candidates(), Params.model_validate({"objective": {"goal": "max_throughput"},
                                                       "constraints": {"validation": "not_required"}}))
    assert best["selected"] == "int8"  # fp16 is faster but failed validation
    assert by_name(best)["int8"]["operating_point"]["batch_size"] == 8
    items = candidates()
    items[0].benchmark = bench("b-fp32", [(1, 1.0)], load=[(1, 2.0, 900.0), (4, 6.0, 2500.0), (16, 30.0, 3000.0)])
    items[1].benchmark = bench("b-int8", [(1, 1.0)], load=[(1, 2.5, 800.0), (4, 9.0, 2700.0)])
    budget = decide(items, Params.model_validate(
        {"objective": {"goal": "max_throughput_under_latency", "percentile": "p99", "latency_budget_ms": 7}}))
    rows = by_name(budget)
    assert budget["selected"] == "fp32"
    assert rows["fp32"]["operating_point"]["concurrency"] == 4  # 2500 qps within 7 ms; 16 is over budget
    assert rows["int8"]["operating_point"]["concurrency"] == 1
    assert rows["int8"]["reason"] == \
        "highest throughput with p99 latency <= 7 ms: 800 qps vs 2500 qps for fp32 (3.12x lower)"


def test_constraints_and_no_candidate_qualifies():
    params = Params.model_validate({"objective": {"goal": "min_size"},
                                    "constraints": {"max_size_mb": 3, "max_latency_ms": 0.995}})
    selection = decide(candidates(), params)
    rows = by_name(selection)
    assert selection["selected"] == "int8"
    assert rows["fp32"]["reason"] == "excluded: p50 latency 1 ms at batch 1 > max_latency_ms 0.995; size 4 MB > " \
                                     "max_size_mb 3"
    assert gate(params, selection, None) == []
    impossible = Params.model_validate({"constraints": {"max_size_mb": 0.5}})
    nothing = decide(candidates(), impossible)
    assert nothing["selected"] is None
    [message] = gate(impossible, nothing, None)
    assert message.startswith("no candidate qualifies for lowest p50 latency at batch 1:")
    assert "excluded: size 4 MB > max_size_mb 0.5" in message and "candidate  kind" in message


def test_missing_results_are_reasons_not_crashes():
    items = candidates()
    items[0].validation = None
    items[1].benchmark = bench("b-int8", [(1, 0.99)])
    selection = decide(items, Params.model_validate({"objective": {"batch_size": 8}}))
    rows = by_name(selection)
    assert rows["fp32"]["reason"] == "excluded: no validation result"
    assert rows["int8"]["reason"] == "excluded: not benchmarked at batch 8 (measured: 1)"
    assert selection["selected"] is None


def test_pareto_front_on_latency_and_accuracy():
    rows = [{"name": n, "operating_point": {"latency_ms": lat}, "validation": {"cosine_similarity": cos}}
            for n, lat, cos in (("a", 1.0, 0.99), ("b", 2.0, 0.999), ("c", 3.0, 0.995), ("d", 0.5, None))]
    assert pareto_front(rows) == {"a", "b"}


def test_objective_params_are_checked():
    with pytest.raises(ValueError, match="needs latency_budget_ms"):
        Params.model_validate({"objective": {"goal": "max_throughput_under_latency"}})
    with pytest.raises(ValueError, match="limit latency with constraints.max_latency_ms"):
        Params.model_validate({"objective": {"latency_budget_ms": 3}})


def _files(tmp_path: Path, tiny_mlp_onnx: Path) -> tuple[dict, dict]:
    """Candidate folders as the runner lays them out, with validation and benchmark files."""
    inputs: dict = {"candidates": [], "validations": [], "benchmarks": []}
    sources: dict = {"candidates": [], "validations": [], "benchmarks": []}
    for name in ("simplify", "quantize"):
        model = tmp_path / "candidates" / name / "model.onnx"
        model.parent.mkdir(parents=True)
        model.write_bytes(tiny_mlp_onnx.read_bytes())
        inputs["candidates"].append(model)
        sources["candidates"].append({"node": name, "template": name, "matrix": {}, "inputs": {}})
        check = tmp_path / "validations" / f"validate-{name}" / "validate.json"
        check.parent.mkdir(parents=True)
        check.write_text(json.dumps({"passed": True, "outputs": {"logits": {"cosine_similarity": 0.999,
                                                                            "mean_abs_error": 0.01}}}))
        inputs["validations"].append(check)
        sources["validations"].append({"node": f"validate-{name}", "template": "validate",
                                       "matrix": {"c": name}, "inputs": {"reference": ["simplify"],
                                                                         "candidate": [name]}})
    return inputs, sources


def test_gather_associates_results_through_the_evaluated_slot(tmp_path, tiny_mlp_onnx):
    inputs, sources = _files(tmp_path, tiny_mlp_onnx)
    found, _ = gather(inputs, sources, Params())
    assert [(c.name, c.kind, c.precision, c.validation["node"]) for c in found] == [
        ("simplify", "onnx", "fp32", "validate-simplify"), ("quantize", "onnx", "fp32", "validate-quantize")]
    assert found[0].size_bytes == tiny_mlp_onnx.stat().st_size
    with pytest.raises(RecipeError, match=r"took candidate 'simplify' .* and none through evaluated_slots \[.model.\]"):
        gather(inputs, sources, Params.model_validate({"evaluated_slots": ["model"]}))
    sources["validations"][0]["inputs"] = {"model": ["simplify"]}
    with pytest.raises(RecipeError, match=r"took several candidates .* and none through evaluated_slots \[.model.\]"):
        gather(inputs, sources, Params.model_validate({"evaluated_slots": ["model"]}))
    sources["validations"][1]["inputs"] = {"reference": ["export"]}
    with pytest.raises(RecipeError, match="evaluated none of the candidates"):
        gather(inputs, sources, Params())
    # a candidate taken only as the reference is not what the node's gate judges: never its owner
    sources["validations"][1]["inputs"] = {"reference": ["quantize"], "candidate": ["export"]}
    with pytest.raises(RecipeError, match=r"took candidate 'quantize' \(reference: quantize, candidate: export\) "
                       r"and none through evaluated_slots \['candidate', 'model'\]"):
        gather(inputs, sources, Params())


def test_gather_refuses_one_candidate_and_mixed_kinds(tmp_path, tiny_mlp_onnx):
    inputs, sources = _files(tmp_path, tiny_mlp_onnx)
    with pytest.raises(RecipeError, match="at least two candidates"):
        gather({"candidates": inputs["candidates"][:1]}, {"candidates": sources["candidates"][:1]}, Params())
    engine = tmp_path / "candidates" / "build" / "model.engine"
    engine.parent.mkdir(parents=True)
    engine.write_bytes(b"not onnx: an engine")
    mixed = {"candidates": [*inputs["candidates"], engine]}
    mixed_sources = {"candidates": [*sources["candidates"], {"node": "build", "matrix": {}, "inputs": {}}]}
    with pytest.raises(RecipeError, match=r"mix ONNX models \(simplify, quantize\) and engines \(build\)"):
        gather(mixed, mixed_sources, Params())


def _benchmark_file(folder: Path, batches: dict[int, float]) -> Path:
    path = folder / "benchmark.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"backend": "onnxruntime", "device": "cpu", "points": [
        {"batch_size": b, "report": {"latency_ms": {"p50": ms, "p99": ms * 2}, "throughput_qps": b / ms * 1e3,
                                     "flags": []}} for b, ms in batches.items()]}))
    return path


def _run(tmp_path: Path, inputs: dict, sources: dict, params: dict):
    from trtflow.stage import StageContext
    from trtflow_stages.select import run, stage

    ctx = StageContext("select", tmp_path / "scratch", tmp_path, stage.outputs, tmp_path / "cache",
                       input_sources=sources)
    return ctx, run(ctx, inputs, Params.model_validate(params))


def test_run_writes_the_selection_and_the_winner(tmp_path, tiny_mlp_onnx):
    inputs, sources = _files(tmp_path, tiny_mlp_onnx)
    (tmp_path / "candidates" / "quantize" / "model.onnx_data").write_bytes(b"external weights")
    inputs["benchmarks"], sources["benchmarks"] = [], []
    for name, ms in (("simplify", 2.0), ("quantize", 1.0)):
        inputs["benchmarks"].append(_benchmark_file(tmp_path / "benchmarks" / f"benchmark-{name}", {1: ms}))
        sources["benchmarks"].append({"node": f"benchmark-{name}", "inputs": {"model": [name]}})
    ctx, summary = _run(tmp_path, inputs, sources, {"baseline": "simplify"})
    written = json.loads((ctx.out_dir / "selection.json").read_text())
    assert written == summary and written["selected"] == "quantize"
    assert written["artifact"] == {"candidate": "quantize", "kind": "onnx",
                                   "files": ["model.onnx", "model.onnx_data"]}
    assert (ctx.out_dir / "model.onnx_data").read_bytes() == b"external weights"
    assert by_name(written)["quantize"]["speedup"] == pytest.approx(2.0)


def test_run_wiring_errors(tmp_path, tiny_mlp_onnx):
    inputs, sources = _files(tmp_path, tiny_mlp_onnx)
    with pytest.raises(RecipeError, match="needs benchmark results but no benchmarks are wired"):
        _run(tmp_path, inputs, sources, {})
    inputs["benchmarks"] = [_benchmark_file(tmp_path / "b1", {1: 1.0}), _benchmark_file(tmp_path / "b2", {1: 1.0})]
    sources["benchmarks"] = [{"node": "b1", "inputs": {"model": ["quantize"]}},
                             {"node": "b2", "inputs": {"model": ["quantize"]}}]
    with pytest.raises(RecipeError, match="candidate 'quantize' has two benchmarks: b1 and b2"):
        _run(tmp_path, inputs, sources, {})
    sources["benchmarks"][1]["inputs"] = {"model": ["simplify"]}
    with pytest.raises(RecipeError, match="baseline 'simplfy' is not a candidate") as error:
        _run(tmp_path, inputs, sources, {"baseline": "simplfy"})
    assert "simplify" in (error.value.hint or "")


def test_engine_candidates_bring_their_provenance(tmp_path):
    inputs: dict = {"candidates": [], "benchmarks": []}
    sources: dict = {"candidates": [], "benchmarks": []}
    for name, ms in (("build-fp16-bs8", 2.0), ("build-int8-bs8", 1.5)):
        folder = tmp_path / "candidates" / name
        folder.mkdir(parents=True)
        (folder / "model.engine").write_bytes(f"engine {name}".encode())
        (folder / "engine.json").write_text(json.dumps({
            "backend": "tensorrt", "builder": {"precision": "strongly-typed"},
            "profiles": [{"name": "bs8", "shapes": {"input": {"min": [1, 4], "opt": [8, 4], "max": [8, 4]}}}]}))
        inputs["candidates"].append(folder / "model.engine")
        sources["candidates"].append({"node": name, "matrix": {"dtype": name.split("-")[1], "profile": "bs8"},
                                      "inputs": {"model": ["quantize"]}})
        inputs["benchmarks"].append(_benchmark_file(tmp_path / "benchmarks" / name, {8: ms}))
        sources["benchmarks"].append({"node": f"benchmark-{name}", "inputs": {"model": [name]}})
    ctx, summary = _run(tmp_path, inputs, sources, {"constraints": {"validation": "not_required"}})
    rows = by_name(summary)
    assert summary["selected"] == "build-int8-bs8"
    assert rows["build-fp16-bs8"]["precision"] == "fp16" and rows["build-fp16-bs8"]["profiles"] == ["bs8"]
    assert summary["artifact"]["files"] == ["model.engine", "engine.json"]
    assert (ctx.out_dir / "model.engine").read_bytes() == b"engine build-int8-bs8"
    assert json.loads((ctx.out_dir / "engine.json").read_text())["backend"] == "tensorrt"


def _with_intervals(candidate: Candidate, intervals: dict[int, tuple[float, float]], wait: float = 0.0) -> Candidate:
    for point in candidate.benchmark["points"]:
        low, high = intervals[point["batch_size"]]
        point["latency_ci_ms"] = {"p50": [low, high]}
        point["cpu_wait_ms_per_query"] = wait
    return candidate


def test_a_win_needs_confidence_beyond_the_tolerance_else_the_tie_breakers_decide():
    fast, slow, quantized = candidates()
    quantized.validation = valid("v-fp16", 0.9999)
    # int8 at 2.0 ms [1.5, 2.6] against fp32 at 4.0 ms [3.4, 5.0] at batch 8: 2x apart, and the ratio's own interval
    # (1.47-2.88: both halves added in quadrature on the log scale) clears the 5% band and the 15% run-to-run
    # allowance (1.05 x 1.15 = 1.21): a clear win for the faster one, whatever accuracy says
    items = [_with_intervals(fast, {1: (0.9, 1.1), 8: (3.4, 5.0)}),
             _with_intervals(slow, {1: (0.9, 1.1), 8: (1.5, 2.6)})]
    clear = decide(items, Params.model_validate({"objective": {"batch_size": 8}, "finalists": {"measure": False}}))
    assert clear["selected"] == "int8" and not clear["tie_within_noise"] and clear["tied"] == []
    loser = by_name(clear)["fp32"]
    assert loser["tie"] is False and loser["ratio_to_best"] == pytest.approx([2.0, 1.4689, 2.8784], rel=1e-4)
    assert loser["basis"] == "stored figures"
    assert ("(2x slower; ratio 2, 95% interval 1.47-2.88, beyond the 5% preference band and the host's 15% "
            "run-to-run variation (stored figures))" in loser["reason"])
    # an interval from 1.13 clears the band but not the run-to-run allowance: a tie, accuracy decides
    items = [_with_intervals(candidates()[0], {1: (0.9, 1.1), 8: (2.4, 5.0)}),
             _with_intervals(candidates()[1], {1: (0.9, 1.1), 8: (1.5, 2.6)})]
    assert decide(items, Params.model_validate({"objective": {"batch_size": 8}}))["tie_within_noise"]

    # the same estimates with wide intervals: the ratio could be 1, a tie within noise, so accuracy decides
    items = [_with_intervals(candidates()[0], {1: (0.9, 1.1), 8: (1.8, 5.0)}),
             _with_intervals(candidates()[1], {1: (0.9, 1.1), 8: (1.5, 2.6)})]
    tie = decide(items, Params.model_validate({"objective": {"batch_size": 8}}))
    rows = by_name(tie)
    assert tie["selected"] == "fp32" and tie["tie_within_noise"] and tie["tied"] == ["fp32", "int8"]
    assert rows["fp32"]["reason"].startswith("selected: tie within noise on lowest p50 latency at batch 8")
    assert "chosen by accuracy: mean abs error 0 vs 0.003, max abs error 0 vs 0.003, cosine similarity 1 vs " \
        "0.997 for int8" in rows["fp32"]["reason"]
    assert "tie within noise with fp32" in rows["int8"]["reason"] and "lost the tie-break on accuracy" in \
        rows["int8"]["reason"]
    # the decision is a function of the figures: the same inputs always give the same choice
    assert decide(items, Params.model_validate({"objective": {"batch_size": 8}})) == tie


def test_a_candidate_measured_on_a_busy_host_is_unmeasurable_not_tied():
    # fp32 measured while its benchmark waited 3 ms of every 4 ms query for a CPU: 2.7x slower by the clock, but the
    # clock measured the host: unmeasurable, said so (not "a tie within noise" by an interval widened 16x)
    items = [_with_intervals(candidates()[0], {1: (0.9, 1.1), 8: (3.9, 4.1)}, wait=3.0),
             _with_intervals(candidates()[1], {1: (0.9, 1.1), 8: (1.45, 1.55)})]
    items[1].benchmark["points"][1]["latency_ms"]["p50"] = 1.5
    selection = decide(items, Params.model_validate({"objective": {"batch_size": 8}}))
    assert selection["unmeasurable"] == {"fp32": "unmeasurable: the benchmark waited for a CPU 75% of the time"}
    row = by_name(selection)["fp32"]
    assert row["objective_ci"] == [3.9, 4.1] and row["compared_ci"] == [3.9, 4.1]  # no widening
    assert selection["selected"] == "fp32"  # not ranked on the objective: the tie-breakers decided
    assert "fp32 unmeasurable: the benchmark waited for a CPU 75% of the time: not ranked on it" in row["reason"]
    assert "tie within noise" not in row["reason"]


def _rounds(ratios: dict[str, float], count: int, noise: float = 0.03, seed: int = 0) -> dict:
    """A record of finalists timed together: per round, each candidate's median is its ratio x a level the host
    drifted to (shared by the round) x its own noise."""
    import math
    import random

    from trtflow_stages.measure.statistics.paired import Schedule, select_budget

    rng = random.Random(seed)
    rounds = []
    for _ in range(count):
        level = math.exp(rng.gauss(0.0, 0.15))  # the host's speed moves by 15% between rounds: cancels
        rounds.append({name: {"p50": 2.0 * ratio * level * math.exp(rng.gauss(0.0, noise))}
                       for name, ratio in ratios.items()})
    return {"names": list(ratios), "figure": "p50", "batch_size": 8, "tolerance_percent": 5.0, "rounds": rounds,
            "looks": list(Schedule.up_to(count, select_budget(len(ratios))).looks), "ended": True,
            "seconds": {name: 1.0 for name in ratios}}


def test_finalists_timed_together_see_a_10_percent_win_through_the_drift():
    # stored figures 1.9 vs 2.0 ms with wide intervals: a tie, which accuracy would give to fp32
    items = [_with_intervals(candidates()[0], {1: (0.9, 1.1), 8: (1.5, 2.6)}),
             _with_intervals(candidates()[1], {1: (0.9, 1.1), 8: (1.5, 2.6)})]
    items[0].benchmark["points"][1]["latency_ms"]["p50"] = 1.9
    items[1].benchmark["points"][1]["latency_ms"]["p50"] = 2.0
    params = Params.model_validate({"objective": {"batch_size": 8}})
    assert decide(items, params)["selected"] == "fp32"
    # timed together, int8 is truly 10% faster: it wins, beyond the 5% preference band with confidence
    selection = decide(items, params, finalists=_rounds({"fp32": 1.1, "int8": 1.0}, 20))
    rows = by_name(selection)
    assert selection["selected"] == "int8" and rows["fp32"]["tie"] is False and rows["fp32"]["basis"] == "paired A/B"
    assert rows["fp32"]["paired"]["outcome"] == "loses" and rows["fp32"]["paired"]["ratio"] == pytest.approx(1.1,
                                                                                                              rel=0.03)
    assert "timed together over" in rows["fp32"]["reason"]
    assert "beyond the 5% preference band" in rows["fp32"]["reason"]
    assert selection["finalists"]["measured"] and selection["finalists"]["rounds"] == 20
    # 2% apart: within the band with confidence; the preference (accuracy) decides
    close = decide(items, params, finalists=_rounds({"fp32": 1.02, "int8": 1.0}, 20, noise=0.01))
    assert close["selected"] == "fp32" and by_name(close)["fp32"]["paired"]["outcome"] == "within"
    assert "the fastest when the finalists were timed together, but fp32 was within the preference band of it" in \
        by_name(close)["int8"]["reason"]
    assert "lost the tie-break on accuracy" in by_name(close)["int8"]["reason"]
    # why they were not timed together is said
    said = decide(items, params, finalists={"why": "the finalists were benchmarked with different devices"})
    assert said["finalists"] == {"measured": False, "why": "the finalists were benchmarked with different devices"}


def test_run_times_the_finalists_together_on_onnxruntime(tmp_path, tiny_mlp_onnx):
    """End to end: two candidates tied on their stored figures are timed again, together, with the ONNX Runtime
    options their benchmarks used; the selection records the rounds (or says why it could not)."""
    inputs, sources = _files(tmp_path, tiny_mlp_onnx)
    inputs["benchmarks"], sources["benchmarks"] = [], []
    method = {"onnxruntime": {"intra_op_threads": 1}, "min_duration_s": 0.1, "repeats": 5, "max_duration_s": 0.3,
              "warmup_ms": 10.0}
    for name in ("simplify", "quantize"):
        path = _benchmark_file(tmp_path / "benchmarks" / f"benchmark-{name}", {2: 0.05})
        data = json.loads(path.read_text())
        data["method"] = method
        data["points"][0]["shapes"] = {"input": [2, 16]}
        path.write_text(json.dumps(data))
        inputs["benchmarks"].append(path)
        sources["benchmarks"].append({"node": f"benchmark-{name}", "inputs": {"model": [name]}})
    _, summary = _run(tmp_path, inputs, sources, {})
    finalists = summary["finalists"]
    assert finalists["measured"] and finalists["names"] == ["simplify", "quantize"]
    assert finalists["rounds"] >= 8 and finalists["batch_size"] == 2 and finalists["figure"] == "p50"
    # a new random order each run, recorded so it can be replayed; short windows (8 queries, at least 0.02 s)
    assert isinstance(finalists["seed"], int) and len(finalists["orders"]) == finalists["rounds"]
    assert 0.02 <= finalists["window_s"] <= 0.2
    rows = by_name(summary)
    assert {row["basis"] for row in rows.values()} == {"paired A/B"}
    assert summary["selected"] in ("simplify", "quantize")  # the same model twice: never told apart beyond 5%
    assert all(row["tie"] for row in rows.values())
    # without the shapes of the benchmarked batch, the stored figures decide, and the selection says why
    data = json.loads(inputs["benchmarks"][0].read_text())
    del data["points"][0]["shapes"]
    inputs["benchmarks"][0].write_text(json.dumps(data))
    _, stored = _run(tmp_path / "again", inputs, sources, {})
    assert stored["finalists"] == {"measured": False,
                                   "why": "simplify's benchmark does not record the shapes of batch 2"}


def test_load_objective_finalists_are_timed_together_on_their_service(tmp_path, tiny_mlp_onnx):
    """A load objective (the highest throughput whose p99 meets a bound, over a load sweep): each finalist is timed
    together with the other on its chosen level's service (fixed-batch windows at that level's batch, throughput
    compared per round, each at its own batch); which levels meet the bound stays on the stored figures, and the
    selection says the rule. A level whose batch has no recorded shapes: the stored figures decide, said why."""
    inputs, sources = _files(tmp_path, tiny_mlp_onnx)
    inputs["benchmarks"], sources["benchmarks"] = [], []
    method = {"onnxruntime": {"intra_op_threads": 1}, "min_duration_s": 0.1, "repeats": 5, "max_duration_s": 0.15,
              "warmup_ms": 10.0}
    for name, best_batch in (("simplify", 4), ("quantize", 2)):
        path = _benchmark_file(tmp_path / "benchmarks" / f"benchmark-{name}", {2: 0.05, 4: 0.08})
        data = json.loads(path.read_text())
        data["method"] = method
        for point in data["points"]:
            point["shapes"] = {"input": [point["batch_size"], 16]}
        # levels: concurrency 2 at batch 2 and 4; each candidate's best level within the 5 ms p99 bound differs
        data["load"] = [{"concurrency": 2, "batch_size": b, "latency_ms": {"p50": 1.0, "p99": 2.0 if b == best_batch
                                                                            else 9.0},
                         "throughput_qps": 4000.0 if b == best_batch else 9000.0} for b in (2, 4)]
        path.write_text(json.dumps(data))
        inputs["benchmarks"].append(path)
        sources["benchmarks"].append({"node": f"benchmark-{name}", "inputs": {"model": [name]}})
    params = {"objective": {"goal": "max_throughput_under_latency", "percentile": "p99", "latency_budget_ms": 5}}
    _, summary = _run(tmp_path, inputs, sources, params)
    finalists = summary["finalists"]
    assert finalists["measured"] and finalists["figure"] == "throughput" and finalists["rounds"] >= 2
    assert finalists["batch_size"] == {"simplify": 4, "quantize": 2}  # each at its own level's batch
    assert "latency bound" in finalists["load_rule"] and finalists["runtime"] == "onnxruntime"
    rows = by_name(summary)
    assert {row["basis"] for row in rows.values()} == {"paired A/B"}
    assert rows["simplify"]["operating_point"]["concurrency"] == 2
    # the same model at batch 4 and at batch 2: batch 4 serves more per second than batch 2 does on this tiny MLP
    # (about twice), and the throughput rounds see it: simplify leads; quantize loses (or, on a host too busy to
    # decide by the cap, stays undecided, which its reason says)
    assert rows["simplify"]["paired"] is None and rows["quantize"]["paired"]["ratio"] > 1.0, rows["quantize"]["reason"]
    assert rows["quantize"]["paired"]["outcome"] in ("loses", "undecided")
    if rows["quantize"]["paired"]["outcome"] == "loses":
        assert summary["selected"] == "simplify"
    data = json.loads(inputs["benchmarks"][0].read_text())
    data["points"] = [p for p in data["points"] if p["batch_size"] != 4]
    inputs["benchmarks"][0].write_text(json.dumps(data))
    _, stored = _run(tmp_path / "again", inputs, sources, params)
    assert stored["finalists"] == {"measured": False, "why": "simplify's benchmark does not record the shapes of its "
                                   "load level's batch 4 among its fixed-batch points"}

def _validated(node: str, reference, candidate) -> dict:
    """A candidate's accuracy as select keeps it, from outputs measured as validate measures them."""
    from trtflow_stages.accuracy.compare import measure_outputs
    from trtflow_stages.decision.candidates import accuracy_of

    outputs = measure_outputs({"y": reference}, {"y": candidate})
    return accuracy_of({"passed": True, "outputs": outputs}, node)


def test_accuracy_decides_only_beyond_resolution_and_spread_the_reported_case():
    # issue 32: "chosen by accuracy: cosine similarity 1 vs 0.99999998 for simplify" picked the fp16 candidate (mean
    # error 1.68e-5) over the fp32 one (9.3e-9): the cosines' eighth digit is float rounding, the mean errors are
    # 1,800 times apart. A validate.json as it was written then (no uncertainty recorded):
    from trtflow_stages.decision.candidates import accuracy_of

    def stored(node: str, cosine: float, mean: float, largest: float) -> dict:
        return accuracy_of({"passed": True, "outputs": {"y": {"elements": 10_000, "cosine_similarity": cosine,
                                                              "mean_abs_error": mean, "max_abs_error": largest}}},
                           node)

    items = [Candidate("simplify", "onnx", 4_000_000, "fp32",
                       validation=stored("v-simplify", 0.99999998, 9.3e-9, 6e-8),
                       benchmark=bench("b-simplify", [(1, 1.0)])),
             Candidate("convert", "onnx", 2_000_000, "fp16", validation=stored("v-convert", 1.0, 1.68e-5, 1.2e-4),
                       benchmark=bench("b-convert", [(1, 1.0)]))]
    rows = by_name(decide(items, Params()))
    assert rows["simplify"]["rank"] == 1
    assert "chosen by accuracy: mean abs error 9.3e-09 vs 1.68e-05, max abs error 6e-08 vs 0.00012, cosine " \
        "similarity 0.99999998 vs 1 within its resolution and spread" in rows["simplify"]["reason"]
    assert "lost the tie-break on accuracy: mean abs error 1.68e-05 vs 9.3e-09" in rows["convert"]["reason"]

    # the same from outputs measured the way validate measures them: fp16 rounding against fp32 noise at rounding
    import numpy as np

    rng = np.random.default_rng(0)
    reference = rng.normal(0.0, 0.1, (16, 500)).astype(np.float32)
    fp16 = reference.astype(np.float16).astype(np.float32)
    fp32 = (reference + rng.normal(0.0, 1e-8, reference.shape)).astype(np.float32)
    fp32_too = (reference + rng.normal(0.0, 1e-8, reference.shape)).astype(np.float32)
    measured = [Candidate("fp32", "onnx", 4_000_000, "fp32", validation=_validated("v-fp32", reference, fp32),
                          benchmark=bench("b-fp32", [(1, 1.0)])),
                Candidate("fp16", "onnx", 2_000_000, "fp16", validation=_validated("v-fp16", reference, fp16),
                          benchmark=bench("b-fp16", [(1, 1.0)]))]
    rows = by_name(decide(measured, Params()))
    assert rows["fp32"]["rank"] == 1 and "chosen by accuracy: mean abs error" in rows["fp32"]["reason"]
    # with size first, the smaller one wins: accuracy only breaks what size leaves tied
    assert decide(measured, Params.model_validate({"tie_breakers": {"order": ["size", "accuracy"]}}))[
        "selected"] == "fp16"

    # two fp32 candidates apart only by rounding: accuracy cannot order them, the next tie-breaker (size) decides
    twins = [Candidate("a", "onnx", 4_000_000, "fp32", validation=_validated("v-a", reference, fp32),
                       benchmark=bench("b-a", [(1, 1.0)])),
             Candidate("b", "onnx", 3_000_000, "fp32", validation=_validated("v-b", reference, fp32_too),
                       benchmark=bench("b-b", [(1, 1.0)]))]
    selection = decide(twins, Params())
    rows = by_name(selection)
    assert rows["b"]["rank"] == 1 and "chosen by size: 3 MB vs 4 MB for a" in rows["b"]["reason"]
    assert "accuracy did not order them: mean abs error" in rows["b"]["reason"]
    assert "within its resolution and spread" in rows["b"]["reason"]
    lines = table(selection).splitlines()  # the table prints their cosines alike, at the cosine's resolution
    assert lines[1].split()[4] == lines[2].split()[4]


def test_accuracy_figures_that_disagree_leave_the_decision_to_the_next_tie_breaker():
    # a has the better mean error, b the better max error, each beyond its resolution and spread: not ordered
    def record(node: str, mean: float, largest: float) -> dict:
        return {"node": node, "passed": True, "cosine_similarity": 0.999, "mean_abs_error": mean,
                "max_abs_error": largest, "failures": [],
                "uncertainty": {"mean_abs_error": {"resolution": 1e-7, "spread": 1e-5},
                                "max_abs_error": {"resolution": 1e-6, "spread": 1e-3}}}

    items = [Candidate("a", "onnx", 4_000_000, "int8", validation=record("v-a", 1e-3, 0.5),
                       benchmark=bench("b-a", [(1, 1.0)])),
             Candidate("b", "onnx", 3_000_000, "int8", validation=record("v-b", 2e-3, 0.1),
                       benchmark=bench("b-b", [(1, 1.0)]))]
    rows = by_name(decide(items, Params()))
    assert rows["b"]["rank"] == 1 and "chosen by size" in rows["b"]["reason"]
    # a mean error beyond the spread with nothing against it decides
    items[1].validation = record("v-b", 2e-3, 0.5)
    assert decide(items, Params())["selected"] == "a"
    # within the rows' spread it does not
    items[1].validation = record("v-b", 1.005e-3, 0.5)
    assert decide(items, Params())["selected"] == "b"
