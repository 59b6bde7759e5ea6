"""`trtflow init`: a recipe from an ONNX file or a PyTorch factory, checked by the recipe loader before it is
written (running one end to end is in test_quickstart.py)."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import yaml

from tests.conftest import short_benchmarks, trtflow_cli, trtflow_in_process
from trtflow.errors import TrtflowError
from trtflow_stages.cli.init_inputs import Range, dynamic_ranges, parse_input_option, read_onnx_inputs

#: one worker (CI: `--dist loadgroup`): the module-scoped hf_bert and cnn_archive made once per run, not once per worker
pytestmark = pytest.mark.xdist_group("init")

REPO = Path(__file__).resolve().parent.parent


trtflow = trtflow_cli


def test_init_onnx_writes_a_recipe_that_plans(tmp_path, tiny_cnn_onnx):
    (tmp_path / "cnn.onnx").write_bytes(tiny_cnn_onnx.read_bytes())
    outside = trtflow_in_process("init", "cnn.onnx", "-o", "recipes/cnn.yaml", cwd=tmp_path, check=2)  # as run at plan
    assert "outside the project" in outside.stderr and "pyproject.toml" in outside.stderr
    assert not (tmp_path / "recipes" / "cnn.yaml").exists()
    (tmp_path / "pyproject.toml").write_text("")  # the folder holding model and recipes is the project
    proc = trtflow_in_process("init", "cnn.onnx", "-o", "recipes/cnn.yaml", "--batch", "1:4:8", cwd=tmp_path)
    assert "WARNING: no --data given" in proc.stderr and "next: trtflow run recipes/cnn.yaml" in proc.stderr
    text = (tmp_path / "recipes" / "cnn.yaml").read_text()
    assert text.startswith("# yaml-language-server: $schema=recipe.schema.json\n")
    assert (tmp_path / "recipes" / "recipe.schema.json").is_file()  # no shipped schema above: one written beside
    assert "# WARNING: no --data was given" in text
    recipe = yaml.safe_load(text)
    assert recipe["profiles"]["default"] == {"input": {"min": [1, 3, 32, 32], "opt": [4, 3, 32, 32],
                                                       "max": [8, 3, 32, 32]}}
    nodes = {n["name"]: n for n in recipe["nodes"]}
    assert nodes["export"]["params"]["model"] == "../cnn.onnx"
    assert nodes["convert"]["params"]["calibration_data"] == {
        "random": {"seed": 0, "num_samples": 32, "shapes": {"input": [1, 3, 32, 32]}}}
    assert nodes["select"]["inputs"]["candidates"] == ["simplify", "convert", "quantize"]
    assert nodes["benchmark"]["params"]["batch_sizes"] == [1, 4, 8]
    # decisions measurable on a shared machine: one ONNX Runtime thread, finalists timed together (the default)
    assert nodes["benchmark"]["params"]["onnxruntime"] == {"intra_op_threads": 1}
    assert nodes["select"]["params"]["tie_breakers"] == {"tolerance_percent": 5, "order": ["accuracy", "size"]}
    plan = trtflow_in_process("plan", "recipes/cnn.yaml", cwd=tmp_path).stdout
    assert "13 nodes: 0 fresh, 13 stale" in plan
    again = trtflow_in_process("init", "cnn.onnx", "-o", "recipes/cnn.yaml", cwd=tmp_path, check=2)
    assert "exists" in again.stderr and "--force" in again.stderr


def test_init_with_data_and_a_shipped_schema(tmp_path, tiny_cnn_onnx):
    project = tmp_path / "project"
    (project / "schema").mkdir(parents=True)
    (project / "schema" / "recipe.schema.json").write_text("{}")
    (project / "pyproject.toml").write_text("")
    (project / "cnn.onnx").write_bytes(tiny_cnn_onnx.read_bytes())
    (project / "samples.npz").write_bytes((REPO / "examples" / "data" / "cnn_calib.npz").read_bytes())
    proc = trtflow_in_process("init", "cnn.onnx", "-o", "pipelines/cnn.yaml", "--data", "samples.npz", cwd=project)
    assert "WARNING" not in proc.stderr
    text = (project / "pipelines" / "cnn.yaml").read_text()
    assert text.startswith("# yaml-language-server: $schema=../schema/recipe.schema.json\n") and "random" not in text
    nodes = {n["name"]: n for n in yaml.safe_load(text)["nodes"]}
    assert nodes["validate"]["params"]["data"] == {"path": "../samples.npz"}


def test_init_factory_needs_input_specs(tmp_path):
    (tmp_path / "net.py").write_text((REPO / "examples" / "models" / "tiny_transformer.py").read_text())
    proc = trtflow("init", "python:net.py:build", cwd=tmp_path, check=2)
    assert "give each forward() argument with --input NAME:DIMS[:DTYPE]" in proc.stderr
    proc = trtflow("init", "python:net.py:build", "--input", "input_ids:batch,seq:int64", cwd=tmp_path, check=2)
    assert "seq (axis 1 of input_ids)" in proc.stderr and "--dim seq=1:128:512" in proc.stderr
    trtflow("init", "python:net.py:build", "--input", "input_ids:batch,seq:int64", "--dim", "seq=4:16:32",
            "--output-name", "logits", "--batch", "1:2:4", cwd=tmp_path)
    recipe = yaml.safe_load((tmp_path / "recipe.yaml").read_text())
    export = recipe["nodes"][0]["params"]
    assert recipe["name"] == "net"
    assert export == {"model": "python:net.py:build", "outputs": ["logits"], "profiles": ["default"],
                      "inputs": {"input_ids": {"shape": [2, 16], "dtype": "int64",
                                               "dynamic_axes": {0: "batch", 1: "seq"}}}}
    assert recipe["profiles"]["default"]["input_ids"] == {"min": [1, 4], "opt": [2, 16], "max": [4, 32]}


def test_onnx_dims_and_option_parsing(tiny_transformer_onnx):
    inputs = read_onnx_inputs(tiny_transformer_onnx)
    assert [(i.name, i.dtype, i.dims) for i in inputs] == [("input_ids", "int64", ("batch", "seq"))]
    with pytest.raises(TrtflowError, match="need a range: seq"):
        dynamic_ranges(inputs, Range(1, 8, 32), {})
    with pytest.raises(TrtflowError, match="--dim names no dynamic dimension of the model: width"):
        dynamic_ranges(inputs, Range(1, 8, 32), {"seq": Range(1, 2, 3), "width": Range(1, 2, 3)})
    assert parse_input_option("x:batch,3,224,224").dims == ("batch", 3, 224, 224)
    for bad in ("x", "x:batch,0:float32", "x:3:complex64"):
        with pytest.raises(TrtflowError):
            parse_input_option(bad)
    with pytest.raises(TrtflowError, match="need 1 <= MIN <= OPT <= MAX"):
        Range.parse("8:4:16", "--batch")


# -- every model format: init, then run the recipe as written ------------------------------------------------

#: The Keras model, saved in a process of its own (TensorFlow stays out of the test's process, which has torch).
_KERAS_MODEL = '''
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import keras

inputs = keras.Input(shape=(8,), name="features")
model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Dense(16, activation="relu")(inputs)))
model.export("saved", verbose=False)
'''


def save_format_model(which: str, folder: Path) -> None:
    """The model of one format in ``folder``: the PyTorch ones made in this process (torch and transformers are
    imported once per worker, not once per model), the Keras one in a subprocess (`_KERAS_MODEL`)."""
    import subprocess
    import sys

    if which == "tensorflow":
        (folder / "make.py").write_text(_KERAS_MODEL)
        subprocess.run([sys.executable, "make.py"], cwd=folder, check=True, capture_output=True, timeout=600)
        return
    import torch

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, features):
            return self.fc(features).relu()

    if which == "torchscript":
        with warnings.catch_warnings():  # deprecated in favour of torch.export: still a format users have
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.save(torch.jit.script(Mlp().eval()), str(folder / "mlp.pt"))
    elif which == "pt2":
        batch = torch.export.Dim("batch")
        torch.export.save(torch.export.export(Mlp().eval(), (torch.randn(2, 8),), dynamic_shapes=({0: batch},)),
                          str(folder / "mlp.pt2"))
    else:
        import transformers

        config = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, max_position_embeddings=32, num_labels=3)
        transformers.BertForSequenceClassification(config).save_pretrained(folder / "bert")


@pytest.fixture(scope="module")
def hf_bert(tmp_path_factory) -> Path:
    """The small BERT saved once for this module's tests (each copies it into its project)."""
    folder = tmp_path_factory.mktemp("hf")
    save_format_model("huggingface", folder)
    return folder / "bert"


