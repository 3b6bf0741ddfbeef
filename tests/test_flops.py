"""estimate_flops against a hand derivation and against PyTorch's own FLOP counter."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from fixedhead.configuration import FixedHeadConfig
from fixedhead.flops import estimate_flops
from fixedhead.modeling import FixedHeadForMaskedLM


def tiny(**kw):
    base = dict(
        vocab_size=10, hidden_size=4, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
        max_position_embeddings=8, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    base.update(kw)
    return FixedHeadConfig(**base)


def test_hand_derivation_tiny_standard():
    # d=4, i=h·d_p=2·2=4, f=8, v=10, l=1, n=3, B=2 -> T=6 tokens, M=round(0.5·6)=3 scored.
    # per token and layer: qkv 2·4·12=96, W_o 2·4·4=32, QKᵀ 2·3·4=24, PV 24, FFN 2·2·4·8=128 -> 304
    # MLM head per scored position: 2·4·4 + 2·4·10 = 112
    forward = 6 * 304 + 3 * 112
    assert forward == 2160
    cfg = tiny()
    assert estimate_flops(cfg, 2, 3, masked_fraction=0.5, training=False) == forward
    assert estimate_flops(cfg, 2, 3, masked_fraction=0.5, training=True) == 3 * forward


def test_hand_derivation_tiny_fixed_head():
    # fixed head size d_p=3 with h=2 -> i=6 (not d): qkv 2·4·18=144, W_o 2·6·4=48, QKᵀ 2·3·6=36,
    # PV 36, FFN 128 -> 392 per token; the MLM head does not depend on the head size.
    cfg = tiny(head_dim=3)
    assert estimate_flops(cfg, 2, 3, masked_fraction=0.5, training=False) == 6 * 392 + 3 * 112


def test_fixed_over_standard_ratio_behaves():
    std = tiny(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
               intermediate_size=1024, max_position_embeddings=128)
    fixed = tiny(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=16,
                 head_dim=128, intermediate_size=1024, max_position_embeddings=128)
    same = tiny(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                head_dim=64, intermediate_size=1024, max_position_embeddings=128)
    f_std, f_fixed = estimate_flops(std, 32, 128), estimate_flops(fixed, 32, 128)
    # a fixed head size equal to d/h is the standard layer: same cost
    assert estimate_flops(same, 32, 128) == f_std
    # 16 heads of 128 = an inner size of 2048 = 8·d: the attention terms grow 8×, the rest does not
    enc_std = estimate_flops(std, 32, 128, masked_fraction=0.0)
    enc_fixed = estimate_flops(fixed, 32, 128, masked_fraction=0.0)
    attn_std = 3 * 32 * 128 * 4 * (8 * 256 * 256 + 4 * 128 * 256)
    assert enc_fixed - enc_std == 7 * attn_std
    assert 2.5 < f_fixed / f_std < 3.5
    # the ratio is the same in training and inference (backward is a constant 2× forward)
    assert f_fixed / f_std == pytest.approx(
        estimate_flops(fixed, 32, 128, training=False) / estimate_flops(std, 32, 128, training=False)
    )
    # full logits (BERT) cost more than scoring only masked positions
    assert estimate_flops(std, 32, 128, masked_fraction=1.0) > 2 * f_std


@pytest.mark.parametrize("head_dim", [None, 3])
def test_matches_torch_flop_counter(head_dim):
    # eager attention: PyTorch's FlopCounterMode has no formula for the CPU SDPA kernel
    # (_scaled_dot_product_flash_attention_for_cpu), so with SDPA it would miss the QKᵀ and PV terms.
    torch.manual_seed(0)
    cfg = tiny(head_dim=head_dim, num_hidden_layers=2)
    cfg._attn_implementation = "eager"
    model = FixedHeadForMaskedLM(cfg)
    batch, seq = 2, 5
    ids = torch.randint(1, 10, (batch, seq))
    labels = torch.full((batch, seq), -100)
    labels.view(-1)[:4] = ids.view(-1)[:4]  # 4 of 10 positions scored
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=labels).loss.backward()
    assert counter.get_total_flops() == estimate_flops(cfg, batch, seq, masked_fraction=0.4, training=True)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids)  # no labels: full logits
    assert counter.get_total_flops() == estimate_flops(cfg, batch, seq, masked_fraction=1.0, training=False)


@pytest.mark.parametrize("bad", [dict(batch_size=0), dict(seq_len=-1), dict(masked_fraction=1.5), dict(batch_size=True)])
def test_rejects_bad_arguments(bad):
    args = dict(batch_size=2, seq_len=3, masked_fraction=0.15)
    args.update(bad)
    with pytest.raises(ValueError):
        estimate_flops(tiny(), **args)
