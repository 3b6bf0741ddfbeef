"""The causal LM's generation contract, each input against transformers' GPT-2 or BERT built from a
local config (no downloads) as the expected behaviour.

Special token ids live in the config, head sizes are read where transformers reads them, every
cache implementation does what it does for GPT-2, generation lengths are checked before the first
forward pass, a masked checkpoint opened as a causal LM warns as BERT's does, config rules hold
after ``from_pretrained`` overrides, and export-style decoding takes the token types BERT takes.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    BertConfig,
    BertForMaskedLM,
    BertLMHeadModel,
    GPT2Config,
    GPT2LMHeadModel,
    StaticCache,
)
from transformers.configuration_utils import get_head_shapes
from transformers.exporters.utils import decompose_prefill_decode
from transformers.generation.configuration_utils import ALL_CACHE_IMPLEMENTATIONS
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging as hf_logging

from fixedhead import (
    FixedHeadConfig,
    FixedHeadForCausalLM,
    FixedHeadForMaskedLM,
    FixedHeadModel,
    count_parameters,
    from_bert,
)

V, D, H, L, P = 60, 32, 4, 2, 16  # vocabulary, hidden size, heads, layers, learned positions


def gpt2(**kw) -> GPT2LMHeadModel:
    config = GPT2Config(vocab_size=V, n_embd=D, n_layer=L, n_head=H, n_positions=P, bos_token_id=1, eos_token_id=2)
    for key, value in kw.items():
        setattr(config, key, value)
    return GPT2LMHeadModel(config).eval()


def fixedhead_config(head_dim=16, **kw) -> FixedHeadConfig:
    base = dict(
        vocab_size=V,
        hidden_size=D,
        num_hidden_layers=L,
        num_attention_heads=H,
        head_dim=head_dim,
        intermediate_size=64,
        max_position_embeddings=P,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        is_decoder=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    return FixedHeadConfig(**{**base, **kw})


def fixedhead(head_dim=16, **kw) -> FixedHeadForCausalLM:
    return FixedHeadForCausalLM(fixedhead_config(head_dim, **kw)).eval()


def prompt(batch=2, length=5, seed=0) -> torch.Tensor:
    return torch.randint(3, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def outcome(fn):
    """What a call did: ("ok", its value) or ("raised", the exception's type)."""
    try:
        return "ok", fn()
    except Exception as e:  # the type is what is compared
        return "raised", type(e)


# ----------------------------------------------------------------- special token ids in the config
def test_bos_and_eos_are_config_fields_as_in_bert(tmp_path):
    assert (FixedHeadConfig().bos_token_id, FixedHeadConfig().eos_token_id) == (
        BertConfig().bos_token_id,
        BertConfig().eos_token_id,
    )
    bert = BertLMHeadModel(BertConfig(vocab_size=V, is_decoder=True, bos_token_id=1, eos_token_id=2))
    ours = fixedhead()
    for model in (bert, ours):  # generate reads them from the model's generation config
        assert (model.generation_config.bos_token_id, model.generation_config.eos_token_id) == (1, 2)
    ours.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert (again.config.bos_token_id, again.config.eos_token_id) == (1, 2)
    assert fixedhead_config(eos_token_id=[2, 5]).eos_token_id == [2, 5]
    with pytest.raises(ValueError, match=r"eos_token_id must be in \[0, vocab_size=60\), got 60"):
        fixedhead_config(eos_token_id=60)


def test_generation_stops_at_eos_as_for_gpt2():
    for model in (gpt2(), fixedhead()):
        ids = prompt(batch=1)
        free = model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
        stop = int(free[0, ids.shape[1] + 2])  # the third new token becomes the end of sequence
        first = (free[0, ids.shape[1] :] == stop).nonzero()[0].item()
        out = model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=stop, pad_token_id=0)
        assert out.shape[1] == ids.shape[1] + first + 1 and out[0, -1] == stop, type(model).__name__


def test_a_trained_causal_run_records_its_tokenizers_ids(tiny_causal_run):
    from transformers import AutoTokenizer, GenerationConfig

    run, _, _ = tiny_causal_run
    tokenizer = AutoTokenizer.from_pretrained(run)
    loaded = AutoModelForCausalLM.from_pretrained(run)
    want = (tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id)
    assert (loaded.config.bos_token_id, loaded.config.eos_token_id, loaded.config.pad_token_id) == want
    saved = GenerationConfig.from_pretrained(run)
    assert (saved.bos_token_id, saved.eos_token_id, saved.pad_token_id) == want


