"""The records one stage reads of another (`runtimes.records`): read checked against their declared types, and
read for what they say (an engine's precision is its audit's requested precision, not the audit)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from trtflow.stage import StageFailed
from trtflow.storage.records import Limits
from trtflow_stages.accuracy.recovery import recorded_settings
from trtflow_stages.runtimes.records import BESIDE_A_MODEL, read_record
from trtflow_stages.runtimes.trt_runtime import read_provenance
from trtflow_stages.validate import candidate_origin

ENGINE_JSON = {
    "backend": "tensorrt-rtx", "version": "1.7.1.116", "gpu": "none: built on CPU",
    "builder": {"precision": "fp16", "strongly_typed": False, "precision_flags": ["fp16"]},
    "profiles": [{"name": "default", "shapes": {"input": {"min": [1, 4], "opt": [2, 4], "max": [4, 4]}}}],
    "network": {"layers": 3, "inputs": [{"name": "input", "dtype": "float", "shape": [-1, 4]}], "outputs": []},
    "precision": {"requested": "fp16", "network": {"layers": 3}, "engine": {"inspected": False}},
    "engine_bytes": 1024, "engine_digest": "87b81bb6f5e20763f731787ca2d16bc6", "build_seconds": 1.5,
}


def write(folder: Path, name: str, record: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(record))
    return folder / name


def test_an_engine_candidate_is_judged_in_the_precision_it_was_built_in(tmp_path: Path) -> None:
    write(tmp_path, "engine.json", ENGINE_JSON)
    origin = candidate_origin(tmp_path / "model.engine")
    assert origin == {"stage": "engine", "backend": "tensorrt-rtx", "precision": "fp16"}
    assert read_provenance(tmp_path / "engine.json") == ENGINE_JSON


@pytest.mark.parametrize("name, record, says", [
    ("engine.json", {**ENGINE_JSON, "backend": 3}, "backend"),
    ("engine.json", {**ENGINE_JSON, "gpu": {"name": "L4"}}, "gpu"),
    ("engine.json", {"version": "10.13.0"}, "backend"),
    ("engine.json", [1, 2], "engine provenance"),
    ("quantize.json", {"mode": "int8", "calibrated": "yes"}, "calibrated"),
    ("convert.json", {"precision": "fp16", "runtime_settings": {"onnxruntime": "all"}}, "runtime_settings"),
    ("export.json", {"runtime_settings": {"other": {}}}, "onnxruntime"),
])
def test_a_record_that_breaks_its_type_is_refused_naming_the_file(tmp_path: Path, name: str, record: object,
                                                                    says: str) -> None:
    path = write(tmp_path, name, record)
    with pytest.raises(StageFailed) as caught:
        read_record(path, BESIDE_A_MODEL[name])
    assert str(path) in caught.value.message and says in caught.value.message
    assert "re-run" in (caught.value.hint or "")
    # the readers that only explain or narrow settings leave a damaged record out; an engine's is refused
    assert recorded_settings(tmp_path / "model.onnx") is None
    if name == "engine.json":
        assert candidate_origin(tmp_path / "model.engine") is None
        with pytest.raises(StageFailed):
            read_provenance(path)


def test_recorded_settings_are_read_from_the_producer_beside_the_model(tmp_path: Path) -> None:
    settings = {"onnxruntime": {"graph_optimization_level": "basic", "disabled_optimizers": ["NchwcTransformer"]}}
    write(tmp_path, "convert.json", {"precision": "fp16", "runtime_settings": settings})
    assert recorded_settings(tmp_path / "model.onnx") == settings
    assert candidate_origin(tmp_path / "model.onnx") == {"stage": "convert", "precision": "fp16"}


def test_a_record_past_its_cap_is_not_read(tmp_path: Path) -> None:
    kind = dataclasses.replace(BESIDE_A_MODEL["quantize.json"], limits=Limits(bytes=1024))
    path = tmp_path / "quantize.json"
    path.write_bytes(b'{"mode": "int8", "pad": "' + b"x" * 4096 + b'"}')
    with pytest.raises(StageFailed, match="more than"):
        read_record(path, kind)
