"""The engine paths of validate and benchmark, and the TensorRT runtime interface.

No TensorRT engine can execute on the machines that run this suite (no GPU; TensorRT-RTX refuses the
datacenter GPUs we could borrow). The engine is real (TensorRT-RTX builds it on the CPU for compute capability
12.0, with its real engine.json); the ``*_fake_trt*`` tests give the machine an RTX GPU of that compute capability
(`fake_rtx_machine`: the GPU list and the cuda-python presence the runtime reads) and replace only TensorRT's
deserialisation (`runtimes.trt_runtime.deserialize_engine`) by `FakeEngineSession`, and the cuda-python harness by
`FakeTimer`. Both stand for TensorRT execution on a GPU: the session computes its outputs with ONNX Runtime on the
ONNX model the engine was built from; the timer calls each enqueue on the host clock. Everything around them --
the provenance, version, GPU and digest checks `open_engine` makes before deserialising, data, shapes, comparison,
statistics, gates, reports -- is real.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import xxhash

from trtflow.environment import GpuInfo, module_available
from trtflow.errors import StageFailed
from trtflow.stage import GateContext
from trtflow.testing import run_stage
from trtflow_stages import benchmark, build, validate
from trtflow_stages.data import onnx_input_specs
from trtflow_stages.measure.statistics.stats import QueryTiming
from trtflow_stages.measure.timing.cuda_timing import TimingRun
from trtflow_stages.runtimes import tensorrt as _tensorrt
from trtflow_stages.runtimes import trt_runtime as _trt_runtime
from trtflow_stages.runtimes.trt_runtime import DeviceTensor


class FakeEngineSession:
    """Stands for a TensorRT execution context: runs the source ONNX model with ONNX Runtime."""

    def __init__(self, onnx_path: Path, output_scale: float = 1.0, log: list | None = None) -> None:
        import onnxruntime as ort

        self.onnx_path = onnx_path
        self.output_scale = output_scale
        self.session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        self.log = log if log is not None else []
        self.entered = False
        self.enqueues = 0
        self.feed: dict = {}
        self.prepared: dict = {}
        self.shapes: dict = {}
        self.batches: list[int] = []
        self.profiled = False

    def __enter__(self) -> FakeEngineSession:
        self.entered = True
        self.log.append(("enter", id(self)))
        return self

    def __exit__(self, *exc: object) -> None:
        self.entered = False
        self.log.append(("exit", id(self)))

    def input_specs(self):
        return onnx_input_specs(self.onnx_path)

    def output_names(self):
        return [o.name for o in self.session.get_outputs()]

    def infer(self, feed):
        assert self.entered, "infer() outside the session's with-block"
        outputs = self.session.run(None, dict(feed))
        return {name: value * self.output_scale for name, value in zip(self.output_names(), outputs, strict=True)}

    def prepare(self, feed):
        assert self.entered, "prepare() outside the session's with-block"
        self.feed = {name: np.array(value) for name, value in feed.items()}
        self.prepared = {name: tuple(a.shape) for name, a in self.feed.items()}
        self.shapes = dict(self.prepared)
        outputs = self.session.run(None, self.feed)
        tensors = [DeviceTensor(name, True, tuple(a.shape), a.dtype.name, 0x1000 + i, a.nbytes)
                   for i, (name, a) in enumerate(self.feed.items())]
        tensors += [DeviceTensor(name, False, tuple(a.shape), a.dtype.name, 0x2000 + i, a.nbytes)
                    for i, (name, a) in enumerate(zip(self.output_names(), outputs, strict=True))]
        return tensors

    def reshape(self, shapes):
        for name, shape in shapes.items():
            assert all(d <= p for d, p in zip(shape, self.prepared[name], strict=True)), "larger than prepared"
        self.shapes = {name: tuple(shape) for name, shape in shapes.items()}

    def enqueue(self, stream: int) -> bool:
        self.enqueues += 1
        feed = {name: array[: self.shapes[name][0]] for name, array in self.feed.items()}
        self.batches.append(next(iter(feed.values())).shape[0])
        self.session.run(None, feed)
        return True

    def layer_information(self):
        return {"Layers": [{"Name": node.name, "LayerType": node.op_type} for node in self._graph_nodes()]}

    def profile_layers(self, stream, iterations, synchronize):
        """Each ONNX node stands for one engine layer; its 'time' is its position (a known ranking)."""
        assert self.entered and self.prepared
        self.profiled = True
        times = {}
        for _ in range(iterations):
            assert self.enqueue(stream)
            synchronize(stream)
            for rank, node in enumerate(self._graph_nodes(), 1):
                times.setdefault(node.name, []).append(0.01 * rank)
        return times

    def _graph_nodes(self):
        import onnx

        return list(onnx.load(str(self.onnx_path)).graph.node)

    def fork(self) -> FakeEngineSession:
        return FakeEngineSession(self.onnx_path, self.output_scale, self.log)


class FakeTimer:
    """Stands for the cuda-python harness on a GPU: calls each enqueue and times it on the host clock."""

    instances: ClassVar[list] = []

    def __init__(self) -> None:
        self.streams: list[int] = []
        self.work: list = []
        self.options = None
        FakeTimer.instances.append(self)

    def __enter__(self) -> FakeTimer:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def new_stream(self) -> int:
        self.streams.append(100 + len(self.streams))
        return self.streams[-1]

    def pinned_array(self, shape, dtype):
        return np.zeros(shape, dtype)

    def synchronize(self, stream: int) -> None:
        assert stream in self.streams

    def time(self, work, options) -> TimingRun:
        self.work, self.options = list(work), options
        origin = time.perf_counter_ns()
        trace = []
        for _ in range(options.min_iterations):
            for index, item in enumerate(work):
                start = (time.perf_counter_ns() - origin) / 1e6
                assert item.enqueue(item.stream) is not False
                end = (time.perf_counter_ns() - origin) / 1e6
                trace.append(QueryTiming(index, start, end, start, start, start, end, end, end))
        graphs = [False] * len(work)
        failures = [f"stream {i}: CUDA graph capture failed (fake harness); timed plain enqueues"
                    for i in range(len(work))] if options.use_cuda_graph else []
        return TimingRun(trace=trace, cuda_graph=graphs, graph_failures=failures)


needs_rtx = pytest.mark.skipif(not module_available("tensorrt_rtx"), reason="needs tensorrt-rtx to build the engine")
#: The GPU the fakes give the machine: one TensorRT-RTX runs on.
RTX_GPU = GpuInfo(index=0, name="NVIDIA GeForce RTX 5090", compute_capability="12.0", driver="580.95",
                  memory_mib=32607)
PROFILE = {"name": "b1to8", "shapes": {"input": {"min": [1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [8, 3, 32, 32]}}}


@pytest.fixture(scope="module")
def built_engine(tiny_cnn_onnx, tmp_path_factory):
    """A real TensorRT-RTX engine of the CNN for compute capability 12.0, and the build's real engine.json."""
    if not module_available("tensorrt_rtx"):
        pytest.skip("needs tensorrt-rtx to build the engine")
    result = run_stage(build.stage, {"backend": "tensorrt-rtx", "compute_capabilities": ["12.0"], "profile": PROFILE},
                       {"model": tiny_cnn_onnx}, tmp_path_factory.mktemp("engine"))
    return result.outputs["engine"], result.outputs["provenance"]


