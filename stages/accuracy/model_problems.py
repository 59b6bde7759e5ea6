"""Diagnosis of model problems: known causes found by cheap graph checks, and commands that reproduce a step.

Native libraries (ONNX Runtime, ModelOpt, onnxsim, TensorRT) can kill the process on a bad model. Every stage
marks such a call with ``ctx.native_step(library, what, repro=..., hint=...)``; if the process dies inside it,
the engine reports the library, the step, the native trace, ``repro`` (the smallest shell command that does the
same thing on its own) and ``hint`` (a known cause found *before* the call, by the detectors below).

How another stage uses this module (validate, quantize, benchmark)::

    from .model_problems import modelopt_step, ort_session_step, ort_run_step

    with ort_session_step(ctx, model_path, options=ort_options):      # creating the session
        session = create_session(model_path, ort_options)
    with ort_run_step(ctx, model_path, feed, options=ort_options):     # one inference on ``feed``
        outputs = session.run(None, feed)
    with modelopt_step(ctx, model_path, "int8 calibration (entropy)",
                       quantize_repro(model_path, "int8", "entropy", calibration_npz)):
        quantize(...)

A Polygraphy ``Comparator.run`` over ONNX Runtime runners creates and runs sessions inside it: wrap the whole
call in ``ort_run_step`` with the first batch as ``feed``.

Paths in ``repro`` commands are absolute paths inside the node's scratch folder (its inputs are hard links
to the store's objects there), which the engine keeps when a node crashes. This module is cheap to import.
"""

from __future__ import annotations

import functools
import logging
import shlex
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trtflow.stage import StageContext

    from ..runtimes.ort import OrtOptions

_LOG = logging.getLogger(__name__)

#: The dim name ModelOpt puts on every dimension whose size it cleared before re-inferring types.
AUTOCAST_PLACEHOLDER = "unk"
#: Initializers with more elements than this are left out of the shape-inference copy (their values
#: cannot be shapes; only their shapes matter).
_SHAPE_VALUE_LIMIT = 64
#: Sizes given to the inputs' dynamic dimensions when shapes are inferred concretely: distinct primes, so a
#: size found inside the graph points back at one named dimension.
_PROBE_SIZES = (7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47)


@dataclass(frozen=True)
class Finding:
    """A known cause of failure found in a model: what is wrong and what to do."""

    code: str
    message: str
    fix: str

    def text(self) -> str:
        return f"{self.message}; {self.fix}"


def hint_text(findings: Sequence[Finding]) -> str | None:
    """One hint from several findings (None when there are none)."""
    return " | ".join(f.text() for f in findings) or None


# ---------------------------------------------------------------------------------------------------------
# Reproduction commands


def _q(value: str | Path) -> str:
    return shlex.quote(str(value))


def _py(value: Any) -> str:
    """A Python literal in double quotes (so it survives the single quotes of the shell command)."""
    import json

    return json.dumps(value)


def _python_c(code: str) -> str:
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"


def _session_code(model: Path, options: OrtOptions | None, providers: Sequence[str] | None) -> str:
    from ..runtimes.ort import OrtOptions, level_member

    options = options or OrtOptions()
    lines = ["import numpy as np, onnxruntime as ort", "so = ort.SessionOptions()"]
    if options.graph_optimization_level != "all":
        lines.append(f"so.graph_optimization_level = ort.GraphOptimizationLevel."
                     f"{level_member(options.graph_optimization_level)}")
    if options.intra_op_threads is not None:
        lines.append(f"so.intra_op_num_threads = {options.intra_op_threads}")
    if options.inter_op_threads is not None:
        lines.append(f"so.inter_op_num_threads = {options.inter_op_threads}")
    extra = f", disabled_optimizers={_py(list(options.disabled_optimizers))}" if options.disabled_optimizers else ""
    chosen = list(providers or ["CPUExecutionProvider"])
    lines.append(f"s = ort.InferenceSession({_py(str(model))}, so, providers={_py(chosen)}{extra})")
    return "; ".join(lines)


def ort_session_repro(model: Path, options: OrtOptions | None = None,
                      providers: Sequence[str] | None = None) -> str:
    """A command that creates the same ONNX Runtime session on ``model``."""
    return _python_c(_session_code(model, options, providers))


