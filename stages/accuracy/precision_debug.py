"""Precision debugging at the ONNX level, on ONNX Runtime.

TensorRT 11's strongly typed networks have no per-layer precision flags (what Polygraphy's ``debug precision``
toggles), so this works on the ONNX model instead, where the convert stage (AutoCast's ``nodes_to_exclude``) and
the quantize stage (ModelOpt's ``nodes_to_exclude``) decide each node's precision:

- `layer_errors`: run the reference and the candidate with every intermediate tensor marked as an output
  (Polygraphy's ``ModifyOutputs``), compare tensors of the same name, and rank nodes by how much error they add.
- `find_nodes_to_keep`: re-run the recipe's convert/quantize node with more and more nodes excluded, each step
  validated on the recipe's validate node (its data, its tolerances, its comparison code), and narrow the set
  down by bisection to a small one that passes.

Recipes are read through the public API (`trtflow.api`): `api.plan` for the nodes, `api.run` brings the needed
upstream nodes up to date and gives their output files; stages run in-process with `trtflow.testing.run_stage`.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.digits import distinct
from trtflow.stage import StageContext, StageFailed

_LOG = logging.getLogger(__name__)
DEBUGGABLE = {"convert": "kept in fp32", "quantize": "left unquantized"}
KEEP = {"convert": "to keep in fp32", "quantize": "to leave unquantized"}
_REDUCED_FLOATS = (10, 16)  # onnx.TensorProto.FLOAT16, BFLOAT16


@contextmanager
def quiet_output() -> Iterator[None]:
    """Silence what libraries print (ModelOpt's and Polygraphy's logs, progress bars) while they run; their
    failures still arrive as exceptions."""
    import io
    import os
    import sys

    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in saved:
        os.dup2(devnull, fd)
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        os.close(devnull)


class DebugError(StageFailed):
    """A precision-debugging request that cannot be carried out (named node, cause, what to do)."""


# ---------------------------------------------------------------------------------------------------------
# What to debug: the validate node, the candidate's producer, the models, the data


@dataclass
class Target:
    """A validate node and the convert/quantize node that made its candidate, with their files."""

    recipe: Path
    recipe_dir: Path
    name: str  # the recipe's name (outputs go to build/<name>/)
    validate: Any  # ConcreteNode
    producer: Any  # ConcreteNode (stage convert or quantize)
    fp32_model: Path  # the producer's input
    reference_model: Path
    candidate_model: Path
    via_engine: bool = False

    @property
    def stage(self) -> str:
        return self.producer.stage


def _first(node: Any, slot: str) -> str | None:
    refs = node.upstream.get(slot) or []
    return refs[0][0] if refs else None


def resolve_target(recipe: str | Path, node_name: str, overrides: Sequence[str] = (),
                   store: str | Path | None = None, say: Callable[[str], None] = print) -> Target:
    """The validate node named (or the one checking the convert/quantize node named), with up-to-date files."""
    from trtflow import api

    steps = api.plan(recipe, (), overrides, store)
    nodes = {step.node.name: step.node for step in steps}
    if node_name not in nodes:
        from trtflow.errors import did_you_mean

        raise DebugError(f"no node named {node_name!r} in {recipe}",
                         hint=did_you_mean(node_name, list(nodes)) or "see `trtflow plan`")
    node = nodes[node_name]
    if node.stage in DEBUGGABLE:
        checks = [n for n in nodes.values() if n.stage == "validate" and _producer_of(nodes, n) == node_name]
        if not checks:
            raise DebugError(f"no validate node checks {node_name!r}: precision debugging needs the data and the "
                             "tolerances of one", hint="add a validate node with this node as its candidate")
        node = checks[0]
    if node.stage != "validate":
        raise DebugError(f"{node_name!r} runs the {node.stage} stage; give a validate node (or the convert/quantize "
                         "node it checks)",
                         hint=f"validate nodes: {[n for n, v in nodes.items() if v.stage == 'validate']}")
    producer_name = _producer_of(nodes, node)
    if producer_name is None or nodes[producer_name].stage not in DEBUGGABLE:
        stage = nodes[producer_name].stage if producer_name else "none"
        raise DebugError(f"the candidate of {node.name!r} comes from a {stage} node; precision debugging changes "
                         "the convert (fp16/bf16) or quantize (int8/fp8) node that lowers the precision",
                         hint="debug a validate node whose candidate is made by convert or quantize")
    reference = _first(node, "reference")
    if reference is None:
        raise DebugError(f"{node.name!r} compares with saved reference_outputs; precision debugging needs a "
                         "reference model (the 'reference' input)")
    producer = nodes[producer_name]
    source = _first(producer, "model")
    assert source is not None
    candidate = _first(node, "candidate")
    assert candidate is not None
    wanted = sorted({producer_name, reference, source})
    say(f"bringing {', '.join(wanted)} up to date")
    pipeline, _, summary = api.run(recipe, wanted, overrides, store)
    paths: dict[str, Path] = {}
    for name in wanted:
        result = summary.results.get(name)
        if result is None or "model" not in result.outputs:
            status = result.status if result else "not run"
            raise DebugError(f"node {name!r} has no model output ({status}: {getattr(result, 'error', '')})",
                             hint=f"`trtflow run {recipe} {name}` and fix what it reports")
        paths[name] = Path(result.outputs["model"])
    recipe_path = Path(recipe).resolve()
    return Target(recipe_path, recipe_path.parent, pipeline.name, node, producer, paths[source], paths[reference],
                  paths[producer_name], via_engine=nodes[candidate].stage == "build")


def _producer_of(nodes: Mapping[str, Any], validate: Any) -> str | None:
    candidate = _first(validate, "candidate")
    if candidate is not None and nodes[candidate].stage == "build":
        return _first(nodes[candidate], "model")
    return candidate


# ---------------------------------------------------------------------------------------------------------
# Running a model on the validate node's data


def _context(target: Target, scratch: Path) -> StageContext:
    return StageContext(node="debug", scratch=scratch, recipe_dir=target.recipe_dir, outputs={},
                        cache_dir=scratch / "caches", allowed_roots=[target.recipe_dir, Path.cwd()], logger=_LOG)


def load_batches(target: Target, scratch: Path, max_rows: int | None = None) -> list[dict[str, Any]]:
    """The validate node's data in its batches (as validate cuts them), at most ``max_rows`` rows."""
    from ..data import iter_batches, load_arrays, onnx_input_specs

    params = target.validate.params_model
    specs = onnx_input_specs(target.reference_model)
    arrays = load_arrays(params.data, specs, _context(target, scratch).resolve, _LOG)
    if max_rows is not None:
        arrays = {name: array[:max_rows] for name, array in arrays.items()}
    static = {s.shape[0] for s in specs if s.shape and isinstance(s.shape[0], int) and s.shape[0] > 0}
    batch = static.pop() if static else (params.batch_size or 1)
    return list(iter_batches(arrays, batch, drop_last=bool(static)))


