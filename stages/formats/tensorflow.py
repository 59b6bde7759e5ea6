"""TensorFlow SavedModels and Keras files to ONNX through tf2onnx, in a child process.

TensorFlow is large, slow to import (about 5 s) and keeps threads and memory for the life of the process, so it
never loads into a node's process: `convert` runs `convert_in_child` in a child process (`confinement.run`:
confined by the kernel, or unconfined for a model the recipe trusts), which loads the model (a Keras file is
first saved as a SavedModel with ``model.export``), converts its serving signature with
``tf2onnx.convert.from_function``, names the dynamic dimensions of the inputs (``batch`` for axis 0,
``height``/``width`` for an image's, else ``<input>_<axis>``: `dim_names.input_dim_name`), and checks the ONNX model
against TensorFlow on random inputs: at a base shape, then each dynamic dimension alone at the min and max the
recipe's profiles give it (else at one more than the base). The outputs keep the signature's names (or take the
recipe's ``outputs:``, in the ONNX model's output order), and their dynamic dimensions take the names of the input
dims they follow (`dim_names.output_dim_names`). It answers with the inputs, the outputs and each checked shape's
largest difference. `signature_in_child` reads only the serving signature's inputs (for `trtflow init`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtflow.stage import StageFailed

from . import confinement
from .dim_names import input_dim_name

_TIMEOUT_S = 1800.0
MODEL_FILE = "model.onnx"


def convert(source: Path, target: Path, opset: int, keras: bool, atol: float, rtol: float, box: Path,
            confine_child: bool = True, log: Any = None, outputs: Sequence[str] | None = None,
            ranges: dict[str, dict[int, tuple[int, int, int]]] | None = None) -> dict[str, Any]:
    """Convert ``source`` to ``target`` in a child process working in ``box``; its summary, or StageFailed.

    ``ranges``: input -> axis -> (min, opt, max), from the recipe's profiles: each dynamic dim is checked at its min
    and max, opt being the base shape."""
    require_tensorflow()
    request = {"source": str(source.absolute()), "opset": opset, "kind": "keras" if keras else "saved", "atol": atol,
               "rtol": rtol, "outputs": list(outputs) if outputs is not None else None,
               "ranges": {name: {str(axis): list(r) for axis, r in axes.items()}
                          for name, axes in (ranges or {}).items()}}
    result = confinement.run(f"{__name__}:convert_in_child", request, box, [source], log=log, timeout=_TIMEOUT_S,
                             what=f"converting the TensorFlow model {source.name} with tf2onnx",
                             confine_child=confine_child, take={MODEL_FILE: target})
    result = confinement.checked(result, {"inputs": dict, "outputs": list, "checked_shapes": list}, "tf2onnx")
    shapes = result["checked_shapes"]
    if not shapes or not all(isinstance(c, dict) and isinstance(c.get("max_abs_diff_vs_tensorflow"), int | float)
                             for c in shapes):
        raise StageFailed("tf2onnx: the child process answered without valid checked shapes",
                          hint="the model's code may have tampered with the conversion; see the node's log")
    return result


def signature_inputs(source: Path, keras: bool, box: Path, confine_child: bool = True) -> dict[str, Any]:
    """The serving signature's inputs (name -> shape with None for a dynamic size, dtype), read in a child."""
    require_tensorflow()
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


def require_tensorflow() -> None:
    """EnvironmentUnavailable (exit 3) unless tensorflow and tf2onnx can be imported (found without importing)."""
    import importlib.util

    from trtflow.errors import EnvironmentUnavailable

    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except (ImportError, ValueError):
            return True

    missing = [name for name in ("tensorflow", "tf2onnx") if absent(name)]
    if missing:
        raise EnvironmentUnavailable(f"a TensorFlow model needs {' and '.join(missing)}, which "
                                     f"{'is' if len(missing) == 1 else 'are'} not installed here",
                                     hint="pip install 'trtflow[tensorflow]'")


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
        dims = value.type.tensor_type.shape.dim
        static = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        for axis, dim in enumerate(dims):
            if not dim.HasField("dim_value"):
                new = renamed.setdefault(dim.dim_param or f"{value.name}:{axis}",
                                         input_dim_name(value.name, axis, static))
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


def _check_shapes(inputs: dict[str, dict[str, Any]], ranges: dict[str, list[int]]) -> list[tuple[dict[str, int],
                                                                                            str | None, str]]:
    """(size of every dynamic dim, the dim varied, why) of each shape to check: the base, then each dim alone at its
    profile min and max (else one more than the base)."""
    dims = sorted({d for spec in inputs.values() for d in spec["dynamic_axes"].values()})
    base = {d: int(ranges[d][1]) if d in ranges else (2 if d == "batch" else 8) for d in dims}
    shapes: list[tuple[dict[str, int], str | None, str]] = [(base, None, "base")]
    for dim in dims:
        others = [(int(ranges[dim][0]), "profile min"), (int(ranges[dim][2]), "profile max")] if dim in ranges \
            else [(base[dim] + 1, "derived")]
        for size, why in others:
            if size != base[dim] and not any(s[0][dim] == size and s[1] == dim for s in shapes):
                shapes.append(({**base, dim: size}, dim, why))
    return shapes


