"""TensorFlow SavedModels and Keras files to ONNX through tf2onnx, in a child process.

TensorFlow is large, slow to import (about 5 s) and keeps threads and memory for the life of the process, so it
never loads into a node's process: `convert` runs `convert_in_child` in a child process (`confinement.run`:
confined by the kernel, or unconfined for a model the recipe trusts), which loads the model (a Keras file is
first saved as a SavedModel with ``model.export``), converts its serving signature with
``tf2onnx.convert.from_function``, names the dynamic dimensions (``batch`` for axis 0, else ``<input>_<axis>``),
and checks the ONNX model against TensorFlow on random inputs at two sizes of every dynamic dimension. It answers
with the inputs, the outputs and each checked shape's largest difference. `signature_in_child` reads only the
serving signature's inputs (for `trtflow init`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from trtflow.stage import StageFailed

from . import confinement

_TIMEOUT_S = 1800.0
MODEL_FILE = "model.onnx"


def convert(source: Path, target: Path, opset: int, keras: bool, atol: float, rtol: float, box: Path,
            confine_child: bool = True, log: Any = None) -> dict[str, Any]:
    """Convert ``source`` to ``target`` in a child process working in ``box``; its summary, or StageFailed."""
    try:
        import tf2onnx  # noqa: F401
    except ImportError as error:
        raise StageFailed("converting a TensorFlow model needs tensorflow and tf2onnx",
                          hint="pip install 'trtflow[tensorflow]'") from error
    request = {"source": str(source.absolute()), "opset": opset, "kind": "keras" if keras else "saved", "atol": atol,
               "rtol": rtol}
    result = confinement.run(f"{__name__}:convert_in_child", request, box, [source], log=log, timeout=_TIMEOUT_S,
                             what=f"converting the TensorFlow model {source.name} with tf2onnx",
                             confine_child=confine_child)
    confinement.take_file(box / MODEL_FILE, target)
    result = confinement.checked(result, {"inputs": dict, "outputs": list, "checked_shapes": list}, "tf2onnx")
    shapes = result["checked_shapes"]
    if not shapes or not all(isinstance(c, dict) and isinstance(c.get("max_abs_diff_vs_tensorflow"), int | float)
                             for c in shapes):
        raise StageFailed("tf2onnx: the child process answered without valid checked shapes",
                          hint="the model's code may have tampered with the conversion; see the node's log")
    return result


def signature_inputs(source: Path, keras: bool, box: Path, confine_child: bool = True) -> dict[str, Any]:
    """The serving signature's inputs (name -> shape with None for a dynamic size, dtype), read in a child."""
    answer = confinement.run(f"{__name__}:signature_in_child", {"source": str(source.absolute()),
                                                                 "kind": "keras" if keras else "saved"},
                             box, [source], timeout=900.0, what=f"reading the inputs of {source.name}",
                             confine_child=confine_child)
    inputs = confinement.checked(answer, {"inputs": dict}, f"reading the inputs of {source.name}")["inputs"]
    for name, spec in inputs.items():
        if not (isinstance(spec, dict) and isinstance(spec.get("dtype"), str) and isinstance(spec.get("shape"), list)
                and all(d is None or isinstance(d, int) for d in spec["shape"])):
            raise StageFailed(f"reading the inputs of {source.name}: the child process answered an invalid input "
                              f"{name!r}")
    return answer


# ---------------------------------------------------------------------------------------------------------
# The child process


def _load(tf: Any, source: str, keras: bool, workdir: Path) -> tuple[Any, Any]:
    """(the serving function, the loaded SavedModel, which must stay referenced while the function is used)."""
    confinement.guard(source)
    if keras:
        import keras as keras_lib

        try:
            model = keras_lib.models.load_model(source, compile=False)
        except Exception as error:  # keras raises many types for a foreign or damaged file
            raise ValueError(f"Keras cannot load {Path(source).name}: {' '.join(str(error).split())[:300]}") from error
        folder = str(workdir / "saved_model")
        model.export(folder, verbose=False)
        source = folder
    try:
        loaded = tf.saved_model.load(source)
    except Exception as error:  # a damaged SavedModel
        raise ValueError(f"TensorFlow cannot load the SavedModel: {' '.join(str(error).split())[:300]}") from error
    signatures = dict(loaded.signatures)
    if not signatures:
        raise ValueError("the SavedModel has no serving signature (save it with tf.saved_model.save(model, path, "
                         "signatures=...) or keras model.export(path))")
    name = "serving_default" if "serving_default" in signatures else sorted(signatures)[0]
    return signatures[name], loaded


