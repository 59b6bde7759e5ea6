"""What a new user tripped on (issue 35), each at the unit that owns it; README's commands run as printed in
tests/test_quickstart.py, and init's TorchScript hint in tests/test_init.py."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest

from trtflow.errors import UsageError


def test_a_mask_fill_saturated_to_infinity_is_no_error() -> None:
    """An attention mask filled with fp32's finfo.min comes out of an fp16 model as -inf: the same value there, so
    `debug layers` does not rank the mask's Where as the layer that adds the most error."""
    from trtflow_stages.accuracy.precision_debug import tensor_error

    reference = np.array([0.5, -2.0, float(np.finfo(np.float32).min), 1.0])
    rel, max_abs, cosine = tensor_error(reference, np.array([0.5, -2.0, -math.inf, 1.0]))
    assert rel == 0.0 and max_abs == 0.0 and cosine == pytest.approx(1.0)
    # an infinity where the reference is in range, or of the other sign, is a real (infinite) error
    assert tensor_error(reference, np.array([math.inf, -2.0, -math.inf, 1.0]))[0] == math.inf
    assert tensor_error(reference, np.array([0.5, -2.0, math.inf, 1.0]))[0] == math.inf
    assert tensor_error(reference, np.array([0.5, -2.0, math.nan, 1.0]))[0] == math.inf


def test_debug_precision_prints_output_names_whole_on_a_narrow_terminal() -> None:
    from rich.console import Console

    from trtflow_stages.accuracy.precision_debug import Evaluation
    from trtflow_stages.cli.debug import _accuracy_table

    names = ["logits_per_image", "logits_per_text", "text_embeds"]
    entry = {"max_abs_error": 0.25, "cosine_similarity": 0.999, "passed": False}
    before = Evaluation(excluded=(), passed=False, failures=[], outputs={n: dict(entry) for n in names})
    out = io.StringIO()
    Console(file=out, width=60, color_system=None).print(_accuracy_table(before, None))
    assert all(name in out.getvalue() for name in names), out.getvalue()


def test_baseline_show_names_where_pin_wrote_the_file(tmp_path: Path, monkeypatch) -> None:
    from trtflow_stages.cli.baseline import _existing

    (tmp_path / "pipelines" / "baselines").mkdir(parents=True)
    (tmp_path / "pipelines" / "baselines" / "quickstart.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as raised:
        _existing(Path("baselines/quickstart.json"))
    assert "pipelines/baselines/quickstart.json" in str(raised.value.hint)
    assert _existing(Path("pipelines/baselines/quickstart.json")) == Path("pipelines/baselines/quickstart.json")