def run_model(path: Path, batches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Outputs over all batches, joined along axis 0 (computed as validate computes them: with the ONNX Runtime
    work-arounds of `accuracy.ort_fixes`, so an int8 model with an fp16 remainder is not judged with a truncating
    op)."""
    import tempfile

    from ..runtimes.ort import create_session
    from .ort_fixes import fix_for_onnxruntime

    with tempfile.TemporaryDirectory(prefix="trtflow-debug-") as workdir:
        fixed, _ = fix_for_onnxruntime(path, Path(workdir))
        session = create_session(fixed)
        return _run_batches(session, batches)


def _run_batches(session: Any, batches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    import numpy as np

    names = [o.name for o in session.get_outputs()]
    parts: dict[str, list[Any]] = {n: [] for n in names}
    for batch in batches:
        for name, value in zip(names, session.run(None, dict(batch)), strict=True):
            parts[name].append(np.asarray(value))
    joined = {}
    for name, values in parts.items():
        try:
            joined[name] = np.concatenate(values, axis=0)
        except ValueError:  # scalar or differently shaped outputs: compare them flattened
            joined[name] = np.concatenate([v.ravel() for v in values])
    return joined


@dataclass
class Evaluation:
    excluded: tuple[str, ...]
    passed: bool
    outputs: dict[str, dict[str, Any]]
    failures: list[str]

    def brief(self) -> dict[str, Any]:
        return {name: {k: entry.get(k) for k in ("max_abs_error", "mean_abs_error", "cosine_similarity", "passed")}
                for name, entry in self.outputs.items()}


class Evaluator:
    """Re-runs the producer node with extra nodes excluded and validates the result like the validate node."""

    def __init__(self, target: Target, workdir: Path, batches: Sequence[Mapping[str, Any]],
                 extra_params: Mapping[str, Any] | None = None, say: Callable[[str], None] = print) -> None:
        self.target = target
        self.workdir = workdir
        self.batches = batches
        self.reference = run_model(target.reference_model, batches)
        self.extra_params = dict(extra_params or {})
        self.say = say
        self.cache: dict[tuple[frozenset[str], str], Evaluation] = {}
        self.steps = 0

    def base_patterns(self) -> list[str]:
        return list(self.target.producer.params.get("nodes_to_exclude") or [])

    def params_for(self, excluded: Sequence[str]) -> dict[str, Any]:
        params = dict(self.target.producer.params)
        params.update(self.extra_params)
        patterns = self.base_patterns() + [node_pattern(name) for name in excluded]
        params["nodes_to_exclude"] = patterns or None
        if self.target.stage == "convert":
            params["check"] = False  # the debug run validates the model itself
        return params

    def model_for(self, excluded: Sequence[str]) -> Path:
        from trtflow.registry import get_stage
        from trtflow.testing import run_stage

        self.steps += 1
        work = self.workdir / f"step-{self.steps}"
        try:
            with quiet_output():
                result = run_stage(get_stage(self.target.stage), self.params_for(excluded),
                                   {"model": self.target.fp32_model}, workdir=work,
                                   recipe_dir=self.target.recipe_dir)
        except StageFailed as failed:
            raise DebugError(f"re-running {self.target.producer.name!r} with {len(excluded)} node(s) excluded "
                             f"failed: {failed.message}", hint=failed.hint) from failed
        return result.outputs["model"]

    def evaluate_model(self, model: Path, excluded: Sequence[str] = ()) -> Evaluation:
        """The validate node's verdict on ``model``: its output comparison and its task metric gates."""
        from trtflow.callables import load_callable

        from .compare import compare_outputs, evaluate_task_metric

        params = self.target.validate.params_model
        candidate = run_model(model, self.batches)
        with quiet_output():
            report = compare_outputs(self.reference, candidate, params)
        failures = [m for entry in report.values() for m in entry["failures"]]
        if params.task_metric:
            function = load_callable(params.task_metric, _context(self.target, self.workdir).resolve,
                                          "task metric")
            failures += evaluate_task_metric(function, self.reference, candidate, params)[1]
        return Evaluation(tuple(excluded), not failures, report, failures)

    def key(self, excluded: Sequence[str]) -> tuple[frozenset[str], str]:
        return frozenset(excluded), json.dumps(self.extra_params, sort_keys=True)

    def __call__(self, excluded: Sequence[str]) -> Evaluation:
        key = self.key(excluded)
        if key not in self.cache:
            evaluation = self.evaluate_model(self.model_for(excluded), excluded)
            self.cache[key] = evaluation
            verdict = "passes" if evaluation.passed else f"fails ({_worst(evaluation)})"
            self.say(f"  step {self.steps}: {len(excluded)} node(s) {DEBUGGABLE[self.target.stage]} -> {verdict}")
        return self.cache[key]


def _worst(evaluation: Evaluation) -> str:
    if not evaluation.outputs:
        return "no outputs"
    name, entry = min(evaluation.outputs.items(), key=lambda kv: kv[1].get("cosine_similarity", 1.0))
    return (f"{name}: cosine {distinct(entry['cosine_similarity'], [1.0], least=5)}, max abs error "
            f"{entry['max_abs_error']:.4g}")


def node_pattern(name: str) -> str:
    """A nodes_to_exclude pattern (``re.match``) that matches exactly this node name."""
    return re.escape(name) + "$"


# ---------------------------------------------------------------------------------------------------------
# Which nodes the candidate lowered


def lowered_nodes(stage: str, candidate: Path, fp32_model: Path) -> list[tuple[str, str]]:
    """(name, op type) of the nodes the producer lowered, in graph order, named as in the fp32 model."""
    import onnx

    original = {n.name for n in onnx.load(str(fp32_model), load_external_data=False).graph.node if n.name}
    model = onnx.load(str(candidate), load_external_data=False)
    graph = model.graph
    found: list[tuple[str, str]] = []
    if stage == "quantize":
        dequantized = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
        for node in graph.node:
            if node.op_type not in ("QuantizeLinear", "DequantizeLinear") and node.name in original \
                    and any(i in dequantized for i in node.input):
                found.append((node.name, node.op_type))
        return found
    try:
        typed = onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference is best effort; the model's own value_info is used then
        typed = model
    types = {v.name: v.type.tensor_type.elem_type
             for v in [*typed.graph.value_info, *typed.graph.output, *typed.graph.input]}
    for node in graph.node:
        if node.op_type != "Cast" and node.name in original \
                and any(types.get(o) in _REDUCED_FLOATS for o in node.output):
            found.append((node.name, node.op_type))
    return found


# ---------------------------------------------------------------------------------------------------------
# Per-layer comparison


@dataclass
class LayerError:
    node: str
    op_type: str
    tensor: str
    rel_error: float
    max_abs_error: float
    cosine: float
    input_rel_error: float
    index: int

    @property
    def added(self) -> float:
        return self.rel_error - self.input_rel_error

    def record(self) -> dict[str, Any]:
        return {"node": self.node, "op_type": self.op_type, "tensor": self.tensor, "rel_error": self.rel_error,
                "input_rel_error": self.input_rel_error, "added_rel_error": self.added,
                "max_abs_error": self.max_abs_error, "cosine": self.cosine, "position": self.index}


def _all_outputs(path: Path) -> Any:
    from polygraphy import constants
    from polygraphy.backend.onnx import ModifyOutputs, OnnxFromPath

    return ModifyOutputs(OnnxFromPath(str(path)), outputs=constants.MARK_ALL)()


def _run_all(model: Any, feed: Mapping[str, Any]) -> dict[str, Any]:
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, (np.asarray(v) for v in session.run(None, dict(feed))), strict=True))


