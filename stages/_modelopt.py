"""Declarations shared by the stages that run NVIDIA ModelOpt on an ONNX model (quantize, convert)."""

from __future__ import annotations

from typing import Any

from ._data import data_files

MODELOPT_FACTS = ("modelopt", "onnx", "onnxruntime", "numpy")


def modelopt_files(params: Any) -> list[str]:
    """The calibration/reference data files whose content the result depends on."""
    return data_files(params.calibration_data) if params.uses_data else []


def modelopt_resources(params: Any) -> frozenset[str]:
    return frozenset({"gpu"}) if params.uses_gpu else frozenset({"cpu"})


def modelopt_environment(params: Any) -> list[str]:
    return [*MODELOPT_FACTS, "gpu"] if params.uses_gpu else list(MODELOPT_FACTS)