@pytest.fixture
def engine_files(built_engine, tmp_path):
    """A private copy of the engine and its engine.json (a test may change them)."""
    import shutil

    engine, provenance = (tmp_path / "model.engine", tmp_path / "engine.json")
    shutil.copyfile(built_engine[0], engine)
    shutil.copyfile(built_engine[1], provenance)
    return engine, provenance


def fake_rtx_machine(monkeypatch, make_session, gpu: GpuInfo = RTX_GPU) -> list:
    """This machine gets ``gpu`` (and cuda-python), and TensorRT's deserialisation returns ``make_session()``;
    returns what was deserialised: (engine file name, flavour, digest of the bytes)."""
    opened: list = []
    monkeypatch.setattr(_trt_runtime, "gpus", lambda: [gpu])
    monkeypatch.setattr(_tensorrt, "gpus", lambda: [gpu])
    real_module_available = _trt_runtime.module_available
    monkeypatch.setattr(_trt_runtime, "module_available",
                        lambda name: name == "cuda.bindings" or real_module_available(name))

    def deserialize_engine(flavour, data, engine_path):
        opened.append((Path(engine_path).name, flavour, xxhash.xxh3_128_hexdigest(data)))
        return make_session()

    monkeypatch.setattr(_trt_runtime, "deserialize_engine", deserialize_engine)
    return opened