def _check(tf: Any, function: Any, target: Path, inputs: dict[str, dict[str, Any]], atol: float,
           rtol: float, ranges: dict[str, list[int]]) -> tuple[list[dict[str, Any]], list[Any]]:
    """Each checked shape's record, and the observations (dim sizes, TensorFlow's output shapes) for naming."""
    import numpy as np
    import onnxruntime as ort

    from .dim_names import Observation

    session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    specs = function.structured_input_signature[1]
    names = [o.name for o in session.get_outputs()]
    results, observations = [], []
    for index, (sizes, dim, why) in enumerate(_check_shapes(inputs, ranges)):
        rng = np.random.default_rng(index)
        feed = {}
        for name, spec in inputs.items():
            shape = [d if isinstance(d, int) and d > 0 else sizes[d] for d in spec["dims"]]
            dtype = spec["dtype"]
            feed[name] = (rng.integers(0, 2, shape).astype(dtype) if "int" in dtype
                          else rng.uniform(0, 1, shape).astype(dtype))
        shown = {n: list(v.shape) for n, v in feed.items()}
        try:
            expected = function(**{name: tf.constant(feed[name]) for name in specs if name in feed})
        except Exception as error:  # the model's own code: any exception type
            detail = f"TensorFlow itself fails at {shown}: {type(error).__name__}: {' '.join(str(error).split())[:300]}"
            if why == "derived":
                results.append({"shapes": shown, "status": "skipped", "detail": detail})
                continue
            if dim is None:  # the base shape: the model's own failure, not a size the recipe chose
                raise ValueError(detail) from error
            raise ValueError(f"{detail}; the recipe's profiles declare {dim} = {sizes[dim]} ({why})") from error
        expected_by_name = {k: np.asarray(v) for k, v in expected.items()} if isinstance(expected, dict) else {
            names[0]: np.asarray(expected)}
        actual = dict(zip(names, session.run(None, feed), strict=True))
        worst = 0.0
        for key, exp in expected_by_name.items():
            out = actual.get(key, actual[names[0]] if len(names) == 1 else None)
            if out is None:
                raise ValueError(f"the ONNX model has no output {key!r} (it has {names})")
            if exp.shape != out.shape:
                raise ValueError(f"at {shown}: ONNX Runtime gives {key} shape {list(out.shape)}, TensorFlow "
                                 f"{list(exp.shape)}")
            worst = max(worst, float(np.max(np.abs(exp.astype("float64") - out))) if exp.size else 0.0)
            if not np.allclose(out, exp, atol=atol, rtol=rtol):
                raise ValueError(f"the ONNX model differs from TensorFlow by up to {worst:.3g} (atol {atol}, rtol "
                                 f"{rtol}) at {shown}")
        record: dict[str, Any] = {"shapes": shown, "status": "ok", "max_abs_diff_vs_tensorflow": worst}
        if dim is not None:
            record.update(dim=dim, size=sizes[dim], origin=why)
        results.append(record)
        observations.append(Observation(sizes, {k: list(v.shape) for k, v in expected_by_name.items()}))
    return results, observations


def _rename_outputs(target: Path, wanted: list[str] | None) -> list[str]:
    """The ONNX model's output names, renamed to ``wanted`` (in the model's output order) when given."""
    import onnx

    model = onnx.load(str(target))
    names = [o.name for o in model.graph.output]
    if wanted is None or wanted == names:
        return names
    if len(wanted) != len(names):
        raise ValueError(f"outputs: names {len(wanted)} output(s) {wanted}, but the model has {len(names)} "
                         f"({names})")
    mapping = dict(zip(names, wanted, strict=True))
    for node in model.graph.node:
        node.output[:] = [mapping.get(o, o) for o in node.output]
        node.input[:] = [mapping.get(i, i) for i in node.input]
    for value in model.graph.output:
        value.name = mapping[value.name]
    onnx.save(model, str(target))
    return wanted


def convert_in_child(request: dict[str, Any]) -> dict[str, Any]:
    """In the child: the model to ``model.onnx`` in the working folder, checked; the summary (or StageFailed)."""
    import tensorflow as tf

    from .dim_names import dynamic_output_axes, output_dim_names, rename_output_dims

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
            ranges = {spec["dynamic_axes"][int(axis)]: sizes for name, spec in inputs.items()
                      for axis, sizes in (request.get("ranges") or {}).get(name, {}).items()
                      if int(axis) in spec["dynamic_axes"]}
            checked, observations = _check(tf, function, target, inputs, float(request["atol"]),
                                           float(request["rtol"]), ranges)
            del loaded
        except ValueError as error:
            raise StageFailed(f"the converted model does not match TensorFlow: {error}") from error
    rename_output_dims(target, output_dim_names(observations, dynamic_output_axes(target)))
    try:
        outputs = _rename_outputs(target, request.get("outputs"))
    except ValueError as error:
        raise StageFailed(str(error), hint="give one name per output, or leave outputs out to keep the signature's "
                          "names") from error
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
