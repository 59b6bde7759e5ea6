"""Crash recovery for ONNX Runtime: find, in child processes, the session settings under which a model runs.

A native library that crashes on a model kills the process that called it; `model_problems` names the crash after
the fact. This module goes further: before a stage creates a session in its own process, `runtime_options`
creates one in a child process (`probe`: create the session, run it once on a small input). When the child dies
of a signal, `recover` searches for settings that run, each try in a child process of its own:

1. the lower graph optimisation levels, highest first (all > layout > extended > basic > disable), until one
   runs: some optimiser that only the higher levels apply crashes;
2. back at the requested level, the single optimiser to disable (``disabled_optimizers``), found by halving the
   list of optimisers ONNX Runtime applies at that level (read from its verbose log: `optimizers_at`), those the
   working level does not apply first;
3. the best setting found is kept: the highest level with the fewest optimisers disabled.

Nothing here knows a cause in advance: it works for crashes nobody listed. It fails only when no level runs,
saying what was tried. The settings found are recorded by the stage that found them (``runtime_settings`` in
its summary file beside the model, e.g. convert.json), and `runtime_options` reads them back for every later
stage that runs the same model (validate, benchmark), so the search happens once per model.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.stage import StageFailed

from ..runtimes.ort import OrtOptions

_LOG = logging.getLogger(__name__)

#: Graph optimisation levels, highest first.
LEVELS = ("all", "layout", "extended", "basic", "disable")
#: Summary files a producing stage writes beside its model, in which it may record ``runtime_settings``.
SETTINGS_FILES = ("convert.json", "quantize.json", "export.json", "simplify.json")
#: A child that runs longer than this is taken to hang (a session on a multi-GB model takes minutes).
PROBE_TIMEOUT_S = 900.0
_TRANSFORMER_LINE = re.compile(r"GraphTransformer (\S+) modified")
#: Session errors that are about the file or the graph as given, not about an optimiser.
_NOT_OPTIMISER = ("INVALID_PROTOBUF", "NO_SUCHFILE", "NO_MODEL", "INVALID_GRAPH", "Protobuf parsing failed",
                  "Load model from", "NOT_IMPLEMENTED", "No such file")


@dataclass(frozen=True)
class Attempt:
    """One try in a child process: the settings and what happened."""

    level: str
    disabled: tuple[str, ...]
    outcome: str  # "ok", "crashed: SIGSEGV", "error: ...", "hung"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def crashed(self) -> bool:
        return self.outcome.startswith("crashed") or self.outcome == "hung"

    @property
    def searchable(self) -> bool:
        """A failure other settings may avoid: a crash, or an error while ONNX Runtime optimised the graph (not a
        file it cannot read or a graph it rejects before optimising, which no setting changes)."""
        if self.crashed:
            return True
        return self.outcome.startswith("error") and not any(mark in self.outcome for mark in _NOT_OPTIMISER)

    def record(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"graph_optimization_level": self.level, "disabled_optimizers": list(self.disabled),
                                 "outcome": self.outcome}
        if self.detail:
            entry["detail"] = self.detail
        return entry

    def label(self) -> str:
        disabled = f" without {', '.join(self.disabled)}" if self.disabled else ""
        return f"level {self.level}{disabled}: {self.outcome}"


@dataclass
class Recovery:
    """The settings to use for a model, and how they were found (``attempts`` empty: the first try ran)."""

    options: OrtOptions
    attempts: list[Attempt] = field(default_factory=list)
    #: True when the requested settings failed (a crash, or an optimiser's error) and these settings run.
    recovered: bool = False

    def record(self) -> dict[str, Any]:
        """``runtime_settings`` for a summary file: what later stages read back (`runtime_options`)."""
        entry: dict[str, Any] = {"onnxruntime": {
            "graph_optimization_level": self.options.graph_optimization_level,
            "disabled_optimizers": list(self.options.disabled_optimizers)}}
        if self.recovered:
            first = self.attempts[0]
            what = first.outcome.removeprefix("crashed: ") if first.crashed else f"failed ({first.outcome[:160]})"
            entry["recovered_from"] = (f"ONNX Runtime {what} at graph optimisation level {first.level}"
                                       + (f" without {', '.join(first.disabled)}" if first.disabled else ""))
            entry["tried"] = [a.record() for a in self.attempts]
        return entry

    def note(self) -> str:
        """One line for logs and summaries."""
        if not self.recovered:
            return "ONNX Runtime runs the model with the requested settings"
        options = self.options
        disabled = f", disabled_optimizers {list(options.disabled_optimizers)}" if options.disabled_optimizers else ""
        return (f"{self.record()['recovered_from']}; runs with graph_optimization_level "
                f"{options.graph_optimization_level}{disabled} (found in {len(self.attempts)} tries)")


# ---------------------------------------------------------------------------------------------------------
# Child processes


def _child(args: Sequence[str], timeout: float) -> tuple[int | None, str, str]:
    """(return code, stdout, stderr) of this module run as a child; return code None when it hung."""
    command = [sys.executable, "-m", __name__, *args]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout.decode(errors="replace") if isinstance(expired.stdout, bytes) else expired.stdout or ""
        return None, out, ""
    return proc.returncode, proc.stdout, proc.stderr


def _tail(text: str, limit: int = 300) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " ".join(" ".join(lines[-3:]).split())[-limit:]


def probe(model: Path, options: OrtOptions, feed: Path | None = None, timeout: float = PROBE_TIMEOUT_S) -> Attempt:
    """Create a session on ``model`` with ``options`` in a child process and run it once (``feed``: a .npz of
    inputs; else small inputs made from the model's input types, dynamic dimensions 1)."""
    args = ["probe", str(model), options.model_dump_json()]
    if feed is not None:
        args.append(str(feed))
    code, out, err = _child(args, timeout)
    level, disabled = options.graph_optimization_level, tuple(options.disabled_optimizers)
    if code is None:
        return Attempt(level, disabled, "hung", f"no answer after {timeout:.0f} s")
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return Attempt(level, disabled, f"crashed: {name}", _tail(err))
    result = _last_json(out)
    if code == 0 and result.get("status") == "ok":
        return Attempt(level, disabled, "ok", result.get("detail", ""))
    message = _clean(result.get("error") or _tail(err) or f"exit code {code}")
    return Attempt(level, disabled, f"error: {message[:300]}")


def _clean(message: str) -> str:
    """ONNX Runtime's message without its source locations and C++ signatures."""
    message = re.sub(r"\[ONNXRuntimeError\] : \d+ : (\w+) : ", r"\1: ", message)
    message = re.sub(r"/onnxruntime_src/\S+ .*? was false\. ", "", message)
    return re.sub(r"/onnxruntime_src/\S+ ", "", message)


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return {}


_OPTIMIZER_CACHE: dict[str, list[str]] = {}


def optimizers_at(level: str) -> list[str]:
    """The graph optimisers ONNX Runtime applies at ``level`` on the CPU, in the order it applies them (from
    its verbose log, on a one-node model: the list depends on the level and the provider, not on the model)."""
    if level not in _OPTIMIZER_CACHE:
        code, out, err = _child(["optimizers", level], 120.0)
        names = list(dict.fromkeys(_TRANSFORMER_LINE.findall(out + err)))
        if code != 0 or not names:
            _LOG.warning("cannot list ONNX Runtime's optimisers at level %s: %s", level, _tail(err))
        _OPTIMIZER_CACHE[level] = names
    return list(_OPTIMIZER_CACHE[level])


# ---------------------------------------------------------------------------------------------------------
# The search


def _with(options: OrtOptions, level: str, disabled: Sequence[str]) -> OrtOptions:
    return options.model_copy(update={"graph_optimization_level": level, "disabled_optimizers": list(disabled)})


def _candidates(level: str, working: str | None, already: Sequence[str]) -> list[str]:
    """Optimisers to consider disabling at ``level``: those the working level does not apply first; the ones
    ONNX Runtime applies even with optimisations disabled (it needs them) and those already disabled left out."""
    required = set(optimizers_at("disable"))
    names = [n for n in optimizers_at(level) if n not in required and n not in already]
    below = set(optimizers_at(working)) if working else set()
    return [n for n in names if n not in below] + [n for n in names if n in below]


def _smallest_set(runs: Callable[[list[str]], bool], names: list[str]) -> list[str] | None:
    """The smallest set of ``names`` found by halving whose disabling makes the model run (None: not even all)."""
    if not names or not runs(names):
        return None
    current = names
    while len(current) > 1:
        half = len(current) // 2
        first, second = current[:half], current[half:]
        if runs(first):
            current = first
        elif runs(second):
            current = second
        else:  # it takes optimisers of both halves: keep what is known to work
            break
    return current


def recover(model: Path, options: OrtOptions | None = None, feed: Path | None = None,
            log: logging.Logger | None = None, first: Attempt | None = None) -> Recovery:
    """Settings under which ONNX Runtime runs ``model``: ``options`` if a child runs it, else the best found.

    Raises StageFailed (with every try) when the model crashes ONNX Runtime at every optimisation level. An error
    that no setting avoids (at every level, or a file ONNX Runtime cannot read) is returned unrecovered, with
    its attempts: the caller's own session then raises it, as it would have.
    """
    log = log or _LOG
    options = options or OrtOptions()
    attempts = [first or probe(model, options, feed)]
    if not attempts[0].searchable:
        return Recovery(options, attempts[:0] if attempts[0].ok else attempts)
    log.warning("ONNX Runtime failed on %s (%s); searching for settings that run it", model.name,
                attempts[0].label())

    def attempt(level: str, disabled: Sequence[str]) -> Attempt:
        result = probe(model, _with(options, level, disabled), feed)
        attempts.append(result)
        log.info("recovery try: %s", result.label())
        return result

    requested = options.graph_optimization_level
    base = list(options.disabled_optimizers)
    lower = list(LEVELS[LEVELS.index(requested) + 1:])
    working = next((level for level in lower if attempt(level, base).ok), None)
    if working is None:
        if not attempts[0].crashed:
            return Recovery(options, attempts)
        raise StageFailed(
            f"ONNX Runtime crashes on {model.name} at every graph optimisation level: "
            + "; ".join(a.label() for a in attempts),
            hint="the crash is not in a graph optimiser: run the model on another runtime (TensorRT), or report it "
            "to ONNX Runtime with the model; the first try's message: " + (attempts[0].detail or "none"))
    for level in LEVELS[LEVELS.index(requested):LEVELS.index(working)]:
        def works(names: Sequence[str], at: str = level) -> bool:
            return attempt(at, [*base, *names]).ok

        found = _smallest_set(works, _candidates(level, working, base))
        if found is not None:
            return Recovery(_with(options, level, [*base, *found]), attempts, recovered=True)
    return Recovery(_with(options, working, base), attempts, recovered=True)


# ---------------------------------------------------------------------------------------------------------
# For the stages


def recorded_settings(model: Path) -> dict[str, Any] | None:
    """``runtime_settings`` that the stage which made ``model`` recorded in its summary file beside it."""
    from ..runtimes.records import PRODUCER, ProducerRecord, read_record

    for name in SETTINGS_FILES:
        path = Path(model).parent / name
        if path.is_file():
            try:
                record: ProducerRecord = read_record(path, PRODUCER)  # what this reads of it, checked
            except StageFailed:
                continue
            settings = record.get("runtime_settings")
            if settings is not None:
                return dict(settings)
    return None


def merge(options: OrtOptions, settings: dict[str, Any] | None) -> OrtOptions:
    """``options`` narrowed by recorded settings: the lower level of the two, the union of disabled optimisers."""
    if not settings:
        return options
    recorded = settings["onnxruntime"]
    level = recorded.get("graph_optimization_level", "all")
    if level not in LEVELS:
        return options
    lowest = max(LEVELS.index(options.graph_optimization_level), LEVELS.index(level))
    disabled = list(dict.fromkeys([*options.disabled_optimizers, *recorded.get("disabled_optimizers", [])]))
    return _with(options, LEVELS[lowest], disabled)


def runtime_options(model: Path, options: OrtOptions | None = None, log: logging.Logger | None = None,
                    feed: Path | None = None) -> Recovery:
    """The ONNX Runtime settings to create a session on ``model`` with, in this process, without crashing it.

    ``options`` (the recipe's) narrowed by what the model's producer recorded beside it, then checked in a child
    process; after a crash, `recover` finds settings that run. Used by every stage that runs a model on ONNX
    Runtime (export, convert, validate, benchmark).
    """
    options = merge(options or OrtOptions(), recorded_settings(model))
    return recover(Path(model), options, feed, log)


# ---------------------------------------------------------------------------------------------------------
# The child process


def _feed_for(session: Any, feed: str | None) -> dict[str, Any]:
    import numpy as np

    if feed:
        with np.load(feed, allow_pickle=False) as data:
            return {i.name: data[i.name] for i in session.get_inputs() if i.name in data.files}
    arrays = {}
    for spec in session.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in spec.shape]
        kind = spec.type.removeprefix("tensor(").removesuffix(")")
        dtype = {"float": "float32", "double": "float64", "float16": "float16", "bool": "bool"}.get(kind, kind)
        try:
            arrays[spec.name] = np.zeros(shape, dtype=dtype) if "int" in kind or kind == "bool" else \
                np.random.default_rng(0).uniform(0, 1, shape).astype(dtype)
        except TypeError:  # a type numpy has no name for (bfloat16, float8): the session alone is the probe
            return {}
    return arrays


