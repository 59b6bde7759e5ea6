"""Every family of transformers' seq2seq-LM and speech-seq2seq mappings (the installed transformers', not a
hand-picked list) either goes through `formats.seq2seq` -- its cache layout read from the model's own forward(), and
greedy generation through the two wrapped graphs (the encoder's cross-attention cache fed to the decoder, the
self-attention cache grown step by step) equal to transformers' generate token for token -- or is refused by name
with a StageFailed that says why. A family transformers adds that neither works nor is refused fails here."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from trtflow.stage import StageFailed

#: A tiny shape, set where the config class has the field.
SMALL = {"d_model": 32, "hidden_size": 32, "encoder_layers": 2, "decoder_layers": 2, "num_layers": 2,
         "num_decoder_layers": 2, "num_hidden_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
         "num_heads": 4, "num_attention_heads": 4, "d_kv": 8, "d_ff": 64, "encoder_ffn_dim": 64,
         "decoder_ffn_dim": 64, "intermediate_size": 64, "vocab_size": 96, "max_position_embeddings": 64,
         "max_target_positions": 64, "max_source_positions": 16, "num_mel_bins": 8}
#: Special tokens within the tiny vocabulary, set on every config (real checkpoints' configs carry them).
TOKENS = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2}
MAX_PARAMS = 3_000_000
NEW_TOKENS = 3


def families() -> list[str]:
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES,
    )

    return sorted({*MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, *MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES})


def _tiny_model(family: str) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoModelForSpeechSeq2Seq
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES

    from trtflow_stages.formats.seq2seq import check_encoder_decoder

    base = AutoConfig.for_model(family)
    check_encoder_decoder(base)  # refused from the config alone: nothing built
    fields = {k: v for k, v in SMALL.items() if hasattr(base, k) or k in getattr(type(base), "attribute_map", {})}
    config = AutoConfig.for_model(family, **fields, **TOKENS)
    auto = AutoModelForSeq2SeqLM if family in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES else \
        AutoModelForSpeechSeq2Seq
    with torch.device("meta"):
        meta = auto.from_config(config)
    if sum(p.numel() for p in meta.parameters()) > MAX_PARAMS:
        return "too large"
    torch.manual_seed(0)
    model = auto.from_config(config, attn_implementation="eager").eval()
    for parameter in model.parameters():
        parameter.data.normal_(0, 0.3)  # informative references: random ids give varied tokens
    return model


def _outcome(family: str) -> str:
    import numpy as np

    from trtflow_stages.accuracy.generation import seq2seq_reference
    from trtflow_stages.formats.seq2seq import layout_of, wrap
    from trtflow_stages.runtimes.generation import greedy
    from trtflow_stages.runtimes.seq2seq import torch_encoder

    try:
        model = _tiny_model(family)
    except StageFailed as error:
        return f"refused: {error.message}"
    except ImportError as error:
        return f"skip: needs an extra package ({error})"
    except Exception as error:  # transformers' own default config of the family: any exception type
        return f"skip: the family's tiny config does not build ({' '.join(str(error).split())[:120]})"
    if isinstance(model, str):
        return f"skip: {model}"
    try:
        layout = layout_of(model)
    except StageFailed as error:
        return f"refused: {error.message}"
    decoder = TorchSeq2Seq(wrap(model, "decoder", layout).module, torch_encoder(wrap(model, "encoder", layout).module),
                           layout)
    sources = layout.sources(1, 5, 0)
    for source, (tokens, logits) in zip(sources, seq2seq_reference(model, sources, NEW_TOKENS), strict=True):
        run = greedy(decoder, source[None, ...], NEW_TOKENS)
        if run.tokens[0].tolist() != tokens.tolist():
            return f"FAIL: tokens {run.tokens[0].tolist()} != generate's {tokens.tolist()}"
        if not np.allclose(run.logits[0], logits, atol=1e-4, rtol=1e-3):
            return f"FAIL: logits differ by {np.abs(run.logits[0] - logits).max():.3g}"
    return "ok"


class TorchSeq2Seq:
    """The wrapped decoder graph (PyTorch, as exported) as a `runtimes.generation` decoder: the seq2seq runtime's
    loop with the graph called in place of an ONNX Runtime session."""

    def __init__(self, module: Any, encode: Any, layout: Any) -> None:
        from trtflow_stages.runtimes.seq2seq import OrtSeq2SeqDecoder

        self.inner = OrtSeq2SeqDecoder(self, encode, layout)
        self.module = module
        self.layout = layout

    def run(self, names: list[str], feed: dict[str, Any]) -> list[Any]:
        import torch

        tensors = [torch.from_numpy(feed[name]) for name in self.layout.input_names]
        with torch.inference_mode():
            return [t.numpy() for t in self.module(*tensors)]

    def prefill(self, source: Any) -> Any:
        return self.inner.prefill(source)

    def step(self, tokens: Any, cache: Any) -> Any:
        return self.inner.step(tokens, cache)

    def pick(self, logits: Any) -> Any:
        return logits.argmax(axis=-1)

    def numpy(self, logits: Any) -> Any:
        return logits


#: Families each must go through (the issue's own list): never skipped or refused.
REQUIRED = ("t5", "bart", "marian", "whisper")


@pytest.mark.parametrize("family", families())
def test_every_seq2seq_family_generates_or_is_refused_by_name(family: str) -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcome = _outcome(family)
    assert not outcome.startswith("FAIL"), f"{family}: {outcome}"
    if family in REQUIRED:
        assert outcome == "ok", f"{family}: {outcome}"
    if outcome.startswith("refused"):  # by name: the model type and why
        assert repr(family) in outcome, outcome
    print(f"{family}: {outcome}")


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Any:
    """Tiny models: one thread (torch's default pool of threads thrashes on a shared host, 100x slower)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("family", ["qwen2_audio"])
def test_a_decoder_only_family_of_the_mapping_is_refused_with_the_decoder_only_hint(family: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    from trtflow_stages.formats.seq2seq import layout_of

    with torch.device("meta"):  # refused from its config, before anything runs
        model = AutoModelForSeq2SeqLM.from_config(AutoConfig.for_model(family))

    with pytest.raises(StageFailed) as caught:
        layout_of(model)
    assert "not an encoder-decoder" in caught.value.message and "text-generation-with-past" in (caught.value.hint or "")
