"""Every family of transformers' causal-LM mapping (the installed transformers', not a hand-picked list): the cache
layout `trtflow init` reads for a tiny random config (`cli.init_generation.layout_from_config`: the model built with
its weights uninitialised, its cache read from its forward()) must be the one the model's own forward() caches with
initialised weights (read here through the cache's layers, not the code under test), or the family must be refused
by name (a cache that is not one key and one value per layer). A new family that transformers adds and that init
misreads fails here. The config's rule (`formats.generation.layout_of`) is only a cross-check: where it disagrees
with the model (transformers 5.25 caches Falcon's ``num_kv_heads`` where 5.24 broadcast them), the survey reports it
("ok; the config's rule differs: ..."), init says so, and the recipe follows the model. Falcon is also tried in each
of its attention variants (multi-query, multi-head, the new decoder architecture, ALiBi)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from trtflow.stage import StageFailed

#: A tiny shape for every config that has these fields (set only where the config class has the field).
SMALL = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
         "vocab_size": 128, "head_dim": 8, "num_hidden_layers": 2, "rotary_dim": 4, "pad_token_id": 0}
#: Multi-head latent attention sets its own head sizes (qk_rope_head_dim, v_head_dim): the generic ones stay out.
LATENT = ("head_dim", "num_key_value_heads")
#: Tiny models are built on the meta device and given uninitialised memory (shapes are what is checked): this many
#: parameters at most.
MAX_PARAMS = 3_000_000
VARIANTS = {"falcon": [{"multi_query": True}, {"multi_query": False},
                       {"new_decoder_architecture": True, "num_kv_heads": 2}, {"alibi": True, "multi_query": True}],
            "bloom": [{}], "gpt_bigcode": [{"multi_query": True}, {"multi_query": False}]}
#: Families whose forward() fails at a generic tiny config for reasons of the test's shape, not of init; each says why.
HARNESS = {
    "xmod": "forward() needs set_default_language() (a language adapter), which no config field sets",
    "reformer": "ReformerModelWithLMHead needs is_decoder=True and chunked-attention sizes a generic config lacks",
    "cohere_compass_text": "its layer types at 2 layers name no full_attention layer its model code looks up",
    "dbrx": "its attention sub-config keeps rope_theta apart from the generic fields",
    "deepseek_v2": "its router's top-k is unset at the default config",
    "dots1": "its MoE sizes at the generic config",
    "dots3_note_text": "its pad token id lives in a sub-config the generic fields do not reach",
    "gemma3n_text": "its shared-cache layer types do not shrink to 2 layers",
    "lfm2_moe": "its MoE layer list does not shrink to 2 layers",
    "xlstm": "its recurrent state sizes do not follow hidden_size",
}


def _has(config: Any, name: str) -> bool:
    try:
        return hasattr(config, name)
    except Exception:  # a heterogeneous config's per-layer field
        return True


def _tiny_config(model_type: str, extra: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    base = AutoConfig.for_model(model_type)  # transformers' defaults (raises where they do not validate)
    settable = [k for k in SMALL if _has(base, k) and not isinstance(getattr(type(base), k, None), property)]
    fields = {k: v for k, v in SMALL.items() if k in settable or k in getattr(type(base), "attribute_map", {})}
    if _has(base, "qk_rope_head_dim"):
        fields = {k: v for k, v in fields.items() if k not in LATENT}
    # a config whose own validation refuses the generic shape (a state-space block's sizes) keeps its other sizes
    tries = [fields, {k: v for k, v in fields.items() if k in ("num_hidden_layers", "vocab_size")}, {}]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for index, sizes in enumerate(tries):
            try:
                return AutoConfig.for_model(model_type, **sizes, **extra)
            except Exception:  # the config class's own validation: any exception type
                if index == len(tries) - 1:
                    raise


def _real_cache(config: Any) -> tuple[set[tuple[int, ...]], int] | str:
    """The key and value shapes (without batch and positions) the model's forward() caches, and the layer count; or
    why it caches no plain key/value per layer."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from trtflow_stages.formats.generation import ATTENTION_LAYERS

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    if sum(p.numel() for p in model.parameters()) > MAX_PARAMS:
        return "too large"
    with no_init_weights():  # buffers (position ids, rotary tables) as the model makes them; weights left as they are
        model = AutoModelForCausalLM.from_config(config).eval()
    for parameter in model.parameters():
        parameter.data.normal_(0, 0.02) if parameter.is_floating_point() else None
    ids = torch.ones((1, 3), dtype=torch.long)
    with torch.no_grad():
        result = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True)
    cache = result.get("past_key_values")
    layers = getattr(cache, "layers", None)
    if cache is None or layers is None or any(type(layer).__name__ not in ATTENTION_LAYERS for layer in layers):
        return "no key/value layers"
    return {(layer.keys.shape[1], layer.keys.shape[3], layer.values.shape[1], layer.values.shape[3])
            for layer in layers}, len(layers)


