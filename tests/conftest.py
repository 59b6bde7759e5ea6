"""Shared fixtures: tiny real models exported to real ONNX files once per test session."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Signing keys (trtflow.keys) live in the user's config folder: the tests' own, never the user's (inherited by the
# trtflow processes tests start).
os.environ["XDG_CONFIG_HOME"] = __import__("tempfile").mkdtemp(prefix="trtflow-test-config-")
os.environ.pop("TRTFLOW_SIGNING_KEY", None)
os.environ.pop("TRTFLOW_SIGNING_KEY_FILE", None)
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.checkout_guard import CheckoutGuard  # noqa: E402  (the checkout on the path first)
from tests.checkout_guard import failure as checkout_failure  # noqa: E402


def _ensure_example_plugin() -> None:
    """Install the example plugin (examples/plugin) the way a user installs a third-party stage package."""
    import subprocess
    from importlib import metadata

    if any(ep.name == "synth" for ep in metadata.entry_points(group="trtflow.stages")):
        return
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                    str(REPO / "examples" / "plugin")], check=True)
    metadata.entry_points.cache_clear() if hasattr(metadata.entry_points, "cache_clear") else None


def pytest_sessionstart(session) -> None:
    _ensure_example_plugin()
    global _CHECKOUT
    _CHECKOUT = CheckoutGuard(REPO)


#: The checkout's files as this test process found them (tests/checkout_guard.py).
_CHECKOUT: CheckoutGuard | None = None


def pytest_runtest_teardown(item, nextitem) -> None:
    """After the last test of each test file: no file of the checkout changed (the test file fails otherwise)."""
    if _CHECKOUT is None or (nextitem is not None and nextitem.path == item.path):
        return
    changed = _CHECKOUT.changed()
    if changed:
        raise AssertionError(checkout_failure(changed, str(item.path.relative_to(REPO))))


def pytest_collection_finish(session) -> None:
    """The test process's cyclic collector: what collection imported (torch, onnx, tensorflow: millions of objects)
    frozen, never scanned again, and fewer collections of what tests make: a full collection of such a heap takes
    0.1-0.2 s, and the default thresholds start one every few seconds of a test (tests/stages/test_validate.py in
    one process: 1.8 s of its 24 s in collections; 0.65 s with these settings). Product code is not affected: the
    processes tests start keep Python's defaults (the CLI's own start-up: trtflow/cli/startup.py)."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 10)


#: The suite's slowest tests as pytest's --durations prints them ("12.34s call     tests/...::test"), refreshed
#: from a CI log (CI prints 150): `grep -E '^[0-9.]+s (setup|call|teardown) ' CI_LOG > tests/durations.txt`.
DURATIONS = Path(__file__).with_name("durations.txt")


def _recorded_seconds() -> dict[str, float]:
    """Test id -> its recorded seconds (setup, call and teardown together); {} without a record."""
    import re

    seconds: dict[str, float] = {}
    line = re.compile(r"^\s*([0-9.]+)s\s+(?:setup|call|teardown)\s+(\S.*?)\s*$")
    for text in DURATIONS.read_text().splitlines() if DURATIONS.exists() else []:
        if found := line.match(text):
            test = re.sub(r"@\w+$", "", found[2])  # a grouped test's id as CI prints it (`_restore_xdist_groups`)
            seconds[test] = seconds.get(test, 0.0) + float(found[1])
    return seconds


def pytest_collection_modifyitems(config, items) -> None:
    """Longest first, so that no xdist worker idles at the end of the run while the other finishes a long test:
    test files run in the order of their slowest recorded test (tests/durations.txt), longest first. A file's
    tests stay together and in their own order (module-scoped fixtures are made once per worker, and tests that
    build on each other keep doing so); files without a recorded test keep their order, after the others."""
    seconds = _recorded_seconds()
    if seconds:
        _longest_files_first(items, seconds)
    _restore_xdist_groups(config, items)


def _longest_files_first(items, seconds: dict[str, float]) -> None:
    longest: dict[str, float] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        longest[module] = max(longest.get(module, 0.0), seconds.get(item.nodeid, 0.0))
    first_seen = {module: i for i, module in enumerate(dict.fromkeys(i.nodeid.split("::", 1)[0] for i in items))}
    items.sort(key=lambda item: (-longest[item.nodeid.split("::", 1)[0]], first_seen[item.nodeid.split("::", 1)[0]]))


def _restore_xdist_groups(config, items) -> None:
    """`--dist loadgroup` (CI's) keeps the tests of one ``xdist_group`` on one worker (so a module-scoped fixture of
    a grouped module is made once per run, not once per worker) only if their node ids end in ``@GROUP``:
    pytest-xdist 3.8 writes that suffix to ``item._nodeid``, which pytest 9.2's structured node ids no longer read,
    so the groups were silently ignored (pytest-dev/pytest-xdist#1386). Set it where pytest 9.2 reads it; a no-op
    where xdist's own suffix took effect (older pytest), without xdist, and on the controller."""
    if not config.getoption("loadgroup", default=False):
        return
    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        suffix, node_id = f"@{'_'.join(groups)}", getattr(item, "_id", None)
        if groups and node_id is not None and not item.nodeid.endswith(suffix):
            item._id = type(node_id).parse(item.nodeid + suffix)


