"""FixedHeadForCausalLM: a decoder with the same attention layer, against transformers' own BERT decoder.

Expected values come from transformers' ``BertLMHeadModel`` (``is_decoder=True``) with the same
weights, from the definition of causal attention (a token's output never depends on later tokens),
and from generation without a cache.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, BertConfig, BertForMaskedLM, BertLMHeadModel, DynamicCache

from fixedhead import FixedHeadConfig, FixedHeadForCausalLM, from_bert
from fixedhead.model.attention import MultiHeadAttention
from fixedhead.model.kernels import causal_bias


def bert_config(**kw) -> BertConfig:
    base = dict(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        is_decoder=True,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertConfig(**{**base, **kw})


def tiny(head_dim=16, **kw) -> FixedHeadForCausalLM:
    cfg = FixedHeadConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        head_dim=head_dim,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        **kw,
    )
    return FixedHeadForCausalLM(cfg).eval()


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_parity_with_transformers_bert_decoder(impl):
    torch.manual_seed(0)
    bert = BertLMHeadModel(bert_config(attn_implementation=impl)).eval()
    ours = from_bert(bert)
    assert isinstance(ours, FixedHeadForCausalLM) and ours.config.is_decoder
    ids = torch.randint(0, 100, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 9:] = 0  # right padding
    with torch.no_grad():
        expected, got = (
            bert(input_ids=ids, attention_mask=mask, labels=ids),
            ours(input_ids=ids, attention_mask=mask, labels=ids),
        )
    keep = mask.bool()
    torch.testing.assert_close(got.logits[keep], expected.logits[keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.loss, expected.loss, atol=1e-5, rtol=1e-5)


def test_a_decoder_bert_masked_lm_stays_causal():
    torch.manual_seed(1)
    bert = BertForMaskedLM(bert_config()).eval()  # is_decoder=True: BERT attends left to right here too
    with pytest.warns(UserWarning, match="decoder config"):  # as BERT, which logs the same
        ours = from_bert(bert).eval()
    ids = torch.randint(0, 100, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, bert(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


def test_a_bidirectional_lm_head_model_is_refused():
    with pytest.raises(ValueError, match="is_decoder=False attends in both directions"):
        from_bert(BertLMHeadModel(bert_config(is_decoder=False)))


@pytest.mark.parametrize("head_dim", [None, 16])
def test_outputs_never_depend_on_later_tokens(head_dim):
    torch.manual_seed(2)
    model = tiny(head_dim)
    ids = torch.randint(3, 60, (2, 10))
    changed = ids.clone()
    changed[:, 6:] = torch.randint(3, 60, (2, 4))
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=0, rtol=0)
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-3


def test_loss_is_next_token_cross_entropy():
    torch.manual_seed(3)
    model = tiny()
    ids = torch.randint(3, 60, (2, 8))
    labels = ids.clone()
    labels[0, 5] = -100
    with torch.no_grad():
        out = model(ids, labels=labels)
    logits, targets = out.logits[:, :-1].reshape(-1, 60), labels[:, 1:].reshape(-1)  # predict t+1 from <= t
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100))


def test_a_cache_gives_the_same_logits_as_the_whole_sequence():
    torch.manual_seed(4)
    model = tiny()
    ids = torch.randint(3, 60, (2, 11))
    with torch.no_grad():
        whole = model(ids).logits
        first = model(ids[:, :7], cache=DynamicCache(config=model.config), use_cache=True)
        rest = model(ids[:, 7:], cache=first.cache, use_cache=True)
    assert first.cache.get_seq_length() == 11
    torch.testing.assert_close(torch.cat([first.logits, rest.logits], 1), whole, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sampling", [False, True])
def test_generate_with_and_without_cache(sampling):
    torch.manual_seed(5)
    model = tiny()
    model.generation_config.eos_token_id = None  # a random model; generate the full length
    prompt = torch.randint(3, 60, (2, 4))
    kw = dict(max_new_tokens=9, do_sample=sampling, top_k=5 if sampling else None)
    torch.manual_seed(0)
    cached = model.generate(prompt, use_cache=True, **kw)
    torch.manual_seed(0)
    uncached = model.generate(prompt, use_cache=False, **kw)
    assert cached.shape == (2, 13) and torch.equal(cached[:, :4], prompt)
    assert torch.equal(cached, uncached)


def test_left_padded_batch_generates_what_each_prompt_does_alone():
    torch.manual_seed(6)
    model = tiny()
    model.generation_config.eos_token_id = None
    prompts = torch.randint(3, 60, (2, 5))
    padded = prompts.clone()
    padded[0, :2] = 0
    mask = torch.ones_like(padded)
    mask[0, :2] = 0
    batch = model.generate(padded, attention_mask=mask, max_new_tokens=6, do_sample=False)
    alone = model.generate(prompts[:1, 2:], max_new_tokens=6, do_sample=False)
    assert torch.equal(batch[0, 2:], alone[0])


def test_causal_bias_after_a_cache():
    bias = causal_bias(2, 5, torch.float32)
    assert bias.shape == (1, 1, 2, 5)
    hidden = bias[0, 0] < 0
    # queries are the tokens at positions 3 and 4: each sees keys 0..its own position
    assert hidden.tolist() == [[False, False, False, False, True], [False] * 5]
    with pytest.raises(ValueError, match="query_len <= key_len"):
        causal_bias(6, 5, torch.float32)


def test_layer_refuses_a_cache_without_its_index():
    with pytest.raises(ValueError, match="layer_idx"):
        MultiHeadAttention(32, 4)(torch.randn(1, 3, 32), cache=DynamicCache(), is_causal=True)


def test_saved_run_loads_with_auto_class_and_generates(tmp_path):
    model = tiny()
    model.save_pretrained(tmp_path / "m")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    assert isinstance(loaded, FixedHeadForCausalLM) and loaded.config.is_decoder
    ids = torch.randint(3, 60, (1, 6))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    assert loaded.cls.decoder.weight is loaded.fixedhead.embeddings.word_embeddings.weight  # tied by default


def test_bad_labels_and_positions_are_refused():
    model = tiny()
    ids = torch.randint(3, 60, (1, 6))
    with pytest.raises(ValueError, match="labels hold 60, outside the vocabulary"):
        model(ids, labels=torch.full((1, 6), 60))
    with pytest.raises(ValueError, match="labels must have shape"):
        model(ids, labels=torch.zeros(1, 5, dtype=torch.long))
    first = model(ids, use_cache=True)
    with pytest.raises(ValueError, match="6 cached \\+ 30 new tokens exceeds max_position_embeddings=32"):
        model(torch.randint(3, 60, (1, 30)), cache=first.cache, use_cache=True)


# ------------------------------------------------------------------ training a causal LM
def test_pretrain_clm_writes_a_causal_run_that_evaluates_the_same(tiny_causal_run):
    from fixedhead.training import evaluate_run

    run, data, result = tiny_causal_run
    assert result["objective"] == "clm"
    # every packed row scores its n - 2 next tokens (not [CLS], not the closing [SEP])
    assert result["heldout_masked_tokens"] == data.heldout.shape[0] * (data.heldout.shape[1] - 2)
    again = evaluate_run(run)
    assert again["objective"] == "clm"
    assert again["loss"] == pytest.approx(result["heldout_loss"], rel=1e-6)
    assert (run / "README.md").read_text().count("text-generation") >= 1


def test_text_generation_pipeline_continues_a_prompt(tiny_causal_run):
    from transformers import pipeline

    run, _, _ = tiny_causal_run
    generate = pipeline("text-generation", model=str(run))
    ids = generate.tokenizer("it was the best of times")["input_ids"]
    assert (
        ids[0] == generate.tokenizer.cls_token_id and generate.tokenizer.sep_token_id not in ids
    )  # continued, not closed
    out = generate("it was the best of times", max_new_tokens=5, do_sample=False)[0]["generated_text"]
    assert out.startswith("it was the best of times") and len(out) > len("it was the best of times")
    # the pipeline's default of 256 new tokens runs past the 32 learned positions: refused before
    # generating, naming the table and how many new tokens fit (a prompt of len(ids) embeds 32 + 1 - len(ids))
    with pytest.raises(ValueError, match=f"max_position_embeddings=32 .*at most {33 - len(ids)} new tokens"):
        generate("it was the best of times")
    tokens = generate("it was the best of times", max_new_tokens=33 - len(ids), return_tensors=True)
    assert len(tokens[0]["generated_token_ids"]) <= 33


def test_causal_unigram_reference_counts_every_predicted_token(tiny_causal_run):
    import math
    from collections import Counter

    from fixedhead.data.lm import unigram_perplexity

    _, data, _ = tiny_causal_run
    vocab = len(data.tokenizer)
    special = set(data.tokenizer.all_special_ids)
    counts = Counter(t for t in data.train.reshape(-1).tolist() if t not in special)
    total = sum(counts.values())
    targets = data.heldout[:, 1:-1].reshape(-1).tolist()  # tokens 1..n-2 of every row
    expected = math.exp(-sum(math.log((counts[t] + 1) / (total + vocab)) for t in targets) / len(targets))
    assert unigram_perplexity(data, objective="clm") == pytest.approx(expected, rel=1e-9)


def test_cli_compare_causal_reports_the_unigram_reference(small_real_corpus, tmp_path, monkeypatch, capsys):
    import json

    from fixedhead.cli import main

    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "cmp"
    assert (
        main(
            [
                "compare",
                "--preset",
                "tiny",
                "--objective",
                "clm",
                "--corpus",
                str(small_real_corpus),
                "--max-steps",
                "3",
                "--output-dir",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "below unigram" in printed and "held-out next tokens" in printed
    results = json.loads((out / "results.json").read_text())["runs"].values()
    assert {r["objective"] for r in results} == {"clm"} and all(r["unigram_perplexity"] > 1 for r in results)
    assert all(json.loads((out / name / "config.json").read_text())["is_decoder"] for name in ("standard", "fixed"))
    # every causal model's continuation of each prompt is printed and kept (the README's output check)
    from fixedhead.studies.compare import SAMPLE_PROMPTS

    for r in results:
        assert set(r["samples"]) == set(SAMPLE_PROMPTS) and all(r["samples"].values())
    assert f"| standard | {SAMPLE_PROMPTS[0]} … | " in printed


def test_a_causal_config_in_the_masked_lm_class_warns():
    """As transformers' BertForMaskedLM: allowed, but said (AutoModelForMaskedLM or the fill-mask
    pipeline on a causal run would otherwise answer with causal attention, silently)."""
    from fixedhead import FixedHeadConfig, FixedHeadForMaskedLM

    config = FixedHeadConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, intermediate_size=64)
    config.is_decoder = True
    with pytest.warns(UserWarning, match="decoder config"):
        FixedHeadForMaskedLM(config)
