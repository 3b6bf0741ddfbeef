"""The rank intervention (fixedhead.intervention): expected values from NumPy and from constructions
whose logit rank is known."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fixedhead import FixedHeadConfig, FixedHeadForCausalLM, FixedHeadForMaskedLM
from fixedhead.intervention import (
    _RANK_ATTR,
    _truncated_attention,
    attention_modules,
    default_ranks,
    needed_rank,
    rank_curve,
    truncate_logits,
    truncate_product,
    truncated_logits,
)
from fixedhead.model.attention import MultiHeadAttention


def test_truncate_logits_is_numpys_best_rank_k_of_the_row_centred_logits():
    rng = np.random.default_rng(0)
    s = rng.normal(size=(2, 3, 9, 9))
    for k in (1, 3, 8, 9, 20):
        centred = s - s.mean(-1, keepdims=True)
        u, sv, vt = np.linalg.svd(centred)
        want = (u[..., :k] * sv[..., None, :k]) @ vt[..., :k, :]
        np.testing.assert_allclose(truncate_logits(torch.from_numpy(s), k).numpy(), want, atol=1e-12)


@pytest.mark.parametrize("n_q, n_k, d_p", [(9, 9, 3), (7, 11, 4), (6, 6, 10)])
def test_truncate_product_is_numpys_best_rank_k_of_the_centred_product(n_q, n_k, d_p):
    """The factored route (QR of queries and centred keys, SVD of the small core) against NumPy's SVD
    of the whole [n_q, n_k] product, head sizes below and above n."""
    rng = np.random.default_rng(1)
    q, key = rng.normal(size=(2, 3, n_q, d_p)), rng.normal(size=(2, 3, n_k, d_p))
    centred = q @ key.swapaxes(-1, -2)
    centred = centred - centred.mean(-1, keepdims=True)
    u, sv, vt = np.linalg.svd(centred, full_matrices=False)
    for k in (0, 1, 2, d_p, 20):
        want = (u[..., :k] * sv[..., None, :k]) @ vt[..., :k, :]
        got = truncate_product(torch.from_numpy(q), torch.from_numpy(key), k).numpy()
        np.testing.assert_allclose(got, want, atol=1e-10)


def test_truncation_keeps_the_softmax_when_k_reaches_the_rank():
    """Softmax ignores the per-query shift: the centred logits give the same attention."""
    torch.manual_seed(0)
    q, k = torch.randn(7, 3, dtype=torch.float64), torch.randn(7, 3, dtype=torch.float64)
    s = q @ k.T + torch.randn(7, 1, dtype=torch.float64)  # rank 3 plus a per-query shift
    torch.testing.assert_close(torch.softmax(truncate_logits(s, 3), -1), torch.softmax(s, -1))
    assert not torch.allclose(torch.softmax(truncate_logits(s, 2), -1), torch.softmax(s, -1), atol=1e-3)


@pytest.mark.parametrize("bad", [-1, 1.5, "2", None])
def test_bad_rank_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="rank"):
        truncate_logits(torch.zeros(3, 3), bad)


def _models():
    fh = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, head_dim=6)
    fh |= dict(intermediate_size=37, max_position_embeddings=16)
    llama = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped keys
        head_dim=6,
        intermediate_size=37,
        max_position_embeddings=16,
    )
    return [
        FixedHeadForCausalLM(FixedHeadConfig(**fh)),
        FixedHeadForMaskedLM(FixedHeadConfig(**fh)),
        LlamaForCausalLM(llama),
    ]


@pytest.mark.parametrize("index", [0, 1, 2], ids=["fixedhead-causal", "fixedhead-masked", "llama-gqa"])
def test_rank_d_p_leaves_the_model_unchanged_and_lower_ranks_change_it(index):
    torch.manual_seed(0)
    model = _models()[index].eval()
    ids = torch.randint(0, 50, (3, 12))
    modules = attention_modules(model, ids)
    assert len(modules) == 2
    with torch.no_grad():
        want = model(ids).logits
        with truncated_logits(model, 6, modules=modules):  # k = d_p < n: the SVD path, nothing lost
            same = model(ids).logits
        with truncated_logits(model, 1, [1], modules=modules):
            changed = model(ids).logits
        after = model(ids).logits
    torch.testing.assert_close(same, want, atol=1e-5, rtol=1e-5)
    assert (changed - want).abs().max() > 1e-6
    torch.testing.assert_close(after, want)  # restored on exit
    assert model.config._attn_implementation == "sdpa"


def test_a_head_of_known_logit_rank_r_changes_exactly_below_r():
    """A bare attention layer whose query and key weights use only r of the head's 8 dimensions:
    rank S ≤ r, so truncating to k ≥ r changes nothing and k = r − 1 does."""
    torch.manual_seed(0)
    r, d_p = 3, 8
    layer = MultiHeadAttention(hidden_size=16, num_attention_heads=2, head_dim=d_p).eval()
    with torch.no_grad():
        w = layer.qkv.weight.view(3, 2, d_p, 16)
        w[0, :, r:] = 0  # queries: only the first r dimensions of each head
        layer.qkv.bias.zero_()
    x = torch.randn(2, 10, 16)
    modules = attention_modules(layer, x)
    with torch.no_grad():
        want = layer(x)[0]
        outputs = {}
        for k in (r - 1, r, r + 2):
            with truncated_logits(layer, k, modules=modules):
                outputs[k] = layer(x)[0]
    torch.testing.assert_close(outputs[r], want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(outputs[r + 2], want, atol=1e-6, rtol=1e-6)
    assert (outputs[r - 1] - want).abs().max() > 1e-4


def test_rank_0_is_uniform_attention_over_the_visible_keys():
    """k = 0: each head averages the values it may see, computed here from the layer's weights by hand
    (bidirectional: every key; causal: the keys up to the query)."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(hidden_size=16, num_attention_heads=2, head_dim=8).eval()
    x = torch.randn(2, 10, 16)
    v = (x @ layer.qkv.weight[32:].T + layer.qkv.bias[32:]).view(2, 10, 2, 8)  # [batch, key, head, d_p]
    want = v.mean(1, keepdim=True).expand(2, 10, 2, 8).reshape(2, 10, 16) @ layer.out_proj.weight.T
    with torch.no_grad(), truncated_logits(layer, 0, modules=attention_modules(layer, x)):
        got = layer(x)[0]
    torch.testing.assert_close(got, want + layer.out_proj.bias, atol=1e-5, rtol=1e-5)

    # causal (no mask tensor, the module causal) and a boolean mask: query i averages the values of keys 0..i
    module = torch.nn.Module()
    module.is_causal = True
    setattr(module, _RANK_ATTR, 0)
    q, k, v = torch.randn(3, 1, 2, 7, 4).unbind(0)  # [batch, heads, n, d_p]
    want = v.cumsum(2) / torch.arange(1, 8).view(7, 1)
    context, _ = _truncated_attention(module, q, k, v, None)
    torch.testing.assert_close(context.transpose(1, 2), want)
    module.is_causal = False
    context, _ = _truncated_attention(module, q, k, v, torch.ones(7, 7, dtype=torch.bool).tril())
    torch.testing.assert_close(context.transpose(1, 2), want)


