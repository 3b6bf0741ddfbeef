"""``fixedhead shrink``: queries and keys cut to size K, the realisable rank-K cut folded into the weights."""

from __future__ import annotations

import json
import re

import pytest
import torch

from fixedhead.diagnostics.intervention import attention_modules, fit_head_maps, truncated_logits
from fixedhead.model.configuration import FixedHeadConfig
from fixedhead.model.modeling import FixedHeadForCausalLM, FixedHeadForMaskedLM
from fixedhead.shrink import shrink_model


def _model(cls=FixedHeadForCausalLM, query_rank=None, seed=0, **config):
    """d = 32, 4 heads of size 8, 2 layers; with ``query_rank`` r each head's queries use only r of
    their 8 dimensions (the rest of its query rows and bias are zero): logits of rank r."""
    torch.manual_seed(seed)
    config = FixedHeadConfig(
        vocab_size=50,
        hidden_size=32,
        num_attention_heads=4,
        head_dim=8,
        num_hidden_layers=2,
        intermediate_size=64,
        max_position_embeddings=32,
        is_decoder=cls is FixedHeadForCausalLM,
        **config,
    )
    model = cls(config).eval()
    with torch.no_grad():  # sharp attention (initialised weights give near-uniform attention)
        for m in attention_modules(model, torch.zeros(1, 4, dtype=torch.long)):
            m.qkv.weight[:64].mul_(30)
            if query_rank is not None:
                m.qkv.weight[:32].view(4, 8, 32)[:, query_rank:] = 0
                m.qkv.bias[:32].view(4, 8)[:, query_rank:] = 0
    return model


def _fit(model, seed=1):
    train = torch.randint(0, 50, (32, 16), generator=torch.Generator().manual_seed(seed))
    return fit_head_maps(model, train, attention_modules(model, train[:1]))


@pytest.mark.parametrize(
    "cls, config",
    [
        (FixedHeadForCausalLM, {}),
        (FixedHeadForMaskedLM, {}),
        (FixedHeadForCausalLM, {"parametrization": "mup", "mup_base_head_dim": 4}),  # logit scale 1/d_p
        (FixedHeadForCausalLM, {"v_head_dim": 12}),  # values of their own size, kept
    ],
)
def test_a_model_whose_logits_have_rank_r_is_unchanged_when_shrunk_to_r_and_changed_below(cls, config):
    """The known answer, from the original model itself: queries of rank r per head lose nothing at
    K = r (the maps are exact on the data's span), and a head of K = r − 1 computes something else."""
    r = 3
    model = _model(cls, query_rank=r, **config)
    v = config.get("v_head_dim", 8)
    maps = _fit(model)
    ids = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids).logits
        at_r = shrink_model(model, maps, r)
        below = shrink_model(model, maps, r - 1)
        torch.testing.assert_close(at_r(ids).logits, want, atol=2e-5, rtol=1e-5)
        assert (below(ids).logits - want).abs().max() > 1e-3
    layer = attention_modules(at_r, ids)[0]
    assert (at_r.config.qk_head_dim, layer.qk_head_dim, layer.v_head_dim) == (r, r, v)
    assert layer.qkv.weight.shape == (4 * (2 * r + v), 32)
    for name, p in model.state_dict().items():  # values, out_proj, embeddings, FFN: copied as they are
        if ".qkv." not in name:
            assert torch.equal(at_r.state_dict()[name], p), name
        else:
            assert torch.equal(at_r.state_dict()[name][-4 * v :], p[-4 * v :]), name  # the value rows


def test_the_shrunk_model_computes_the_interventions_realisable_cut_and_caches_keys_of_size_k():
    model = _model()
    maps = _fit(model)
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(3))
    modules = attention_modules(model, ids)
    small = shrink_model(model, maps, 3)
    with torch.no_grad():
        with truncated_logits(model, 3, modules=modules, method="realisable", maps=maps):
            want = model(ids).logits
        out = small(ids, use_cache=True)
    torch.testing.assert_close(out.logits, want, atol=1e-5, rtol=1e-5)
    assert (out.logits - model(ids).logits).abs().max() > 1e-4  # the cut to 3 of 8 changed something
    cache = out.cache
    keys, values = cache.layers[0].keys, cache.layers[0].values
    assert keys.shape == (2, 4, 12, 3) and values.shape == (2, 4, 12, 8)
    with torch.no_grad():  # decoding from the cache gives what a full forward pass gives
        step = small(ids[:, -1:] * 0 + 7, cache=cache, use_cache=True).logits[:, -1]
        full = small(torch.cat([ids, ids[:, -1:] * 0 + 7], 1)).logits[:, -1]
    torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)