# ----------------------------------------------------------------- head sizes where transformers reads them
@pytest.mark.parametrize("head_dim, want", [(None, [8, 8]), (16, [16, 16]), ([None, 12], [8, 12])])
def test_head_dim_is_resolved_where_transformers_reads_it(head_dim, want):
    # GPT-2: the head size transformers reads for the cache is that of the cached keys
    reference = gpt2()
    with torch.no_grad():
        cache = reference(prompt(), use_cache=True).past_key_values
    assert get_head_shapes(reference.config) == (H, cache.layers[0].keys.shape[-1]) == (H, D // H)

    model = fixedhead(head_dim)
    with torch.no_grad():
        cache = model(prompt(), use_cache=True).past_key_values
    assert [layer.keys.shape[-1] for layer in cache.layers] == want
    assert [layer.head_dim for layer in model.config.per_layer_config] == want
    assert get_head_shapes(model.config) == (H, want[0] if len(set(want)) == 1 else want)
    assert model.config.head_dim == head_dim  # the setting itself (None = d/h) is what is saved


# ----------------------------------------------------------------- every cache implementation


@pytest.mark.parametrize(
    "impl",
    ALL_CACHE_IMPLEMENTATIONS,
)
def test_every_cache_implementation_does_what_it_does_for_gpt2(impl):
    """Same tokens as without it where GPT-2 gives the same tokens; the same exception where GPT-2
    raises (offloading needs a GPU here, quantized caches a quantization package)."""
    ids = prompt()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notices of some implementation names
        results = []
        for model in (gpt2(), fixedhead()):
            plain = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
            kind, value = outcome(
                lambda model=model: model.generate(
                    ids, max_new_tokens=6, do_sample=False, pad_token_id=0, cache_implementation=impl
                )
            )
            results.append((kind, torch.equal(value, plain) if kind == "ok" else value))
    if results[0][0] == "raised" and results[1][0] == "raised":
        # where GPT-2 fails deep inside (offloading needs CUDA streams), fixedhead refuses by name first
        assert results[1][1] in (results[0][1], ValueError)
    else:
        assert results[1] == results[0]


@pytest.mark.parametrize("head_dim", [16, [None, 12]])
def test_a_static_cache_passed_to_forward_gives_the_uncached_logits(head_dim):
    for model in (gpt2(), fixedhead(head_dim)):
        ids = prompt(length=6)
        cache = StaticCache(config=model.config, max_cache_len=12)
        with torch.no_grad():
            want = model(ids).logits
            first = model(ids[:, :4], cache=cache, use_cache=True).logits
            second = model(ids[:, 4:], cache=cache, use_cache=True).logits
        torch.testing.assert_close(torch.cat([first, second], 1), want, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------- training with a cache-using config
def test_gradient_checkpointing_with_use_cache_in_the_config_trains_as_gpt2():
    ids = prompt(length=8)
    for model in (gpt2(use_cache=True), fixedhead(use_cache=True)):
        model.train()
        model.gradient_checkpointing_enable()
        logits = model(ids).logits  # a loss of the user's own, from the logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
        loss.backward()
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad), type(model).__name__


@pytest.mark.slow
def test_fullgraph_compile_at_changing_lengths():
    torch._dynamo.reset()
    for model in (gpt2(), fixedhead()):
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        with torch.no_grad():
            for length in (5, 7, 9):
                ids = prompt(length=length)
                torch.testing.assert_close(compiled(ids).logits, model(ids).logits, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------- lengths
def _messages(model, call):
    """Everything ``call`` warned, through Python warnings or transformers' logger."""
    logger = hf_logging.get_logger("transformers.generation.utils")
    with CaptureLogger(logger) as logged, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return logged.out + "".join(str(w.message) for w in caught)


def test_generate_with_max_new_tokens_warns_about_nothing_as_for_gpt2():
    for model in (gpt2(), fixedhead()):
        said = _messages(model, lambda model=model: model.generate(prompt(), max_new_tokens=6, pad_token_id=0))
        assert "max_length" not in said and "max_new_tokens" not in said, (type(model).__name__, said)


def test_position_overflow_is_refused_before_generating():
    ids = prompt(length=10)
    fits = P + 1 - ids.shape[1]  # a sequence of P + 1 tokens embeds P: the last one is only predicted
    for model in (gpt2(), fixedhead()):
        out = model.generate(ids, max_new_tokens=fits, min_new_tokens=fits, do_sample=False, pad_token_id=0)
        assert out.shape[1] == P + 1, type(model).__name__
    # GPT-2 fails once generation reaches the end of its table (after forward passes); fixedhead
    # refuses the request itself, naming the table, before any forward pass
    calls = []
    reference = gpt2()
    reference.register_forward_pre_hook(lambda *_: calls.append(1))
    kind, _ = outcome(lambda: reference.generate(ids, max_new_tokens=fits + 1, min_new_tokens=fits + 1, pad_token_id=0))
    assert kind == "raised" and len(calls) > 1
    model, calls = fixedhead(), []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    with pytest.raises(ValueError, match=rf"max_position_embeddings={P} .*at most {fits} new tokens"):
        model.generate(ids, max_new_tokens=fits + 1, pad_token_id=0)
    assert calls == []


# ----------------------------------------------------------------- a masked checkpoint as a causal LM
def _bert_logs(call) -> str:
    logger = hf_logging.get_logger("transformers.models.bert.modeling_bert")
    with CaptureLogger(logger) as logged:
        call()
    return logged.out


def test_a_masked_checkpoint_opened_as_a_causal_lm_warns_as_bert_does(tmp_path):
    bert_config = BertConfig(vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H)
    BertForMaskedLM(bert_config).save_pretrained(tmp_path / "bert")
    said = _bert_logs(lambda: AutoModelForCausalLM.from_pretrained(tmp_path / "bert"))
    assert "is_decoder=True" in said  # BERT's notice that its LM head model wants a decoder config

    FixedHeadForMaskedLM(fixedhead_config(is_decoder=False)).save_pretrained(tmp_path / "masked")
    with pytest.warns(UserWarning, match=r"is_decoder=False, architectures=\['FixedHeadForMaskedLM'\]"):
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "masked")
    assert isinstance(model, FixedHeadForCausalLM)

    # a causal run and a fresh config (this class makes it causal) are what the class is for: silent
    fixedhead().save_pretrained(tmp_path / "causal")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AutoModelForCausalLM.from_pretrained(tmp_path / "causal")
        FixedHeadForCausalLM(fixedhead_config(is_decoder=False))


# ----------------------------------------------------------------- config rules after overrides
def test_config_rules_hold_after_from_pretrained_overrides(tmp_path):
    # BERT's behaviour on a uniform config: the override builds the smaller model
    bert = BertLMHeadModel(BertConfig(vocab_size=V, hidden_size=D, num_hidden_layers=4, num_attention_heads=H))
    bert.save_pretrained(tmp_path / "bert")
    assert len(AutoModelForCausalLM.from_pretrained(tmp_path / "bert", num_hidden_layers=2).bert.encoder.layer) == 2
    fixedhead(num_hidden_layers=4).save_pretrained(tmp_path / "uniform")
    small = AutoModelForCausalLM.from_pretrained(tmp_path / "uniform", num_hidden_layers=2)
    assert len(small.fixedhead.encoder["layer"]) == 2
    assert count_parameters(small.config, pooler=False) == sum(p.numel() for p in small.parameters())

    # a per-layer list: the override that no longer matches it is refused, naming both
    fixedhead([None, 12, 8, 6], num_hidden_layers=4).save_pretrained(tmp_path / "per_layer4")
    fixedhead([None, 12]).save_pretrained(tmp_path / "per_layer2")
    for path, layers in (("per_layer4", 2), ("per_layer2", 4)):
        with pytest.raises(ValueError, match=rf"one entry per layer \(num_hidden_layers={layers}\).*overrides"):
            AutoModelForCausalLM.from_pretrained(tmp_path / path, num_hidden_layers=layers)
    # overriding both together is a valid config
    both = FixedHeadConfig.from_pretrained(tmp_path / "per_layer4", num_hidden_layers=2, head_dim=[6, 10])
    assert both.layer_head_dims == [6, 10]

    # a field changed by hand after the config was built: refused when a model or a count uses it
    config = fixedhead_config([None, 12])
    config.num_hidden_layers = 3
    with pytest.raises(ValueError, match="one entry per layer"):
        FixedHeadModel(config)
    with pytest.raises(ValueError, match="one entry per layer"):
        count_parameters(config)


# ----------------------------------------------------------------- export-style decoding
def test_export_style_decode_takes_the_token_types_bert_takes():
    """transformers' export decomposition merges two decode steps' input_ids ([batch, 2]) but keeps
    one step's token_type_ids ([batch, 1]); BERT's embedding sum broadcasts them, and so does fixedhead."""
    torch.manual_seed(0)
    bert = BertLMHeadModel(
        BertConfig(
            vocab_size=V,
            hidden_size=D,
            num_hidden_layers=L,
            num_attention_heads=H,
            intermediate_size=64,
            max_position_embeddings=P,
            is_decoder=True,
        )
    ).eval()
    ours = from_bert(bert).eval()
    ids = prompt()
    inputs = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids)}
    logits = []
    for model in (bert, ours):
        module, decode = decompose_prefill_decode(model, inputs, multi_token_decode=True)["decode"]
        assert decode["input_ids"].shape == (2, 2) and decode["token_type_ids"].shape == (2, 1)
        with torch.no_grad():
            logits.append(module(**copy.deepcopy(decode)).logits)
    torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=1e-5)
    # and without a cache: one type per row for every token, as BERT
    types = torch.tensor([[1], [0]])
    with torch.no_grad():
        want = bert(input_ids=ids, token_type_ids=types).logits
        torch.testing.assert_close(ours(input_ids=ids, token_type_ids=types).logits, want, atol=1e-5, rtol=1e-5)