#: Test-only: ``OPTIMIZER@LEVEL`` makes a probe child die of a real SIGSEGV when ``LEVEL`` or a higher one runs
#: with ``OPTIMIZER`` enabled, standing in for a crash in that optimiser (tests of stages whose real outputs do not
#: crash ONNX Runtime; `tests/stages/ort_crasher.py` has a real crash).
TEST_CRASH_ENV = "TRTFLOW_TEST_CRASH_OPTIMIZER"


def _test_crash(options: OrtOptions) -> None:
    import os

    name, _, level = os.environ.get(TEST_CRASH_ENV, "").partition("@")
    if name and level in LEVELS and LEVELS.index(options.graph_optimization_level) <= LEVELS.index(level) \
            and name not in options.disabled_optimizers:
        os.kill(os.getpid(), signal.SIGSEGV)


def _child_probe(model: str, options_json: str, feed: str | None) -> int:
    from ..runtimes.ort import create_session

    options = OrtOptions.model_validate_json(options_json)
    _test_crash(options)
    try:
        session = create_session(Path(model), options)
    except Exception as error:
        print(json.dumps({"status": "error", "error": " ".join(str(error).split())[:500]}), flush=True)
        return 3
    arrays = _feed_for(session, feed)
    detail = "session created"
    if arrays and len(arrays) == len(session.get_inputs()):
        try:
            session.run(None, arrays)
            detail = "session created and run once"
        except Exception as error:  # an input the probe made up may not suit the model: not a crash
            detail = f"session created; the probe run failed: {' '.join(str(error).split())[:200]}"
    print(json.dumps({"status": "ok", "detail": detail}), flush=True)
    return 0


def _child_optimizers(level: str) -> int:
    import tempfile

    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "probe.onnx"
        onnx.save(model, str(path))
        options = OrtOptions.model_validate({"graph_optimization_level": level})  # from the command line
        from ..runtimes.ort import session_options

        so = session_options(options)
        so.log_severity_level = 0
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return 0


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] == "probe" and len(argv) in (3, 4):
        return _child_probe(argv[1], argv[2], argv[3] if len(argv) == 4 else None)
    if argv and argv[0] == "optimizers" and len(argv) == 2:
        return _child_optimizers(argv[1])
    print("usage: python -m trtflow_stages.accuracy.recovery probe MODEL OPTIONS_JSON [FEED.npz] | optimizers LEVEL",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
