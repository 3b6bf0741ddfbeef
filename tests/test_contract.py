"""transformers' contract, input by input (issue 12): what a BERT user leans on, with transformers'
own BERT (same config, same weights through ``from_bert``) as the expected value wherever one exists.

1. the vocabulary (and the other tables) resized after construction
2. masked-LM logits keep their shape with labels (Trainer evaluation with run_mlm's metrics)
3. ``problem_type`` in sequence classification
4. ``from_bert`` loses no configuration field and covers every head with a counterpart
5. every tensor argument checked (values and shapes) — the table is in test_bad_input.py
6. ``torch.compile(fullgraph=True)`` and ``torch.export`` (no host reads in the graph)
and gradient (activation) checkpointing.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
    BertTokenizerFast,
)

import fixedhead.convert as convert
from fixedhead.configuration import FixedHeadConfig
from fixedhead.convert import from_bert
from fixedhead.modeling import FixedHeadForMaskedLM, FixedHeadForSequenceClassification, FixedHeadModel

HEAD_DIMS = [None, 12]  # the standard head size d/h (BERT itself) and a fixed one


def bert_config(**kw):
    base = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertConfig(**{**base, **kw})


def fh_config(**kw):
    base = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                max_position_embeddings=16)
    return FixedHeadConfig(**{**base, **kw})


def pair(bert_cls, **kw):
    """A transformers BERT model and its fixedhead conversion, both in eval mode."""
    bert = bert_cls(bert_config(**kw)).eval()
    return bert, from_bert(bert).eval()


# ------------------------------------------------------------------ 4. from_bert
def test_untied_bert_decoder_converts_untied():
    """The issue's input: tie_word_embeddings=False and a decoder unlike the embeddings."""
    bert = BertForMaskedLM(bert_config(tie_word_embeddings=False)).eval()
    with torch.no_grad():
        bert.cls.predictions.decoder.weight.normal_(0, 1.0)
    assert bert.cls.predictions.decoder.weight is not bert.bert.embeddings.word_embeddings.weight
    ours = from_bert(bert).eval()
    assert not ours.config.tie_word_embeddings
    assert ours.cls.decoder.weight is not ours.fixedhead.embeddings.word_embeddings.weight
    ids = torch.randint(0, 100, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, bert(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


def test_untied_model_survives_save_and_load(tmp_path):
    bert = BertForMaskedLM(bert_config(tie_word_embeddings=False)).eval()
    ours = from_bert(bert).eval()
    ours.save_pretrained(tmp_path)
    loaded = FixedHeadForMaskedLM.from_pretrained(tmp_path).eval()
    assert loaded.cls.decoder.weight is not loaded.fixedhead.embeddings.word_embeddings.weight
    ids = torch.randint(0, 100, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, bert(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


def test_decoder_untied_by_hand_in_a_tied_config_is_kept():
    bert = BertForMaskedLM(bert_config()).eval()
    bert.cls.predictions.decoder.weight = torch.nn.Parameter(torch.randn(100, 32))
    ours = from_bert(bert).eval()
    ids = torch.randint(0, 100, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, bert(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


#: a BERT config with every field that changes the computation away from its default
NON_DEFAULT = dict(hidden_act="gelu_new", layer_norm_eps=1e-6, type_vocab_size=3, pad_token_id=7,
                   initializer_range=0.05, classifier_dropout=0.3, chunk_size_feed_forward=4,
                   num_labels=3, problem_type="single_label_classification", attn_implementation="eager")


@pytest.mark.parametrize("bert_cls", [BertModel, BertForMaskedLM, BertForSequenceClassification])
def test_every_head_with_a_counterpart_converts_exactly(bert_cls):
    bert, ours = pair(bert_cls, **NON_DEFAULT)
    expected_type = {BertModel: FixedHeadModel, BertForMaskedLM: FixedHeadForMaskedLM,
                     BertForSequenceClassification: FixedHeadForSequenceClassification}[bert_cls]
    assert type(ours) is expected_type
    for name in convert.CARRIED:
        assert getattr(ours.config, name) == getattr(bert.config, name), name
    assert ours.config._attn_implementation == "eager" and ours.config.head_dim is None
    ids = torch.randint(0, 100, (2, 12))  # a multiple of chunk_size_feed_forward, as BERT requires
    types = torch.randint(0, 3, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 6:] = 0
    with torch.no_grad():
        want, got = bert(input_ids=ids, token_type_ids=types, attention_mask=mask), ours(
            input_ids=ids, token_type_ids=types, attention_mask=mask)
    if bert_cls is BertModel:
        real = mask.bool()
        torch.testing.assert_close(got.last_hidden_state[real], want.last_hidden_state[real], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.pooler_output, want.pooler_output, atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-5)


def test_bert_model_without_pooler():
    bert = BertModel(bert_config(), add_pooling_layer=False).eval()
    ours = from_bert(bert).eval()
    assert ours.pooler is None
    ids = torch.randint(0, 100, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).last_hidden_state, bert(input_ids=ids).last_hidden_state,
                                   atol=1e-5, rtol=1e-5)


def test_every_bert_config_field_is_classified():
    """A newer transformers adding a BertConfig field fails here until convert.py classifies it."""
    known = set(convert.CARRIED) | set(convert.REFUSED_UNLESS_DEFAULT) | set(convert.NO_EFFECT)
    assert convert.bert_config_fields() <= known, sorted(convert.bert_config_fields() - known)
    assert not set(convert.CARRIED) & set(convert.NO_EFFECT)


def test_unclassified_or_unsupported_fields_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="is_decoder=True"):
        from_bert(BertForMaskedLM(bert_config(is_decoder=True)))
    with pytest.raises(ValueError, match="relative_key"):
        from_bert(BertModel(bert_config(position_embedding_type="relative_key")))
    # a field convert.py does not know (simulated by forgetting one) is refused unless at its default
    monkeypatch.setattr(convert, "CARRIED", tuple(f for f in convert.CARRIED if f != "layer_norm_eps"))
    from_bert(BertModel(bert_config()))
    with pytest.raises(ValueError, match="layer_norm_eps=1e-06 is not known"):
        from_bert(BertModel(bert_config(layer_norm_eps=1e-6)))


def test_heads_without_a_counterpart_are_refused_by_name():
    with pytest.raises(TypeError, match="BertModel, BertForMaskedLM or BertForSequenceClassification.*BertForPreTraining"):
        from_bert(BertForPreTraining(bert_config()))


def test_old_import_path_still_works():
    from fixedhead.modeling import from_bert as old

    assert old is from_bert