#: The largest finite fp16 value: a reference value beyond it may come out as an infinity in a low-precision model.
SATURATES = 65504.0


def tensor_error(r: Any, c: Any) -> tuple[float, float, float]:
    """(relative error ||c - r|| / ||r||, max abs error, cosine) of a candidate's tensor ``c`` against the reference's
    ``r`` (flat float64 arrays; ``r`` finite). A fill beyond fp16's range (an attention mask's finfo.min) that the
    candidate saturates to an infinity of the same sign is the same value there, not an infinite error."""
    import numpy as np

    c = np.where(~np.isfinite(c) & (np.abs(r) > SATURATES) & (np.sign(c) == np.sign(r)), r, c)
    if not np.isfinite(c).all():
        return math.inf, math.inf, float("nan")
    diff, norm = np.linalg.norm(c - r), np.linalg.norm(r)
    denominator = np.linalg.norm(c) * norm
    return (float(diff / norm) if norm > 0 else float(diff), float(np.max(np.abs(c - r))),
            float(np.dot(c, r) / denominator) if denominator > 0 else float("nan"))


def layer_errors(reference: Path, candidate: Path, feed: Mapping[str, Any]) -> list[LayerError]:
    """Every node of the reference whose float output also exists in the candidate, in graph order, with the
    relative error (||c - r|| / ||r||) of its output, the largest of its inputs', and what it added."""
    import numpy as np

    with quiet_output():
        ref_model = _all_outputs(reference)
        ref_values = _run_all(ref_model, feed)
        cand_values = _run_all(_all_outputs(candidate), feed)
    errors: dict[str, float] = {name: 0.0 for name in feed}
    found: list[LayerError] = []
    for index, node in enumerate(ref_model.graph.node):
        inputs = [errors[i] for i in node.input if i in errors]
        for tensor in node.output:
            ref, cand = ref_values.get(tensor), cand_values.get(tensor)
            if ref is None or cand is None or ref.shape != cand.shape or not np.issubdtype(ref.dtype, np.floating):
                continue
            r = ref.astype(np.float64).ravel()
            if not (np.isfinite(r).all() and r.size):
                continue
            rel, max_abs, cosine = tensor_error(r, cand.astype(np.float64).ravel())
            errors[tensor] = rel
            found.append(LayerError(node.name, node.op_type, tensor, rel, max_abs, cosine, max(inputs, default=0.0),
                                    index))
    return found