def _fake_runtime(monkeypatch, onnx_path: Path, output_scale: float = 1.0) -> list:
    return fake_rtx_machine(monkeypatch, lambda: FakeEngineSession(onnx_path, output_scale))


def test_validate_engine_candidate_fake_trt(monkeypatch, tiny_cnn_onnx, engine_files, tmp_path):
    engine, provenance = engine_files
    opened = _fake_runtime(monkeypatch, tiny_cnn_onnx)
    data = {"random": {"seed": 0, "num_samples": 4}}
    # No provenance input: the build stage's engine.json beside the engine is found.
    result = run_stage(validate.stage, {"data": data, "batch_size": 2},
                       {"reference": tiny_cnn_onnx, "candidate": engine}, workdir=tmp_path / "same")
    metrics = json.loads(result.outputs["metrics"].read_text())
    assert metrics["candidate"] == "tensorrt-rtx engine"
    assert validate.stage.judge(validate.Params.model_validate({"data": data}), result.summary, GateContext()) == []
    digest = json.loads(provenance.read_text())["engine_digest"]
    assert opened == [("model.engine", "tensorrt-rtx", digest)]  # the flavour came from engine.json, digest checked

    _fake_runtime(monkeypatch, tiny_cnn_onnx, output_scale=2.0)
    params = {"data": data, "batch_size": 2, "expect": "fp16"}
    scaled = run_stage(validate.stage, params,
                       {"reference": tiny_cnn_onnx, "candidate": engine, "provenance": provenance},
                       workdir=tmp_path / "scaled")
    failures = validate.stage.judge(validate.Params.model_validate(params), scaled.summary, GateContext())
    assert failures[0].reason.startswith("logits: elements exceed both atol 0.01 and rtol 0.01")


def test_benchmark_tensorrt_path_fake_trt(monkeypatch, tiny_cnn_onnx, engine_files, tmp_path):
    engine, _ = engine_files  # engine.json lies beside it
    _fake_runtime(monkeypatch, tiny_cnn_onnx)
    FakeTimer.instances.clear()
    monkeypatch.setattr(benchmark, "_cuda_timer", FakeTimer)
    params = {"backend": "tensorrt-rtx", "streams": 2, "include_host_transfers": True, "min_iterations": 4,
              "warmup_ms": 0, "batch_sizes": [1, 4], "shapes": {"input": [1, 3, 32, 32]}, "repeats": 1,
              "min_duration_s": 0}
    result = run_stage(benchmark.stage, params, {"model": engine}, workdir=tmp_path)
    metrics = json.loads(result.outputs["metrics"].read_text())
    assert metrics["backend"] == "tensorrt-rtx" and metrics["device"] == "cuda"
    assert [p["batch_size"] for p in metrics["points"]] == [1, 4]

    first, second = FakeTimer.instances
    for timer, batch in ((first, 1), (second, 4)):
        assert len(timer.work) == 2 and len(set(timer.streams)) == 2  # two contexts on two streams
        sessions = [item.enqueue.__self__ for item in timer.work]
        assert len(set(sessions)) == 2  # the opened session and a fork of it
        assert sessions[1].enqueues == 4  # a fresh fork per batch size
        input_bytes = batch * 3 * 32 * 32 * 4
        for item in timer.work:
            assert [c.nbytes for c in item.h2d] == [input_bytes] and [c.nbytes for c in item.d2h] == [batch * 40]
            assert item.h2d[0].dst == 0x1000 and item.d2h[0].src == 0x2000
        assert timer.options.use_cuda_graph and timer.options.include_host_transfers
    assert first.work[0].enqueue.__self__ is second.work[0].enqueue.__self__  # re-prepared, not re-opened
    assert first.work[0].enqueue.__self__.enqueues == 8
    point = metrics["points"][1]
    assert point["runs_on"] == "tensorrt-rtx engine, 2 stream(s)" and point["report"]["queries"] == 8
    assert point["report"]["cuda_graph"] is False
    assert {"multi-stream", "no-cuda-graph"} <= {w["flag"] for w in point["report"]["warnings"]}