def _rename_dims(target: Path) -> dict[str, dict[str, Any]]:
    """Name the dynamic dims of the ONNX inputs (``batch`` for axis 0) and return the inputs' declarations."""
    import onnx

    model = onnx.load(str(target))
    renamed: dict[str, str] = {}
    inputs: dict[str, dict[str, Any]] = {}
    initializers = {i.name for i in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        axes = {}
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if not dim.HasField("dim_value"):
                new = renamed.setdefault(dim.dim_param or f"{value.name}:{axis}",
                                         "batch" if axis == 0 else f"{value.name}_{axis}")
                dim.dim_param = new
                axes[axis] = new
        inputs[value.name] = {"dims": [d.dim_value if d.HasField("dim_value") else d.dim_param
                                       for d in value.type.tensor_type.shape.dim],
                              "dtype": onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name,
                              "dynamic_axes": axes}
    for value in [*model.graph.output, *model.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in renamed:
                dim.dim_param = renamed[dim.dim_param]
    onnx.save(model, str(target))
    return inputs


def _check(tf: Any, function: Any, target: Path, inputs: dict[str, dict[str, Any]], atol: float,
           rtol: float) -> list[dict[str, Any]]:
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    specs = function.structured_input_signature[1]
    results = []
    for size in (2, 3):
        rng = np.random.default_rng(size)
        feed = {}
        for name, spec in inputs.items():
            shape = [d if isinstance(d, int) and d > 0 else size for d in spec["dims"]]
            dtype = spec["dtype"]
            feed[name] = (rng.integers(0, 2, shape).astype(dtype) if "int" in dtype
                          else rng.uniform(0, 1, shape).astype(dtype))
        expected = function(**{name: tf.constant(feed[name]) for name in specs if name in feed})
        expected_list = [np.asarray(expected[k]) for k in sorted(expected)] if isinstance(expected, dict) else [
            np.asarray(expected)]
        names = [o.name for o in session.get_outputs()]
        actual = dict(zip(names, session.run(None, feed), strict=True))
        got = [actual[k] for k in sorted(expected)] if isinstance(expected, dict) and set(expected) <= set(actual) \
            else list(actual.values())
        worst = 0.0
        for exp, out in zip(expected_list, got, strict=False):
            if exp.shape != out.shape:
                raise ValueError(f"at {dict((n, list(v.shape)) for n, v in feed.items())}: ONNX Runtime gives shape "
                                 f"{list(out.shape)}, TensorFlow {list(exp.shape)}")
            worst = max(worst, float(np.max(np.abs(exp.astype("float64") - out))) if exp.size else 0.0)
            if not np.allclose(out, exp, atol=atol, rtol=rtol):
                raise ValueError(f"the ONNX model differs from TensorFlow by up to {worst:.3g} (atol {atol}, rtol "
                                 f"{rtol}) at {dict((n, list(v.shape)) for n, v in feed.items())}")
        results.append({"shapes": {n: list(v.shape) for n, v in feed.items()}, "status": "ok",
                        "max_abs_diff_vs_tensorflow": worst})
    return results


def convert_in_child(request: dict[str, Any]) -> dict[str, Any]:
    """In the child: the model to ``model.onnx`` in the working folder, checked; the summary (or StageFailed)."""
    import tensorflow as tf

    source, keras, target = request["source"], request["kind"] == "keras", Path.cwd() / MODEL_FILE
    with tempfile.TemporaryDirectory() as folder:
        try:
            function, loaded = _load(tf, source, keras, Path(folder))
        except ValueError as error:
            raise StageFailed(str(error), hint="save the model again (model.export(folder) or "
                              "tf.saved_model.save)") from error
        import tf2onnx

        specs = list(function.structured_input_signature[1].values())
        try:
            tf2onnx.convert.from_function(tf.function(function), input_signature=specs, opset=int(request["opset"]),
                                          output_path=str(target))
        except Exception as error:  # tf2onnx raises many types for operators it cannot convert
            raise StageFailed(f"tf2onnx failed: {type(error).__name__}: {' '.join(str(error).split())[:500]}",
                              hint="see the node's log for tf2onnx's messages; a newer opset may cover the "
                              "operator") from error
        inputs = _rename_dims(target)
        try:
            checked = _check(tf, function, target, inputs, float(request["atol"]), float(request["rtol"]))
            del loaded
        except ValueError as error:
            raise StageFailed(f"the converted model does not match TensorFlow: {error}") from error
    outputs = list(function.structured_outputs) if isinstance(function.structured_outputs, dict) else ["output_0"]
    return {"inputs": inputs, "outputs": outputs, "checked_shapes": checked}


def signature_in_child(request: dict[str, Any]) -> dict[str, Any]:
    """In the child: the serving signature's inputs, {name: {shape, dtype}} (a dynamic size is None)."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as folder:
        try:
            function, _loaded = _load(tf, request["source"], request["kind"] == "keras", Path(folder))
        except ValueError as error:
            raise StageFailed(str(error), hint="save the model again (model.export(folder) or "
                              "tf.saved_model.save)") from error
        specs = function.structured_input_signature[1]
        return {"inputs": {name: {"shape": list(spec.shape.as_list()), "dtype": spec.dtype.name}
                           for name, spec in specs.items()}}