def layer_report(errors: Sequence[LayerError], threshold: float, top: int) -> dict[str, Any]:
    """The first layers above ``threshold`` relative error and the layers that add the most error."""
    above = [e for e in errors if e.rel_error > threshold]
    largest = sorted(errors, key=lambda e: e.added, reverse=True)[:top]
    return {
        "tensors_compared": len(errors),
        "threshold": threshold,
        "first_above_threshold": [e.record() for e in above[:top]],
        "largest_added_error": [e.record() for e in largest],
        "layers": [e.record() for e in errors],
    }


# ---------------------------------------------------------------------------------------------------------
# Bisection


def minimize(passes: Callable[[list[Any]], bool], required: list[Any], candidates: list[Any],
             budget: list[int]) -> list[Any]:
    """A small subset X of ``candidates`` with ``passes(required + X)``, given ``passes(required + candidates)``.

    Binary splitting (as in delta debugging): keep one half when it passes alone, else minimise each half with
    the other held fixed. Assumes excluding more never hurts. ``budget`` ([steps left]) bounds the evaluations;
    when it runs out the current (passing) set is returned as is.
    """
    if not candidates or budget[0] <= 0:
        return candidates
    if len(candidates) == 1:
        budget[0] -= 1
        return [] if passes(required) else candidates
    middle = len(candidates) // 2
    first, second = candidates[:middle], candidates[middle:]
    budget[0] -= 1
    if passes(required + first):
        return minimize(passes, required, first, budget)
    budget[0] -= 1
    if passes(required + second):
        return minimize(passes, required, second, budget)
    kept_first = minimize(passes, required + second, first, budget)
    kept_second = minimize(passes, required + kept_first, second, budget)
    return kept_first + kept_second