@pytest.mark.slow
@pytest.mark.parametrize(("which", "model", "extra", "targets"), [
    ("huggingface", "bert", [], []),                          # the whole recipe: candidates, select, build, triton
    ("tensorflow", "saved", [], ["validate"]),
    ("torchscript", "mlp.pt", ["--input", "features:batch,8"], ["validate"]),  # export, candidates, validation
    ("pt2", "mlp.pt2", [], ["validate"]),
])
def test_init_then_run_for_each_format(tmp_path, request, which, model, extra, targets):
    if which == "tensorflow":
        pytest.importorskip("tf2onnx")
    (tmp_path / "pyproject.toml").write_text("")
    if which == "huggingface":
        shutil.copytree(request.getfixturevalue("hf_bert"), tmp_path / "bert")
    else:
        save_format_model(which, tmp_path)
    # init in this process where it imports only torch/transformers (the worker has them); Keras in its own
    init = trtflow if which == "tensorflow" else trtflow_in_process
    proc = init("init", model, "-o", "recipe.yaml", "--batch", "1:2:4", *extra, cwd=tmp_path)
    assert "next: trtflow run recipe.yaml" in proc.stderr
    recipe = yaml.safe_load((tmp_path / "recipe.yaml").read_text())
    export = recipe["nodes"][0]["params"]
    assert ("inputs" in export) == (which == "torchscript")  # the others declare their own
    run = trtflow("run", "recipe.yaml", *targets, *short_benchmarks(tmp_path / "recipe.yaml"), cwd=tmp_path)
    assert "Done" in run.stdout
    name = recipe["name"]
    for candidate in ("simplify", "convert", "quantize"):
        verdict = __import__("json").loads((tmp_path / "build" / name / f"validate-{candidate}" /
                                            "validate.json").read_text())
        assert verdict["passed"], (candidate, verdict["failures"])
    if not targets:
        assert (tmp_path / "build" / name / "triton" / name / "config.pbtxt").is_file() or any(
            (tmp_path / "build" / name / "triton").rglob("config.pbtxt"))