def test_shrink_model_refuses_a_size_it_cannot_cut_to():
    model = _model()
    maps = _fit(model)
    with pytest.raises(ValueError, match="qk-head-dim 9 is larger"):
        shrink_model(model, maps, 9)
    with pytest.raises(ValueError, match="qk_head_dim"):
        shrink_model(model, maps, 0)
    with pytest.raises(ValueError, match="one \\(A, B\\) pair per attention layer"):
        shrink_model(model, maps[:1], 2)


@pytest.mark.parametrize(
    "which, shape, shown",
    [
        (0, (1, 8, 8), r"\(1, 8, 8\) and \(4, 8, 8\)"),  # one head's map, which would broadcast over all four
        (1, (4, 6, 6), r"\(4, 8, 8\) and \(4, 6, 6\)"),  # maps of queries and keys of size 6
        (0, (4, 8, 2), r"\(4, 8, 2\) and \(4, 8, 8\)"),  # fewer columns than the new size 3
    ],
)
def test_shrink_model_refuses_a_map_of_another_shape_naming_the_layer_and_leaves_the_model(which, shape, shown):
    model = _model()
    maps = _fit(model)
    maps[1] = tuple(torch.zeros(shape, dtype=torch.float64) if j == which else t for j, t in enumerate(maps[1]))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError) as refused:
        shrink_model(model, maps, 3)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("maps[1] (layer ")
    second = attention_modules(model, torch.zeros(1, 4, dtype=torch.long))[1]
    layer = next(n for n, m in model.named_modules() if m is second)
    assert f"(layer {layer}): A and B must each be [4, 8, >= 3] (heads" in message
    assert re.search(f"got {shown}$", message), message
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_command_writes_a_run_that_loads_and_scores_like_any_run(tiny_causal_run, tmp_path):
    from transformers import AutoModelForCausalLM

    from fixedhead.cli import main
    from fixedhead.diagnostics.intervention import run_rank_curve
    from fixedhead.training.evaluate import evaluate_run

    run, _, _ = tiny_causal_run
    out = tmp_path / "small"
    argv = ["shrink", str(run), "--qk-head-dim", "4", "--output-dir", str(out), "--fit-tokens", "2000"]
    assert main([*argv, "--no-progress"]) == 0
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert not list(out.glob("*.bin"))
    record = json.loads((out / "shrink.json").read_text())
    assert (record["qk_head_dim"], record["old_qk_head_dims"], record["v_head_dim"]) == (4, [16], 16)
    loaded = AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True)
    assert loaded.config.qk_head_dim == 4
    # scored on the source's held-out text, it is the intervention's realisable cut at k = 4
    score = evaluate_run(out, max_eval_tokens=1000)["loss"]
    curve = run_rank_curve(run, 1000, ranks=[4], per_layer=False, progress=False, method="realisable", fit_tokens=2000)
    assert score == pytest.approx(curve["curves"]["all"][4], abs=1e-5)
    # bad input: one line, nothing written
    assert main(["shrink", str(run), "--qk-head-dim", "17", "--output-dir", str(tmp_path / "big")]) == 2
    assert not (tmp_path / "big").exists()
    assert main(["shrink", str(run), "--qk-head-dim", "4", "--output-dir", str(run)]) == 2
    assert main([*argv, "--no-progress"]) == 2  # an earlier output, without --overwrite


def test_the_command_fine_tunes_the_shrunk_model_with_the_pretraining_trainer(tiny_causal_run, tmp_path, capsys):
    from fixedhead.cli import main
    from fixedhead.runs import open_run

    run, _, _ = tiny_causal_run
    out = tmp_path / "small"
    argv = ["shrink", str(run), "--qk-head-dim", "2", "--output-dir", str(out), "--fit-tokens", "2000"]
    capsys.readouterr()
    assert main([*argv, "--finetune-steps", "2", "--no-progress"]) == 0
    # --no-progress: nothing per step, neither the Trainer's log dicts nor transformers' loading bars
    printed = capsys.readouterr()
    assert printed.out.splitlines() == [printed.out.splitlines()[-1]] and printed.out.startswith("shrunk "), printed.out
    assert "{'" not in printed.out and "it/s]" not in printed.err, printed.err
    record = json.loads((out / "shrink.json").read_text())
    tuned = open_run(out / "finetuned")
    assert tuned.config.qk_head_dim == 2 and record["finetuned"]["steps"] == 2
    assert tuned.settings["train"]["max_steps"] == 2
    assert record["finetuned"]["heldout_loss"] > 0