def test_benchmark_load_on_engine_contexts_fake_trt(monkeypatch, tiny_cnn_onnx, engine_files, tmp_path):
    """Load on an engine: one execution context and stream per instance, buffers bound once at the largest
    batch, every batch reshaped within them and inside the engine's optimization profile (from engine.json)."""
    engine, _ = engine_files  # built with the profile b1to8 (batch 1 to 8), recorded in its engine.json
    sessions: list = []

    def make_session():
        sessions.append(FakeEngineSession(tiny_cnn_onnx))
        return sessions[-1]

    fake_rtx_machine(monkeypatch, make_session)
    monkeypatch.setattr(benchmark, "_cuda_timer", FakeTimer)
    params = {"backend": "tensorrt-rtx", "min_iterations": 2, "warmup_ms": 0, "min_duration_s": 0,
              "shapes": {"input": [4, 3, 32, 32]}, "streams": [1, 2], "concurrency": [1, 3],
              "arrival_rate_qps": [400], "dynamic_batching": {"max_batch_size": 8, "max_queue_delay_ms": 2},
              "load_duration_s": 0.2, "load_warmup_s": 0.0, "latency_budget_ms": 5000}
    result = run_stage(benchmark.stage, params, {"model": engine}, workdir=tmp_path)
    metrics = json.loads(result.outputs["metrics"].read_text())
    assert [(p["streams"], p["concurrency"]) for p in metrics["load"]] == [(1, 1), (1, 3), (2, 1), (2, 3)]
    assert [p["streams"] for p in metrics["points"]] == [1, 2]  # fixed-batch points per stream count too
    assert metrics["load_settings"]["batch_limits"] == [1, 8]
    served = sessions[1:]  # sessions[0] timed the fixed-batch points
    assert len(served) == 2  # one engine load per stream count; its forks are the other instances
    for session in served:
        assert session.prepared == {"input": (8, 3, 32, 32)}  # bound once at max_batch_size
        assert session.batches and max(session.batches) <= 8
    for point in metrics["load"]:
        assert point["throughput_qps"] > 0 and 1 <= point["mean_batch_size"] <= 8
    (open_point, _) = metrics["open_loop"]
    assert open_point["arrival_rate_qps"] == 400 and open_point["meets_budget"]
    assert [b["streams"] for b in metrics["max_rate_meeting_budget"]] == [1, 2]

    params["dynamic_batching"] = {"max_batch_size": 16}
    with pytest.raises(Exception, match=r"max_batch_size 16 exceeds the largest batch the model accepts \(8"):
        run_stage(benchmark.stage, params, {"model": engine}, workdir=tmp_path / "too-big")


