"""Model files are data unless the recipe says otherwise (formats.trust, formats.confinement): real attack files —
a .pt2 with pickled payloads, a .pt2 whose symbolic shape is Python code, a TorchScript archive that writes with
torch.from_file, a SavedModel that calls tf.io.write_file — are read in a child the kernel confines (nothing lands
outside its scratch folder, no network), refused where no confinement is available, and read as before with
``trust_code: true``."""

from __future__ import annotations

import ast
import os
import pickle
import socket
from pathlib import Path

import pytest
import yaml

from tests.conftest import trtflow_cli
from tests.stages import model_attacks as attacks
from trtflow.stage import StageFailed
from trtflow.testing import run_stage
from trtflow_stages import export
from trtflow_stages.formats import confinement, trust

STAGES = Path(__file__).resolve().parents[2] / "stages"
TS_INPUTS = {"features": {"shape": [2, 8], "dynamic_axes": {0: "batch"}}}
needs_confinement = pytest.mark.skipif(not confinement.probe().available,
                                       reason=f"this machine cannot confine: {confinement.probe().reason}")


def _export(tmp_path: Path, work: str = "work", **params):
    return run_stage(export.stage, params, workdir=tmp_path / work, recipe_dir=tmp_path)


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the model that no attack may write into (watched before and after)."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "existing.txt").write_text("before")
    return folder


# ---------------------------------------------------------------------------------------------------------
# .pt2 programs


def test_pt2_with_pickled_weights_is_refused_and_runs_only_when_trusted(tmp_path, outside):
    marker = outside / "pickle_pwned"
    attacks.pickled_weight_pt2(tmp_path / "pickled.pt2", marker)
    with pytest.raises(StageFailed, match="would unpickle") as refused:
        _export(tmp_path, model="pickled.pt2")
    assert "fc.weight is stored as a pickle" in refused.value.message and "trust_code: true" in refused.value.hint
    assert _listing(outside) == ["existing.txt"]
    # trusted, the file is read as before trtflow confined it: torch unpickles the payload, which runs
    with pytest.raises(StageFailed):  # (the payload is not a tensor, so the load fails after it ran)
        _export(tmp_path, work="trusted", model="pickled.pt2", trust_code=True)
    assert marker.exists()


@pytest.mark.parametrize("protocol", [2, 4])
def test_pt2_whose_sample_inputs_are_a_foreign_pickle_is_refused(tmp_path, outside, protocol):
    attacks.pickled_sample_inputs_pt2(tmp_path / "samples.pt2", outside / "samples_pwned", protocol)
    with pytest.raises(StageFailed, match="would unpickle") as refused:
        _export(tmp_path, model="samples.pt2")
    assert "names posix.system" in refused.value.message
    assert _listing(outside) == ["existing.txt"]


def test_pickle_globals_are_read_from_opcodes_without_unpickling():
    class Payload:
        def __reduce__(self):
            return (os.system, ("true",))

    for protocol in (2, 4, 5):
        assert "posix.system" in trust.pickle_globals(pickle.dumps(Payload(), protocol=protocol))
    # a STACK_GLOBAL whose operands are not strings pushed just before cannot be told without running it
    computed = b"\x80\x04\x8c\x05posix\x8c\x06system\x86\x8c\x01x\x93."
    assert trust.pickle_globals(computed) == ["?"]
    assert trust.pickle_globals(b"not a pickle") == ["?"]
    assert trust.pickled_payloads(attacks.clean_pt2(Path(os.environ.get("TMPDIR", "/tmp")) / "clean-scan.pt2")) == []


