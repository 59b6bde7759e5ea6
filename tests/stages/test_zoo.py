"""The model zoo (slow): small random-weight Hugging Face models of 22 architectures across tasks (text
classification, fill-mask, question answering, token classification, causal LMs, encoder-decoders as encoder and
decoder, image classification, detection, semantic segmentation, depth, vision-text with both towers and each
tower alone, audio classification, speech recognition), each from its save_pretrained folder through `trtflow
init` and `trtflow run` of the recipe init wrote, unedited (the benchmarks shortened with --set): export,
fp32/fp16/int8 candidates, validation, benchmarks, select, a TensorRT-RTX engine and a Triton repository.
"""

from __future__ import annotations

import json
import os

import onnx
import pytest

from tests.stages.zoo_models import CI_SUBSET, EXPECTED_GATE_FAILURES, TOWERS, ZOO, markdown, run_zoo


@pytest.mark.slow
@pytest.mark.timeout(3600)  # TRTFLOW_ZOO=all; the CI subset takes a few minutes
def test_every_zoo_model_goes_through_init_and_run_unedited(tmp_path):
    """The zoo's CI subset (`CI_SUBSET`); TRTFLOW_ZOO=all runs every recipe (at least 8 minutes on an idle
    2-core machine), TRTFLOW_ZOO=bert,t5,... only those."""
    pytest.importorskip("transformers")
    (tmp_path / "pyproject.toml").write_text("")
    wanted = os.environ.get("TRTFLOW_ZOO", "")
    chosen = None if wanted == "all" else [n for n in wanted.split(",") if n] or list(CI_SUBSET)
    results = run_zoo(tmp_path, chosen)
    print(f"\n{markdown(results)}\n{len(results)} recipes in {sum(r.seconds for r in results):.0f} s of runs")
    assert {r.recipe for r in results} == set(chosen or [*ZOO, *TOWERS])
    failed = {r.recipe: r.unexpected for r in results}
    assert not any(failed.values()) and all(r.nodes for r in results), \
        f"{failed}\n" + "\n".join(r.output[-1500:] for r in results if failed[r.recipe] or not r.nodes)
    for (recipe, node), why in EXPECTED_GATE_FAILURES.items():  # a gate failure is a verdict, not a crash
        status = next((r.nodes.get(node) for r in results if r.recipe == recipe), "done")
        assert status in ("gate_failed", "done"), (recipe, node, status, why)
    ran = {r.recipe for r in results}
    # the model's own names reach the Triton repository and the engine: DETR's boxes, the encoder-decoders' parts
    if "detr" in ran:
        detr = (tmp_path / "build" / "detr" / "triton" / "model" / "config.pbtxt").read_text()
        assert 'name: "logits"' in detr and 'name: "pred_boxes"' in detr
    if "t5" in ran:  # an encoder-decoder for generation: the decoder with its KV cache (Optimum's names)
        decoder = onnx.load(str(tmp_path / "build" / "t5" / "export" / "model.onnx"), load_external_data=False)
        assert [(o.name, [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim])
                for o in decoder.graph.output] == [
            ("logits", ["batch_size", "sequence_length", 128]),
            ("present.0.decoder.key", ["batch_size", 2, "past_sequence_length + sequence_length", 16]),
            ("present.0.decoder.value", ["batch_size", 2, "past_sequence_length + sequence_length", 16])]
        assert "past_key_values.0.encoder.key" in {i.name for i in decoder.graph.input}
        validated = json.loads((tmp_path / "build" / "t5" / "validate-simplify" / "validate.json").read_text())
        assert validated["generation"]["tokens_matched"] == [validated["generation"]["new_tokens"]] * 4
        timed = json.loads((tmp_path / "build" / "t5" / "benchmark-simplify" / "benchmark.json").read_text())
        level = timed["generation"][0]
        assert level["ttft_ms"]["n"] > 0 and level["tpot_ms"]["ci"]["p50"][0] <= level["tpot_ms"]["p50"]
    if "roberta" in ran:
        roberta = json.loads((tmp_path / "build" / "roberta" / "build" / "engine.json").read_text())
        assert [t["name"] for t in roberta["network"]["outputs"]] == ["logits"]