def test_a_masked_lm_run_shrinks_to_what_the_intervention_scores(tiny_pretrained_run, tmp_path):
    from fixedhead.diagnostics.intervention import run_rank_curve
    from fixedhead.shrink import shrink_run
    from fixedhead.training.evaluate import evaluate_run

    run, _, _ = tiny_pretrained_run
    record = shrink_run(run, 2, tmp_path / "small", fit_tokens=2000, progress=False)
    assert (record["objective"], record["old_qk_head_dims"], record["qk_head_dim"]) == ("mlm", [16, 16], 2)
    score = evaluate_run(tmp_path / "small", max_eval_tokens=1000)["loss"]
    curve = run_rank_curve(run, 1000, ranks=[2], per_layer=False, progress=False, method="realisable", fit_tokens=2000)
    assert score == pytest.approx(curve["curves"]["all"][2], abs=1e-5)


def _without_corpus(run, folder):
    """A copy of ``run`` whose settings record no corpus (as a run trained from Python on text in memory)."""
    import shutil

    copy = folder / "no-corpus"
    shutil.copytree(run, copy)
    path = copy / "pretrain_settings.json"
    settings = json.loads(path.read_text())
    settings["data"]["corpus"] = None
    path.write_text(json.dumps(settings))
    return copy


def test_a_run_that_records_no_corpus_is_shrunk_and_intervened_with_the_corpus_option(
    tiny_causal_run, small_real_corpus, tmp_path, capsys
):
    """The refusal's advice can be followed: both commands take --corpus, the corpus the fit reads."""
    from fixedhead.cli import main
    from fixedhead.training.evaluate import evaluate_run

    run = _without_corpus(tiny_causal_run[0], tmp_path)
    out = tmp_path / "small"
    argv = ["shrink", str(run), "--qk-head-dim", "4", "--output-dir", str(out), "--fit-tokens", "2000", "--no-progress"]
    assert main(argv) == 2
    assert "records no corpus; pass --corpus" in capsys.readouterr().err and not out.exists()
    assert main([*argv, "--corpus", str(small_real_corpus)]) == 0
    assert evaluate_run(out, max_eval_tokens=500)["loss"] > 0  # the shrunk run records where its text is

    ri = tmp_path / "ri"
    argv = ["rank-intervention", str(run), "--output-dir", str(ri), "--ranks", "4", "--max-eval-tokens", "500"]
    argv += ["--fit-tokens", "1000", "--no-progress"]
    assert main(argv) == 2
    assert "records no corpus; pass --corpus" in capsys.readouterr().err and not ri.exists()
    assert main([*argv, "--corpus", str(small_real_corpus)]) == 0
    assert (ri / "rank_intervention.json").is_file()


def test_no_progress_shows_none_of_transformers_bars(tiny_causal_run, tmp_path, capfd):
    """--no-progress: no bar while the weights load or the shrunk model is written (transformers' own switch)."""
    from transformers.utils import logging as hf_logging

    from fixedhead.shrink import shrink_run
    from fixedhead.training.settings import transformers_progress_bars

    run, _, _ = tiny_causal_run
    with transformers_progress_bars(True):  # bars on, whatever an earlier test left
        capfd.readouterr()
        shrink_run(run, 4, tmp_path / "small", fit_tokens=2000, progress=False)
        err = capfd.readouterr().err
        assert "Loading" not in err and "Writing" not in err and "it/s" not in err, err
        assert hf_logging.is_progress_bar_enabled()  # switched back afterwards