@needs_confinement
def test_pt2_running_code_at_load_is_confined(tmp_path, outside, monkeypatch):
    """No pickle at all: the symbolic batch size is Python that torch evaluates while loading. Confined, it runs
    but can write only in the child's box, reaches no listener, reads neither the secret beside the model nor the
    parent's environment; the export itself succeeds."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's token")
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(1)
    tcp.settimeout(0.5)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.5)
    attacks.code_in_shapes_pt2(tmp_path / "shapes.pt2", outside, tcp.getsockname()[1], udp.getsockname()[1], secret)

    result = _export(tmp_path, model="shapes.pt2")
    assert result.summary["model_code"] == "confined" and "bubblewrap" in result.summary["confinement"]
    assert result.summary["checked"] is True
    report = (tmp_path / "work" / "scratch" / "confined" / attacks.REPORT).read_text()
    lines = dict(line.split(": ", 1) for line in report.splitlines() if ": " in line)
    # in its own file system the folder beside the model and the secret are not there; sockets are refused
    assert lines["write"].startswith("FileNotFoundError") and lines["secret"].startswith("FileNotFoundError")
    assert lines["tcp"].startswith("PermissionError") and lines["udp"].startswith("PermissionError")
    assert lines["environ"].split(":")[0] in ("PermissionError", "FileNotFoundError")
    assert "the user's token" not in report
    assert _listing(outside) == ["existing.txt"]
    with pytest.raises(TimeoutError):
        tcp.accept()
    with pytest.raises(TimeoutError):
        udp.recv(100)

    # the same file trusted: the attack is real (it writes outside, reads the secret, connects)
    monkeypatch.chdir(tmp_path)  # (read in this process, it writes its report here)
    _export(tmp_path, work="trusted", model="shapes.pt2", trust_code=True)
    assert "shapes_pwned" in _listing(outside) and "shell_pwned" in _listing(outside)
    conn, _ = tcp.accept()
    assert conn.recv(100) == b"stolen"
    conn.close()
    tcp.close()
    udp.close()


@needs_confinement
@pytest.mark.parametrize("fmt", ["torchscript", "exported_program"])
def test_a_confined_export_is_the_trusted_one(tmp_path, fmt):
    """The confined child exports and checks as the node's process does: the same ONNX bytes, the same checks."""
    import torch

    if fmt == "torchscript":
        torch.jit.save(torch.jit.script(attacks.Mlp().eval()), tmp_path / "mlp.pt")
        params = {"model": "mlp.pt", "inputs": TS_INPUTS}
    else:
        attacks.clean_pt2(tmp_path / "mlp.pt2")
        params = {"model": "mlp.pt2"}
    confined = _export(tmp_path, work="confined", **params)
    trusted = _export(tmp_path, work="trusted", trust_code=True, **params)
    assert confined.outputs["model"].read_bytes() == trusted.outputs["model"].read_bytes()
    same = {k: v for k, v in confined.summary.items() if k not in ("model_code", "confinement")}
    assert same == {k: v for k, v in trusted.summary.items() if k != "model_code"}
    assert confined.summary["model_code"] == "confined" and trusted.summary["model_code"] == "trusted"


# ---------------------------------------------------------------------------------------------------------
# TorchScript and TensorFlow


@needs_confinement
def test_torchscript_writing_with_from_file_is_confined(tmp_path, outside):
    attacks.writing_torchscript(tmp_path / "writer.pt", outside / "ts_pwned.bin")
    with pytest.raises(StageFailed) as failed:
        _export(tmp_path, model="writer.pt", inputs=TS_INPUTS)
    assert "confined child" in failed.value.message
    assert "confinement forbids" in failed.value.hint and "ts_pwned.bin" in failed.value.hint
    assert "trust_code: true" in failed.value.hint
    assert _listing(outside) == ["existing.txt"]
    trusted = _export(tmp_path, work="trusted", model="writer.pt", inputs=TS_INPUTS, trust_code=True)
    assert trusted.summary["model_code"] == "trusted" and "ts_pwned.bin" in _listing(outside)


@pytest.mark.slow
@needs_confinement
def test_saved_model_writing_with_tf_io_is_confined(tmp_path, outside):
    pytest.importorskip("tf2onnx")
    attacks.writing_saved_model(tmp_path / "saved", outside / "tf_pwned.txt")
    with pytest.raises(StageFailed) as failed:
        _export(tmp_path, model="saved")
    assert "PermissionDenied" in failed.value.message and "confinement forbids" in failed.value.hint
    assert _listing(outside) == ["existing.txt"]