def test_rank_curve_records_each_layer_and_all_layers():
    torch.manual_seed(0)
    model = _models()[0].eval()
    ids = torch.randint(0, 50, (4, 12))

    def score(m):
        with torch.no_grad():
            return m(ids, labels=ids).loss

    curve = rank_curve(model, score, ids, progress=False)
    assert curve["head_dims"] == [6, 6] and curve["seq_len"] == 12 and curve["ranks"] == [1, 2, 3, 4, 5, 6]
    assert set(curve["curves"]) == {"all", "layer 0", "layer 1"}
    with torch.no_grad():
        assert curve["full"] == pytest.approx(float(model(ids, labels=ids).loss), abs=1e-6)
        with truncated_logits(model, 0, modules=attention_modules(model, ids)):
            assert curve["uniform"] == pytest.approx(float(model(ids, labels=ids).loss), abs=1e-6)
    assert curve["attention_gain"] == pytest.approx(curve["uniform"] - curve["full"])
    for losses in curve["curves"].values():
        assert losses[6] == curve["full"]  # k = d_p: nothing to cut
        assert losses[1] != curve["full"]
    cheap = rank_curve(model, score, ids, ranks=[1, 3], progress=False, per_layer=False)
    assert cheap["curves"] == {"all": {1: curve["curves"]["all"][1], 3: curve["curves"]["all"][3]}}