def ort_run_repro(model: Path, feed: Mapping[str, Any], options: OrtOptions | None = None,
                  providers: Sequence[str] | None = None) -> str:
    """A command that creates the session and runs it once on inputs of ``feed``'s shapes and dtypes (zeros)."""
    inputs = ", ".join(f"{_py(name)}: np.zeros({tuple(int(d) for d in value.shape)!r}, {_py(value.dtype.name)})"
                       for name, value in feed.items())
    run = f"print([o.shape for o in s.run(None, {{{inputs}}})])"
    return _python_c(_session_code(model, options, providers) + "; " + run)


def onnxsim_repro(model: Path, test_shapes: Mapping[str, Sequence[int]] | None = None) -> str:
    """The onnxsim command line that simplifies ``model`` with the same check shapes."""
    command = f"onnxsim {_q(model)} \"${{TMPDIR:-/tmp}}/simplified.onnx\""
    if test_shapes:
        command += " --test-input-shape " + " ".join(
            _q(f"{name}:{','.join(str(d) for d in shape)}") for name, shape in test_shapes.items())
    return command


def autocast_repro(model: Path, precision: str, calibration_data: Path | None = None,
                   options: Mapping[str, Any] | None = None) -> str:
    """ModelOpt AutoCast's command line (``python -m modelopt.onnx.autocast``) for the same conversion."""
    parts = [shlex.quote(sys.executable), "-m modelopt.onnx.autocast", "--onnx_path", _q(model),
             "--output_path \"${TMPDIR:-/tmp}/converted.onnx\"", "--low_precision_type", precision]
    if calibration_data is not None:
        parts += ["--calibration_data", _q(calibration_data)]
    parts += _cli_options(options)
    return " ".join(parts)


def quantize_repro(model: Path, mode: str, method: str, calibration_data: Path | None = None,
                   options: Mapping[str, Any] | None = None) -> str:
    """ModelOpt's ONNX PTQ command line (``python -m modelopt.onnx.quantization``) for the same quantization."""
    parts = [shlex.quote(sys.executable), "-m modelopt.onnx.quantization", "--onnx_path", _q(model),
             "--output_path \"${TMPDIR:-/tmp}/quantized.onnx\"", "--quantize_mode", mode,
             "--calibration_method", method]
    if calibration_data is not None:
        parts += ["--calibration_data_path", _q(calibration_data)]
    parts += _cli_options(options)
    return " ".join(parts)


def _cli_options(options: Mapping[str, Any] | None) -> list[str]:
    parts: list[str] = []
    for name, value in (options or {}).items():
        if value is None or value is False:
            continue
        if value is True:
            parts.append(f"--{name}")
        elif isinstance(value, (list, tuple)):
            if value:
                parts += [f"--{name}", *(_q(str(v)) for v in value)]
        else:
            parts += [f"--{name}", _q(str(value))]
    return parts


def trt_build_repro(model: Path, backend: str, profiles: Sequence[Any] = (), strongly_typed: bool = True,
                    flags: Sequence[str] = ()) -> str:
    """Polygraphy's command line that parses and builds ``model`` with the same flavour, profiles and typing."""
    prefix = "POLYGRAPHY_USE_TENSORRT_RTX=1 " if backend == "tensorrt-rtx" else ""
    parts = [f"{prefix}polygraphy convert {_q(model)} --convert-to trt -o \"${{TMPDIR:-/tmp}}/model.engine\""]
    if strongly_typed:
        parts.append("--strongly-typed")
    parts += [f"--{flag}" for flag in flags]
    for spec in profiles:  # each --trt-min-shapes starts a new profile
        for option, attr in (("--trt-min-shapes", "min"), ("--trt-opt-shapes", "opt"), ("--trt-max-shapes", "max")):
            parts.append(option)
            parts += [_q(f"{name}:{list(getattr(r, attr))}".replace(" ", "")) for name, r in spec.shapes.items()]
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------------------
# Shape inference on a light copy of the model (no weight data)


