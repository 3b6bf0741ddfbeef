"""The rank intervention (fixedhead.diagnostics.intervention): expected values from NumPy and from constructions
whose logit rank is known."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fixedhead import FixedHeadConfig, FixedHeadForCausalLM, FixedHeadForMaskedLM
from fixedhead.diagnostics.intervention import (
    _RANK_ATTR,
    _truncated_attention,
    attention_modules,
    default_ranks,
    fit_head_maps,
    fit_projections,
    fit_visible,
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


def test_the_maps_of_one_cut_are_refused_by_another_in_one_line():
    torch.manual_seed(0)
    model = _models()[0].eval()
    ids = torch.randint(0, 50, (2, 8))
    modules = attention_modules(model, ids)
    maps = fit_head_maps(model, ids, modules)
    with pytest.raises(
        ValueError, match=r"method 'oracle' takes maps=None or one dict per attention module.*; got 2 \(tuple\) for 2"
    ):
        with truncated_logits(model, 2, modules=modules, method="oracle", maps=maps):
            pass
    with pytest.raises(ValueError, match=r"method 'realisable' needs maps: one \(A, B\) pair.*; got None$"):
        with truncated_logits(model, 2, modules=modules, method="realisable"):
            pass


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
    setattr(module, _RANK_ATTR, ("oracle", 0, None))
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
    with torch.no_grad():  # sharper attention, so that a rank-1 cut moves the loss of a random model
        for layer in model.modules():
            if hasattr(layer, "qkv"):
                layer.qkv.weight.mul_(4)
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


def test_the_oracle_fits_the_first_layers_logits_once_per_rank(monkeypatch):
    """Layer 0's inputs are the same with all layers cut and with layer 0 cut alone: one fit serves
    both, and the curve is the one each cut scored apart gives."""
    import fixedhead.diagnostics.intervention as intervention

    torch.manual_seed(0)
    model = _models()[0].eval()
    ids = torch.randint(0, 50, (2, 12))

    def score(m):
        with torch.no_grad():
            return m(ids, labels=ids).loss

    calls = []
    fit = intervention.fit_visible
    monkeypatch.setattr(intervention, "fit_visible", lambda s, v, k: calls.append(k) or fit(s, v, k))
    curve = rank_curve(model, score, ids, ranks=[1, 2], progress=False)
    assert sorted(calls) == [0] * 4 + [1, 1, 1, 2, 2, 2]  # uniform (2 layers, each alone); per k: all + layer 1
    modules = attention_modules(model, ids)
    for name, layers in (("all", None), ("layer 0", [0]), ("layer 1", [1])):
        for k in (1, 2):
            with truncated_logits(model, k, layers, modules=modules):
                assert curve["curves"][name][k] == float(score(model))


def test_needed_rank_is_the_smallest_k_from_which_every_loss_is_within_the_band():
    losses = {1: 5.0, 2: 4.2, 3: 4.01, 4: 4.3, 5: 4.0, 6: 4.0}
    assert needed_rank(losses, 4.0, 0.02) == 5  # k = 3 is within, but k = 4 is not
    assert needed_rank(losses, 4.0, 0.5) == 2
    assert needed_rank({1: 9.0}, 4.0, 0.1) is None
    with pytest.raises(ValueError, match="band"):
        needed_rank(losses, 4.0, -0.1)


def test_the_needed_rank_is_0_where_uniform_attention_is_within_the_band():
    """k = 0 (uniform attention) within the band, and every k tried too: the model needs no logit rank. The curves
    start at k = 1, so the uniform loss is read beside them."""
    losses = {1: 4.001, 2: 4.0, 3: 4.0}
    assert needed_rank(losses, 4.0, 0.01, uniform=4.005) == 0
    assert needed_rank(losses, 4.0, 0.01, uniform=4.02) == 1  # attention gain 0.02 > the band
    assert needed_rank({1: 4.3, 2: 4.0}, 4.0, 0.01, uniform=4.005) == 2  # k = 1 outside: not 0
    assert needed_rank(losses, 4.0, 0.01) == 1  # no uniform loss given: k = 0 was not scored


def test_the_summary_reads_the_uniform_losses_as_k_0():
    """All layers uniform (``uniform``) and each layer alone (``uniform_layers``); results scored before layers
    alone were scored at k = 0 read their curves from k = 1."""
    from fixedhead.diagnostics.intervention import summarise

    curve = {"name": "m", "run": "r", "full": 4.0, "uniform": 4.004, "method": "oracle"}
    curve["curves"] = {"all": {1: 4.001, 2: 4.0}, "layer 0": {1: 4.0, 2: 4.0}, "layer 1": {1: 4.0, 2: 4.0}}
    (row,) = summarise([curve | {"uniform_layers": [4.001, 4.02]}], band=0.01, tolerances=(0.002,))
    assert row["needed"] == {"all": 0, "layer 0": 0, "layer 1": 1}  # layer 1 alone uniform: 0.02 > the band
    assert row["needed_at"]["0.002"] == {"all": 1, "layer 0": 0, "layer 1": 1}  # gain 0.004 > 0.002
    (older,) = summarise([curve], band=0.01)
    assert older["needed"] == {"all": 0, "layer 0": 1, "layer 1": 1}


def test_a_layer_that_needs_no_attention_reads_0_alone():
    """Layer 0's queries are 0, so its attention is uniform already: cut alone to k = 0 it loses nothing, and its
    needed rank is 0 (not 1, the smallest k of the curve); layer 1, sharp, needs some rank, and so do all layers."""
    from fixedhead.diagnostics.intervention import report_markdown, summarise

    torch.manual_seed(0)
    model = _models()[0].eval()
    layers = attention_modules(model, torch.zeros(1, 4, dtype=torch.long))
    with torch.no_grad():
        layers[0].qkv.weight[:24].zero_()  # the 4 heads' queries (4 × 6 rows)
        layers[0].qkv.bias[:24].zero_()
        layers[1].qkv.weight.mul_(8)
    ids = torch.randint(0, 50, (4, 12))
    with torch.no_grad():
        want = model(ids).logits

    def score(m):  # how far the outputs moved: 0 uncut, above 0 wherever a cut changes anything
        with torch.no_grad():
            return float((m(ids).logits - want).abs().max())

    curve = rank_curve(model, score, ids, ranks=[1, 3, 6], progress=False) | {"name": "m", "run": "r", "seed": 0}
    (row,) = summarise([curve], band=1e-6)
    assert row["needed"]["layer 0"] == 0
    assert row["needed"]["layer 1"] >= 1 and row["needed"]["all"] >= 1
    text = " ".join(report_markdown([row], "cmd").split())
    assert "0 where uniform attention (k = 0, in all layers or in the layer alone) is within it" in text


@pytest.mark.parametrize(
    "option, value, words",
    [
        ("--ranks", "-1", "--ranks must be ints >= 1 (k = 0, uniform attention, is always scored), got -1"),
        ("--ranks", "0", "--ranks must be ints >= 1"),
        ("--ranks", "17", "--ranks must be at most 16, the largest query/key head size of"),
        ("--ranks", "2 2", "--ranks must be distinct, got 2 2"),
        ("--band", "nan", "--band must be a finite number >= 0, got nan, which is not finite"),
        ("--band", "inf", "--band must be a finite number >= 0, got inf, which is not finite"),
        ("--tolerances", "nan", "--tolerances must be a finite number >= 0, got nan, which is not finite"),
    ],
)
def test_the_command_refuses_bad_ranks_and_tolerances_by_option_before_scoring(
    option, value, words, tiny_causal_run, tmp_path, capsys, monkeypatch
):
    """A rank above the run's query/key head size (16) would report a needed rank the logits cannot have; it is
    refused before any run is scored, as are ranks below 1 and tolerances that are not finite."""
    import fixedhead.diagnostics.intervention as intervention
    from fixedhead.cli import main

    monkeypatch.setattr(intervention, "run_rank_curve", lambda *a, **k: pytest.fail("scored before the refusal"))
    run, _, _ = tiny_causal_run
    out = tmp_path / "ri"
    assert main(["rank-intervention", str(run), "--output-dir", str(out), option, *value.split(), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
    assert not out.exists()


def test_the_command_refuses_a_run_given_twice(tiny_causal_run, tmp_path, capsys, monkeypatch):
    """Runs of one folder name are read as seeds of one model: the same run twice would be two seeds with no spread."""
    import fixedhead.diagnostics.intervention as intervention
    from fixedhead.cli import main

    monkeypatch.setattr(intervention, "run_rank_curve", lambda *a, **k: pytest.fail("scored before the refusal"))
    run, _, _ = tiny_causal_run
    out = tmp_path / "ri"
    assert main(["rank-intervention", str(run), f"{run}/", "--output-dir", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the run '{run}' is given twice" in err, err
    assert not out.exists()


def test_the_report_says_the_oracle_is_not_causal_and_the_realisable_cut_is():
    from fixedhead.diagnostics.intervention import report_markdown, summarise

    curves = []
    for method in ("oracle", "realisable"):
        c = {"name": "m", "run": "r", "seed": 0, "head_dims": [4], "seq_len": 8, "full": 4.0, "uniform": 4.1}
        c |= {"attention_gain": 0.1, "method": method, "curves": {"all": {1: 4.0}}}
        curves.append(c)
    text = " ".join(report_markdown(summarise(curves, tolerances=(0.01,)), "cmd").split())
    assert "It is not causal" in text and "its logits at a position depend on later tokens too" in text
    assert "an optimistic bound that no causal model (no fixed weights) realises" in text
    assert "a causal model with query/key heads of size k exists" in text


def test_rank_curve_refuses_ranks_below_1_and_reads_the_full_loss_above_the_head_size():
    """A study's arms of several head sizes share one list of ranks: above a model's head size nothing is cut."""
    torch.manual_seed(0)
    model = _models()[0].eval()  # head_dim 6
    ids = torch.randint(0, 50, (1, 12))
    with pytest.raises(ValueError, match="ranks must be ints >= 1"):
        rank_curve(model, lambda m: 0.0, ids, ranks=[0, 2], progress=False)
    curve = rank_curve(model, lambda m: float(m(ids).logits.double().sum()), ids, ranks=[7], progress=False)
    assert curve["curves"]["all"][7] == curve["full"]


def test_an_encoder_with_n_below_its_head_size_reads_the_full_loss_from_n_minus_1_so_a_band_of_0_finds_a_rank():
    """Row-centred n × n logits have rank at most n − 1: from k = n − 1 the oracle and lookahead cuts change
    nothing but float rounding, which for this random encoder (n = 5 < d_p = 8) put layer 0's loss at k = 4 one
    float32 ulp above the full loss, and a band of 0 then found no needed rank. The realisable maps are fixed
    across sequences: they still cut below d_p."""
    torch.manual_seed(13)
    config = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, head_dim=8)
    model = FixedHeadForMaskedLM(FixedHeadConfig(**config, intermediate_size=37, max_position_embeddings=16)).eval()
    with torch.no_grad():  # sharper attention, so that a cut moves the loss
        for layer in model.modules():
            if hasattr(layer, "qkv"):
                layer.qkv.weight[:64].mul_(4)
    ids = torch.randint(0, 50, (3, 5))
    modules = attention_modules(model, ids)

    def score(m):
        with torch.no_grad():
            return float(m(ids, labels=ids).loss)

    full = score(model)
    with truncated_logits(model, 4, [0], modules=modules):  # the cut at n - 1 = 4: the model to rounding
        assert score(model) == pytest.approx(full, abs=1e-6)
    for method in ("oracle", "lookahead"):
        curve = rank_curve(model, score, ids, progress=False, method=method)
        assert curve["ranks"] == [1, 2, 3, 4]
        for setting, losses in curve["curves"].items():
            assert losses[4] == curve["full"] == full, (method, setting)
            assert needed_rank(losses, curve["full"], 0.0) is not None, (method, setting)
    maps = fit_head_maps(model, ids, modules)
    curve = rank_curve(model, score, ids, progress=False, method="realisable", maps=maps)
    with truncated_logits(model, 4, modules=modules, method="realisable", maps=maps):
        assert curve["curves"]["all"][4] == score(model)  # cut, not read as the full loss


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
    argv += ["--ranks", "2", "8", "--fit-tokens", "2000"]
    assert main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "rank_intervention.csv",
        "rank_intervention.json",
        "rank_intervention.md",
        "rank_intervention.png",
    ]
    record = json.loads((out / "rank_intervention.json").read_text())
    oracle, realisable = record["runs"]
    assert (oracle["method"], realisable["method"]) == ("oracle", "realisable") and realisable["fit_tokens"] > 0
    assert oracle["full"] == realisable["full"]
    (row,) = record["needed"]
    assert set(row["needed"]) == {"0.01", "0.002", "band"}
    for tol, by_setting in row["needed"].items():
        width = float(tol) if tol != "band" else oracle["band"]
        for setting, (low, high) in by_setting.items():
            uniform = oracle["uniform"] if setting == "all" else oracle["uniform_layers"][int(setting.split()[-1])]
            curve = {int(k): v for k, v in oracle["curves"][setting].items()}
            assert low == needed_rank(curve, oracle["full"], width, uniform)
            curve = {int(k): v for k, v in realisable["curves"][setting].items()}
            assert high == needed_rank(curve, oracle["full"], width, uniform)
    result = oracle
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


# ------------------------------------------------------------------ looking only at visible keys


def _causal_head_of_known_visible_rank(n=12, r=2, scale=10.0, seed=0):
    """A one-head causal layer on one-hot inputs whose logits are A Bᵀ (rank r) on and below the
    diagonal plus a large rank-2 block strictly above it (keys a query never sees): its visible
    logits have rank r, its full logits rank r + 2."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(n, r, generator=g), torch.randn(n, r, generator=g)
    u, v = torch.zeros(n, 2), torch.zeros(n, 2)
    u[: n // 3, 0], v[n // 3 :, 0] = 1, 1  # u_i · v_j ≠ 0 only for i < n/3 ≤ j or i < 2n/3 ≤ j: j > i
    u[: 2 * n // 3, 1], v[2 * n // 3 :, 1] = 1, 1
    q, k = torch.cat([a, scale * u], 1), torch.cat([b, scale * v], 1)  # [n, r + 2]
    layer = MultiHeadAttention(hidden_size=n, num_attention_heads=1, head_dim=r + 2).eval()
    layer.is_causal = True
    with torch.no_grad():
        w = layer.qkv.weight.view(3, r + 2, n)
        w[0], w[1] = q.T, k.T  # one-hot input x_i = e_i: query i is row i of q
        layer.qkv.bias.zero_()
    assert torch.equal((u @ v.T).tril(), torch.zeros(n, n))
    return layer, torch.eye(n).unsqueeze(0)


def test_a_causal_head_whose_visible_logits_have_rank_r_is_kept_exactly_at_rank_r():
    """The known answer: cut to k = r the head is unchanged, cut to r − 1 it is not. Cutting all n × n
    logits and masking afterwards (the lookahead cut) spends its rank on the hidden block and fails."""
    layer, x = _causal_head_of_known_visible_rank()
    modules = attention_modules(layer, x)
    with torch.no_grad():
        want = layer(x, is_causal=True)[0]
        with truncated_logits(layer, 2, modules=modules):
            at_r = layer(x, is_causal=True)[0]
        with truncated_logits(layer, 1, modules=modules):
            below = layer(x, is_causal=True)[0]
    torch.testing.assert_close(at_r, want, atol=1e-6, rtol=1e-6)
    assert (below - want).abs().max() > 1e-3
    with torch.no_grad(), truncated_logits(layer, 2, modules=modules, method="lookahead"):
        assert (layer(x, is_causal=True)[0] - want).abs().max() > 1e-2


def test_fit_visible_without_hidden_entries_is_numpys_best_rank_k_plus_row_shifts():
    rng = np.random.default_rng(3)
    s = rng.normal(size=(2, 9, 9))
    centred = s - s.mean(-1, keepdims=True)
    u, sv, vt = np.linalg.svd(centred)
    for k in (0, 1, 4, 9):
        want = (u[..., :k] * sv[..., None, :k]) @ vt[..., :k, :] + s.mean(-1, keepdims=True)
        got = fit_visible(torch.from_numpy(s), torch.ones(9, 9, dtype=torch.bool), k).numpy()
        np.testing.assert_allclose(got, want, atol=1e-10)


def test_fit_visible_never_fits_the_visible_logits_worse_than_the_lookahead_cut():
    torch.manual_seed(4)
    s = torch.randn(6, 16, 16, dtype=torch.float64) * torch.linspace(0.1, 3, 16, dtype=torch.float64)
    visible = torch.ones(16, 16, dtype=torch.bool).tril()
    m = visible.double()
    for k in (1, 3, 6):
        look = truncate_logits(s, k)
        look = look + (m * (s - look)).sum(-1, keepdim=True) / m.sum(-1, keepdim=True)  # its best shifts
        fit = fit_visible(s, visible, k)
        err_look = (m * (s - look)).pow(2).sum((-2, -1))
        err_fit = (m * (s - fit)).pow(2).sum((-2, -1))
        assert bool((err_fit <= err_look * (1 + 1e-9)).all()) and bool((err_fit < 0.95 * err_look).any())
    # rank 0: each query's mean over its visible keys (uniform attention)
    torch.testing.assert_close(fit_visible(s, visible, 0)[..., 5, 0], s[..., 5, :6].mean(-1))


def test_fit_projections_are_the_best_rank_k_bilinear_form_numpy_reference():
    """E[(qᵀ(I − W_k)k)²] for independent q, k equals the Eckart–Young tail of C_q^{1/2} C_k^{1/2}
    (computed here with NumPy), and at the rank of the data the logits are reproduced up to a shift."""
    rng = np.random.default_rng(5)
    d, r = 6, 4
    q = rng.normal(size=(4000, r)) @ rng.normal(size=(r, d))  # queries in an r-dimensional subspace
    k = rng.normal(size=(4000, d)) * [3, 2, 1, 0.5, 0.2, 0.1] + rng.normal(size=d)
    cq, ck = q.T @ q / len(q), np.cov(k.T, bias=True)

    def sqrtm(c):
        w, v = np.linalg.eigh(c)
        return (v * np.sqrt(np.clip(w, 0, None))) @ v.T

    sv = np.linalg.svd(sqrtm(cq) @ sqrtm(ck), compute_uv=False)
    a, b = fit_projections(torch.from_numpy(cq), torch.from_numpy(ck))
    for rank in (1, 2, 3):
        w = (a[:, :rank] @ b[:, :rank].T).numpy()
        err = np.trace((np.eye(d) - w).T @ cq @ (np.eye(d) - w) @ ck)
        assert err == pytest.approx((sv[rank:] ** 2).sum(), rel=1e-8)
    logits = q[:50] @ k[:50].T
    cut = (q[:50] @ a[:, :r].numpy()) @ (k[:50] @ b[:, :r].numpy()).T
    diff = logits - cut
    np.testing.assert_allclose(diff - diff.mean(-1, keepdims=True), 0, atol=1e-8)  # only a per-query shift


def _rotary_llama():
    torch.manual_seed(6)
    config = LlamaConfig(
        vocab_size=50,
        hidden_size=24,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=6,
        intermediate_size=30,
        max_position_embeddings=32,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # queries use one dimension of each head before rotation: rank 1 ...
        w = model.model.layers[0].self_attn.q_proj.weight.view(2, 6, 24)
        w[:, 1:] = 0
    return model  # ... but rotary positions turn dimension 0 into the pair (0, 3): rank 2 after it


@pytest.mark.parametrize("method", ["oracle", "realisable"])
def test_rotary_positions_count_the_rank_of_the_rotated_queries_and_keys(method):
    model = _rotary_llama()
    ids = torch.randint(0, 50, (3, 20), generator=torch.Generator().manual_seed(0))
    train = torch.randint(0, 50, (16, 20), generator=torch.Generator().manual_seed(1))
    modules = attention_modules(model, ids)
    maps = fit_head_maps(model, train, modules) if method == "realisable" else None
    with torch.no_grad():
        want = model(ids).logits
        out = {}
        for k in (1, 2):
            with truncated_logits(model, k, modules=modules, method=method, maps=maps):
                out[k] = model(ids).logits
    torch.testing.assert_close(out[2], want, atol=1e-5, rtol=1e-5)
    assert (out[1] - want).abs().max() > 1e-4


@pytest.mark.parametrize("method", ["oracle", "realisable"])
def test_a_farthest_point_model_of_logit_rank_r_is_kept_from_rank_r(method):
    """The farthest-point model (bidirectional, no positions) with query weights of rank r per head:
    its metrics are unchanged at k = r by either cut, and change at k = r − 1."""
    from fixedhead.data.synthetic import FarthestPointTask
    from fixedhead.studies.farthest_point.set_attention import SetAttentionModel, evaluate

    torch.manual_seed(0)
    r, d_p = 3, 8
    model = SetAttentionModel(8, 2, d_p, logit_scale=16.0).eval()
    with torch.no_grad():
        model.attention.qkv.weight.view(3, 2, d_p, 8)[0, :, r:] = 0
        model.attention.qkv.bias.view(3, 2, d_p)[0, :, r:] = 0
    task = FarthestPointTask(8, 3, 8)
    sets = task.sample(256, torch.Generator().manual_seed(1), task.projection)
    fit_sets = task.sample(256, torch.Generator().manual_seed(2), task.projection)
    modules = attention_modules(model, sets[0])
    maps = fit_head_maps(model, fit_sets[0], modules) if method == "realisable" else None
    full = evaluate(model, sets)
    got = {}
    with torch.no_grad():
        for k in (r - 1, r):
            with truncated_logits(model, k, modules=modules, method=method, maps=maps):
                got[k] = evaluate(model, sets)
    assert got[r]["mse"] == pytest.approx(full["mse"], rel=1e-5)
    assert abs(got[r - 1]["mse"] - full["mse"]) > 1e-4


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


def test_fit_visible_fits_each_matrix_as_it_would_alone():
    """Each matrix stops on its own rule: batched with a matrix that needs many more sweeps, its fit is
    the one it gets alone (so the oracle does not depend on which sequences share a batch)."""
    torch.manual_seed(5)
    visible = torch.ones(12, 12, dtype=torch.bool).tril()
    q, k = torch.randn(2, 12, 6, dtype=torch.float64), torch.randn(2, 12, 6, dtype=torch.float64)
    easy = q[0, :, :2] @ k[0, :, :2].T  # visible rank 2: exact at k = 2 after a few sweeps
    hard = (q[1] * torch.tensor([3.0, 2.0, 1.5, 1.0, 0.5, 0.2], dtype=torch.float64)) @ k[1].T
    together = fit_visible(torch.stack([easy, hard]), visible, 2)
    torch.testing.assert_close(together[0], fit_visible(easy, visible, 2), atol=1e-12, rtol=0)
    torch.testing.assert_close(together[1], fit_visible(hard, visible, 2), atol=1e-12, rtol=0)


@pytest.mark.parametrize("padding", ["left, causal", "right, bidirectional"])
def test_fit_visible_with_padding_is_finite_and_exact_at_the_logits_rank(padding):
    """Padding leaves keys no query sees (and, on the left of a decoder, queries that see nothing): their least
    squares are empty, and the fit must stay finite. Logits of rank 3 plus per-query shifts, fitted at k = 3:
    every visible entry reproduced (a NaN fit would zero the attention silently after the softmax)."""
    n = 10
    g = torch.Generator().manual_seed(8)
    q, k = (
        torch.randn(2, 2, n, 3, generator=g, dtype=torch.float64),
        torch.randn(2, 2, n, 3, generator=g, dtype=torch.float64),
    )
    s = q @ k.transpose(-1, -2) + torch.randn(2, 2, n, 1, generator=g, dtype=torch.float64)
    real = torch.ones(2, n, dtype=torch.bool)
    if padding.startswith("left"):
        real[1, :4] = False
        visible = torch.ones(n, n, dtype=torch.bool).tril()[None, None] & real[:, None, None, :]
    else:
        real[1, 6:] = False
        visible = real[:, None, None, :].expand(2, 1, n, n)
    visible = visible & real[:, None, :, None]  # a padding query sees nothing
    for rank in (1, 3):
        fit = fit_visible(s, visible, rank)
        assert bool(fit.isfinite().all()), rank
    m = visible.expand_as(s)
    torch.testing.assert_close(fit[m], s[m], atol=1e-6, rtol=0)


# ------------------------------------------------------------------ which cuts are causal


@pytest.mark.parametrize("index", [0, 2], ids=["fixedhead-causal", "llama-gqa"])
def test_the_realisable_cut_is_causal_and_the_oracle_is_not(index):
    """Two sequences that share their first 8 tokens: a causal model's outputs there are the same whatever
    follows. The realisable cut (fixed maps) keeps that; the oracle fits each sequence's visible logits with
    factors shared by all its queries, so its outputs at the shared prefix depend on the later tokens too (an
    optimistic bound that no causal model realises). Only the oracle's difference being above rounding is
    asserted, not its size."""
    torch.manual_seed(0)
    model = _models()[index].eval()
    with torch.no_grad():  # sharp attention: initialised weights attend almost uniformly
        for name, weight in model.named_parameters():
            if name.endswith(("qkv.weight", "q_proj.weight", "k_proj.weight")):
                weight.mul_(6)
    prefix, tail = torch.randint(0, 50, (1, 8)), torch.randint(0, 50, (2, 8))
    ids = torch.cat([prefix.expand(2, -1), tail], dim=1)  # [2, 16]: one prefix, two continuations
    modules = attention_modules(model, ids)
    maps = fit_head_maps(model, torch.randint(0, 50, (4, 16)), modules)

    def prefix_difference(method, rank, maps=None):
        with torch.no_grad(), truncated_logits(model, rank, modules=modules, method=method, maps=maps):
            logits = model(ids).logits.double()
        return (logits[0, :8] - logits[1, :8]).abs().max().item()

    with torch.no_grad():
        full = model(ids).logits.double()
    assert (full[0, :8] - full[1, :8]).abs().max().item() < 1e-5  # the model itself is causal
    for k in (1, 2):
        realisable, oracle = prefix_difference("realisable", k, maps), prefix_difference("oracle", k)
        assert realisable < 1e-5 and oracle > 1e-4


def _numpy_als(s, visible, rank, max_iter=100, tol=1e-4):
    """The oracle's earlier algorithm, written plainly in NumPy for one matrix: alternating least squares from
    the visible-filled SVD, each query's and each key's least squares solved alone over its visible entries,
    the step extrapolated as :func:`fit_visible` does, every residual summed entry by entry. Returns the fit's
    visible residual."""
    m = visible.astype(float)
    n_q, n_k = s.shape
    counts = np.maximum(m.sum(1, keepdims=True), 1)
    b = np.linalg.svd(m * (s - (m * s).sum(1, keepdims=True) / counts))[2][:rank].T
    a = np.zeros((n_q, rank + 1))

    def ridged(g):
        return g + 1e-12 * max(np.trace(g) / len(g), 1e-300) * np.eye(len(g))

    def residual(a, b):
        return float(((m * (s - a[:, :rank] @ b.T - a[:, rank:])) ** 2).sum())

    best, alpha = np.inf, 1.0
    for sweep in range(max_iter):
        bt = np.hstack([b, np.ones((n_k, 1))])
        new_a = np.stack(
            [np.linalg.solve(ridged(bt.T @ (m[i, :, None] * bt)), bt.T @ (m[i] * s[i])) for i in range(n_q)]
        )
        ak, c = new_a[:, :rank], new_a[:, rank]
        new_b = np.stack(
            [np.linalg.solve(ridged(ak.T @ (m[:, j, None] * ak)), ak.T @ (m[:, j] * (s[:, j] - c))) for j in range(n_k)]
        )
        now = residual(new_a, new_b)
        if sweep:
            a_far, b_far = new_a + alpha * (new_a - a), new_b + alpha * (new_b - b)
            far = residual(a_far, b_far)
            if far < now:
                new_a, new_b, now, alpha = a_far, b_far, far, alpha * 1.5
            else:
                alpha = 1.0
        a, b, previous, best = new_a, new_b, best, now
        if now <= 1e-24 * float(((m * s) ** 2).sum()) or (np.isfinite(previous) and previous - now <= tol * previous):
            break
    return best


@pytest.mark.parametrize("rotary", [False, True])
def test_fit_visible_fits_no_worse_than_plain_alternating_least_squares(rotary):
    """Against the earlier algorithm (one matrix, one row and one key at a time, in NumPy), on logits of rank 8
    with and without rotary positions, at every k below 8: no matrix is fitted worse by more than 1e-6 of its
    visible logits' squared norm, and over all matrices and k the residual is lower."""
    rng = np.random.default_rng(7)
    n, d_p = 14, 8
    q = rng.normal(size=(3, n, d_p)) * np.logspace(0.3, -1, d_p) + rng.normal(size=(3, 1, d_p))
    k = rng.normal(size=(3, n, d_p)) * np.logspace(-1, 0.3, d_p) + rng.normal(size=(3, 1, d_p))
    if rotary:  # pairs (i, i + d_p / 2) rotated by position × frequency, as Llama's rotary embedding
        angle = np.arange(n)[:, None] * 10000.0 ** (-np.arange(d_p // 2) / (d_p // 2))
        cos, sin = np.tile(np.cos(angle), 2), np.tile(np.sin(angle), 2)
        q, k = (x * cos + np.concatenate([-x[..., d_p // 2 :], x[..., : d_p // 2]], -1) * sin for x in (q, k))
    s = q @ k.transpose(0, 2, 1)
    visible = np.tril(np.ones((n, n), dtype=bool))
    ours, theirs = 0.0, 0.0
    for rank in range(1, d_p):
        got = fit_visible(torch.from_numpy(s), torch.from_numpy(visible), rank).numpy()
        for i in range(3):
            residual, reference = ((got[i] - s[i])[visible] ** 2).sum(), _numpy_als(s[i], visible, rank)
            assert residual <= reference + 1e-6 * (s[i][visible] ** 2).sum()
            ours, theirs = ours + residual, theirs + reference
    assert ours < theirs


# ------------------------------------------------------------------ padding


@pytest.mark.parametrize("index", [0, 1, 2], ids=["fixedhead-causal", "fixedhead-masked", "llama-gqa"])
def test_padding_keys_stay_hidden_under_the_intervention(index):
    """A batch with padding (left for the decoders, right for the encoder): with nothing cut (rank None, the same
    code path) and at k = d_p the outputs at real tokens are the model's own, and every cut depends on the real
    tokens only (changing the padded tokens changes nothing)."""
    torch.manual_seed(0)
    model = _models()[index].eval()
    ids = torch.randint(1, 50, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    if index == 1:
        mask[1, 6:] = 0
    else:
        mask[1, :4] = 0
    other = torch.where(mask.bool(), ids, 0)  # the same real tokens, other padding tokens
    real = mask.bool()
    modules = attention_modules(model, ids)
    maps = fit_head_maps(model, torch.randint(0, 50, (4, 10)), modules)
    with torch.no_grad():
        want = model(ids, attention_mask=mask).logits
        for rank, method in ((None, "oracle"), (6, "oracle"), (6, "realisable"), (2, "oracle"), (2, "realisable")):
            given = maps if method == "realisable" else None
            with truncated_logits(model, rank, modules=modules, method=method, maps=given):
                got = model(ids, attention_mask=mask).logits
                again = model(other, attention_mask=mask).logits
            if rank in (None, 6):
                torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(again[real], got[real], atol=1e-5, rtol=1e-5)


def test_a_bare_layer_keeps_its_padding_mask_under_the_intervention():
    torch.manual_seed(0)
    layer = MultiHeadAttention(hidden_size=16, num_attention_heads=2, head_dim=8).eval()
    x = torch.randn(2, 10, 16)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0
    modules = attention_modules(layer, x)
    with torch.no_grad():
        want = layer(x, attention_mask=mask)[0]
        for rank in (None, 8):
            with truncated_logits(layer, rank, modules=modules):
                got = layer(x, attention_mask=mask)[0]
            torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=1e-5)
