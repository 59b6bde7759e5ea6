"""Polygraphy runners over the models the stages compare: an ONNX model on ONNX Runtime, an engine through
`trt_runtime.EngineSession`; `run_over` runs one over a data set, reading inputs one batch at a time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .ort import OrtOptions


def onnx_runner(path: Path, name: str, options: OrtOptions) -> Any:
    from polygraphy.backend.onnxrt import OnnxrtRunner

    from .ort import create_session

    return OnnxrtRunner(lambda: create_session(path, options), name=name)


def engine_session_runner(session: Any, name: str) -> Any:
    """A Polygraphy runner over an `EngineSession` (engines run through the same loop as ONNX models). The session
    is active inside its `candidate.Candidate`'s with-block, which holds the runner's whole life."""
    from polygraphy.backend.base import BaseRunner
    from polygraphy.common import TensorMetadata

    class EngineSessionRunner(BaseRunner):
        def __init__(self) -> None:
            super().__init__(name=name, prefix="trtflow-engine")

        def activate_impl(self) -> None:
            pass  # the execution context is the candidate's (its with-block)

        def get_input_metadata_impl(self) -> Any:
            meta = TensorMetadata()
            for spec in session.input_specs():
                meta.add(spec.name, spec.dtype, spec.shape)
            return meta

        def infer_impl(self, feed_dict: dict) -> dict:
            start = time.perf_counter()
            outputs = session.infer(feed_dict)
            self.inference_time = time.perf_counter() - start
            return outputs

        def deactivate_impl(self) -> None:
            pass

    return EngineSessionRunner()


def run_over(runner: Any, batches: Callable[[], Iterator[dict[str, Any]]], total: int,
             progress: Callable[[int, int], None]) -> dict[str, Any]:
    """Every output of ``runner`` over the batches, joined along axis 0; inputs are read one batch at a time."""
    import numpy as np

    parts: dict[str, list[Any]] = {}
    with runner:
        for index, batch in enumerate(batches(), 1):
            for name, value in runner.infer(batch).items():
                parts.setdefault(name, []).append(np.array(value, copy=True))
            progress(index, total)
    return _join(parts)


def _join(parts: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """One array per output over all batches: joined along axis 0 (flattened if batch shapes differ)."""
    import numpy as np

    joined = {}
    for name, arrays in parts.items():
        try:
            joined[name] = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
        except ValueError:
            joined[name] = np.concatenate([a.ravel() for a in arrays])
    return joined
