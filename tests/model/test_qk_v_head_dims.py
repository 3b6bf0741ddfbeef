"""Queries and keys of one head size (``qk_head_dim``), values of another (``v_head_dim``).

Expected values come from a float64 softmax(q kᵀ/√d_qk + mask) v written here from the layer's
weights (rows [q | k | v] of the fused projection), from hand-counted parameter and FLOP formulas,
from the same model decoding by full forwards, and from a config.json written as before the fields
existed. FlexAttention has no backward on CPU, so it is checked forward only.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from transformers import AttentionInterface

from fixedhead import FixedHeadConfig, FixedHeadForCausalLM, FixedHeadForMaskedLM, FixedHeadModel
from fixedhead.model.architectures import build_config
from fixedhead.model.attention import MultiHeadAttention, check_flash_head_dim, check_head_dims
from fixedhead.model.kernels import sdpa_backends
from fixedhead.model.sizes import count_parameters, estimate_flops
from fixedhead.model.surgery import widen_heads

# (qk, v): values wider than queries and keys, narrower, and odd sizes
SIZES = [(4, 12), (12, 4), (3, 7)]


def config(qk=4, v=12, **kw) -> FixedHeadConfig:
    base = dict(
        vocab_size=61,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        qk_head_dim=qk,
        v_head_dim=v,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return FixedHeadConfig(**{**base, **kw})


def reference(layer: MultiHeadAttention, x, keep, causal):
    """float64 attention from the layer's weights; keep [batch, keys] 1 = token."""
    w, b = layer.qkv.weight.double(), layer.qkv.bias.double()
    h, qk, v = layer.num_attention_heads, layer.qk_head_dim, layer.v_head_dim
    batch, n, _ = x.shape
    out = x.double() @ w.T + b
    q, k, val = out[..., : h * qk], out[..., h * qk : 2 * h * qk], out[..., 2 * h * qk :]
    q, k = (t.reshape(batch, n, h, qk).transpose(1, 2) for t in (q, k))
    val = val.reshape(batch, n, h, v).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(qk)
    allowed = keep.bool()[:, None, None, :].expand(batch, 1, n, n)
    if causal:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
    context = (scores.masked_fill(~allowed, -math.inf).softmax(-1) @ val).transpose(1, 2).reshape(batch, n, h * v)
    return context @ layer.out_proj.weight.double().T + layer.out_proj.bias.double()


# ------------------------------------------------------------------------------------------ config


def test_sizes_default_to_head_dim_per_layer():
    cfg = FixedHeadConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=3, head_dim=[None, 16, 6])
    assert cfg.layer_qk_head_dims == cfg.layer_v_head_dims == [8, 16, 6]
    cfg = FixedHeadConfig(
        hidden_size=32, num_attention_heads=4, num_hidden_layers=3, head_dim=[None, 16, 6], qk_head_dim=2
    )
    assert cfg.layer_qk_head_dims == [2, 2, 2] and cfg.layer_v_head_dims == [8, 16, 6]


@pytest.mark.parametrize("name", ["qk_head_dim", "v_head_dim"])
@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8", [4, 4]])
def test_bad_sizes_are_refused_by_name(name, bad):
    with pytest.raises(ValueError, match=f"{name} must be a positive int, got {re.escape(repr(bad))}"):
        FixedHeadConfig(hidden_size=32, num_attention_heads=4, **{name: bad})


def test_per_layer_config_tells_transformers_keys_and_values_differ():
    """transformers' generate skips early StaticCache sizing when a layer config has ``qk_head_dim``
    (its sign of MLA-style distinct sizes) and otherwise sizes keys and values by ``head_dim``."""
    differ = config(4, 12).per_layer_config
    assert [(c.head_dim, c.qk_head_dim, c.v_head_dim) for c in differ] == [(4, 4, 12)] * 2
    same = config(16, 16).per_layer_config  # one size, not d/h = 16: head_dim must say 16
    assert [(c.head_dim, c.qk_head_dim) for c in same] == [(16, None)] * 2