def test_benchmark_layer_profile_fake_trt(monkeypatch, tiny_cnn_onnx, engine_files, tmp_path):
    """Layer information and per-layer times come from a separate execution context, not the timed one."""
    engine, _ = engine_files
    _fake_runtime(monkeypatch, tiny_cnn_onnx)
    FakeTimer.instances.clear()
    monkeypatch.setattr(benchmark, "_cuda_timer", FakeTimer)
    params = {"backend": "tensorrt-rtx", "min_iterations": 2, "warmup_ms": 0, "min_duration_s": 0,
              "shapes": {"input": [2, 3, 32, 32]}, "profile_layers": True, "profile_iterations": 3}
    result = run_stage(benchmark.stage, params, {"model": engine}, workdir=tmp_path)
    layers = json.loads(result.outputs["layers"].read_text())
    names = [layer["Name"] for layer in layers["layer_information"]["Layers"]]
    profile = layers["profile"]
    assert layers["batch_size"] == 2 and profile["iterations"] == 3
    assert [layer["name"] for layer in profile["layers"]] == names[::-1]  # most expensive (last) first
    top = profile["layers"][0]
    assert top["average_ms"] == pytest.approx(0.01 * len(names))
    assert top["median_ms"] == pytest.approx(top["average_ms"])
    assert sum(layer["percent"] for layer in profile["layers"]) == pytest.approx(100.0)
    assert result.summary["top_layers"][0] == {"name": top["name"], "average_ms": top["average_ms"],
                                               "percent": top["percent"]}
    assert len(result.summary["top_layers"]) == min(5, len(names))
    timed = FakeTimer.instances[0].work[0].enqueue.__self__
    assert not timed.profiled  # the profiler never touched the context that was timed
    assert json.loads(result.outputs["metrics"].read_text())["top_layers"][0]["name"] == top["name"]
    with pytest.raises(ValueError, match="profile_layers needs an engine"):
        benchmark.Params.model_validate({"backend": "onnxruntime", "profile_layers": True})


@needs_rtx
def test_open_engine_checks_provenance_before_loading(tmp_path):
    """Real: a provenance from another TensorRT-RTX version is refused before anything is deserialised."""
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"never read")
    provenance = tmp_path / "engine.json"
    provenance.write_text(json.dumps({"backend": "tensorrt-rtx", "version": "0.0.1"}))
    with pytest.raises(StageFailed, match=r"engine built for tensorrt-rtx 0\.0\.1 but this machine has "):
        _trt_runtime.open_engine(engine, provenance, "auto")
    provenance.write_text("{not json")
    with pytest.raises(StageFailed, match=r"engine provenance \(engine.json\) .* is damaged \(not valid JSON"):
        _trt_runtime.open_engine(engine, provenance, "auto")


def test_the_fakes_leave_every_check_before_deserialising_real_fake_trt(monkeypatch, engine_files, tiny_cnn_onnx):
    """With an RTX GPU and a fake deserialisation, open_engine still refuses a changed engine, an engine without a
    digest, another GPU and another TensorRT-RTX version, and deserialises nothing then."""
    engine, provenance = engine_files
    opened = _fake_runtime(monkeypatch, tiny_cnn_onnx)
    manifest = json.loads(provenance.read_text())
    engine.write_bytes(engine.read_bytes() + b"!")
    with pytest.raises(StageFailed, match="does not match its provenance"):
        _trt_runtime.open_engine(engine, provenance, "auto")
    provenance.write_text(json.dumps({key: value for key, value in manifest.items() if key != "engine_digest"}))
    with pytest.raises(StageFailed, match="records no engine digest"):
        _trt_runtime.open_engine(engine, provenance, "auto")
    provenance.write_text(json.dumps(dict(manifest, version="0.0.1")))
    with pytest.raises(StageFailed, match=r"engine built for tensorrt-rtx 0\.0\.1"):
        _trt_runtime.open_engine(engine, provenance, "auto")
    assert opened == []
    ada = GpuInfo(index=0, name="NVIDIA GeForce RTX 4090", compute_capability="8.9", driver="580.95", memory_mib=24564)
    fake_rtx_machine(monkeypatch, lambda: FakeEngineSession(tiny_cnn_onnx), gpu=ada)
    provenance.write_text(json.dumps(manifest))
    with pytest.raises(StageFailed, match=r"engine built for compute capabilities 12\.0 but this machine's GPU "
                       r"NVIDIA GeForce RTX 4090 has compute capability 8\.9"):
        _trt_runtime.open_engine(engine, provenance, "auto")
    assert opened == []