def test_init_hugging_face_task_option(tmp_path, hf_bert):
    (tmp_path / "pyproject.toml").write_text("")
    shutil.copytree(hf_bert, tmp_path / "bert")
    trtflow_in_process("init", "bert", "--task", "feature-extraction", "-o", "recipe.yaml", cwd=tmp_path)
    export = yaml.safe_load((tmp_path / "recipe.yaml").read_text())["nodes"][0]["params"]
    assert export == {"model": "bert", "task": "feature-extraction", "profiles": ["default"]}
    profile = yaml.safe_load((tmp_path / "recipe.yaml").read_text())["profiles"]["default"]
    assert profile["input_ids"] == {"min": [1, 1], "opt": [8, 32], "max": [32, 32]}  # max_position_embeddings 32


# -- mistakes named at the earliest point, with one exit code per kind (issue 25) ------------------------------

_CNN = '''
import torch


class Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, image):
        return self.fc(self.bn(self.conv(image)).relu().mean((2, 3)))


torch.jit.save(torch.jit.script(Cnn().eval()), "cnn.pt")
'''


@pytest.fixture(scope="module")
def cnn_archive(tmp_path_factory):
    import subprocess
    import sys

    folder = tmp_path_factory.mktemp("cnn")
    (folder / "pyproject.toml").write_text("")
    (folder / "make.py").write_text(_CNN)
    subprocess.run([sys.executable, "make.py"], cwd=folder, check=True, capture_output=True, timeout=300)
    return folder


