"""Generation on PyTorch (`runtimes.torch_generation`): a static KV cache whose decode step makes no host
synchronisation (what lets it be captured as a CUDA graph on a GPU), tokens and logits equal to transformers'
generate for every family of the generation tests, the benchmark stage's backend torch, and the generation
clients that live for a whole level on their own threads. The CUDA graph capture itself runs only on a GPU
(bench/generation_gpu.py; its H100 results are in bench/results/generation/)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from pydantic import ValidationError

from tests.stages.test_generation import FAMILIES, save_family
from trtflow.testing import run_stage
from trtflow_stages import benchmark

#: Saved and loaded through `load_causal_lm` (BLOOM: transformers has no SDPA attention for it, the loader falls
#: back to its eager attention); the other families are built in memory, as fast.
SAVED = ("llama", "bloom")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("torch-lms")
    return {name: save_family(root, name) for name in SAVED}


def family_model(folders: dict[str, Path], family: str):
    import torch
    import transformers

    from trtflow_stages.runtimes.torch_generation import load_causal_lm

    if family in folders:
        return load_causal_lm(folders[family], "float32", "cpu", family)
    config_class, model_class, kwargs = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**kwargs)
    return getattr(transformers, model_class)._from_config(config, attn_implementation="sdpa").eval()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_static_decoder_generates_what_transformers_generates_without_a_host_sync(folders, family):
    from trtflow_stages.accuracy.generation import torch_reference
    from trtflow_stages.runtimes.generation import greedy
    from trtflow_stages.runtimes.torch_generation import counting_syncs, open_decoder

    model = family_model(folders, family)
    assert model.config._attn_implementation == ("eager" if family == "bloom" else "sdpa")  # BLOOM has no SDPA
    decoder = open_decoder(model, "cpu", 16, cuda_graphs=True, slots=1)
    prompts = [np.random.default_rng(seed).integers(0, 128, size=6) for seed in (1, 2)]
    for prompt, (tokens, logits) in zip(prompts, torch_reference(model, prompts, 4), strict=True):
        run = greedy(decoder, prompt.reshape(1, -1), 4)
        np.testing.assert_array_equal(run.tokens[0], tokens)
        np.testing.assert_allclose(run.logits[0], logits, atol=1e-4)
    logits, request = decoder.prefill(prompts[0].reshape(1, -1))
    with counting_syncs() as syncs:  # what a CUDA graph cannot hold: the host reading a device value
        decoder.step(decoder.pick(logits), request)
    assert syncs == {}
    second = decoder.prefill(prompts[1].reshape(1, -1))[1]  # two requests in flight: two cache slots
    assert decoder.describe()["slots"] == 2
    del request, second
    assert len(decoder._free[1]) == 2  # both given back when their requests were dropped
    described = decoder.describe()
    assert described["cuda_graphs"] is False and described["cuda_graphs_off"] == "not on a CUDA device"
    assert described["cache"] == "static (16 positions)"


def test_the_static_decoder_refuses_what_its_cache_cannot_hold(folders):
    from trtflow.stage import StageFailed
    from trtflow_stages.runtimes.torch_generation import load_causal_lm, open_decoder

    model = load_causal_lm(folders["llama"], "float32", "cpu", "llama")
    with pytest.raises(StageFailed, match="exceeds the model's context of 64"):
        open_decoder(model, "cpu", 65, cuda_graphs=False, slots=1)
    decoder = open_decoder(model, "cpu", 8, cuda_graphs=False, slots=1)
    with pytest.raises(StageFailed, match="a prompt of 8 tokens leaves no room"):
        decoder.prefill(np.zeros((1, 8), dtype=np.int64))
    with pytest.raises(StageFailed, match="cannot load 'nothing' as a causal LM"):
        load_causal_lm(folders["llama"].parent / "nothing", "float32", "cpu", "nothing")


def test_benchmark_times_generation_on_pytorch_in_its_dtype(folders, tmp_path):
    params = {"backend": "torch", "device": "cpu", "hf_model": "llama", "torch_dtype": "bfloat16",
              "generation": {"context_length": 8, "new_tokens": 4, "concurrency": [2]}, "repeats": 2,
              "min_duration_s": 0.05, "max_duration_s": 0.1, "min_iterations": 4, "warmup_ms": 0}
    result = run_stage(benchmark.stage, params, workdir=tmp_path, recipe_dir=folders["llama"].parent)
    (level,) = result.summary["generation"]
    assert result.summary["backend"] == "torch" and level["concurrency"] == 2 and level["requests"] >= 4
    for figure in (level["ttft_ms"], level["tpot_ms"]):
        low, high = figure["ci"]["p50"]
        assert figure["n"] == level["requests"] and 0 < low <= figure["p50"] <= high
    method = json.loads(result.outputs["metrics"].read_text())["method"]
    assert method["runs_on"] == "torch cpu bfloat16"
    assert method["torch"] == {"dtype": "bfloat16", "device": "cpu", "attention": "sdpa",
                               "cache": "static (12 positions)", "cuda_graphs": False, "slots": 2,
                               "captured_slots": 0, "cuda_graphs_off": "not on a CUDA device"}
    assert "llama" in benchmark.stage.files_for(benchmark.Params.model_validate(params))  # keyed by its files


def test_torch_generation_params_are_checked():
    base = {"backend": "torch", "generation": {"context_length": 8, "new_tokens": 4}}
    with pytest.raises(ValidationError, match="needs the causal LM: hf_model"):
        benchmark.Params.model_validate(base)
    with pytest.raises(ValidationError, match="not both"):
        benchmark.Params.model_validate({**base, "hf_model": "m", "torch_model": "python:f.py:make"})
    with pytest.raises(ValidationError, match="hf_model and torch_dtype apply to backend torch with generation"):
        benchmark.Params.model_validate({"backend": "onnxruntime", "torch_dtype": "float16",
                                         "generation": {"context_length": 8}})
    with pytest.raises(ValidationError, match="torch_cuda_graphs applies to backend torch on device cuda"):
        benchmark.Params.model_validate({**base, "hf_model": "m", "torch_cuda_graphs": True})  # device cpu
    on_gpu = {**base, "hf_model": "m", "device": "cuda"}
    assert benchmark.Params.model_validate(on_gpu).generation_cuda_graphs  # on by default for generation
    assert not benchmark.Params.model_validate({**on_gpu, "torch_cuda_graphs": False}).generation_cuda_graphs
    assert "transformers" in benchmark.stage.environment_for(benchmark.Params.model_validate(on_gpu))


class _Recording:
    """A decoder that records the thread of every call (a runtime's per-thread state, made visible)."""

    def __init__(self) -> None:
        from trtflow_stages.formats.generation import KvLayout

        self.layout = KvLayout(1, 1, 1, 16, 64)
        self.threads: list[int] = []

    def prefill(self, ids):
        self.threads.append(threading.get_ident())
        return np.zeros((ids.shape[0], 16)), 0

    def step(self, tokens, cache):
        return np.zeros((len(tokens), 16)), cache + 1

    def pick(self, logits):
        return logits.argmax(axis=-1)

    def numpy(self, logits):
        return logits


def test_generation_clients_live_for_the_level_and_warm_up_on_their_own_threads():
    # the fp16 slowness (bench/results/generation/h100-torch-diagnose.log): cuDNN's attention builds its graphs per
    # shape and per thread, and the clients were new threads in every window: every timed step paid for them
    from trtflow_stages.measure.serving.generation import measure_level, random_prompts
    from trtflow_stages.measure.statistics.intervals import Precision
    from trtflow_stages.measure.timing.windows import WindowPlan

    decoder = _Recording()
    prompts = random_prompts(8, 4, SimpleNamespace(vocab_size=16), 0)
    level = measure_level(decoder, prompts, 3, 2, WindowPlan(4, 8, 0.02, 0.04, Precision(5.0)), warmup_requests=2)
    assert level["windows"] >= 4 and level["requests"] >= 8
    clients = set(decoder.threads)
    assert len(clients) == 2 and threading.get_ident() not in clients  # the same two threads in every window
    assert len(decoder.threads) == level["requests"] + 2 * 2  # the warm-up requests ran on those threads
    assert not [thread for thread in threading.enumerate() if thread.ident in clients]  # ended with the level


def test_a_client_that_fails_stops_the_level_with_its_error():
    from trtflow_stages.measure.serving.generation import measure_level, random_prompts
    from trtflow_stages.measure.statistics.intervals import Precision
    from trtflow_stages.measure.timing.windows import WindowPlan

    class Failing(_Recording):
        def prefill(self, ids):
            if len(self.threads) >= 5:
                raise RuntimeError("the runtime broke")
            return super().prefill(ids)

    decoder = Failing()
    with pytest.raises(RuntimeError, match="the runtime broke"):
        measure_level(decoder, random_prompts(4, 4, SimpleNamespace(vocab_size=16), 0), 3, 2,
                      WindowPlan(50, 8, 1.0, 2.0, Precision(5.0)))
    assert not [thread for thread in threading.enumerate() if thread.ident in set(decoder.threads)]


def test_a_torch_model_factory_must_return_a_causal_lm(tmp_path):
    from trtflow.stage import StageFailed
    from trtflow_stages.runtimes.generation import greedy
    from trtflow_stages.runtimes.torch_generation import open_decoder, prepare_model

    (tmp_path / "factory.py").write_text("import torch\n\ndef make():\n    return torch.nn.Linear(2, 2)\n")
    params = {"backend": "torch", "torch_model": "python:factory.py:make",
              "generation": {"context_length": 4, "new_tokens": 2}}
    with pytest.raises(StageFailed, match="returned a Linear, not a Hugging Face causal LM"):
        run_stage(benchmark.stage, params, workdir=tmp_path / "w", recipe_dir=tmp_path)
    model = prepare_model(family_model({}, "gpt2"), "bfloat16", "cpu")  # a factory's model: moved to its dtype
    assert next(model.parameters()).dtype.is_floating_point and str(next(model.parameters()).dtype) == "torch.bfloat16"
    run = greedy(open_decoder(model, "cpu", 8, cuda_graphs=True, slots=1), np.zeros((1, 4), dtype=np.int64), 3)
    assert run.tokens.shape == (1, 3)
