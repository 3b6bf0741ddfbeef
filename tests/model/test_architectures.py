"""fixedhead.model.architectures: a Llama-style decoder (transformers' own LlamaForCausalLM) sized
with fixedhead's field names, its parameter count, and what it refuses."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fixedhead.model.architectures import (
    build_config,
    is_fixed_head,
    new_model,
    objective_of,
)
from fixedhead.model.configuration import FixedHeadConfig
from fixedhead.model.parametrization import learning_rate_multipliers
from fixedhead.model.sizes import parameter_count
from fixedhead.training.settings import ModelSettings

SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=32, vocab_size=400)


def test_llama_fields_map_onto_llama_config_with_a_free_head_size():
    config = build_config(dict(SIZES, architecture="llama", head_dim=16, intermediate_size=64))
    assert isinstance(config, LlamaConfig)
    assert (config.head_dim, config.num_key_value_heads, config.intermediate_size) == (16, 4, 64)
    assert config.tie_word_embeddings and is_fixed_head(config) and objective_of(config) == "clm"
    model = LlamaForCausalLM(config)
    attn = model.model.layers[0].self_attn
    # q, k, v: d -> h·d_p = 64; output projection h·d_p -> d; the logit scale is BERT's 1/sqrt(d_p)
    assert attn.q_proj.weight.shape == (64, 32) and attn.k_proj.weight.shape == (64, 32)
    assert attn.o_proj.weight.shape == (32, 64) and attn.scaling == pytest.approx(16**-0.5)
    standard = build_config(dict(SIZES, architecture="llama"))
    assert standard.head_dim == 8 and not is_fixed_head(standard) and standard.intermediate_size == 4 * 32
    assert isinstance(build_config(SIZES), FixedHeadConfig)


@pytest.mark.parametrize("head_dim, tie", [(None, True), (16, True), (12, False)])
def test_llama_parameter_count_matches_the_formula_and_the_built_model(head_dim, tie):
    config = build_config(
        dict(SIZES, architecture="llama", head_dim=head_dim, intermediate_size=96, tie_word_embeddings=tie)
    )
    d, v, f, layers = 32, 400, 96, 2
    i = 4 * (head_dim or 8)
    # per layer: q, k, v (d·i each) and o (i·d); SwiGLU's gate, up and down (3·d·f); two RMSNorms.
    # Then the final norm, the embedding, and the output layer unless tied. No biases.
    expected = v * d + layers * (4 * d * i + 3 * d * f + 2 * d) + d + (0 if tie else v * d)
    assert parameter_count(config) == expected
    assert sum(p.numel() for p in LlamaForCausalLM(config).parameters()) == expected


def test_llama_models_get_no_mup_learning_rate_groups():
    model = new_model(build_config(dict(SIZES, architecture="llama", head_dim=16)), "clm")
    assert isinstance(model, LlamaForCausalLM) and learning_rate_multipliers(model) == {}
    from fixedhead.training.checkpoints import apply_learning_rate_multipliers

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    apply_learning_rate_multipliers(optimizer, model)
    assert [g["lr"] for g in optimizer.param_groups] == [1e-3]


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(head_dim=[8, 16]), r"one head size for every layer; got per-layer head_dim=\[8, 16\]"),
        (dict(parametrization="mup", mup_base_head_dim=8), "parametrization='mup' is an option of fixedhead's"),
        (dict(query_init="zero"), "query_init='zero' is an option of fixedhead's attention only"),
        (dict(attention_scale=0.5), "attention_scale=0.5 is an option of fixedhead's attention only"),
        (dict(hidden_dropout_prob=0.1), "attention dropout only .*hidden_dropout_prob=0.1"),
        (dict(head_dim=5), "LlamaConfig refuses .*'head_dim': 5.*even"),
        (dict(hidden_size=30), r"hidden size \(30\) is not a multiple of the number of attention heads \(4\)"),
        (dict(position_embedding_type="absolute"), "no field 'position_embedding_type'"),
        (dict(architecture="gpt"), "architecture must be one of fixedhead, llama, got 'gpt'"),
    ],
)
def test_llama_refuses_what_it_has_no_counterpart_for(fields, message):
    with pytest.raises(ValueError, match=message):
        build_config({**SIZES, "architecture": "llama", **fields})


def test_model_settings_build_llama_configs_and_refuse_fixedhead_only_options():
    config = ModelSettings(architecture="llama", hidden_size=32, num_attention_heads=4, head_dim=16).config(64)
    assert isinstance(config, LlamaConfig) and config.head_dim == 16 and config.max_position_embeddings == 64
    assert config.intermediate_size == 128  # the fixedhead default, 4d
    for kw, message in [
        (dict(head_dim=[8, 16]), "per-layer head_dim"),
        (dict(parametrization="mup", mup_base_head_dim=8), "parametrization='mup'"),
        (dict(query_init="zero"), "query_init='zero'"),
        (dict(attention_scale=0.25), "attention_scale=0.25"),
        (dict(dropout=0.1), "attention dropout only, and --dropout sets hidden dropout too; got dropout=0.1"),
    ]:
        with pytest.raises(ValueError, match=message):
            ModelSettings(architecture="llama", num_hidden_layers=2, **kw).config(64)
    with pytest.raises(ValueError, match="trains causal LMs only; got objective 'mlm'"):
        new_model(config, "mlm")