@dataclass
class DebugResult:
    producer: str
    stage: str
    before: Evaluation
    after: Evaluation | None
    nodes: list[str]
    op_types: list[str]
    extra_params: dict[str, Any] = field(default_factory=dict)
    steps: int = 0
    message: str = ""

    def recipe_change(self, base_patterns: Sequence[str]) -> str:
        """The YAML to put in the producer node's params."""
        lines = [f"# nodes: - name: {self.producer}  (params)"]
        for key, value in self.extra_params.items():
            lines.append(f"{key}: {json.dumps(value)}")
        if self.nodes:
            patterns = [*base_patterns, *(node_pattern(n) for n in self.nodes)]
            lines.append("nodes_to_exclude:")
            lines += [f"  - {json.dumps(p)}" for p in patterns]
        return "\n".join(lines)


def find_nodes_to_keep(evaluator: Evaluator, lowered: Sequence[tuple[str, str]], order: Sequence[str] = (),
                       max_steps: int = 40) -> DebugResult:
    """Nodes of ``lowered`` to exclude so the candidate passes: first by op type, then node by node.

    ``order`` (node names, most suspect first, e.g. from `layer_errors`) decides how candidates are split, so
    the culprits end up together and the bisection needs fewer steps.
    """
    target = evaluator.target
    before = evaluator.evaluate_model(target.candidate_model)
    evaluator.cache[evaluator.key([])] = before
    if before.passed:
        return DebugResult(target.producer.name, target.stage, before, None, [], [],
                           message="the candidate already passes its accuracy gate: nothing to change")
    names = [name for name, _ in lowered]
    rank = {name: i for i, name in enumerate(order)}
    names.sort(key=lambda n: rank.get(n, len(rank)))
    op_of = dict(lowered)
    everything = evaluator(names)
    extra: dict[str, Any] = {}
    if not everything.passed and target.stage == "quantize" \
            and (target.producer.params.get("high_precision_dtype") or "fp16") != "fp32":
        evaluator.extra_params = {"high_precision_dtype": "fp32"}
        extra = dict(evaluator.extra_params)
        evaluator.say("  with every quantized node excluded it still fails: trying high_precision_dtype: fp32")
        if evaluator([]).passed:
            return DebugResult(target.producer.name, target.stage, before, evaluator([]), [], [], extra,
                               evaluator.steps, "the unquantized rest of the model in fp16 loses the accuracy, "
                               "not the quantized nodes: keep it in fp32")
        everything = evaluator(names)
    if not everything.passed:
        return DebugResult(target.producer.name, target.stage, before, everything, names, [], extra, evaluator.steps,
                           f"even with all {len(names)} lowered nodes {DEBUGGABLE[target.stage]}, the gate fails: "
                           "the precision of these nodes is not the cause (check the tolerances, keep_io_types, "
                           "or the reference)")
    budget = [max_steps]
    op_types = sorted({op_of[n] for n in names}, key=lambda t: min(rank.get(n, len(rank)) for n in names
                                                                    if op_of[n] == t))

    def passes_types(types: list[str]) -> bool:
        return evaluator([n for n in names if op_of[n] in types]).passed

    kept_types = minimize(passes_types, [], op_types, budget) if len(op_types) > 1 else op_types
    within = [n for n in names if op_of[n] in kept_types]
    kept = minimize(lambda chosen: evaluator(chosen).passed, [], within, budget)
    after = evaluator(kept)
    message = "" if budget[0] > 0 else f"stopped after the step budget ({max_steps}): the set may not be minimal"
    return DebugResult(target.producer.name, target.stage, before, after, kept, kept_types, extra,
                       evaluator.steps, message)