def _init_refuses(config: Any) -> str | None:
    """Why init refuses this config (its message), or None where it reads a layout."""
    from trtflow_stages.cli.init_generation import layout_from_config

    try:
        layout_from_config(config)
    except StageFailed as error:
        return error.message
    except Exception:  # the model's own code fails for init too: init then says so by its own error path
        return None
    return None


def families() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def survey(chosen: list[str] | None = None) -> list[tuple[str, str, str]]:
    """(family, variant, outcome) for every family of the mapping (or ``chosen``): "ok", "refused: ...",
    "skip: ..." or a failure ("FAIL: ...")."""
    import transformers

    from trtflow_stages.cli.init_generation import layout_from_config
    from trtflow_stages.formats.generation import context_limit

    transformers.logging.set_verbosity_error()
    rows = []
    for family in chosen if chosen is not None else families():
        for extra in VARIANTS.get(family, [{}]):
            variant = ",".join(f"{k}={v}" for k, v in extra.items())
            try:
                config = _tiny_config(family, extra)
            except ImportError as error:
                rows.append((family, variant, f"skip: needs an extra package ({error})"))
                continue
            except Exception as error:  # transformers' own default config of the family: any exception type
                rows.append((family, variant, "skip: transformers' own default config of this family does not "
                             f"validate ({' '.join(str(error).split())[:100]})"))
                continue
            text = config.get_text_config(decoder=True)
            if text is not config:
                inner = getattr(text, "model_type", "")
                outcome = (f"skip: a wrapper of the {inner!r} text family, tried under its own name"
                           if inner in families() else f"skip: a multimodal or audio "
                           f"wrapper whose decoder {inner!r} is no causal-LM family (Optimum exports no cache for it)")
                rows.append((family, variant, outcome))
                continue
            if getattr(config, "is_encoder_decoder", False):
                rows.append((family, variant, "skip: an encoder-decoder (issue 34 item 2)"))
                continue
            try:
                real = _real_cache(config)
                decoder = getattr(config, "is_decoder", None)
                if real == "no key/value layers" and decoder is False:
                    # BERT-style encoders with a causal head cache only as decoders: a config that says so
                    config = _tiny_config(family, {**extra, "is_decoder": True})
                    variant = ",".join([variant, "is_decoder=True"]).strip(",")
                    real = _real_cache(config)
            except ImportError as error:
                rows.append((family, variant, f"skip: needs an extra package ({error})"))
                continue
            except Exception as error:  # the model's own code
                refused = _init_refuses(config)
                outcome = f"skip: {HARNESS[family]}" if family in HARNESS else f"refused: {refused}" if refused \
                    else f"FAIL: forward() at a tiny config: {type(error).__name__}: {str(error)[:120]}"
                rows.append((family, variant, outcome))
                continue
            if real == "too large":
                rows.append((family, variant, "skip: over 3M parameters at the generic tiny config (time)"))
                continue
            try:
                layout, rule = layout_from_config(config)
            except StageFailed as error:
                # refused: right only where the model caches no plain key/value of one shape per layer
                plain = not isinstance(real, str) and len(real[0]) == 1 and \
                    (lambda s: s[0] == s[2] and s[1] == s[3])(next(iter(real[0])))
                # (or where transformers' own cache for the config holds other kinds of layer: "keeps a cache of")
                wrong = plain and "keeps a cache of" not in error.message
                rows.append((family, variant, f"FAIL: refused ({error.message}) but caches {real}" if wrong
                             else f"refused: {error.message}"))
                continue
            if real == "no key/value layers":
                rows.append((family, variant, f"FAIL: init reads {layout} but forward() returns no key/value cache"))
                continue
            want = ({(layout.kv_heads, layout.head_dim, layout.kv_heads, layout.head_dim)}, layout.layers)
            if real != want:
                rows.append((family, variant, f"FAIL: init reads {want}, the model caches {real}"))
            elif layout.context_length != context_limit(config):
                rows.append((family, variant, "FAIL: context"))
            else:
                rows.append((family, variant, "ok" if rule is None else f"ok; the config's rule differs: {rule}"))
    return rows


