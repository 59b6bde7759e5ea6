"""Engines are loaded only after their provenance and digest check out (no TensorRT runtime needed)."""

from __future__ import annotations

import json

import pytest
import xxhash

from trtflow.stage import StageFailed
from trtflow_stages.runtimes import trt_runtime as _trt_runtime


def test_engine_without_provenance_is_refused(tmp_path):
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"engine bytes")
    with pytest.raises(StageFailed, match="no provenance manifest"):
        _trt_runtime.open_engine(engine, None, "tensorrt-rtx")


def test_changed_engine_bytes_are_refused():
    data = b"the engine the build wrote"
    manifest = {"engine_digest": xxhash.xxh3_128_hexdigest(data)}
    _trt_runtime.verify_engine_digest(data, manifest, "model.engine")
    with pytest.raises(StageFailed, match="does not match its provenance"):
        _trt_runtime.verify_engine_digest(data + b"!", manifest, "model.engine")
    with pytest.raises(StageFailed, match="records no engine digest"):
        _trt_runtime.verify_engine_digest(data, {}, "model.engine")


def test_build_records_the_engine_digest(tmp_path, tiny_mlp_onnx):
    from trtflow.testing import run_stage
    from trtflow_stages.build import stage

    profile = {"name": "b", "shapes": {"input": {"min": [1, 16], "opt": [2, 16], "max": [4, 16]}}}
    result = run_stage(stage, {"backend": "tensorrt-rtx", "profile": profile}, {"model": tiny_mlp_onnx}, tmp_path)
    record = json.loads(result.outputs["provenance"].read_text())
    assert record["engine_digest"] == xxhash.xxh3_128_hexdigest(result.outputs["engine"].read_bytes())