def test_runtime_available_names_the_reason():
    reason = _trt_runtime.runtime_available("auto")
    if reason is None:
        pytest.skip("engines can execute here")
    assert "GPU" in reason or "installed" in reason
    assert "compute capability 7.5, 8.6, 8.9, 12.0, 12.1" in _trt_runtime.runtime_needs("tensorrt-rtx")


def test_benchmark_times_the_reference_engine_in_pairs_fake_trt(monkeypatch, tiny_cnn_onnx, engine_files, tmp_path):
    """A gated engine benchmark: the reference engine (laid out as the engine lays out a pin) is deserialised,
    checked like the candidate, and timed at the gate point in A/B pairs on the same harness; the verdict rests on
    the pairs. A reference that cannot be opened here falls back to stored figures, saying why."""
    import shutil

    from trtflow.stage import Reference
    from trtflow.verdicts import PAIRED, STORED

    engine, provenance = engine_files
    pinned = tmp_path / "reference" / "inputs" / "model"
    pinned.mkdir(parents=True)
    shutil.copy(engine, pinned / "model.engine")
    shutil.copy(provenance, pinned / "engine.json")
    opened = _fake_runtime(monkeypatch, tiny_cnn_onnx)
    monkeypatch.setattr(benchmark, "_cuda_timer", FakeTimer)
    params = {"backend": "tensorrt-rtx", "min_iterations": 10, "warmup_ms": 0, "batch_sizes": [1, 4],
              "shapes": {"input": [1, 3, 32, 32]}, "repeats": 5, "min_duration_s": 0.5,
              "max_regression_percent": 10}
    reference = Reference("the last accepted result", {"model": pinned / "model.engine"}, {},
                          {"summary": {"points": []}})
    result = run_stage(benchmark.stage, params, {"model": engine}, workdir=tmp_path / "run", reference=reference)
    assert [name for name, _, _ in opened] == ["model.engine", "model.engine"]  # candidate and reference, checked
    paired = result.summary["reference"]["paired"]
    assert result.summary["reference"]["basis"] == "paired A/B"
    assert paired["batch_size"] == 4 and len(paired["pairs"]) >= 9  # the gate point: the largest batch
    assert {pair["order"] for pair in paired["pairs"]} == {"AB", "BA"}
    verdicts = benchmark.stage.judge(benchmark.Params.model_validate(params), result.summary, GateContext())
    assert [v.basis for v in verdicts if v.primary] == [PAIRED]

    (pinned / "engine.json").unlink()  # a reference without its provenance is not opened: stored figures
    stored = run_stage(benchmark.stage, params, {"model": engine}, workdir=tmp_path / "stored",
                       reference=Reference("pinned", {"model": pinned / "model.engine"}, {},
                                           {"summary": {"points": result.summary["points"]}}))
    assert stored.summary["reference"]["basis"] == "stored figures"
    assert "the reference does not run here" in stored.summary["reference"]["why"]
    judged = benchmark.stage.judge(benchmark.Params.model_validate(params), stored.summary, GateContext())
    assert [v.basis for v in judged if v.primary] == [STORED]