#: The mapping is surveyed in two halves, one per CI worker (about 15 s each on a loaded 2-core machine).
SHARDS = 2
NAMED = {"falcon", "bloom", "gpt2", "llama", "qwen2", "mistral", "gemma2", "gpt_bigcode", "phi3", "gpt_neox", "opt",
         "gptj", "mpt", "phi", "stablelm", "gemma", "codegen", "persimmon"}


@pytest.mark.parametrize("shard", range(SHARDS))
def test_init_reads_every_causal_lm_familys_cache_as_its_model_does(shard):
    chosen = families()[shard::SHARDS]
    rows = survey(chosen)
    failures = [row for row in rows if row[2].startswith("FAIL")]
    assert not failures, "\n".join(map(str, failures))
    ok = {family for family, _, outcome in rows if outcome.startswith("ok")}
    # the families of issue 34 and the zoo's, by name: a survey that silently skipped them would prove nothing
    assert NAMED & set(chosen) <= ok, sorted(NAMED & set(chosen) - ok)
    assert len(ok) >= len(chosen) // 3, sorted(ok)
    differ = [row for row in rows if row[2].startswith("ok; ")]
    if differ:  # reported, not failed: the recipe follows the model (what init prints and writes says so too)
        warnings.warn("the config's rule differs from the model's cache for " + "; ".join(map(str, differ)),
                      stacklevel=1)


def test_falcons_attention_flags_give_its_key_value_heads():
    """Each attention variant of Falcon is read as its model caches it, whichever rule the installed transformers
    follows (5.24 broadcast the new decoder architecture's num_kv_heads to every query head, 5.25 caches them)."""
    from trtflow_stages.cli.init_generation import layout_from_config

    rows = survey(["falcon"])
    assert len(rows) == len(VARIANTS["falcon"]) and all(outcome.startswith("ok") for _, _, outcome in rows), rows
    for extra, heads in (({"multi_query": True}, {1}), ({"multi_query": False}, {4}),
                         ({"new_decoder_architecture": True, "num_kv_heads": 2}, {2, 4})):
        assert layout_from_config(_tiny_config("falcon", extra))[0].kv_heads in heads, extra


def test_a_config_rule_that_disagrees_with_the_model_is_reported_and_the_model_followed(monkeypatch, tmp_path):
    """A transformers release that changes how a family caches (the config's rule then reads the old layout):
    `trtflow init` writes the model's layout, says how the rule differs, and the recipe's comment says it too."""
    from tests.conftest import trtflow_in_process
    from tests.stages.test_generation import save_family
    from trtflow_stages.formats import generation

    (tmp_path / "pyproject.toml").write_text("")
    save_family(tmp_path, "llama")
    right = generation.kv_heads_of
    monkeypatch.setattr(generation, "kv_heads_of", lambda text: right(text) * 2)  # the rule of another release
    proc = trtflow_in_process("init", "llama", "-o", "recipe.yaml", cwd=tmp_path)
    said = "key/value heads 4 by the config's fields, 2 in the model's cache"
    assert "(2 layers, 2 key/value heads of 8)" in proc.stderr and said in proc.stderr, proc.stderr
    text = (tmp_path / "recipe.yaml").read_text()
    assert f"# The cache layout is read from the model's forward(); its config's fields say otherwise ({said})" in text
    import yaml

    assert yaml.safe_load(text)["profiles"]["decode"]["past_key_values.0.key"]["max"][1] == 2


def test_alibi_models_have_no_context_bound():
    from trtflow_stages.formats.generation import layout_of

    assert layout_of(_tiny_config("bloom", {}), takes_position_ids=False).context_length == 0