def test_a_config_without_the_fields_is_written_back_byte_for_byte(tmp_path):
    """A run saved before the fields existed: its config.json (a fixedhead one, written here as
    transformers wrote it) loads with both at None and is saved again unchanged."""
    old = FixedHeadConfig(hidden_size=32, num_attention_heads=4, head_dim=16, is_decoder=True)
    old.save_pretrained(tmp_path / "old")
    text = (tmp_path / "old" / "config.json").read_text()
    assert "qk_head_dim" not in text and "v_head_dim" not in text
    loaded = FixedHeadConfig.from_pretrained(tmp_path / "old")
    assert loaded.qk_head_dim is None and loaded.v_head_dim is None
    loaded.save_pretrained(tmp_path / "again")
    assert (tmp_path / "again" / "config.json").read_text() == text
    assert "qk_head_dim" not in json.dumps(loaded.to_diff_dict())  # the run's settings record too


def test_set_sizes_are_saved_and_loaded(tmp_path):
    model = FixedHeadForCausalLM(config(3, 7)).eval()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["qk_head_dim"], saved["v_head_dim"]) == (3, 7)
    again = FixedHeadForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(3, 61, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits)


# ------------------------------------------------------------------------------------------ layer


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("qk,v", SIZES)
@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex_attention"])
def test_each_implementation_computes_the_equation(impl, qk, v, causal):
    torch.manual_seed(0)
    cfg = config(qk, v, is_decoder=causal)
    cfg._attn_implementation = impl
    layer = MultiHeadAttention(32, 2, qk_head_dim=qk, v_head_dim=v, config=cfg).eval()
    assert layer.qkv.weight.shape == (2 * (2 * qk + v), 32) and layer.out_proj.weight.shape == (32, 2 * v)
    x = torch.randn(2, 9, 32)
    keep = torch.ones(2, 9, dtype=torch.long)
    keep[1, :3] = 0
    with torch.no_grad():
        got, _ = layer(x, attention_mask=keep)
    want = reference(layer, x, keep, causal)
    real = keep.bool()  # rows of padded queries are meaningless
    torch.testing.assert_close(got[real].double(), want[real], atol=1e-5, rtol=1e-4)


def test_logit_scale_is_one_over_root_qk():
    assert MultiHeadAttention(32, 2, head_dim=16, qk_head_dim=4, v_head_dim=9).scale == 0.5
    model = FixedHeadModel(config(4, 12, parametrization="mup", mup_base_head_dim=1))
    assert model.encoder["layer"][0].attention.scale == pytest.approx(1 / 4)  # √1 / d_qk


def test_one_head_size_is_asked_for_where_there_are_two():
    layer = MultiHeadAttention(32, 2, qk_head_dim=4, v_head_dim=12)
    with pytest.raises(ValueError, match="qk_head_dim=4, v_head_dim=12"):
        _ = layer.head_dim
    assert MultiHeadAttention(32, 2, head_dim=16, qk_head_dim=16, v_head_dim=16).head_dim == 16