def test_needed_rank_is_the_smallest_k_from_which_every_loss_is_within_the_band():
    losses = {1: 5.0, 2: 4.2, 3: 4.01, 4: 4.3, 5: 4.0, 6: 4.0}
    assert needed_rank(losses, 4.0, 0.02) == 5  # k = 3 is within, but k = 4 is not
    assert needed_rank(losses, 4.0, 0.5) == 2
    assert needed_rank({1: 9.0}, 4.0, 0.1) is None
    with pytest.raises(ValueError, match="band"):
        needed_rank(losses, 4.0, -0.1)


def test_default_ranks():
    assert default_ranks(8, 64) == list(range(1, 9))
    assert default_ranks(32, 16) == list(range(1, 16))  # a head larger than n: up to n - 1
    big = default_ranks(512, 1024)
    assert big[:16] == list(range(1, 17)) and big[-1] == 512 and big == sorted(set(big))


def test_the_command_on_a_trained_run_writes_its_outputs_and_scores_the_run_as_evaluate_does(tiny_causal_run, tmp_path):
    import json

    from fixedhead.cli import main
    from fixedhead.training.evaluate import evaluate_run

    run, _, _ = tiny_causal_run
    out = tmp_path / "ri"
    argv = ["rank-intervention", str(run), "--output-dir", str(out), "--max-eval-tokens", "1000", "--no-progress"]
    assert main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "rank_intervention.csv",
        "rank_intervention.json",
        "rank_intervention.md",
        "rank_intervention.png",
    ]
    record = json.loads((out / "rank_intervention.json").read_text())
    (result,) = record["runs"]
    assert (
        record["versions"]["transformers"] and result["band"] == 0.01 and result["band_source"] == "default (one run)"
    )
    # the full-rank loss is the run's held-out loss, as `fixedhead evaluate` scores it
    assert result["full"] == pytest.approx(evaluate_run(run, max_eval_tokens=1000)["loss"], abs=1e-5)
    assert set(result["needed"]) == {"all"} | {f"layer {i}" for i in range(len(result["head_dims"]))}
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not ours")
    assert main([*argv[:2], "--output-dir", str(tmp_path / "other")]) == 2  # a folder holding something else
    assert (tmp_path / "other" / "notes.txt").read_text() == "not ours"
    assert main(["rank-intervention", str(run), "--output-dir", str(tmp_path / "x"), "--band", "-1"]) == 2


def test_queries_and_keys_of_their_own_size_bound_the_rank_values_do_not():
    """Logits Q Kᵀ have rank ≤ qk_head_dim whatever the values' size: truncating to k = qk changes
    nothing, k = qk − 1 does; the rank curve stops at qk (a bare layer and a causal model, v > qk)."""
    torch.manual_seed(0)
    qk, v = 3, 10
    layer = MultiHeadAttention(hidden_size=16, num_attention_heads=2, qk_head_dim=qk, v_head_dim=v).eval()
    x = torch.randn(2, 12, 16)
    modules = attention_modules(layer, x)
    with torch.no_grad():
        want = layer(x)[0]
        outputs = {}
        for k in (qk - 1, qk):
            with truncated_logits(layer, k, modules=modules):
                outputs[k] = layer(x)[0]
    torch.testing.assert_close(outputs[qk], want, atol=1e-6, rtol=1e-6)
    assert (outputs[qk - 1] - want).abs().max() > 1e-4

    config = FixedHeadConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        qk_head_dim=qk,
        v_head_dim=v,
        initializer_range=0.3,
    )
    model = FixedHeadForCausalLM(config).eval()
    ids = torch.randint(0, 50, (3, 12))

    def score(m):
        with torch.no_grad():
            return m(ids, labels=ids).loss

    curve = rank_curve(model, score, ids, progress=False)
    assert curve["head_dims"] == [qk, qk] and curve["ranks"] == [1, 2, 3]
    with torch.no_grad():
        assert curve["full"] == pytest.approx(float(model(ids, labels=ids).loss), abs=1e-6)
    for losses in curve["curves"].values():
        assert losses[qk] == curve["full"] and losses[1] != curve["full"]
