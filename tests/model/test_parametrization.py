"""The head-size parametrizations (fixedhead.model.parametrization): μP's rules on the head axis."""

import math

import pytest
import torch

from fixedhead import FixedHeadConfig, FixedHeadForCausalLM, FixedHeadForMaskedLM
from fixedhead.model.parametrization import attention_scale, learning_rate_multipliers


def cfg(**kw):
    base = dict(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, head_dim=32, intermediate_size=64
    )
    return FixedHeadConfig(**{**base, **kw})


def attn(model, layer=0):
    return model.fixedhead.encoder["layer"][layer].attention


def test_mup_at_its_base_is_the_standard_model():
    torch.manual_seed(0)
    standard = FixedHeadForMaskedLM(cfg())
    torch.manual_seed(0)
    mup = FixedHeadForMaskedLM(cfg(parametrization="mup", mup_base_head_dim=32))
    assert attn(mup).scale == attn(standard).scale == 1 / math.sqrt(32)
    for (name, a), b in zip(standard.state_dict().items(), mup.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert learning_rate_multipliers(mup) == {}  # width = base width: every factor is 1


def test_mup_rules_on_the_head_axis():
    # d_p = 32 against a base of 8 at the same h: width h·d_p is 4× the base width
    torch.manual_seed(0)
    model = FixedHeadForMaskedLM(cfg(parametrization="mup", mup_base_head_dim=8))
    a = attn(model)
    assert a.scale == pytest.approx(math.sqrt(8) / 32)  # μP: ∝ 1/d_p, equal to 1/√d_p at the base
    # W_o: std 0.02 × base width / width = 0.005 (1024 × 128 draws: the sample std is within 3%)
    assert a.out_proj.weight.std().item() == pytest.approx(0.02 / 4, rel=0.03)
    assert a.qkv.weight.std().item() == pytest.approx(0.02, rel=0.03)  # input-like weights unchanged
    names = learning_rate_multipliers(model)
    assert names == {f"fixedhead.encoder.layer.{i}.attention.out_proj.weight": 0.25 for i in range(2)}
    # base h differs from h: the head-count axis (8 heads of 32 against 4 of 8: 8× the width)
    wide = FixedHeadForMaskedLM(
        cfg(num_attention_heads=8, parametrization="mup", mup_base_head_dim=8, mup_base_num_attention_heads=4)
    )
    assert set(learning_rate_multipliers(wide).values()) == {1 / 8}
    assert attention_scale(FixedHeadConfig(hidden_size=32, num_attention_heads=4, attention_scale=0.5), 8) == 0.5


def test_zero_query_init_gives_uniform_attention_at_step_zero():
    torch.manual_seed(0)
    model = FixedHeadForCausalLM(cfg(query_init="zero", attention_probs_dropout_prob=0.0)).eval()
    inner = attn(model).inner_size
    assert attn(model).qkv.weight[:inner].abs().max().item() == 0.0
    assert attn(model).qkv.weight[inner:].std().item() == pytest.approx(0.02, rel=0.05)
    with torch.no_grad():
        probs = model(input_ids=torch.randint(0, 64, (2, 6)), output_attentions=True).attentions
    # logits all 0: query i attends uniformly to keys 0..i
    expected = torch.tril(torch.ones(6, 6)) / torch.arange(1, 7).unsqueeze(1)
    for p in probs:
        torch.testing.assert_close(p, expected.expand_as(p))


def test_a_saved_mup_model_loads_its_weights_unchanged(tmp_path):
    torch.manual_seed(0)
    model = FixedHeadForMaskedLM(cfg(parametrization="mup", mup_base_head_dim=8, query_init="zero"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)  # trained-like: a re-initialisation at load would show
    model.save_pretrained(str(tmp_path))
    loaded = FixedHeadForMaskedLM.from_pretrained(str(tmp_path))
    assert loaded.config.parametrization == "mup" and attn(loaded).scale == attn(model).scale
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(parametrization="mu-p"), "parametrization must be one of"),
        (dict(parametrization="mup"), "needs mup_base_head_dim"),
        (dict(parametrization="mup", mup_base_head_dim=0), "mup_base_head_dim must be a positive int"),
        (dict(mup_base_num_attention_heads=2.0), "mup_base_num_attention_heads must be a positive int"),
        (dict(attention_scale=0.0), "attention_scale must be a positive number"),
        (dict(attention_scale=float("nan")), "attention_scale must be a positive number"),
        (dict(query_init="zeros"), "query_init must be one of"),
    ],
)
def test_bad_parametrization_fields_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        cfg(**fields)


def test_trainer_gives_the_output_projections_their_learning_rate(tmp_path):
    from transformers import TrainingArguments

    from fixedhead.training.checkpoints import atomic_checkpoint_trainer

    model = FixedHeadForMaskedLM(cfg(parametrization="mup", mup_base_head_dim=8))
    args = TrainingArguments(output_dir=str(tmp_path), learning_rate=1e-3, weight_decay=0.01, report_to=[])
    optimizer = atomic_checkpoint_trainer()(model=model, args=args).create_optimizer()
    lr_of = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    decay_of = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        expected = 0.25e-3 if name.endswith("attention.out_proj.weight") else 1e-3
        assert lr_of[id(p)] == pytest.approx(expected), name
    out_proj = attn(model).out_proj
    assert decay_of[id(out_proj.weight)] == 0.01 and decay_of[id(out_proj.bias)] == 0.0  # Trainer's split kept
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