@pytest.mark.parametrize("model_class", [FixedHeadForMaskedLM, FixedHeadForCausalLM])
def test_sdpa_trains_as_eager(model_class):
    """Forward and every gradient: SDPA (the CPU math kernel for two sizes) against the eager path."""
    torch.manual_seed(0)
    model = model_class(config(3, 10)).train()
    ids = torch.randint(3, 61, (2, 11))
    grads = {}
    for impl in ("eager", "sdpa"):
        model.set_attn_implementation(impl)
        model.zero_grad()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        grads[impl] = (out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(grads["sdpa"][0], grads["eager"][0], atol=2e-5, rtol=1e-4)
    for name, g in grads["eager"][1].items():
        torch.testing.assert_close(grads["sdpa"][1][name], g, atol=2e-5, rtol=1e-4, msg=name)


def test_cpu_training_with_dropout_runs_and_changes_every_projection():
    """The CPU dropout-attention kernel with values of their own size: a step reaches every weight."""
    torch.manual_seed(0)
    model = FixedHeadForCausalLM(config(3, 10, attention_probs_dropout_prob=0.1)).train()
    ids = torch.randint(3, 61, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    attn = model.fixedhead.encoder["layer"][0].attention
    h = attn.num_attention_heads
    for rows in (slice(0, 3 * h), slice(3 * h, 6 * h), slice(6 * h, 16 * h)):  # q, k, v rows
        assert attn.qkv.weight.grad[rows].abs().sum() > 0
    assert torch.isfinite(attn.out_proj.weight.grad).all() and attn.out_proj.weight.grad.abs().sum() > 0


def test_zero_query_init_zeroes_the_query_rows_only():
    attn = FixedHeadModel(config(3, 10, query_init="zero")).encoder["layer"][0].attention
    h = attn.num_attention_heads
    assert attn.qkv.weight[: 3 * h].abs().sum() == 0 and attn.qkv.weight[3 * h :].abs().sum() > 0


# ------------------------------------------------------------------------------------- generation


@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_cached_decoding_matches_full_forwards(cache_implementation):
    torch.manual_seed(0)
    model = FixedHeadForCausalLM(config(3, 10)).eval()
    prompt = torch.randint(3, 61, (1, 5))
    out = model.generate(
        prompt, max_new_tokens=8, do_sample=False, cache_implementation=cache_implementation, pad_token_id=0
    )
    ids = prompt
    with torch.no_grad():
        for _ in range(8):  # greedy by full forwards, no cache
            nxt = model(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
    assert out.tolist() == ids.tolist()


def test_the_cache_holds_keys_and_values_at_their_sizes():
    model = FixedHeadForCausalLM(config(3, 10)).eval()
    with torch.no_grad():
        cache = model(torch.randint(3, 61, (2, 6)), use_cache=True).cache
    keys, values = cache.layers[0].keys, cache.layers[0].values
    assert keys.shape == (2, 2, 6, 3) and values.shape == (2, 2, 6, 10)


# ----------------------------------------------------------------------------------------- counts


def test_parameter_count_matches_the_model_and_the_hand_count():
    cfg = config(3, 10)
    d, h, f, vocab, n = 32, 2, 64, 61, 64
    attention = 2 * (d * h * 3 + h * 3) + (d * h * 10 + h * 10) + (h * 10 * d + d)  # W_q, W_k, W_v, W_o + biases
    layer = attention + (d * f + f) + (f * d + d) + 4 * d
    embeddings = vocab * d + n * d + 2 * d + 2 * d
    head = d * d + d + 2 * d + vocab
    assert count_parameters(cfg, pooler=False) == embeddings + 2 * layer + head
    model = FixedHeadForMaskedLM(cfg)
    assert count_parameters(cfg, pooler=False) == sum(p.numel() for p in model.parameters())


def test_flops_count_each_size_where_it_is_used():
    cfg = config(3, 10)
    d, h, f, vocab, n = 32, 2, 64, 61, 16
    per_token_layer = 2 * d * h * (3 + 3 + 10) + 2 * h * 10 * d + 2 * n * h * 3 + 2 * n * h * 10 + 2 * 2 * d * f
    forward = n * 2 * per_token_layer + n * (2 * d * d + 2 * d * vocab)
    assert estimate_flops(cfg, 1, n, masked_fraction=1.0, training=False) == forward
    # one head size: the same count as head_dim alone
    assert estimate_flops(config(8, 8), 2, n) == estimate_flops(config(None, None, head_dim=8), 2, n)


# ------------------------------------------------------------------------------- what refuses them


def test_llama_runs_refuse_two_sizes_by_name_and_take_one():
    """transformers' Llama has one head size: a query/key or value size other than it is refused, each field as
    ``field=value`` (what the command line rewrites as its option and value: ``--qk-head-dim 4``); one size given
    under several names is that size."""
    llama = {"architecture": "llama", "hidden_size": 32, "num_attention_heads": 4}  # d/h = 8
    for name in ("qk_head_dim", "v_head_dim"):
        refused = rf"{name}=4 with head_dim=16: architecture='llama' .* one head size .*; give head_dim alone, or "
        with pytest.raises(ValueError, match=refused + "architecture='fixedhead' for separate sizes"):
            build_config(llama | {"head_dim": 16, name: 4})
        with pytest.raises(ValueError, match=rf"{name}=4 with head_dim=None \(d/h = 8\)"):
            build_config(llama | {name: 4})
    with pytest.raises(ValueError, match=r"v_head_dim=8 with head_dim=16"):
        build_config(llama | {"head_dim": 16, "qk_head_dim": 16, "v_head_dim": 8})
    assert build_config(llama | {"qk_head_dim": None}).head_dim == 8
    assert build_config(llama | {"head_dim": 16, "qk_head_dim": 16, "v_head_dim": 16}).head_dim == 16
    assert build_config(llama | {"qk_head_dim": 8}).head_dim == 8  # d/h
    assert build_config(llama | {"qk_head_dim": 16, "v_head_dim": 16}).head_dim == 16  # both: d/h unused


def test_the_llama_refusal_names_the_options_as_typed(tmp_path, capsys):
    """From the command line the refusal reads in options; nothing is written."""
    from fixedhead.cli import main

    out = tmp_path / "run"
    argv = ["pretrain", "--architecture", "llama", "--objective", "clm", "--hidden-size", "32"]
    argv += ["--num-attention-heads", "4", "--head-dim", "16", "--qk-head-dim", "4", "--output-dir", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "qk" in err and "head" in err and "fixedhead" in err, err
    assert not out.exists()


def test_flash_attention_takes_values_no_wider_than_queries():
    """transformers' FlashAttention integration pads values up to the query size and crops the output."""
    check_flash_head_dim("flash_attention_2", 32, 16)
    with pytest.raises(ValueError, match="v_head_dim <= qk_head_dim; got qk_head_dim=16, v_head_dim=32"):
        check_flash_head_dim("flash_attention_2", 16, 32)
    with pytest.raises(ValueError, match="v_head_dim <= qk_head_dim"):
        FixedHeadForCausalLM._from_config(config(4, 12), attn_implementation="flash_attention_2")


def test_a_serving_engines_attention_is_refused_for_two_sizes(monkeypatch):
    """vLLM's attention ("vllm", registered in transformers' attention interface when vLLM's
    Transformers backend is imported) sizes its cache and kernel from one head size in the config."""
    monkeypatch.setitem(AttentionInterface._global_mapping, "vllm", lambda *a, **k: None)
    check_head_dims("vllm", 32, 32)
    for impl in ("eager", "sdpa", "flex_attention", None):
        check_head_dims(impl, 4, 12)
    with pytest.raises(ValueError, match=r"'vllm' is not known to take .* \(qk_head_dim=4, v_head_dim=12\)"):
        check_head_dims("vllm", 4, 12)
    check_head_dims("foo", 4, 12)  # registered nowhere: transformers refuses it as unknown
    with pytest.raises(ValueError, match='Specified `attn_implementation="foo"` is not supported'):
        FixedHeadForCausalLM._from_config(config(4, 12), attn_implementation="foo")


def test_a_model_set_to_an_engines_attention_refuses_two_sizes(monkeypatch):
    """As vLLM's Transformers backend runs it: its function registered in transformers' attention
    interface and ``config._attn_implementation`` set to its name."""
    calls = []
    monkeypatch.setitem(AttentionInterface._global_mapping, "engine", lambda *a, **k: calls.append(1))
    refused = r"'engine' is not known to take .* \(qk_head_dim=4, v_head_dim=12\)"
    cfg = config(4, 12)
    cfg._attn_implementation = "engine"  # vLLM sets it before it builds the model
    with pytest.raises(ValueError, match=refused):
        FixedHeadModel(cfg)
    model = FixedHeadForCausalLM(config(4, 12)).eval()
    model.config._attn_implementation = "engine"  # set after the model is built: its first forward
    with pytest.raises(ValueError, match=refused):
        model(torch.randint(3, 61, (1, 5)))
    assert calls == []
    cfg = config(8, 8)
    cfg._attn_implementation = "engine"
    FixedHeadModel(cfg)  # one size: taken


def test_sdpa_on_cuda_leaves_flash_out_for_two_sizes():
    backends, reason = sdpa_backends(32, "cuda", 64)
    assert backends[0].name == "EFFICIENT_ATTENTION" and "v_head_dim=64 != qk_head_dim=32" in reason
    assert sdpa_backends(32, "cuda", 32) == sdpa_backends(32, "cuda")


def test_widening_refuses_separate_sizes():
    """Named by what widening does (no function name) and the sizes the layers have: the value size 10, not the
    config's unset field."""
    refused = r"^widening grows head_dim, .*its values have sizes of their own \(qk_head_dim=3, v_head_dim=10\)$"
    with pytest.raises(ValueError, match=refused):
        widen_heads(FixedHeadForCausalLM(config(3, 10)), 16)
    with pytest.raises(ValueError, match=r"\(qk_head_dim=4, v_head_dim=8\)$"):  # v_head_dim None: head_dim's 8
        widen_heads(FixedHeadForCausalLM(config(4, None, head_dim=8)), 16)


def test_both_sizes_given_need_no_divisible_hidden_size(capsys):
    """With qk_head_dim and v_head_dim both given no layer reads d/h, so d need not be divisible by h (as with an
    explicit head_dim); the model builds and runs at those sizes, and the command line counts it."""
    from fixedhead.cli import main

    cfg = config(4, 6, hidden_size=18, num_attention_heads=4)
    model = FixedHeadForCausalLM(cfg).eval()
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert [(m.qk_head_dim, m.v_head_dim, m.qkv.out_features) for m in layers] == [(4, 6, 4 * (2 * 4 + 6))] * 2
    assert model(torch.randint(3, 61, (1, 5))).logits.shape == (1, 5, 61)
    mlm, pooler = FixedHeadForMaskedLM(cfg), FixedHeadModel(cfg).pooler  # what count counts: BERT's MLM and pooler
    assert count_parameters(cfg) == sum(p.numel() for m in (mlm, pooler) for p in m.parameters())
    with pytest.raises(ValueError, match="divisible by num_attention_heads"):  # one size given: d/h is read
        config(4, None, hidden_size=18, num_attention_heads=4)
    argv = ["count", "--hidden-size", "18", "--num-attention-heads", "4", "--qk-head-dim", "4", "--v-head-dim", "6"]
    assert main(argv) == 0
    assert "d=18, h=4, qk_head_dim=4, v_head_dim=6" in capsys.readouterr().out


def test_the_count_command_takes_both_sizes(capsys):
    """``fixedhead count`` with explicit sizes: the parameters of the model built (masked LM + BERT's pooler by
    default; the masked or causal LM alone with --objective), naming the two sizes each head has and no d_p."""
    from fixedhead.cli import main
    from fixedhead.model.modeling import FixedHeadForCausalLM, FixedHeadModel

    sizes = dict(hidden_size=32, num_attention_heads=4, qk_head_dim=3, v_head_dim=10, num_hidden_layers=2)
    sizes |= dict(vocab_size=61, max_position_embeddings=64, intermediate_size=64)
    argv = ["count"] + [a for k, v in sizes.items() for a in (f"--{k.replace('_', '-')}", str(v))]

    def n(model):
        return sum(p.numel() for p in model.parameters())

    mlm, pooler = n(FixedHeadForMaskedLM(FixedHeadConfig(**sizes))), n(FixedHeadModel(FixedHeadConfig(**sizes)).pooler)
    clm = n(FixedHeadForCausalLM(FixedHeadConfig(**sizes, is_decoder=True)))
    for objective, built in ((None, mlm + pooler), ("mlm", mlm), ("clm", clm)):
        assert main(argv + (["--objective", objective] if objective else [])) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"{built:,} parameters: d=32, h=4, qk_head_dim=3, v_head_dim=10, 2 layers"), objective
        assert "d_p" not in out
    assert main(["count", "--preset", "lm1b-fixed-d256-h4-dp32", "--qk-head-dim", "8"]) == 2
    assert "drop --qk-head-dim" in capsys.readouterr().err
