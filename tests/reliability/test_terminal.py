"""Text from models and records reaches a terminal without control characters (trtflow/terminal.py): a model whose
tensor and node names hold a clipboard write (OSC 52), a window title and clear-screen sequences, through the
command that prints a model's names (`trtflow init`); the rich consoles keep their own styling. The commands over
records holding such text are run by test_records.py ("controls")."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trtflow.terminal import CONTROL, console, guard

HOSTILE = "\x1b]52;c;cHduZWQ=\x07\x1b]0;owned\x07\x1b[2J\x1b[H\x9b2J\r"


def _controls(text: str) -> list[str]:
    return CONTROL.findall(text.replace("\n", "").replace("\t", ""))


def test_a_model_with_hostile_tensor_names_prints_no_control_characters(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    inp = helper.make_tensor_value_info(f"in{HOSTILE}", TensorProto.FLOAT, [1, 4])
    out = helper.make_tensor_value_info(f"out{HOSTILE}", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", [inp.name], [out.name], name=f"relu{HOSTILE}")],
                              f"g{HOSTILE}", [inp], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "model.onnx")
    done = subprocess.run([sys.executable, "-m", "trtflow.cli", "init", "model.onnx", "-o", "r.yaml"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode != 70, done.stderr
    printed = done.stdout + done.stderr
    assert "in" in printed and _controls(printed) == [], printed


def test_the_consoles_keep_their_own_styling_and_strip_the_text_s(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = io.StringIO()
    monkeypatch.setattr(sys, "stdout", raw)
    from rich.text import Text

    with guard():
        print(f"plain {HOSTILE}print")
        console(force_terminal=True, color_system="standard").print(Text.from_markup("[red]styled[/]"),
                                                                     Text(f"{HOSTILE}text"), f"markup {HOSTILE}x")
    text = raw.getvalue()
    assert "plain print" in text and "text" in text
    assert "\x1b[31m" in text  # the console's own colour
    assert _controls(re.sub(r"\x1b\[[0-9;]*m", "", text)) == [], repr(text)