@pytest.mark.parametrize("family", ["falcon_mqa", "bloom"])
def test_falcon_mqa_and_bloom_export_from_their_init_recipe(family, tmp_path):
    """The recipe init writes for Falcon with multi-query attention (one key/value head) and for BLOOM (ALiBi, no
    position table: the context from --dim) exports and matches PyTorch's greedy tokens (the node that failed)."""
    import yaml

    from tests.stages.test_generation import save_family
    from trtflow.testing import run_stage
    from trtflow_stages import export
    from trtflow_stages.cli.init_generation import scaffold
    from trtflow_stages.cli.init_recipe import flow

    save_family(tmp_path, family)
    dims = {"sequence_length": (1, 8, 24)} if family == "bloom" else {}
    plan = scaffold(tmp_path / family, family, family, family, (1, 1, 2), dims, None)
    assert plan.layout.kv_heads == (1 if family == "falcon_mqa" else 4)
    assert plan.context == (24 if family == "bloom" else 64) and plan.layout.context_length == (0 if family ==
                                                                                                   "bloom" else 64)
    recipe = yaml.safe_load(plan.render("schema.json", flow))
    params = recipe["nodes"][0]["params"]
    profiles = [{"name": name, "shapes": shapes} for name, shapes in recipe["profiles"].items()]
    result = run_stage(export.stage, {**params, "profiles": profiles}, workdir=tmp_path / "work",
                       recipe_dir=tmp_path)
    summary = result.summary
    assert summary["kv_cache"]["kv_heads"] == plan.layout.kv_heads
    check = summary["generation_check"]
    assert check["tokens_matched"] == [check["new_tokens"]] * len(check["tokens_matched"])
    assert len(check["reference_informative"]["reference_distinct_tokens"]) == len(check["tokens_matched"])


def test_a_degenerate_reference_draws_more_prompts_and_says_so(tmp_path):
    """Random prompts whose greedy reference repeats one token are replaced by more prompts drawn from the same
    seeded generator (the most informative kept); a file's prompts are kept and the record says the reference is
    degenerate."""
    import json

    import numpy as np

    from trtflow_stages.accuracy.generation import informative_reference
    from trtflow_stages.data.prompts import Prompts

    def generate(prompts, new_tokens):  # a model that repeats one token after a prompt starting with an even id
        return [(np.full(new_tokens, 7) if int(p[0]) % 2 == 0 else (np.arange(new_tokens) + p[0]) % 50,
                 np.zeros((new_tokens, 50))) for p in prompts]

    spec = Prompts(count=4, length=3, seed=0)
    prompts, _, record = informative_reference(spec, 50, 8, generate)
    assert len(prompts) == 4 and record["prompts_drawn"] > 4
    assert record["degenerate_prompts"] == 0 and record["reference_distinct_tokens"] == [8, 8, 8, 8]
    drawn = [p.tolist() for p in np.random.default_rng(0).integers(0, 50, size=(record["prompts_drawn"], 3))]
    assert all(p.tolist() in drawn and p[0] % 2 for p in prompts)  # drawn by the recipe's seed, the informative ones
    (tmp_path / "p.json").write_text(json.dumps([[2, 1], [4, 1]]))
    _, _, record = informative_reference(Prompts(path=str(tmp_path / "p.json")), 50, 8, generate)
    assert record["degenerate_prompts"] == 2 and "degenerate on 2 of 2 prompts" in record["note"]


def test_a_profile_with_other_cache_sizes_than_the_models_is_a_recipe_mismatch():
    """A recipe written for 4 key/value heads (init before issue 34, on a Falcon with multi_query) against a model
    that caches 1: refused by name (exit 2), not a size mismatch inside the exporter."""
    from trtflow.errors import RecipeMismatch
    from trtflow.stage import ProfileSpec
    from trtflow_stages.formats.generation import KvLayout, check_profiles

    written = KvLayout(layers=2, kv_heads=4, head_dim=8, vocab_size=128, context_length=64)
    profiles = [ProfileSpec.model_validate({"name": name, "shapes": shapes})
                for name, shapes in written.profiles((1, 1, 2), 64, 16).items()]
    model = KvLayout(layers=2, kv_heads=1, head_dim=8, vocab_size=128, context_length=64)
    with pytest.raises(RecipeMismatch, match=r"past_key_values.0.key at min is \[1, 4, 0, 8\], but the model caches "
                       r"\[batch, 1 key/value heads"):
        check_profiles(profiles, model)
    check_profiles(profiles, written)
