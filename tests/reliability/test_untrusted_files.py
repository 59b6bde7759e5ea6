"""Untrusted files: recipes cannot construct objects or run code unless they say `python:`, paths cannot
escape the allowed directories, nothing is unpickled, and a changed byte in the store is detected before use.
"""

from __future__ import annotations

import ast
import os
import re
import stat
from pathlib import Path

import pytest

from trtflow.errors import TrtflowError
from trtflow.fsutil import resolve_user_path
from trtflow.storage.store import Store
from trtflow.storage.verify import verify_store

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("payload", [
    "stage: !!python/object/apply:os.system ['touch PWNED']",
    "params: {text: !!python/object/new:subprocess.Popen [['touch', 'PWNED']]}",
    "params: !!python/name:os.system",
    "? !!python/object/apply:os.system ['touch PWNED']\n    : 1",
    "stage: !<tag:yaml.org,2002:python/object/apply:os.system> ['touch PWNED']",
])
def test_yaml_tags_never_construct_objects(tmp_path: Path, trtflow, payload: str) -> None:
    (tmp_path / "recipe.yaml").write_text(f"name: x\nnodes:\n  - name: a\n    {payload}\n")
    proc = trtflow("plan", "recipe.yaml")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert re.search(r"error: recipe\.yaml:\d+:\d+: YAML tag '.*python/.*' is not allowed in a recipe", proc.stderr)
    assert not (tmp_path / "PWNED").exists()


def test_a_module_callable_without_python_prefix_is_refused(tmp_path: Path, trtflow) -> None:
    """`os:system` names a real callable; without `python:` the recipe must not run it."""
    (tmp_path / "recipe.yaml").write_text("""\
name: x
nodes:
  - name: e
    stage: export
    params:
      model: "os:system"
      factory_args: {command: "touch PWNED"}
      inputs: {input: {shape: [1, 16]}}
""")
    proc = trtflow("run", "recipe.yaml")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "'os:system': expected python:path/to/file.py:function" in proc.stderr
    assert "a recipe runs code only where it says python:" in proc.stderr
    assert "write 'python:os:system' if you mean to run it" in proc.stderr
    assert not (tmp_path / "PWNED").exists()


def test_planning_a_python_module_entry_imports_nothing(tmp_path: Path, trtflow, plugin_env) -> None:
    """`python:pkg.module:fn` is hashed into the node key by its file; `trtflow plan` runs none of its code."""
    package = tmp_path / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("open('IMPORTED', 'w').close()\n")
    (package / "models.py").write_text("def build():\n    raise SystemExit('never called by plan')\n")
    (tmp_path / "recipe.yaml").write_text("""\
name: x
nodes:
  - name: e
    stage: export
    params: {model: "python:userpkg.models:build", inputs: {input: {shape: [1, 16]}}}
""")
    env = dict(plugin_env, PYTHONPATH=f"{tmp_path}{os.pathsep}{plugin_env['PYTHONPATH']}")
    first = trtflow("plan", "recipe.yaml", "--json", env=env)
    assert first.returncode == 0, first.stderr
    assert not (tmp_path / "IMPORTED").exists(), "planning imported the user's package"
    (package / "models.py").write_text("def build():\n    raise SystemExit('changed')\n")
    second = trtflow("plan", "recipe.yaml", "--json", env=env)
    assert second.returncode == 0, second.stderr
    key = re.compile(r'"key": "([0-9a-f]+)"')
    assert key.search(first.stdout).group(1) != key.search(second.stdout).group(1), \
        "the module's source is part of the node key"


SHADOW_PROBE = """\
import json, sys
from pathlib import Path
from trtflow.callables import load_callable
assert "colorsys" not in sys.modules
build = load_callable("python:models/net.py:build", lambda rel: Path(sys.argv[1]) / rel, "model factory")
import colorsys  # a later import, by trtflow or a stage, in the same process
print(json.dumps({"factory": build(), "later": colorsys.__file__}))
"""


