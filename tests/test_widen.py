"""Per-layer head sizes (config, counts, FLOPs, CLI) and exact head widening (issue 16 items 1-3)."""

from __future__ import annotations

import json

import pytest
import torch

from fixedhead import (
    FixedHeadConfig,
    FixedHeadForMaskedLM,
    FixedHeadModel,
    count_parameters,
)
from fixedhead.attention import MultiHeadAttention
from fixedhead.cli import main, parse_head_dim
from fixedhead.flops import estimate_flops

D, H, L, V, F = 32, 4, 4, 60, 48


def cfg(head_dim=None, **kw):
    base = dict(
        vocab_size=V,
        hidden_size=D,
        num_hidden_layers=L,
        num_attention_heads=H,
        head_dim=head_dim,
        intermediate_size=F,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    base.update(kw)
    return FixedHeadConfig(**base)


# ------------------------------------------------------------------------ per-layer configs
def test_per_layer_config_resolves_and_round_trips(tmp_path):
    c = cfg([None, 6, 16, None])
    assert c.layer_head_dims == [8, 6, 16, 8]
    assert c.is_fixed_head and c.head_size_label == [8, 6, 16, 8]
    with pytest.raises(ValueError, match="layer_head_dims"):
        c.attention_head_size  # noqa: B018 (differs per layer: no single d_p)
    model = FixedHeadForMaskedLM(c)
    assert [m.head_dim for m in model.modules() if isinstance(m, MultiHeadAttention)] == [8, 6, 16, 8]
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["head_dim"] == [None, 6, 16, None]
    again = FixedHeadForMaskedLM.from_pretrained(tmp_path)
    assert again.config.head_dim == [None, 6, 16, None]
    for (n, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), n


def test_scalar_configs_keep_their_behaviour():
    assert cfg(None).attention_head_size == 8 and not cfg(None).is_fixed_head
    assert cfg(12).attention_head_size == 12 and cfg(12).layer_head_dims == [12] * L
    assert cfg([None] * L).attention_head_size == 8 and not cfg([None] * L).is_fixed_head
    assert cfg(12).to_dict()["head_dim"] == 12


@pytest.mark.parametrize(
    "bad, match",
    [
        ([8, 8, 8], r"one entry per layer \(num_hidden_layers=4\), got 3"),
        ([8, 0, 8, 8], r"head_dim\[1\] \(layer 1\).*positive int, got 0"),
        ([8, 8, 2.5, 8], r"head_dim\[2\].*2.5"),
        ([8, 8, 8, True], r"head_dim\[3\]"),
    ],
)
def test_per_layer_config_errors_name_the_entry(bad, match):
    with pytest.raises(ValueError, match=match):
        cfg(bad)


def test_per_layer_none_needs_divisibility():
    with pytest.raises(ValueError, match=r"head_dim\[0\].*divisible"):
        cfg([None, 8, 8, 8], hidden_size=30, num_attention_heads=4)


def test_count_and_flops_per_layer_against_a_hand_count():
    c = cfg([None, 6, 16, None])
    emb = V * D + 16 * D + 2 * D + 2 * D
    layers = 0
    for dp in (8, 6, 16, 8):
        i = H * dp
        layers += 3 * (D * i + i) + (i * D + D) + (D * F + F) + (F * D + D) + 4 * D
    mlm = D * D + D + 2 * D + V
    assert count_parameters(c, pooler=False) == emb + layers + mlm
    assert count_parameters(c, pooler=False) == sum(p.numel() for p in FixedHeadForMaskedLM(c).parameters())
    assert count_parameters(c) == sum(p.numel() for p in FixedHeadModel(c).parameters()) + mlm
    n = 10
    per_token = sum(8 * D * H * dp + 4 * n * H * dp + 4 * D * F for dp in (8, 6, 16, 8))
    assert estimate_flops(c, 2, n, masked_fraction=1.0, training=False) == 2 * n * per_token + 2 * n * (
        2 * D * D + 2 * D * V
    )
    # a uniform list counts as the scalar does
    assert estimate_flops(cfg([12] * L), 3, n) == estimate_flops(cfg(12), 3, n)
    assert count_parameters(cfg([12] * L)) == count_parameters(cfg(12))


def test_cli_head_dim_lists(capsys):
    assert parse_head_dim("64") == 64 and parse_head_dim(None) is None
    assert parse_head_dim("64,64,128,128") == [64, 64, 128, 128]
    assert parse_head_dim("none,16") == [None, 16]
    argv = ["count", "--hidden-size", "32", "--num-attention-heads", "4", "--num-hidden-layers", "4"]
    assert main([*argv, "--head-dim", "8,8,16,16"]) == 0
    out = capsys.readouterr().out
    want = cfg([8, 8, 16, 16], vocab_size=30522, intermediate_size=128, max_position_embeddings=512)
    assert f"{count_parameters(want):,} parameters" in out
    assert "d_p=[8, 8, 16, 16]" in out
    assert main([*argv, "--head-dim", "8,x"]) == 2
    assert "--head-dim takes an int or a comma-separated list" in capsys.readouterr().err
    assert main([*argv, "--head-dim", "8,8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "one entry per layer" in err


def test_analyze_reads_per_layer_head_sizes():
    from fixedhead.analysis import _head_dims

    assert _head_dims(FixedHeadForMaskedLM(cfg([None, 6, 16, None]))) == [8, 6, 16, 8]
