"""`trtflow doctor`: what this machine has, and what the installed stages can build and run here.

The engine knows no backend: each stage package reports its own through the ``trtflow.backends`` entry-point
group (a function returning rows ``{backend, build, run, why}``).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from trtflow.environment import Environment, gpus
from trtflow.registry import get_stage, stage_names

BACKENDS_GROUP = "trtflow.backends"


def diagnose() -> dict[str, Any]:
    env = Environment.from_env()
    names = ["python", "platform", "cpu", "torch", "onnx", "onnxruntime", "onnxsim", "modelopt", "polygraphy",
             "numpy", "cuda_python", "tensorrt", "tensorrt_rtx", "gpu", "driver"]
    facts = env.facts(names)
    backends: list[dict[str, Any]] = []
    for ep in entry_points(group=BACKENDS_GROUP):
        try:
            backends.extend(ep.load()())
        except Exception as exc:  # a broken plugin must not break doctor
            backends.append({"backend": ep.name, "build": False, "run": False, "why": f"failed to load: {exc}"})
    stages = []
    for name in stage_names():
        try:
            stage = get_stage(name)
            stages.append({"name": name, "version": stage.version, "description": stage.description})
        except Exception as exc:  # a broken plugin must not break doctor
            stages.append({"name": name, "version": "?", "description": f"failed to load: {exc}"})
    return {"facts": facts, "backends": backends, "stages": stages, "gpus": [g.__dict__ for g in gpus()]}
