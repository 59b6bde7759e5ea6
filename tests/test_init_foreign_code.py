"""A Hugging Face folder's own code never runs, and its sizes never end `trtflow init` in an internal error.

A `config.json` may name code of its own (``auto_map``: transformers' ``trust_remote_code``), and a folder may hold
it; transformers asks on the terminal whether to run it when the caller does not say. trtflow says no at every call
that reads a folder or builds a model from a config (an audit below), so `trtflow init` refuses such a folder by
name, whatever its standard input answers. A config with sizes this machine cannot hold is a clear error (exit 2),
not exit 70."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOADERS = ("from_pretrained", "from_config")


def test_every_transformers_loader_refuses_a_folders_own_code():
    missing = []
    for path in sorted([*ROOT.joinpath("trtflow").rglob("*.py"), *ROOT.joinpath("stages").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LOADERS):
                continue
            said = {k.arg: k.value for k in node.keywords}
            value = said.get("trust_remote_code")
            if not (isinstance(value, ast.Constant) and value.value is False):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.func.attr}() without "
                               "trust_remote_code=False")
    assert not missing, "\n".join(missing)


def test_the_audit_sees_a_loader_that_does_not_say_no():
    call = ast.parse("transformers.AutoConfig.from_pretrained(folder, local_files_only=True)").body[0]
    assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call)
    assert call.value.func.attr in LOADERS  # type: ignore[attr-defined]
    assert "trust_remote_code" not in {k.arg for k in call.value.keywords}


def _init(project: Path, folder: str, answer: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtflow.cli", "init", folder, "-o", "recipe.yaml"], cwd=project,
                          input=answer, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("task", [None, "text-generation-with-past"])
def test_init_never_runs_a_folders_own_code_whatever_stdin_says(tmp_path, task):
    (tmp_path / "pyproject.toml").write_text("")
    folder = tmp_path / "evil"
    folder.mkdir()
    marker = tmp_path / "RAN"
    (folder / "config.json").write_text(json.dumps({
        "model_type": "evilgpt", "architectures": ["EvilForCausalLM"],
        "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}}))
    (folder / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    args = ["--task", task] if task else []
    proc = subprocess.run([sys.executable, "-m", "trtflow.cli", "init", "evil", "-o", "recipe.yaml", *args],
                          cwd=tmp_path, input="y\ny\n", capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "custom code" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not marker.exists() and not (tmp_path / "recipe.yaml").exists()


def test_init_on_a_config_this_machine_cannot_build_is_a_clear_error(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "huge").mkdir()
    (tmp_path / "huge" / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 16_777_216,
        "hidden_size": 4096, "num_hidden_layers": 1, "num_attention_heads": 32, "intermediate_size": 64}))
    proc = _init(tmp_path, "huge")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cannot build the 'llama' model of this config to read its cache" in proc.stderr
    assert "check config.json's sizes" in proc.stderr and "Traceback" not in proc.stderr
