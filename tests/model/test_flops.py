"""estimate_flops against PyTorch's own FLOP counter on real models, and the properties it must have."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from fixedhead.model.configuration import FixedHeadConfig
from fixedhead.model.modeling import FixedHeadForMaskedLM
from fixedhead.model.sizes import estimate_flops


def tiny(**kw):
    base = dict(
        vocab_size=10,
        hidden_size=4,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=8,
        max_position_embeddings=8,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    base.update(kw)
    return FixedHeadConfig(**base)


def test_fixed_over_standard_ratio_behaves():
    std = tiny(
        vocab_size=30522,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=128,
    )
    fixed = tiny(
        vocab_size=30522,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=16,
        head_dim=128,
        intermediate_size=1024,
        max_position_embeddings=128,
    )
    same = tiny(
        vocab_size=30522,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        head_dim=64,
        intermediate_size=1024,
        max_position_embeddings=128,
    )
    f_std, f_fixed = estimate_flops(std, 32, 128), estimate_flops(fixed, 32, 128)
    # a fixed head size equal to d/h is the standard layer: same cost
    assert estimate_flops(same, 32, 128) == f_std
    # 16 heads of 128 = an inner size of 2048 = 8·d: only the attention terms grow, so the
    # output layer (the same in both) adds the same to each
    enc_std = estimate_flops(std, 32, 128, masked_fraction=0.0)
    enc_fixed = estimate_flops(fixed, 32, 128, masked_fraction=0.0)
    assert f_fixed - enc_fixed == f_std - enc_std > 0
    assert 2.5 < f_fixed / f_std < 3.5
    # the ratio is the same in training and inference (backward is a constant 2× forward)
    assert f_fixed / f_std == pytest.approx(
        estimate_flops(fixed, 32, 128, training=False) / estimate_flops(std, 32, 128, training=False)
    )
    # full logits (BERT) cost more than scoring only masked positions
    assert estimate_flops(std, 32, 128, masked_fraction=1.0) > 2 * f_std


# (config changes, batch, seq, labelled positions): standard and fixed head sizes, an inner size
# h·d_p equal to d, below it, above it and 4·d, one and two layers
COUNTED = [
    (dict(), 2, 3, 3),  # d = 4, h = 2, d_p = d/h = 2
    (dict(head_dim=3), 2, 3, 3),  # fixed d_p = 3: inner size 6, not d
    (dict(num_hidden_layers=2), 2, 5, 4),
    (dict(num_hidden_layers=2, head_dim=3), 2, 5, 4),
    (dict(hidden_size=8, num_attention_heads=4, head_dim=1, intermediate_size=12), 3, 4, 1),  # inner size 4 < d
    (dict(hidden_size=8, num_attention_heads=2, head_dim=16, intermediate_size=12, vocab_size=30), 3, 7, 5),
]


@pytest.mark.parametrize("changes,batch,seq,labelled", COUNTED, ids=[f"case{i}" for i in range(len(COUNTED))])
def test_matches_torch_flop_counter(changes, batch, seq, labelled):
    """PyTorch's FlopCounterMode counts the matrix products the model really runs: an independent
    reference for the formula (forward + backward with labels, forward with labels, full logits)."""
    # eager attention: PyTorch's FlopCounterMode has no formula for the CPU SDPA kernel
    # (_scaled_dot_product_flash_attention_for_cpu), so with SDPA it would miss the QKᵀ and PV terms.
    cfg = tiny(**changes)
    cfg._attn_implementation = "eager"
    model = FixedHeadForMaskedLM(cfg)
    ids = torch.randint(1, cfg.vocab_size, (batch, seq))
    labels = torch.full((batch, seq), -100)
    labels.view(-1)[:labelled] = ids.view(-1)[:labelled]
    fraction = labelled / (batch * seq)
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=labels).loss.backward()
    assert counter.get_total_flops() == estimate_flops(cfg, batch, seq, masked_fraction=fraction, training=True)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=labels)
    assert counter.get_total_flops() == estimate_flops(cfg, batch, seq, masked_fraction=fraction, training=False)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids)  # no labels: full logits
    assert counter.get_total_flops() == estimate_flops(cfg, batch, seq, masked_fraction=1.0, training=False)


@pytest.mark.parametrize(
    "bad", [dict(batch_size=0), dict(seq_len=-1), dict(masked_fraction=1.5), dict(batch_size=True)]
)
def test_rejects_bad_arguments(bad):
    args = dict(batch_size=2, seq_len=3, masked_fraction=0.15)
    args.update(bad)
    with pytest.raises(ValueError):
        estimate_flops(tiny(), **args)


@pytest.mark.parametrize("head_dim, kv_heads", [(None, None), (16, None), (16, 2)])
def test_llama_flops_match_torch_flop_counter(head_dim, kv_heads):
    """The same independent reference for transformers' LlamaForCausalLM (eager attention, as above):
    a causal LM's output layer runs at every position."""
    from transformers import LlamaForCausalLM

    from fixedhead.model.architectures import build_config

    extra = {} if kv_heads is None else dict(num_key_value_heads=kv_heads)
    cfg = build_config(
        dict(
            architecture="llama",
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            head_dim=head_dim,
            intermediate_size=96,
            vocab_size=400,
            max_position_embeddings=32,
            **extra,
        )
    )
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(1, 400, (2, 24))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    assert counter.get_total_flops() == estimate_flops(cfg, 2, 24, masked_fraction=1.0, training=True)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids)
    assert counter.get_total_flops() == estimate_flops(cfg, 2, 24, masked_fraction=1.0, training=False)