def test_hugging_face_bin_weights_holding_code_are_refused_as_data(tmp_path, outside, monkeypatch):
    """A Hugging Face folder is data: even without confinement it is read in the node's process, and a .bin with a
    pickled payload is refused by torch's weights_only unpickler, with a clear error."""
    monkeypatch.setenv(confinement.DISABLE_ENV, "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    attacks.pickled_bin_huggingface(tmp_path / "bert", outside / "hf_pwned")
    with pytest.raises(StageFailed, match="weights_only unpickler refuses") as refused:
        _export(tmp_path, model="bert")
    assert "safetensors" in refused.value.hint
    assert _listing(outside) == ["existing.txt"]


# ---------------------------------------------------------------------------------------------------------
# Without confinement


def test_without_confinement_models_that_run_code_are_refused_unless_trusted(tmp_path, monkeypatch):
    monkeypatch.setenv(confinement.DISABLE_ENV, "1")
    attacks.clean_pt2(tmp_path / "clean.pt2")
    with pytest.raises(StageFailed) as refused:
        _export(tmp_path, model="clean.pt2")
    message = refused.value.message
    assert "carries a program" in message and "no confinement here" in message and confinement.DISABLE_ENV in message
    assert "bubblewrap" in refused.value.hint and "trust_code: true" in refused.value.hint
    trusted = _export(tmp_path, work="trusted", model="clean.pt2", trust_code=True)
    assert trusted.summary["model_code"] == "trusted" and trusted.summary["checked"] is True
    assert trusted.summary["inputs"] == {"features": ["batch", 8]}


def test_an_onnx_file_is_data_and_needs_no_confinement(tmp_path, monkeypatch, tiny_cnn_onnx):
    monkeypatch.setenv(confinement.DISABLE_ENV, "1")
    (tmp_path / "cnn.onnx").write_bytes(tiny_cnn_onnx.read_bytes())
    assert _export(tmp_path, model="cnn.onnx", check=False).summary["model_code"] == "data"
    (tmp_path / "pyproject.toml").write_text("")
    wrong = trtflow_cli("init", "cnn.onnx", "-o", "r.yaml", "--trust-code", cwd=tmp_path, check=2)
    assert "--trust-code is for model files that carry a program" in wrong.stderr


def test_a_confined_child_that_cannot_confine_itself_fails(tmp_path, monkeypatch):
    """The kernel refusing in the child (here: the probe says no) is a clear failure, never an unconfined run."""
    monkeypatch.setenv(confinement.DISABLE_ENV, "1")
    attacks.clean_pt2(tmp_path / "clean.pt2")
    with pytest.raises(StageFailed, match="could not confine itself"):
        confinement.run("trtflow_stages.export:export_in_child", {}, tmp_path / "box", [tmp_path / "clean.pt2"])


def test_plan_shows_a_node_that_trusts_model_code(tmp_path):
    attacks.clean_pt2(tmp_path / "clean.pt2")
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "r.yaml").write_text("name: r\nnodes:\n  - name: export\n    stage: export\n"
                                     "    params: {model: clean.pt2, trust_code: true}\n")
    plan = trtflow_cli("plan", "r.yaml", cwd=tmp_path).stdout
    assert "note: trust_code: true" in plan and "unconfined" in plan
    typed = trtflow_cli("plan", "r.yaml", "--set", "nodes.export.params.trust_code=true", cwd=tmp_path, check=2)
    assert "only in a recipe file, not with --set" in typed.stderr
    (tmp_path / "r.yaml").write_text("name: r\nnodes:\n  - name: export\n    stage: export\n"
                                     "    params: {model: clean.pt2}\n")
    assert "trust_code" not in trtflow_cli("plan", "r.yaml", cwd=tmp_path).stdout
    assert trtflow_cli("plan", "r.yaml", "--set", "defaults.export.trust_code=true", cwd=tmp_path, check=2)


# ---------------------------------------------------------------------------------------------------------
# trtflow init