def test_a_callables_folder_does_not_shadow_installed_modules(tmp_path: Path) -> None:
    """A `colorsys.py` (or `numpy.py`) beside a `python:` callable's file must not replace the real module, for the
    callable or for anything imported after it; the callable's own sibling modules are still found."""
    import subprocess
    import sys

    models = tmp_path / "models"
    models.mkdir()
    (models / "colorsys.py").write_text("SHADOW = True\n")
    (models / "helpers.py").write_text("NAME = 'sibling helper'\n")
    (models / "net.py").write_text("import colorsys\nimport helpers\n\n\ndef build():\n"
                                   "    return [colorsys.__file__, helpers.NAME]\n")
    proc = subprocess.run([sys.executable, "-c", SHADOW_PROBE, str(tmp_path)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    import json

    seen = json.loads(proc.stdout)
    assert str(models) not in seen["factory"][0] and str(models) not in seen["later"], seen
    assert seen["factory"][1] == "sibling helper"


SECRET = "s3cr3t-t0ken-value"


@pytest.mark.parametrize("recipe", [
    'name: x\nextends: "{spelling}/base.yaml"\nnodes: []\n',
    'name: x\nnodes:\n  - name: e\n    stage: export\n    params: {{model: "python:{spelling}/net.py:build", '
    'inputs: {{input: {{shape: [1, 4]}}}}}}\n',
    'name: x\nnodes:\n  - name: e\n    stage: export\n    params: {{model: "python:../../{spelling}/net.py:build", '
    'inputs: {{input: {{shape: [1, 4]}}}}}}\n',
])
@pytest.mark.parametrize("spelling", ["${TRTFLOW_TEST_TOKEN}", "$TRTFLOW_TEST_TOKEN"])
def test_an_environment_value_in_a_path_is_not_printed(tmp_path: Path, trtflow, plugin_env, recipe: str,
                                                       spelling: str) -> None:
    """A recipe (say, from a pull request) that puts a CI secret into a path cannot make an error message print
    it: the value is shown as the variable's name."""
    (tmp_path / "recipe.yaml").write_text(recipe.format(spelling=spelling))
    for command in (["plan", "recipe.yaml"], ["run", "recipe.yaml"]):
        proc = trtflow(*command, env=dict(plugin_env, TRTFLOW_TEST_TOKEN=SECRET))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert SECRET not in proc.stdout + proc.stderr, proc.stderr
        assert "${TRTFLOW_TEST_TOKEN}" in proc.stderr, proc.stderr


def test_paths_that_escape_the_allowed_directories_are_refused(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "ok.npz").write_text("x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    (project / "data" / "link").symlink_to(outside)  # a directory link leading out
    monkeypatch.delenv("TRTFLOW_ALLOWED_PATHS", raising=False)
    roots = [project]
    assert resolve_user_path("data/ok.npz", project, roots) == project / "data" / "ok.npz"
    for bad in ["../outside/secret", str(outside / "secret"), "data/link/secret", "data/../../outside/secret",
                "~/.ssh/id_rsa", "$HOME/.bashrc"]:
        with pytest.raises(TrtflowError, match="outside the allowed directories"):
            resolve_user_path(bad, project, roots)
    monkeypatch.setenv("TRTFLOW_ALLOWED_PATHS", str(outside))
    from trtflow.fsutil import allowed_roots_for

    assert resolve_user_path("data/link/secret", project, allowed_roots_for(project)) == outside / "secret"


def _run_chain(trtflow, tmp_path: Path, *extra: str):
    (tmp_path / "chain.yaml").write_text("""\
name: chain
nodes:
  - {name: a, stage: synth, params: {text: a, size: 5000}}
  - {name: b, stage: synth, params: {text: b}, inputs: {source: a}}
""")
    return trtflow("run", "chain.yaml", *extra)


def test_store_objects_are_read_only_and_a_changed_byte_is_detected_before_use(tmp_path: Path, trtflow) -> None:
    first = _run_chain(trtflow, tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    reference = {n: (tmp_path / "build/chain" / n / "data.bin").read_bytes() for n in "ab"}
    store = Store(tmp_path / "store")
    objects = list(store.iter_objects())
    assert len(objects) == 2
    for obj in objects:
        assert stat.S_IMODE(obj.stat().st_mode) & 0o222 == 0, f"{obj} is writable"

    digest_a = store.read_manifest(store.refs.current(str(tmp_path / "chain.yaml"))["a"])["outputs"]["data"]["digest"]
    victim = store.object_path(digest_a)
    victim.chmod(0o644)
    data = bytearray(victim.read_bytes())
    data[1234] ^= 0x01  # one bit, same size: the cheap completeness check cannot see it
    victim.write_bytes(bytes(data))

    verify = trtflow("verify")
    assert verify.returncode == 1
    assert f"object objects/{digest_a[:2]}/{digest_a} has content digest" in verify.stdout
    assert re.search(r"node a of \S*chain.yaml \(", verify.stdout)
    assert "outputs ['data'] missing or damaged" in verify.stdout
    assert "run `trtflow verify --fix`" in verify.stdout

    # The next run sees the damage (the object's mtime moved, so it is re-hashed), rebuilds `a` and replaces the
    # damaged object instead of keeping it because it has the same name and size.
    plan = trtflow("plan", "chain.yaml")
    assert re.search(r"a\s+synth\s+stale\s+stored output data missing or damaged", plan.stdout), plan.stdout
    again = _run_chain(trtflow, tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert {n: (tmp_path / "build/chain" / n / "data.bin").read_bytes() for n in "ab"} == reference
    assert verify_store(store).problems == []

    # A damaged object whose size and mtime were put back: its ctime moved (it cannot be set back), so the planner
    # re-hashes it as well, rebuilds `a`, and the consumer reads the right bytes.
    victim.chmod(0o644)
    stamp = victim.stat()
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    plan = trtflow("plan", "chain.yaml", "--set", "nodes.b.params.text=b2")
    assert re.search(r"a\s+synth\s+stale\s+stored output data missing or damaged", plan.stdout), plan.stdout
    rerun_b = _run_chain(trtflow, tmp_path, "--set", "nodes.b.params.text=b2")
    assert rerun_b.returncode == 0, rerun_b.stdout + rerun_b.stderr
    assert (tmp_path / "build/chain/a/data.bin").read_bytes() == reference["a"]
    assert verify_store(store).problems == []


def test_verify_reports_an_object_replaced_by_a_symlink(tmp_path: Path, trtflow) -> None:
    assert _run_chain(trtflow, tmp_path).returncode == 0
    store = Store(tmp_path / "store")
    victim = next(iter(store.iter_objects()))
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(victim.read_bytes())  # same content, so only the link itself is wrong
    victim.chmod(0o644)
    victim.unlink()
    victim.symlink_to(outside)
    verify = trtflow("verify")
    assert verify.returncode == 1
    assert f"is a symbolic link to {outside}" in verify.stdout
    assert trtflow("verify", "--fix").returncode == 0
    assert outside.exists(), "--fix removes the link, never what it points to"
    assert trtflow("verify").returncode == 0


# ------------------------------------------------------------------------------------------ static audit
UNSAFE_CALLS = {
    ("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler"), ("cPickle", "load"), ("dill", "load"),
    ("dill", "loads"), ("joblib", "load"), ("marshal", "loads"), ("marshal", "load"), ("shelve", "open"),
    ("yaml", "unsafe_load"), ("yaml", "full_load"), ("yaml", "unsafe_load_all"), ("os", "system"),
    ("os", "popen"), ("jsonpickle", "decode"),
}


def _python_files() -> list[Path]:
    return sorted([*REPO.joinpath("trtflow").rglob("*.py"), *REPO.joinpath("stages").rglob("*.py")])


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _problems(path: Path, root: Path = REPO) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[str] = []

    def where(node: ast.AST) -> str:
        return f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"

    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            if any(n and n.split(".")[0] in ("pickle", "cPickle", "dill", "shelve", "marshal") for n in names):
                found.append(f"{where(node)}: imports a pickle-like module")
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("eval", "exec"):
            found.append(f"{where(node)}: calls {func.id}()")
        if not isinstance(func, ast.Attribute):
            continue
        owner = func.value.id if isinstance(func.value, ast.Name) else None
        if (owner, func.attr) in UNSAFE_CALLS:
            found.append(f"{where(node)}: calls {owner}.{func.attr}()")
        if owner == "torch" and func.attr == "load":
            flag = _keyword(node, "weights_only")
            if not (isinstance(flag, ast.Constant) and flag.value is True):
                found.append(f"{where(node)}: torch.load without weights_only=True")
        if owner in ("np", "numpy") and func.attr == "load":
            flag = _keyword(node, "allow_pickle")
            if isinstance(flag, ast.Constant) and flag.value is True:
                found.append(f"{where(node)}: numpy.load with allow_pickle=True")
        if owner == "yaml" and func.attr in ("load", "load_all"):
            loader = _keyword(node, "Loader") or (node.args[1] if len(node.args) > 1 else None)
            text = ast.unparse(loader) if loader is not None else ""
            if "Safe" not in text and text != "_LOADER":
                found.append(f"{where(node)}: yaml.{func.attr} with loader {text or 'default'}")
        if func.attr in ("Popen", "run", "call", "check_call", "check_output") and owner == "subprocess":
            shell = _keyword(node, "shell")
            if isinstance(shell, ast.Constant) and shell.value is True:
                found.append(f"{where(node)}: subprocess with shell=True")
    return found


def test_no_pickle_eval_or_unsafe_yaml_in_the_engine_and_stages() -> None:
    files = _python_files()
    assert len(files) > 20
    problems = [p for path in files for p in _problems(path)]
    assert problems == [], "\n".join(problems)


def test_the_audit_itself_catches_unsafe_code(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import pickle\nimport yaml, torch, numpy as np\nx = torch.load('m.pt')\n"
                   "y = yaml.load(open('r'), Loader=yaml.Loader)\nz = np.load('a.npy', allow_pickle=True)\n"
                   "eval('1')\nimport subprocess\nsubprocess.run('ls', shell=True)\n")
    found = [p.split(": ", 1)[1] for p in _problems(bad, tmp_path)]
    assert sorted(found) == sorted(["imports a pickle-like module", "torch.load without weights_only=True",
                                    "yaml.load with loader yaml.Loader", "numpy.load with allow_pickle=True",
                                    "calls eval()", "subprocess with shell=True"])
