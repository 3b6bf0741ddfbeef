"""Per-layer head sizes (config, counts, FLOPs, CLI) and exact head widening (issue 16 items 1-3)."""

from __future__ import annotations

import json

import pytest
import torch

from fixedhead import (
    FixedHeadConfig,
    FixedHeadForCausalLM,
    FixedHeadForMaskedLM,
    FixedHeadForSequenceClassification,
    FixedHeadModel,
    count_parameters,
    from_bert,
    widen_heads,
)
from fixedhead.cli import main
from fixedhead.model.attention import MultiHeadAttention
from fixedhead.model.sizes import estimate_flops
from fixedhead.options import parse_head_dim
from fixedhead.training.widen import WIDEN_FILE

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
    with pytest.raises(SystemExit) as info:  # argparse's usage error, as for any unparsable option
        main([*argv, "--head-dim", "8,x"])
    assert info.value.code == 2 and "invalid int value: 'x'" in capsys.readouterr().err
    assert main([*argv, "--head-dim", "8,8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "one entry per layer" in err


def test_analyze_reads_per_layer_head_sizes():
    from fixedhead.diagnostics.analysis import analyze_model

    result = analyze_model(FixedHeadForMaskedLM(cfg([None, 6, 16, None])), torch.randint(0, V, (1, 10)))
    assert result.head_dims == [8, 6, 16, 8]


# ------------------------------------------------------------------------------- widening
def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 9:] = 0  # padding too
    return ids, mask


def _trained_like(model, seed=0):
    """Perturb every weight so no structure of the fresh init (zero biases) hides a mistake."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


CASES = [
    # (model class, original head_dim, new head_dim)
    (FixedHeadForMaskedLM, None, 16),  # standard -> uniform fixed
    (FixedHeadForMaskedLM, 6, 20),  # fixed -> uniform fixed
    (FixedHeadForMaskedLM, None, [8, 12, 16, 24]),  # standard -> per layer (layer 0 unchanged)
    (FixedHeadForCausalLM, 6, [None, 9, 6, 32]),  # causal, fixed -> per layer
    (FixedHeadForCausalLM, [None, 6, 16, 8], 32),  # per layer -> uniform
    (FixedHeadForSequenceClassification, 10, 12),
]


@pytest.mark.parametrize("cls, old, new", CASES)
def test_widened_model_computes_the_same_function(cls, old, new):
    model = _trained_like(cls(cfg(old, num_labels=3))).eval()
    wide = widen_heads(model, new, init_std=0.05).eval()
    ids, mask = _inputs()
    with torch.no_grad():
        a, b = model(ids, attention_mask=mask).logits, wide(ids, attention_mask=mask).logits
    assert (a - b).abs().max().item() <= 1e-5
    want = cfg(old).layer_head_dims if new is None else ([new] * L if isinstance(new, int) else new)
    want = [w if w is not None else o for w, o in zip(want, cfg(old).layer_head_dims, strict=True)]
    assert wide.config.layer_head_dims == want
    assert [m.head_dim for m in wide.modules() if isinstance(m, MultiHeadAttention)] == want
    assert wide.config.head_dim == (new if isinstance(new, int) else want)
    # the original is untouched, the count follows the new config
    assert model.config.head_dim == old
    assert sum(p.numel() for p in wide.parameters()) == sum(p.numel() for p in cls(wide.config).parameters())


def test_widened_causal_model_generates_the_same_with_a_cache():
    model = _trained_like(FixedHeadForCausalLM(cfg(6))).eval()
    wide = widen_heads(model, 16, init_std=0.05).eval()
    ids, _ = _inputs()
    a = model.generate(ids[:, :4], max_new_tokens=6, do_sample=False, pad_token_id=0)
    b = wide.generate(ids[:, :4], max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(a, b)


def test_widened_converted_bert_matches_bert():
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    bert = BertForMaskedLM(
        BertConfig(
            vocab_size=V,
            hidden_size=D,
            num_hidden_layers=2,
            num_attention_heads=H,
            intermediate_size=F,
            max_position_embeddings=16,
            attn_implementation="eager",
        )
    ).eval()
    wide = widen_heads(from_bert(bert), 24).eval()
    ids, mask = _inputs()
    with torch.no_grad():
        diff = (bert(ids, attention_mask=mask).logits - wide(ids, attention_mask=mask).logits).abs().max().item()
    assert diff <= 1e-5
    assert wide.config.head_dim == 24 and wide.config.is_fixed_head


def test_widened_model_saves_and_reloads(tmp_path):
    model = _trained_like(FixedHeadForMaskedLM(cfg(None))).eval()
    wide = widen_heads(model, [8, 12, 16, 8]).eval()
    wide.save_pretrained(tmp_path)
    again = FixedHeadForMaskedLM.from_pretrained(tmp_path).eval()
    ids, mask = _inputs()
    with torch.no_grad():
        assert torch.equal(wide(ids, attention_mask=mask).logits, again(ids, attention_mask=mask).logits)


@pytest.mark.parametrize("new", [8, [8] * L, None])
def test_widening_to_the_same_size_is_the_identity(new):
    model = _trained_like(FixedHeadForMaskedLM(cfg(None)))
    wide = widen_heads(model, new)
    assert wide is not model
    assert wide.config.layer_head_dims == model.config.layer_head_dims
    for (n, a), (_, b) in zip(model.state_dict().items(), wide.state_dict().items(), strict=True):
        assert torch.equal(a, b), n


def test_widening_is_reproducible_and_keeps_dtype():
    model = FixedHeadForMaskedLM(cfg(6)).to(torch.float64)
    a, b = widen_heads(model, 10, seed=3), widen_heads(model, 10, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert all(p.dtype == torch.float64 for p in a.parameters())
    c = widen_heads(model, 10, seed=4)
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters(), strict=True))


def test_widening_refuses_smaller_or_malformed_sizes():
    model = FixedHeadForMaskedLM(cfg([8, 6, 16, 8]))
    with pytest.raises(ValueError, match="head_dim=12 for layer 2 is smaller than its current head size 16"):
        widen_heads(model, 12)
    with pytest.raises(ValueError, match="one entry per layer"):
        widen_heads(model, [16, 16])
    with pytest.raises(ValueError, match="positive int"):
        widen_heads(model, [16, 16, 16, 0])
    with pytest.raises(ValueError, match="init_std"):
        widen_heads(model, 16, init_std=0.0)


def _new_entries(model_old_dims, wide):
    """(name, tensor of the new entries' gradients) for every new weight of every widened layer."""
    out = []
    layers = [m for m in wide.modules() if isinstance(m, MultiHeadAttention)]
    for layer, (old, m) in enumerate(zip(model_old_dims, layers, strict=True)):
        h, dp, d = m.num_attention_heads, m.head_dim, m.hidden_size
        if dp == old:
            continue
        gw = m.qkv.weight.grad.view(3, h, dp, d)
        gb = m.qkv.bias.grad.view(3, h, dp)
        go = m.out_proj.weight.grad.view(d, h, dp)
        out += [
            (f"layer {layer} new q rows", gw[0, :, old:]),
            (f"layer {layer} new k rows", gw[1, :, old:]),
            (f"layer {layer} new v rows", gw[2, :, old:]),
            (f"layer {layer} new q bias", gb[0, :, old:]),
            (f"layer {layer} new v bias", gb[2, :, old:]),
            (f"layer {layer} new out_proj columns", go[:, :, old:]),
        ]
    return out


def _mlm_step(model, ids, mask):
    labels = ids.clone()
    labels[:, ::2] = -100
    model.zero_grad()
    model(ids, attention_mask=mask, labels=labels).loss.backward()


@pytest.mark.parametrize("cls, old, new", [(FixedHeadForMaskedLM, None, 16), (FixedHeadForCausalLM, 6, [6, 9, 12, 24])])
def test_every_new_weight_learns_after_one_step(cls, old, new):
    torch.manual_seed(0)
    model = _trained_like(cls(cfg(old)))
    wide = widen_heads(model, new).train()
    opt = torch.optim.SGD(wide.parameters(), lr=0.5)
    ids, mask = _inputs()
    _mlm_step(wide, ids, mask)
    # first backward: the zero sides (k rows, out_proj columns) already get gradients
    first = dict(_new_entries(model.config.layer_head_dims, wide))
    for name, grad in first.items():
        if "new k rows" in name:
            assert (grad.abs().sum(-1) > 0).all(), name
        if "out_proj" in name:
            assert (grad.abs().sum(0) > 0).all(), name
    opt.step()
    _mlm_step(wide, ids, mask)
    for name, grad in _new_entries(model.config.layer_head_dims, wide):
        # every new row (per head, per new dimension), bias entry and out_proj column moves
        if "bias" in name:
            nonzero = grad.abs() > 0  # [h, new]
        elif "out_proj" in name:
            nonzero = grad.abs().sum(0) > 0  # [d, h, new] -> per column
        else:
            nonzero = grad.abs().sum(-1) > 0  # [h, new, d] -> per row
        assert nonzero.all(), name


def test_zero_padding_both_sides_would_never_learn():
    """The trap the construction avoids: with q and k (and v and out_proj) both zero-padded the new
    weights get exactly zero gradient, step after step."""
    torch.manual_seed(0)
    model = _trained_like(FixedHeadForMaskedLM(cfg(None)))
    wide = widen_heads(model, 16)
    with torch.no_grad():
        for m in wide.modules():
            if isinstance(m, MultiHeadAttention):
                m.qkv.weight.view(3, H, 16, D)[:, :, 8:] = 0
    opt = torch.optim.SGD(wide.parameters(), lr=0.5)
    ids, mask = _inputs()
    for _ in range(2):
        _mlm_step(wide, ids, mask)
        for name, grad in _new_entries([8] * L, wide):
            if "bias" not in name:
                assert grad.abs().max().item() == 0, name
        opt.step()


# ------------------------------------------------------------------------------------ CLI
def _save_run(path, config, cls):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertTokenizerFast

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c"])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = BertTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    model = _trained_like(cls(config)).eval()
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return model


@pytest.mark.parametrize("cls, old", [(FixedHeadForMaskedLM, None), (FixedHeadForCausalLM, 6)])
def test_cli_widen_writes_an_equivalent_run(tmp_path, capsys, cls, old):
    from fixedhead.runs import open_run

    src = tmp_path / "run"
    model = _save_run(src, cfg(old, is_decoder=cls is FixedHeadForCausalLM), cls)
    out = tmp_path / "wide"
    assert main(["widen", str(src), "--head-dim", "8,12,16,16", "--output-dir", str(out)]) == 0
    assert "-> [8, 12, 16, 16]" in capsys.readouterr().out
    record = json.loads((out / WIDEN_FILE).read_text())
    assert record["old_head_dims"] == model.config.layer_head_dims and record["new_head_dims"] == [8, 12, 16, 16]
    assert record["source_run"] == str(src.resolve())
    run = open_run(out)
    wide = cls.from_pretrained(str(out)).eval()
    assert type(wide) is cls and run.config.head_dim == [8, 12, 16, 16]
    ids, mask = _inputs()
    ids = ids % 8
    with torch.no_grad():
        assert (model(ids, attention_mask=mask).logits - wide(ids, attention_mask=mask).logits).abs().max() <= 1e-5
    # its own earlier output is replaced with --overwrite
    assert main(["widen", str(src), "--head-dim", "16", "--output-dir", str(out), "--overwrite"]) == 0
    assert json.loads((out / WIDEN_FILE).read_text())["new_head_dims"] == [16] * L


@pytest.mark.parametrize(
    "config, argv, message",
    [
        (cfg(12), ["--head-dim", "16", "--init-std", "-1"], "--init-std must be a positive finite number, got -1.0"),
        (cfg(12), ["--head-dim", "8"], "--head-dim 8 for layer 0 is smaller than its current head size 12"),
        (cfg(8, qk_head_dim=4), ["--head-dim", "16"], "sizes of their own (qk_head_dim=4, v_head_dim=8)"),
    ],
    ids=["init-std", "a smaller head", "separate query and value sizes"],
)
def test_cli_widen_refuses_its_options_before_loading_the_weights(config, argv, message, tmp_path, capfd):
    """The one line comes alone: transformers' "Loading weights" bar would show the model was loaded first."""
    from fixedhead.training.settings import transformers_progress_bars

    src, out = tmp_path / "run", tmp_path / "wide"
    _save_run(src, config, FixedHeadForMaskedLM)
    capfd.readouterr()
    with transformers_progress_bars(True):
        assert main(["widen", str(src), *argv, "--output-dir", str(out)]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and message in err and "Loading" not in err, err
    assert not out.exists()


def test_cli_widen_errors_are_one_line(tmp_path, capsys):
    src = tmp_path / "run"
    _save_run(src, cfg(12), FixedHeadForMaskedLM)
    capsys.readouterr()  # the setup's progress bars
    out = tmp_path / "wide"
    assert main(["widen", str(src), "--head-dim", "8", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--head-dim 8 for layer 0 is smaller than its current head size 12" in err
    assert not out.exists()
    assert main(["widen", str(src), "--head-dim", "16,none", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err  # the per-layer list as it is typed
    assert err.count("\n") == 1 and f"({L} layers), got 2 (--head-dim 16,none)" in err, err
    assert not out.exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert main(["widen", str(src), "--head-dim", "16", "--output-dir", str(foreign)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did not create" in err and "notes.txt" in err
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    assert main(["widen", str(tmp_path / "missing"), "--head-dim", "16", "--output-dir", str(out)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