def test_init_refuses_a_pickled_pt2_and_trusts_it_only_with_the_flag(tmp_path, outside, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("")
    attacks.pickled_weight_pt2(tmp_path / "pickled.pt2", outside / "init_pwned")
    refused = trtflow_cli("init", "pickled.pt2", "-o", "r.yaml", cwd=tmp_path, check=1)
    assert "would unpickle" in refused.stderr and "--trust-code" in refused.stderr
    assert not (tmp_path / "r.yaml").exists() and _listing(outside) == ["existing.txt"]
    attacks.clean_pt2(tmp_path / "clean.pt2")
    monkeypatch.setenv(confinement.DISABLE_ENV, "1")
    refused = trtflow_cli("init", "clean.pt2", "-o", "r.yaml", cwd=tmp_path, check=1)
    assert "carries a program" in refused.stderr and "--trust-code" in refused.stderr
    trtflow_cli("init", "clean.pt2", "-o", "r.yaml", "--trust-code", cwd=tmp_path)
    params = yaml.safe_load((tmp_path / "r.yaml").read_text())["nodes"][0]["params"]
    assert params["trust_code"] is True


@needs_confinement
def test_init_reads_a_pt2_that_runs_code_confined(tmp_path, outside):
    (tmp_path / "pyproject.toml").write_text("")
    secret = tmp_path / "secret.txt"
    secret.write_text("token")
    attacks.code_in_shapes_pt2(tmp_path / "shapes.pt2", outside, 9, 9, secret)
    proc = trtflow_cli("init", "shapes.pt2", "-o", "r.yaml", cwd=tmp_path)
    assert "features: float32[batch, 8]" in proc.stderr
    assert "trust_code" not in (tmp_path / "r.yaml").read_text()
    assert _listing(outside) == ["existing.txt"]


# ---------------------------------------------------------------------------------------------------------
# Nothing goes around it


def test_loaders_refuse_a_process_that_is_neither_confined_nor_trusting(tmp_path):
    from trtflow_stages.formats.torch_archives import load_program

    path = attacks.clean_pt2(tmp_path / "clean.pt2")
    with pytest.raises(RuntimeError, match="neither confined nor told to trust"):
        load_program(path, "clean.pt2")
    with confinement.trusting():
        assert load_program(path, "clean.pt2").inputs["features"]["dynamic_axes"] == {0: "batch"}


#: Calls that read a model format whose reading or tracing runs the file's own code.
_RUNS_MODEL_CODE = ("torch.jit.load", "torch.export.load", "tf.saved_model.load", "keras_lib.models.load_model",
                    "keras.models.load_model", "keras.saving.load_model", "torch.load")


def test_every_loader_of_a_code_carrying_format_is_guarded():
    """Every function in stages/ that calls one of those loaders calls confinement.guard first (torch.load only
    with weights_only=True, which reads tensors and nothing else)."""
    unguarded = []
    for path in STAGES.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            calls = [node for node in ast.walk(function) if isinstance(node, ast.Call)]
            names = {ast.unparse(call.func): call for call in calls}
            guarded = any(name.endswith("guard") for name in names)
            for call in calls:
                name = ast.unparse(call.func)
                if name not in _RUNS_MODEL_CODE:
                    continue
                if name == "torch.load" and any(k.arg == "weights_only" and ast.unparse(k.value) == "True"
                                                for k in call.keywords):
                    continue
                if not guarded:
                    unguarded.append(f"{path.relative_to(STAGES)}:{call.lineno} {name} in {function.name}")
    assert unguarded == []


def test_doctor_says_whether_model_files_can_be_confined(tmp_path, monkeypatch):
    import json

    row = {b["backend"]: b for b in json.loads(trtflow_cli("doctor", "--json", cwd=tmp_path).stdout)["backends"]}
    assert row["model confinement"]["run"] is confinement.probe().available
    monkeypatch.setenv(confinement.DISABLE_ENV, "1")
    row = {b["backend"]: b for b in json.loads(trtflow_cli("doctor", "--json", cwd=tmp_path).stdout)["backends"]}
    assert row["model confinement"]["run"] is False and "trust_code: true" in row["model confinement"]["why"]
