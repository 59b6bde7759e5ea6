"""Every place trtflow/ and stages/ open, read or write a file by its path (issue 41, item 2).

Deny by default: a call that opens, reads or writes a file (``open()``, pathlib's ``open``, ``read_text``,
``read_bytes``, ``write_text``, ``write_bytes``, ``touch``; ``os.open``, ``io.open``; ``shutil`` copies and
moves; ``json.load``/``dump``; ``np.load``/``save``; ``torch.load``/``save``; ``onnx.load``/``save``;
``zipfile.ZipFile``; ``tempfile``'s files; ``gzip.open``; ``.tofile``) is allowed only inside the confined layer
(`trtflow.storage.confined` and `trtflow.userfiles`, which own the rules: regular files only, bounded, no link
followed, exclusive-create temporaries) or at a site named below, by module and function, with its reason.
A new site fails here until it goes through the layer or is named with a reason. (`tests/reliability/
test_confined.py` is the stricter audit of paths under the store and build/.)

Most sites named below are in stages: a node's process reading the model and data files plan checked
(`fsutil.input_path`: inside the project, a regular file or a folder of regular files) or an upstream output
laid out from the store, and writing its own outputs below the scratch space the engine made for it. Moving them
behind the layer is the remaining work; each is named so that none is added unseen.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAYER = ("trtflow/storage/confined/", "trtflow/userfiles.py")

PATH_METHODS = {"open": {0, 1}, "read_text": {0}, "read_bytes": {0}, "write_text": {1}, "write_bytes": {1},
                "touch": {0}}
MODULE_CALLS = {
    "os": {"open"}, "io": {"open"}, "builtins": {"open"}, "codecs": {"open"}, "gzip": {"open"}, "bz2": {"open"},
    "lzma": {"open"}, "tarfile": {"open"}, "zipfile": {"ZipFile"}, "sqlite3": {"connect"}, "h5py": {"File"},
    "shutil": {"copy", "copy2", "copyfile", "copytree", "move", "copymode", "copystat"},
    "np": {"load", "save", "savez", "savez_compressed", "fromfile", "loadtxt", "savetxt", "genfromtxt", "memmap"},
    "numpy": {"load", "save", "savez", "savez_compressed", "fromfile", "loadtxt", "savetxt", "genfromtxt",
              "memmap"},
    "json": {"load", "dump"}, "pickle": {"load", "dump"}, "torch": {"load", "save"},
    "onnx": {"load", "save", "load_model", "save_model"},
    "tempfile": {"NamedTemporaryFile", "TemporaryFile", "mkstemp", "SpooledTemporaryFile"},
}

PROC = "/proc or cgroup files of this process or host (the kernel's, never a repository's)"
MODEL_IN = ("an ONNX model the node is given: a recipe's file checked by fsutil.input_path at plan, or an upstream "
            "output laid out from the store")
OUT = "the node's own output (ctx.output) or scratch file, below the folder the engine made for it"
ONNX_REWRITE = "rewrites the ONNX model the node has just written into its own output folder"
SANDBOX = "the confinement sandbox: descriptors of the box it builds (O_PATH, O_NOFOLLOW, O_EXCL)"
DATA_IN = "a data file the recipe names, checked by fsutil.input_path at plan (regular, inside the project)"
OWN_FEED = "a feed file the node wrote itself in its scratch folder"

#: (module, function) -> why it may open, read or write a file by its path.
ALLOWED: dict[tuple[str, str], str] = {
    ("stages/accuracy/model_problems.py", "_available_memory"): PROC,
    ("stages/accuracy/model_problems.py", "_load"): MODEL_IN,
    ("stages/accuracy/ort_fixes.py", "fix_for_onnxruntime"): MODEL_IN + "; the fixed copy in its scratch",
    ("stages/accuracy/passes.py", "ort_hint"): MODEL_IN,
    ("stages/accuracy/passes.py", "saved_reference"): "an upstream node's reference outputs (.npz from the store)",
    ("stages/accuracy/precision_debug.py", "lowered_nodes"): MODEL_IN,
    ("stages/accuracy/precision_debug.py", "quiet_output"): "os.devnull, to silence a library's C-level output",
    ("stages/accuracy/recovery.py", "_child_optimizers"): OUT,
    ("stages/accuracy/recovery.py", "_feed_for"): OWN_FEED,
    ("stages/benchmark.py", "_generation"): OUT,
    ("stages/benchmark.py", "run"): OUT,
    ("stages/build.py", "run"): OUT + " (the engine and its provenance record)",
    ("stages/cli/init.py", "_check_recipe"): "tempfile: a random name made with O_EXCL beside the recipe, removed "
                                             "after loading it",
    ("stages/convert.py", "_check_feed"): OWN_FEED,
    ("stages/convert.py", "_check_on_onnx_runtime"): OWN_FEED,
    ("stages/convert.py", "_count_op"): MODEL_IN,
    ("stages/convert.py", "run"): OUT,
    ("stages/data/dataset.py", "Dataset.batches"): "FilePart.open (its own method, not a file call)",
    ("stages/data/dataset.py", "FilePart._streams"): DATA_IN,
    ("stages/data/dataset.py", "FilePart.open"): DATA_IN,
    ("stages/data/prompts.py", "load_prompts"): DATA_IN,
    ("stages/data/specs.py", "onnx_input_specs"): MODEL_IN,
    ("stages/exporting/onnx_file.py", "copy_onnx"): MODEL_IN + "; copied into the node's output",
    ("stages/exporting/pytorch.py", "build_model"): "a checkpoint the recipe names (input_path at plan), "
                                                    "weights_only=True",
    ("stages/formats/confinement.py", "_allow"): SANDBOX,
    ("stages/formats/confinement.py", "_probe"): SANDBOX,
    ("stages/formats/confinement.py", "_run_child"): SANDBOX,
    ("stages/formats/confinement.py", "child_main"): SANDBOX + " (the confined child's answer in its box)",
    ("stages/formats/detect.py", "_check_torch_archive"): "zipfile over the file object userfiles.open_file opened",
    ("stages/formats/dim_names.py", "_save"): ONNX_REWRITE,
    ("stages/formats/dim_names.py", "dynamic_output_axes"): MODEL_IN,
    ("stages/formats/dim_names.py", "rename_output_dims"): ONNX_REWRITE,
    ("stages/formats/generation.py", "name_output_dims"): ONNX_REWRITE,
    ("stages/formats/onnx_model.py", "candidate_kind"): MODEL_IN,
    ("stages/formats/onnx_model.py", "describe_onnx"): MODEL_IN,
    ("stages/formats/onnx_model.py", "inspect_model"): MODEL_IN,
    ("stages/formats/sandbox_box.py", "fresh_box"): SANDBOX,
    ("stages/formats/sandbox_box.py", "fresh_file"): SANDBOX,
    ("stages/formats/sandbox_box.py", "open_folder"): SANDBOX,
    ("stages/formats/sandbox_box.py", "open_plain"): SANDBOX,
    ("stages/formats/sandbox_box.py", "take"): SANDBOX,
    ("stages/formats/sandbox_policy.py", "unshare_plan.bind"): SANDBOX,
    ("stages/formats/sandbox_unshare.py", "_bind"): SANDBOX + " (bind-mount targets in the new root)",
    ("stages/formats/sandbox_unshare.py", "_build_root"): SANDBOX + " (the new root's files)",
    ("stages/formats/sandbox_unshare.py", "_write"): SANDBOX + " (/proc/self/{uid,gid}_map, setgroups)",
    ("stages/formats/seq2seq.py", "name_output_dims"): ONNX_REWRITE,
    ("stages/formats/tensorflow.py", "_rename_dims"): ONNX_REWRITE,
    ("stages/formats/tensorflow.py", "_rename_outputs"): ONNX_REWRITE,
    ("stages/formats/torch_export.py", "baked_sizes"): MODEL_IN,
    ("stages/formats/torch_export.py", "rename_dims"): ONNX_REWRITE,
    ("stages/formats/torch_export.py", "specialised_axes"): MODEL_IN,
    ("stages/formats/torch_probe.py", "forward_names"): "a TorchScript archive the recipe names, after "
                                                        "detect.check_content read it as a regular file",
    ("stages/formats/torch_source.py", "build_module"): "a checkpoint the recipe names (input_path at plan), "
                                                        "weights_only=True",
    ("stages/formats/torch_source.py", "read_source"): "the export node's own source record (an upstream output)",
    ("stages/formats/torch_source.py", "write_source"): OUT,
    ("stages/formats/trust.py", "_foreign_globals"): "zipfile over bytes already in memory (io.BytesIO)",
    ("stages/formats/trust.py", "pickled_payloads"): "a model archive the recipe names, checked at plan",
    ("stages/measure/serving/loadgen.py", "read_detail"): "LoadGen's log, written by the node's own LoadGen run",
    ("stages/measure/serving/loadgen.py", "read_trace"): "LoadGen's trace, written by the node's own LoadGen run",
    ("stages/measure/timing/interference.py", "_cpu_ticks"): PROC,
    ("stages/measure/timing/interference.py", "_processes"): PROC,
    ("stages/measure/timing/interference.py", "thread_wait_ns"): PROC,
    ("stages/measure/timing/kernel_profile.py", "profile_kernels"): "nsys's trace in the node's scratch, "
                                                                    "gzipped into its output",
    ("stages/precision/autocast.py", "reference_data"): OWN_FEED,
    ("stages/precision/modelopt.py", "check_node_patterns"): MODEL_IN,
    ("stages/precision/modelopt.py", "check_op_types"): MODEL_IN,
    ("stages/precision/modelopt.py", "private_model_copy"): MODEL_IN + "; copied into the node's scratch",
    ("stages/precision/onnx_ptq.py", "_relay_log"): "the quantiser child's log in the node's scratch",
    ("stages/precision/torch_quant.py", "export_onnx"): "the ONNX file torch wrote in the node's scratch",
    ("stages/precision/torch_quant.py", "onnx_facts"): MODEL_IN,
    ("stages/precision/torch_quant.py", "save_checkpoint"): OUT,
    ("stages/precision/torch_quant.py", "save_model"): OUT,
    ("stages/precision/torch_route.py", "run_torch"): OUT,
    ("stages/quantize.py", "_graph_facts"): MODEL_IN,
    ("stages/quantize.py", "_name_unnamed_nodes"): ONNX_REWRITE,
    ("stages/quantize.py", "run"): OUT,
    ("stages/quantize.py", "supported_modes"): "an installed package's own source (modelopt's CLI), to read its "
                                               "choices",
    ("stages/runtimes/backends.py", "torch_cuda_build"): "an installed package's version.py (torch)",
    ("stages/runtimes/trt_build.py", "TimingCacheUse.merge_back"): "the shared timing cache, held under its "
                                                                   "lock, and the node's own copy",
    ("stages/runtimes/trt_build.py", "timing_cache"): "the shared timing cache, held under its lock, copied into "
                                                      "the node's scratch",
    ("stages/runtimes/trt_runtime.py", "open_engine"): "an engine from the store or the node's own output",
    ("stages/select.py", "_link_or_copy"): OUT,
    ("stages/select.py", "_read_json"): "an upstream node's summary laid out from the store",
    ("stages/select.py", "run"): OUT,
    ("stages/simplify.py", "run"): MODEL_IN + "; the simplified model is its output",
    ("stages/triton.py", "_link_or_copy"): OUT,
    ("stages/triton.py", "onnx_io"): MODEL_IN,
    ("stages/triton.py", "run"): OUT,
    ("stages/validate.py", "_finish"): OUT,
    ("trtflow/environment.py", "cpu_fact"): PROC,
    ("trtflow/execution/diagnosis.py", "oom_kills"): PROC,
    ("trtflow/execution/diagnosis.py", "total_memory"): PROC,
    ("trtflow/execution/forkserver.py", "_become_node"): "os.devnull as a node's stdin",
    ("trtflow/execution/forkserver.py", "_own_rss"): PROC,
    ("trtflow/execution/noop.py", "_text"): "a project file for the no-op shortcut: O_NONBLOCK, fstat, bounded",
    ("trtflow/execution/progress.py", "rss"): PROC,
    ("trtflow/execution/scheduler.py", "GpuLocks.try_take"): "the host's GPU lock files: folder opened O_NOFOLLOW, "
                                                            "locks O_NOFOLLOW | O_NONBLOCK, never truncated",
    ("trtflow/execution/scheduler.py", "_cgroup_room"): PROC,
    ("trtflow/execution/scheduler.py", "available_memory"): PROC,
    ("trtflow/readtrace.py", "_Supervisor._read"): "/proc/<pid>/mem of the observed child, read-only",
}


def _kind(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return "open()" if func.id == "open" else None
    if not isinstance(func, ast.Attribute):
        return None
    owner = ast.unparse(func.value)
    if owner in MODULE_CALLS:
        return f"{owner}.{func.attr}()" if func.attr in MODULE_CALLS[owner] else None
    if func.attr == "tofile":
        return ".tofile()"
    if func.attr in PATH_METHODS and len(call.args) in PATH_METHODS[func.attr]:
        return f".{func.attr}()"
    return None


def sites(source: str, rel: str) -> list[tuple[str, str, int, str]]:
    """(module, function, line, what) of every file call in ``source``."""
    found = []

    def visit(node: ast.AST, scope: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = f"{scope}.{node.name}" if scope else node.name
        if isinstance(node, ast.Call) and (what := _kind(node)):
            found.append((rel, scope or "<module>", node.lineno, what))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(ast.parse(source, filename=rel), "")
    return found


def audit(source: str, rel: str) -> list[str]:
    if rel.startswith(LAYER):
        return []
    return [f"{module}:{line}: {what} in {function}() opens, reads or writes a file by its path outside "
            "trtflow.userfiles / trtflow.storage.confined (use them, or name the site in ALLOWED with its reason)"
            for module, function, line, what in sites(source, rel) if (module, function) not in ALLOWED]


def _sources() -> list[tuple[str, str]]:
    files = sorted([*REPO.joinpath("trtflow").rglob("*.py"), *REPO.joinpath("stages").rglob("*.py")])
    return [(path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8")) for path in files]


def test_no_file_is_opened_read_or_written_but_through_the_layer_or_at_a_named_site() -> None:
    sources = _sources()
    assert len(sources) > 100
    problems = [problem for rel, source in sources for problem in audit(source, rel)]
    assert problems == [], "\n".join(problems)


def test_every_named_site_still_exists_and_says_why() -> None:
    """An entry whose site went through the layer is removed, so the list shrinks and never hides a new site."""
    used = {(module, function) for rel, source in _sources() for module, function, _, _ in sites(source, rel)}
    assert sorted(set(ALLOWED) - used) == []
    assert all(len(reason) > 20 for reason in ALLOWED.values())


@pytest.mark.parametrize(("code", "expected"), [
    ("def f(p):\n    open(p, 'w')", "open()"),
    ("def f(p):\n    p.write_text('x')", ".write_text()"),
    ("def f(p):\n    return p.read_bytes()", ".read_bytes()"),
    ("def f(p):\n    return json.load(open(p))", "json.load()"),
    ("def f(p):\n    os.open(p, os.O_RDONLY)", "os.open()"),
    ("def f(a, b):\n    shutil.copyfile(a, b)", "shutil.copyfile()"),
    ("def f(p):\n    return np.load(p)", "np.load()"),
    ("def f(p, a):\n    np.save(p, a)", "np.save()"),
    ("def f(p):\n    with p.open('rb') as f:\n        return f.read()", ".open()"),
    ("def f(p):\n    return zipfile.ZipFile(p)", "zipfile.ZipFile()"),
])
def test_the_audit_catches_a_new_site(code: str, expected: str) -> None:
    for rel in ("trtflow/keys.py", "stages/cli/init.py", "stages/new.py"):
        problems = audit(code, rel)
        assert problems and f": {expected} in f()" in problems[0], problems


@pytest.mark.parametrize("code", [
    "def f(tree, rel):\n    tree.write_text(rel, 'x')",
    "def f(tree, rel):\n    return tree.read_bytes(rel, kind)",
    "def f(p):\n    return read_file(p, 100)",
    "def f(p):\n    write_file(p, 'x')",
    "def f(t):\n    return t.replace('a', 'b')",
])
def test_the_audit_lets_the_layer_be(code: str) -> None:
    assert audit(code, "trtflow/keys.py") == []
    assert audit("def f(p):\n    os.open(p, 0)", "trtflow/userfiles.py") == []