def test_layers_of_different_head_sizes_shrink_and_keep_each_layers_values():
    """head_dim = [8, 6]: queries and keys of every layer cut to K = 3, each layer's values keep their own size
    (8, then 6), and the shrunk model computes the intervention's realisable cut."""
    torch.manual_seed(0)
    config = FixedHeadConfig(
        vocab_size=50,
        hidden_size=32,
        num_attention_heads=4,
        head_dim=[8, 6],
        num_hidden_layers=2,
        intermediate_size=64,
        max_position_embeddings=32,
        is_decoder=True,
    )
    model = FixedHeadForCausalLM(config).eval()
    maps = _fit(model)
    small = shrink_model(model, maps, 3)
    layers = attention_modules(small, torch.zeros(1, 4, dtype=torch.long))
    assert [(m.qk_head_dim, m.v_head_dim) for m in layers] == [(3, 8), (3, 6)]
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        with truncated_logits(model, 3, modules=attention_modules(model, ids), method="realisable", maps=maps):
            want = model(ids).logits
        torch.testing.assert_close(small(ids).logits, want, atol=1e-5, rtol=1e-5)


def test_the_maps_and_the_fold_against_numpy_on_a_one_layer_model():
    """From the weights alone, in NumPy: the maps' rank-K form A_K B_Kᵀ is the best one for the training text's
    moments (C_q = E[q̃ q̃ᵀ] of the scaled queries q̃ = s·q, C_k the keys' covariance: the Eckart–Young truncation
    of C_q^{1/2} C_k^{1/2}), and the shrunk model attends with softmax((q̃ᵀ A_K)(B_Kᵀ k)) under the causal mask,
    its values (size 5) as they were."""
    import numpy as np

    torch.manual_seed(0)
    config = FixedHeadConfig(
        vocab_size=50,
        hidden_size=32,
        num_attention_heads=4,
        head_dim=8,
        v_head_dim=5,
        num_hidden_layers=1,
        intermediate_size=64,
        max_position_embeddings=32,
        is_decoder=True,
    )
    model = FixedHeadForCausalLM(config).eval()
    train = torch.randint(0, 50, (32, 16), generator=torch.Generator().manual_seed(1))
    maps = fit_head_maps(model, train, attention_modules(model, train[:1]))
    layer = attention_modules(model, train[:1])[0]
    w, bias, s = layer.qkv.weight.double().detach().numpy(), layer.qkv.bias.double().detach().numpy(), layer.scale

    def heads(x, rows):  # [batch, n, 32] -> [batch, 4, n, 8]
        y = x @ w[rows].T + bias[rows]
        return y.reshape(*x.shape[:2], 4, 8).transpose(0, 2, 1, 3)

    with torch.no_grad():
        x = model.base_model.embeddings(train).double().numpy()
    q = (s * heads(x, slice(0, 32))).transpose(1, 0, 2, 3).reshape(4, -1, 8)  # [heads, tokens, 8]
    k = heads(x, slice(32, 64)).transpose(1, 0, 2, 3).reshape(4, -1, 8)
    cq = q.transpose(0, 2, 1) @ q / q.shape[1]
    kc = k - k.mean(1, keepdims=True)
    ck = kc.transpose(0, 2, 1) @ kc / k.shape[1]

    def sqrtm(c):
        e, v = np.linalg.eigh(c)
        return (v * np.sqrt(np.clip(e, 0, None))[..., None, :]) @ v.transpose(0, 2, 1)

    u, sv, vt = np.linalg.svd(sqrtm(cq) @ sqrtm(ck))
    K = 3
    best = (u[..., :K] * sv[..., None, :K]) @ vt[..., :K, :]  # C_q^{1/2} W_K C_k^{1/2}
    a, b = (m[..., :K].numpy() for m in maps[0])
    np.testing.assert_allclose(sqrtm(cq) @ a @ b.transpose(0, 2, 1) @ sqrtm(ck), best, atol=1e-8)

    small = shrink_model(model, maps, K)
    small.set_attn_implementation("eager")
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        probs = small(ids, output_attentions=True).attentions[0].double().numpy()
        x = model.base_model.embeddings(ids).double().numpy()
    logits = ((s * heads(x, slice(0, 32))) @ a) @ (heads(x, slice(32, 64)) @ b).transpose(0, 1, 3, 2)
    logits = np.where(np.tril(np.ones((12, 12), dtype=bool)), logits, -np.inf)
    want = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(probs, want / want.sum(-1, keepdims=True), atol=1e-6)
    assert [tuple(m.qkv.weight.shape) for m in attention_modules(small, ids[:1])] == [(4 * (2 * K + 5), 32)]