def trtflow_cli(*args: str, cwd: Path, check: int | None = 0, timeout: float = 1200) -> subprocess.CompletedProcess:
    """Run the `trtflow` command in ``cwd`` with a store of its own there; assert its exit code unless ``check`` is
    None."""
    env = dict(os.environ, COLUMNS="200", TRTFLOW_STORE=str(cwd / "store"))
    proc = subprocess.run([sys.executable, "-m", "trtflow.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=timeout)
    if check is not None:
        assert proc.returncode == check, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def trtflow_in_process(*args: str, cwd: Path, check: int | None = 0) -> subprocess.CompletedProcess:
    """`trtflow_cli` through the console script's own entry point (`trtflow.cli.main.main`: the same argument
    handling, printers and exit codes) in this process, for commands whose cost is importing torch and transformers,
    which a test worker imports once (`trtflow init` on a PyTorch or Hugging Face model: ~6 CPU-seconds a process).
    The command sees the environment `trtflow_cli` gives it, and cwd; both are restored after. Tests that run a
    command as a user types it (README's, test_quickstart.py) keep `trtflow_cli`."""
    import contextlib
    import io

    from trtflow.cli.main import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    before = Path.cwd(), sys.argv, dict(os.environ)
    os.environ.update(COLUMNS="200", TRTFLOW_STORE=str(cwd / "store"))
    try:
        os.chdir(cwd)
        sys.argv = ["trtflow", *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exc:
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.chdir(before[0])
        sys.argv = before[1]
        os.environ.clear()
        os.environ.update(before[2])
    proc = subprocess.CompletedProcess(["trtflow", *args], code, out.getvalue(), err.getvalue())
    if check is not None:
        assert proc.returncode == check, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


#: What a test that runs a recipe `trtflow init` wrote overrides (--set) on its benchmark nodes: short measurements.
#: Init's `min_duration_s: 1.0` (3 s cap) on three batch sizes of three candidates, and the finalists that select
#: times again for twice that cap, would be most of such a test's time; these tests check that every node works on
#: the model, not what its latencies are on a CPU (tests/stages/zoo_models.py shortens the zoo's the same way).
#: Each point still times real queries: `repeats` (5) windows of at least 20 ms (the stage's shortest window,
#: `measure.timing.windows.MIN_WINDOW_S`) and `min_iterations` (10) queries at least, so every figure these tests
#: read exists and has an interval. 0.1 s a point where 0.2-0.4 s was (always to the cap: "not-converged"): the
#: tiny BERT's three benchmark nodes took 6.6 s instead of 7.7 s (means of 3 runs, alternated, on a loaded host).
#: Tests that judge figures (gates, history, capacity) set their own.
SHORT_BENCHMARK = ("min_duration_s=0.1", "max_duration_s=0.1", "warmup_ms=10")
#: Generation benchmarks keep the former 0.2-0.4 s: with 0.1 s the zoo's T5 recipe took 6 s longer (twice: wider
#: intervals leave more finalists for select to time token by token, each loading its encoder and decoder).
SHORT_GENERATION_BENCHMARK = ("min_duration_s=0.2", "max_duration_s=0.4", "warmup_ms=20")


def short_benchmarks(recipe: Path) -> list[str]:
    """``--set`` arguments that shorten every benchmark node of ``recipe`` (`SHORT_BENCHMARK`; a generation
    benchmark: `SHORT_GENERATION_BENCHMARK`)."""
    import yaml

    nodes = yaml.safe_load(recipe.read_text())["nodes"]
    return [arg for node in nodes if node.get("stage") == "benchmark"
            for value in (SHORT_GENERATION_BENCHMARK if (node.get("params") or {}).get("generation")
                          else SHORT_BENCHMARK)
            for arg in ("--set", f"nodes.{node['name']}.params.{value}")]


def export_onnx(model, example_inputs: tuple, path: Path, input_names: list[str], output_names: list[str],
                dynamic_axes: dict | None = None, opset: int = 17) -> Path:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, example_inputs, str(path), input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes, opset_version=opset,
                          dynamo=False)
    return path


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_mlp_onnx(models_dir) -> Path:
    """MLP: input 'input' float32 [batch, 16] -> 'logits' [batch, 4]; dynamic batch."""
    import torch

    from examples.models import tiny_mlp

    return export_onnx(tiny_mlp.build(), (torch.randn(2, 16),), models_dir / "mlp.onnx", ["input"], ["logits"],
                       {"input": {0: "batch"}, "logits": {0: "batch"}})


@pytest.fixture(scope="session")
def tiny_cnn_onnx(models_dir) -> Path:
    """CNN: input 'input' float32 [batch, 3, 32, 32] -> 'logits' [batch, 10]; dynamic batch."""
    import torch

    from examples.models import tiny_cnn

    return export_onnx(tiny_cnn.build(), (torch.randn(2, 3, 32, 32),), models_dir / "cnn.onnx", ["input"],
                       ["logits"], {"input": {0: "batch"}, "logits": {0: "batch"}})


@pytest.fixture(scope="session")
def tiny_transformer_onnx(models_dir) -> Path:
    """Encoder: 'input_ids' int64 [batch, seq] -> 'logits' [batch, 4]; dynamic batch and sequence."""
    import torch

    from examples.models import tiny_transformer

    return export_onnx(tiny_transformer.build(), (torch.randint(0, 1000, (2, 16)),),
                       models_dir / "encoder.onnx", ["input_ids"], ["logits"],
                       {"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch"}})


@pytest.fixture(scope="session")
def tiny_cnn_fp16_onnx(tiny_cnn_onnx, tmp_path_factory) -> Path:
    """The CNN with float16 weights and compute, float32 inputs and outputs (like the convert stage's output)."""
    import onnx
    from onnxconverter_common import float16

    model = float16.convert_float_to_float16(onnx.load(str(tiny_cnn_onnx)), keep_io_types=True)
    path = tmp_path_factory.mktemp("fp16") / "cnn_fp16.onnx"
    onnx.save(model, str(path))
    return path