def test_select_times_engine_finalists_together_fake_trt(monkeypatch, tiny_cnn_onnx, engine_files, tmp_path):
    """select's engine finalists are timed together like ONNX ones: each engine opened through the TensorRT runtime
    interface (its engine.json and digest checked before the fake deserialisation), one context each on the
    cuda-python harness, rounds of short windows in a random order; the decision rests on the pairs. Without a
    runtime for them here, the stored figures decide and the selection says why."""
    import shutil

    from trtflow.stage import StageContext
    from trtflow_stages import select
    from trtflow_stages.decision.params import Params as SelectParams

    engine, provenance = engine_files
    opened = _fake_runtime(monkeypatch, tiny_cnn_onnx)
    FakeTimer.instances.clear()
    monkeypatch.setattr(select, "_cuda_timer", FakeTimer)
    inputs: dict = {"candidates": [], "benchmarks": []}
    sources: dict = {"candidates": [], "benchmarks": []}
    method = {"spin_wait": True, "use_cuda_graph": False, "include_host_transfers": False, "min_duration_s": 0.1,
              "repeats": 5, "max_duration_s": 0.2, "warmup_ms": 0.0}
    for name in ("fp16", "int8"):
        folder = tmp_path / "candidates" / name
        folder.mkdir(parents=True)
        shutil.copy(engine, folder / "model.engine")
        shutil.copy(provenance, folder / "engine.json")
        inputs["candidates"].append(folder / "model.engine")
        sources["candidates"].append({"node": name, "template": name, "matrix": {}, "inputs": {}})
        bench = tmp_path / "benchmarks" / name / "benchmark.json"
        bench.parent.mkdir(parents=True)
        bench.write_text(json.dumps({"backend": "tensorrt-rtx", "device": "cuda", "method": method, "points": [
            {"batch_size": 2, "shapes": {"input": [2, 3, 32, 32]},
             "report": {"latency_ms": {"p50": 0.5, "p99": 0.9}, "throughput_qps": 4000.0, "flags": []}}]}))
        inputs["benchmarks"].append(bench)
        sources["benchmarks"].append({"node": f"benchmark-{name}", "inputs": {"model": [name]}})
    params = SelectParams.model_validate({"constraints": {"validation": "not_required"}})

    def run(folder: Path, gpu: int | None = 0) -> dict:
        ctx = StageContext("select", folder / "scratch", folder, select.stage.outputs, folder / "cache",
                           input_sources=sources, gpu=gpu)
        return select.run(ctx, inputs, params)

    assert run(tmp_path / "no-gpu", gpu=None)["finalists"] == {
        "measured": False, "why": "they are engines, and this node has no GPU (give select `resources: {gpu: 1}`)"}
    summary = run(tmp_path / "run")
    finalists = summary["finalists"]
    assert finalists["measured"] and finalists["runtime"] == "tensorrt-rtx" and finalists["figure"] == "p50"
    assert finalists["names"] == ["fp16", "int8"] and finalists["rounds"] >= 8 and finalists["batch_size"] == 2
    assert {row["basis"] for row in summary["candidates"]} == {"paired A/B"}
    # the same engine twice, timed on the host clock through the fake: which one wins is this host's noise (a busy
    # host can tell them apart by chance), so only that one was chosen on the pairs
    assert summary["selected"] in ("fp16", "int8")
    digest = json.loads(provenance.read_text())["engine_digest"]
    assert opened == [("model.engine", "tensorrt-rtx", digest)] * 2  # both through open_engine's checks
    (timer,) = FakeTimer.instances  # one harness; one context and stream per engine
    assert len(timer.streams) == 2 and timer.options.min_iterations == 8 and not timer.options.use_cuda_graph
    (last,) = timer.work  # a window times one engine's context at a time
    assert last.enqueue.__self__.prepared == {"input": (2, 3, 32, 32)}

    # an engine whose bytes no longer match its engine.json is refused before deserialising: stored figures decide
    bad = inputs["candidates"][1]
    bad.write_bytes(bad.read_bytes() + b"!")
    stored = run(tmp_path / "changed")
    assert stored["finalists"]["measured"] is False and "does not match its provenance" in stored["finalists"]["why"]
    assert {row["basis"] for row in stored["candidates"]} == {"stored figures"}