@pytest.mark.parametrize(("given", "message", "hint"), [
    ("image:batch,3,64", r"--input: input 'image' has rank 3 \(shape \[\d+, 3, 64\]\), but the model's first "
     r"convolution takes rank 4", r"give image a shape of rank 4"),
    ("image:batch,4,32,32", r"input 'image' has 4 channels \(axis 1 of \[\d+, 4, 32, 32\]\), but the model's first "
     r"convolution takes 3", r"3 channels at axis 1"),
    ("img:batch,3,32,32", r"--input 'img': the model's forward\(\) takes image; did you mean 'image'\?",
     r"name each --input like forward\(\)'s argument: image"),
])
def test_init_names_a_torchscript_input_mistake(cnn_archive, given, message, hint):
    import re

    proc = trtflow_in_process("init", "cnn.pt", "--input", given, "-o", "r.yaml", "--force", cwd=cnn_archive, check=2)
    assert re.search(message, proc.stderr), proc.stderr
    assert re.search(hint, proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr and "\x1b[" not in proc.stderr


def test_init_without_input_suggests_the_archives_own_input_name(cnn_archive):
    """The hint names forward()'s argument (read from the archive), so following it works (issue 35)."""
    proc = trtflow_in_process("init", "cnn.pt", "-o", "r.yaml", "--force", cwd=cnn_archive, check=2)
    assert "--input image:batch,3,224,224:float32 (forward() takes image)" in proc.stderr, proc.stderr
    assert "--input input:" not in proc.stderr


@pytest.mark.slow
def test_run_names_the_same_mistake_with_the_same_exit_code(cnn_archive):
    """The wrong channels given to run: export fails naming them, exit 2 as from init, and the console does not
    repeat the message from the node's log."""
    (cnn_archive / "four.yaml").write_text("name: four\nnodes:\n  - {name: export, stage: export, params: {model: "
                                           "cnn.pt, inputs: {image: {shape: [2, 4, 32, 32]}}}}\n")
    proc = trtflow("run", "four.yaml", cwd=cnn_archive, check=2)
    assert "input 'image' has 4 channels (axis 1 of [2, 4, 32, 32]), but the model's first convolution takes 3" \
        in proc.stdout, proc.stdout
    assert proc.stdout.count("has 4 channels") == 1 and "Traceback" not in proc.stdout, proc.stdout


def test_a_folder_without_config_json_is_named_at_plan_and_by_init(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "model.safetensors").write_bytes(b"weights")
    init = trtflow_in_process("init", "bert", "-o", "r.yaml", cwd=tmp_path, check=2)
    assert "the folder 'bert' is neither a Hugging Face model folder (no config.json)" in init.stderr
    (tmp_path / "r.yaml").write_text("name: r\nnodes:\n  - name: export\n    stage: export\n"
                                     "    params: {model: bert}\n")
    for command in ("plan", "run"):
        proc = trtflow(command, "r.yaml", cwd=tmp_path, check=2)
        assert proc.stderr.count("no config.json") == 1 and "r.yaml:3" in proc.stderr, proc.stderr


def test_init_with_a_missing_package_exits_3_with_the_install_hint(tmp_path):
    """tensorflow hidden from the interpreter (a meta-path finder that refuses it): init says what to install."""
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "saved_model.pb").write_bytes(b"")
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import sys\n\n\nclass _Hide:\n    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('tensorflow', 'tf2onnx'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n\n\nsys.meta_path.insert(0, _Hide())\n")
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "trtflow.cli", "init", "saved", "-o", "r.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 3, proc.stderr
    assert "needs tensorflow and tf2onnx, which are not installed here" in proc.stderr
    assert "pip install 'trtflow[tensorflow]'" in proc.stderr and "Traceback" not in proc.stderr


def test_init_task_names_are_export_tasks():
    from trtflow_stages.cli.init import TASK_NAMES
    from trtflow_stages.formats.hf_tasks import TASKS

    assert tuple(TASKS) == TASK_NAMES


def test_an_architecture_no_task_maps_gets_a_note_naming_the_tasks(tmp_path):
    import transformers

    (tmp_path / "pyproject.toml").write_text("")
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32)
    config.architectures = ["BertForNextSentencePrediction"]
    config.save_pretrained(tmp_path / "nsp")
    (tmp_path / "nsp" / "model.safetensors").write_bytes(b"not read by init")  # init builds on the meta device
    proc = trtflow_in_process("init", "nsp", "-o", "r.yaml", cwd=tmp_path)
    assert ("note: config.json's architectures (BertForNextSentencePrediction) name no task export knows; the "
            "recipe exports feature-extraction. Tasks this model can do: fill-mask, text-classification") in proc.stderr
    proc = trtflow_in_process("init", "nsp", "--task", "object-detection", "-o", "r.yaml", "--force", cwd=tmp_path,
                              check=2)
    assert "a 'bert' model cannot do task 'object-detection'" in proc.stderr
    assert "tasks a 'bert' model can do: text2text-generation" not in proc.stderr and "fill-mask" in proc.stderr