def _skeleton(model: Any, input_dims: Mapping[str, Mapping[int, int]] | None = None,
              keep_value_info: bool = False) -> Any:
    """A copy of ``model`` for shape inference: large initializers become graph inputs of the same type and
    shape (no data), intermediate shapes are dropped (unless ``keep_value_info``), output dims are cleared,
    and ``input_dims`` ({input: {axis: size}}) fixes sizes of graph-input dims."""
    import onnx
    from onnx import helper

    graph = model.graph
    copy = onnx.GraphProto(name=graph.name)
    copy.node.extend(graph.node)
    initializer_names = {init.name for init in graph.initializer}
    for value in graph.input:
        if value.name in initializer_names:
            continue
        new = copy.input.add()
        new.CopyFrom(value)
        for axis, size in (input_dims or {}).get(value.name, {}).items():
            dim = new.type.tensor_type.shape.dim[axis]
            dim.Clear()
            dim.dim_value = size
    for init in graph.initializer:
        count = 1
        for d in init.dims:
            count *= d
        if count <= _SHAPE_VALUE_LIMIT:
            copy.initializer.append(init)
        else:
            copy.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    for value in graph.output:
        new = copy.output.add()
        new.name = value.name
        if value.type.HasField("tensor_type"):
            new.type.tensor_type.elem_type = value.type.tensor_type.elem_type
    if keep_value_info:
        copy.value_info.extend(graph.value_info)
    skeleton = helper.make_model(copy, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    skeleton.functions.extend(model.functions)
    return skeleton


def _inferred_dims(skeleton: Any) -> dict[str, list[Any]]:
    """{tensor name: [dim_value int | dim_param str | None]} after ONNX shape inference (empty on failure)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, check_type=False, strict_mode=False, data_prop=True)
    except Exception as error:  # inference is best effort: some custom ops have no shape function
        _LOG.info("shape inference failed: %s", error)
        return {}
    graph = inferred.graph
    dims: dict[str, list[Any]] = {}
    for value in [*graph.value_info, *graph.output]:
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            dims[value.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                for d in value.type.tensor_type.shape.dim]
    return dims


def _dynamic_input_dims(model: Any) -> dict[str, dict[int, str | None]]:
    initializer_names = {init.name for init in model.graph.initializer}
    found: dict[str, dict[int, str | None]] = {}
    for value in model.graph.input:
        if value.name in initializer_names or not value.type.HasField("tensor_type"):
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if not dim.HasField("dim_value"):
                found.setdefault(value.name, {})[axis] = dim.dim_param or None
    return found


def _probe_sizes(model: Any) -> dict[str, dict[int, int]]:
    """Distinct concrete sizes for the inputs' dynamic dims (dims sharing a name share a size)."""
    by_name: dict[str, int] = {}
    sizes: dict[str, dict[int, int]] = {}
    counter = 0
    for input_name, axes in _dynamic_input_dims(model).items():
        for axis, dim_name in axes.items():
            key = dim_name or f"{input_name}:{axis}"
            if key not in by_name:
                by_name[key] = _PROBE_SIZES[counter % len(_PROBE_SIZES)] + 100 * (counter // len(_PROBE_SIZES))
                counter += 1
            sizes.setdefault(input_name, {})[axis] = by_name[key]
    return sizes


def _labelled_dims(model: Any) -> Iterator[tuple[str, int, str]]:
    """(tensor, axis, dim name) of every named dim of intermediate and output tensors."""
    for value in [*model.graph.value_info, *model.graph.output]:
        if value.type.HasField("tensor_type"):
            for axis, dim in enumerate(value.type.tensor_type.shape.dim):
                if dim.HasField("dim_param") and dim.dim_param:
                    yield value.name, axis, dim.dim_param


def inconsistent_dim_names(model: Any) -> dict[str, list[int]]:
    """Dim names that label dimensions of different sizes: {name: the sizes seen}.

    ONNX Runtime takes two tensors whose dims carry the same names to be the same size and reuses one's
    buffer for the other; a name on dims of different sizes breaks that ("Shape mismatch attempting to re-use
    buffer", or a crash). The sizes come from ONNX shape inference with the inputs' dynamic dims set to
    distinct sizes; dims whose size inference cannot tell are not evidence either way.
    """
    labelled = list(_labelled_dims(model))
    if not labelled:
        return {}
    concrete = _inferred_dims(_skeleton(model, _probe_sizes(model)))
    seen: dict[str, set[int]] = {}
    for tensor, axis, name in labelled:
        dims = concrete.get(tensor)
        if dims is not None and axis < len(dims) and isinstance(dims[axis], int) and dims[axis] > 0:
            seen.setdefault(name, set()).add(dims[axis])
    return {name: sorted(sizes) for name, sizes in seen.items() if len(sizes) > 1}


def clean_dim_names(model: Any) -> dict[str, Any]:
    """Remove dim names that label dims of different sizes (and AutoCast's ``unk``) from ``model`` in place.

    The cleared dims are filled again from ONNX shape inference where it knows them (a size, or a dim name of
    the graph inputs); the others stay unnamed, which ONNX Runtime treats as unknown. The graph inputs are
    never changed. Returns what was done: the names removed (with the sizes they labelled), dims cleared,
    dims filled again, and the names still inconsistent afterwards (empty when the model is clean).
    """
    bad = inconsistent_dim_names(model)
    names = set(bad)
    if any(name == AUTOCAST_PLACEHOLDER for _, _, name in _labelled_dims(model)):
        names.add(AUTOCAST_PLACEHOLDER)
    if not names:
        return {"removed": {}, "cleared_dims": 0, "refilled_dims": 0, "still_inconsistent": {}}
    input_names = {n for axes in _dynamic_input_dims(model).values() for n in axes.values() if n}
    cleared: list[tuple[str, int]] = []
    for value in [*model.graph.value_info, *model.graph.output]:
        if not value.type.HasField("tensor_type"):
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_param") and dim.dim_param in names:
                dim.Clear()
                cleared.append((value.name, axis))
    symbolic = _inferred_dims(_skeleton(model))
    refilled = 0
    dims_of = {v.name: v.type.tensor_type.shape.dim for v in [*model.graph.value_info, *model.graph.output]}
    for tensor, axis in cleared:
        inferred = symbolic.get(tensor)
        if inferred is None or axis >= len(inferred):
            continue
        value = inferred[axis]
        if isinstance(value, int) and value > 0:
            dims_of[tensor][axis].dim_value = value
            refilled += 1
        elif isinstance(value, str) and value in input_names:
            dims_of[tensor][axis].dim_param = value
            refilled += 1
    return {
        "removed": {name: bad.get(name, []) for name in sorted(names)},
        "cleared_dims": len(cleared),
        "refilled_dims": refilled,
        "still_inconsistent": inconsistent_dim_names(model),
    }


# ---------------------------------------------------------------------------------------------------------
# Detectors of known causes (cheap: they read the graph, they run nothing)


def _load(model: Any) -> Any:
    if isinstance(model, (str, Path)):
        import onnx

        return onnx.load(str(model), load_external_data=False)
    return model


def dim_name_findings(model: Any) -> list[Finding]:
    bad = inconsistent_dim_names(_load(model))
    if not bad:
        return []
    shown = ", ".join(f"{name!r} (sizes {', '.join(map(str, sizes))})" for name, sizes in sorted(bad.items())[:5])
    return [Finding(
        "inconsistent-dim-names",
        f"the model labels dimensions of different sizes with one name: {shown}; ONNX Runtime then reuses a "
        "buffer of one size for a tensor of another (\"Shape mismatch attempting to re-use buffer\", or a "
        "segfault with graph optimisations on)",
        "re-run the convert stage (it removes such names since version 2), or remove the dim_param of those "
        "dims in value_info and re-run onnx.shape_inference",
    )]


def _reduced_float_convs(model: Any) -> bool:
    import onnx

    reduced = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    if not any(node.op_type == "Conv" for node in model.graph.node):
        return False
    return any(init.data_type in reduced for init in model.graph.initializer) or any(
        node.op_type == "Cast" and any(a.name == "to" and a.i in reduced for a in node.attribute)
        for node in model.graph.node)


def ort_optimizer_findings(model: Any, options: OrtOptions | None, providers: Sequence[str] | None) -> list[Finding]:
    """fp16 convolutions on the CPU provider with layout optimisations on: the NCHWc transformer has crashed."""
    level = options.graph_optimization_level if options is not None else "all"
    cpu = not providers or any("CPU" in p for p in providers)
    if cpu and level in ("layout", "all") and _reduced_float_convs(_load(model)):
        return [Finding(
            "ort-nchwc-fp16",
            "the model has fp16/bf16 convolutions and ONNX Runtime's CPU layout optimisations are on; its NCHWc "
            "transformer has crashed on such models",
            "set the ONNX Runtime options graph_optimization_level: extended, or disabled_optimizers: "
            "[NchwcTransformer]",
        )]
    return []


def memory_findings(model_path: Path, factor: float, what: str) -> list[Finding]:
    """The step is likely to need more memory than is available (``factor`` times the model file)."""
    try:
        size = Path(model_path).stat().st_size
        data = Path(model_path).with_name(Path(model_path).name + "_data")
        size += data.stat().st_size if data.exists() else 0
        available = _available_memory()
    except OSError:
        return []
    if available is None or size * factor <= available:
        return []
    return [Finding(
        "memory",
        f"{what} needs about {factor:g}x the model's {size / 2**30:.2f} GiB, more than the "
        f"{available / 2**30:.2f} GiB of memory available when it started (the kernel kills the process: "
        "signal 9)",
        "run the node alone (trtflow run -j 1), or on a machine with more memory",
    )]


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def ort_findings(model_path: Path, options: OrtOptions | None = None,
                 providers: Sequence[str] | None = None) -> list[Finding]:
    """Known causes of ONNX Runtime failures on ``model_path`` (a few graph checks, cached per file version)."""
    try:
        stat = Path(model_path).stat()
    except OSError:
        return []
    graph = _graph_findings(str(model_path), stat.st_mtime_ns, stat.st_size,
                            options.model_dump_json() if options is not None else None,
                            tuple(providers) if providers else None)
    return [*graph, *memory_findings(model_path, 3.0, "an ONNX Runtime session")]


@functools.lru_cache(maxsize=8)
def _graph_findings(path: str, mtime_ns: int, size: int, options_json: str | None,
                    providers: tuple[str, ...] | None) -> tuple[Finding, ...]:
    from ..runtimes.ort import OrtOptions

    try:
        model = _load(path)
    except Exception as error:  # an unreadable model: ONNX Runtime says so itself
        _LOG.info("cannot read %s for diagnosis: %s", path, error)
        return ()
    options = OrtOptions.model_validate_json(options_json) if options_json is not None else None
    return (*dim_name_findings(model), *ort_optimizer_findings(model, options, providers))


# ---------------------------------------------------------------------------------------------------------
# Native steps, for every stage that runs these libraries


@contextmanager
def ort_session_step(ctx: StageContext, model_path: Path, *, what: str | None = None,
                     options: OrtOptions | None = None, providers: Sequence[str] | None = None) -> Iterator[None]:
    """Around creating an ONNX Runtime session on ``model_path``: a crash is reported with a repro and hints."""
    with ctx.native_step("onnxruntime", what or f"creating a session on {Path(model_path).name}",
                         repro=ort_session_repro(model_path, options, providers),
                         hint=hint_text(ort_findings(model_path, options, providers))):
        yield


@contextmanager
def ort_run_step(ctx: StageContext, model_path: Path, feed: Mapping[str, Any], *, what: str | None = None,
                 options: OrtOptions | None = None, providers: Sequence[str] | None = None) -> Iterator[None]:
    """Around running (and creating) an ONNX Runtime session on inputs like ``feed``."""
    shapes = ", ".join(f"{name}{list(value.shape)}" for name, value in feed.items())
    with ctx.native_step("onnxruntime", what or f"running {Path(model_path).name} on {shapes}",
                         repro=ort_run_repro(model_path, feed, options, providers),
                         hint=hint_text(ort_findings(model_path, options, providers))):
        yield


@contextmanager
def modelopt_step(ctx: StageContext, model_path: Path, what: str, repro: str,
                  memory_factor: float = 4.0) -> Iterator[None]:
    """Around a ModelOpt call (AutoCast, PTQ calibration) on ``model_path``; ``repro`` from `autocast_repro` or
    `quantize_repro`."""
    findings = memory_findings(model_path, memory_factor, f"ModelOpt {what}")
    with ctx.native_step("modelopt", what, repro=repro, hint=hint_text(findings)):
        yield
