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

import fixedhead.model.from_bert as convert
from fixedhead.model import tensor_checks as checks
from fixedhead.model.configuration import FixedHeadConfig
from fixedhead.model.from_bert import from_bert
from fixedhead.model.modeling import FixedHeadForMaskedLM, FixedHeadForSequenceClassification, FixedHeadModel

HEAD_DIMS = [None, 12]  # the standard head size d/h (BERT itself) and a fixed one


def bert_config(**kw):
    base = dict(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertConfig(**{**base, **kw})


def fh_config(**kw):
    base = dict(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=16,
    )
    return FixedHeadConfig(**{**base, **kw})


def pair(bert_cls, **kw):
    """A transformers BERT model and its fixedhead conversion, both in eval mode."""
    bert = bert_cls(bert_config(**kw)).eval()
    return bert, from_bert(bert).eval()


# ------------------------------------------------------------------ 1. resizing the vocabulary
def _tokenizer(size=100):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(size - 5)]
    return BertTokenizerFast(vocab={w: i for i, w in enumerate(words)})


def test_resize_token_embeddings_after_add_tokens_matches_bert():
    """The usual recipe: tokenizer.add_tokens(...), then resize_token_embeddings(len(tokenizer))."""
    tok = _tokenizer()
    bert, ours = pair(BertForMaskedLM)
    tok.add_tokens(["newa", "newb", "newc", "newd", "newe"])
    assert len(tok) == 105
    bert.resize_token_embeddings(len(tok))
    ours.resize_token_embeddings(len(tok))
    with torch.no_grad():  # the new rows are random in each; give ours BERT's
        ours.fixedhead.embeddings.word_embeddings.weight.copy_(bert.bert.embeddings.word_embeddings.weight)
        ours.cls.decoder.bias.copy_(bert.cls.predictions.decoder.bias)
    assert ours.config.vocab_size == ours.cls.decoder.out_features == 105
    enc = tok(["w3 newd w7 newa", "newe w1"], padding=True, return_tensors="pt")
    assert int(enc["input_ids"].max()) == 104
    with torch.no_grad():
        want = bert(**enc).logits
        got = ours(**enc).logits
    assert got.shape == want.shape == (2, enc["input_ids"].shape[1], 105)
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
    # with labels on the new tokens: BERT's loss
    labels = torch.where(enc["input_ids"] >= 100, enc["input_ids"], -100)
    torch.testing.assert_close(ours(**enc, labels=labels).loss, bert(**enc, labels=labels).loss)


def test_issue_input_resize_to_105_then_token_103():
    bert, ours = pair(BertForMaskedLM)
    for m in (bert, ours):
        m.resize_token_embeddings(105)
    ids = torch.tensor([[5, 103, 7]])
    assert bert(input_ids=ids).logits.shape == ours(input_ids=ids).logits.shape == (1, 3, 105)


def test_shrunk_vocabulary_refuses_the_id_by_name():
    bert, ours = pair(BertForMaskedLM)
    for m in (bert, ours):
        m.resize_token_embeddings(90)
    ids = torch.tensor([[5, 95, 7]])
    with pytest.raises(IndexError):  # BERT: a raw index error
        bert(input_ids=ids)
    with pytest.raises(ValueError, match=r"token id 95, outside the vocabulary \[0, 90\) \(at index \(0, 1\)\)"):
        ours(input_ids=ids)
    with pytest.raises(ValueError, match=r"labels hold 95, outside the vocabulary \[0, 90\)"):
        ours(input_ids=torch.tensor([[5, 6, 7]]), labels=torch.tensor([[-100, 95, -100]]))
    assert ours(input_ids=torch.tensor([[5, 89]])).logits.shape == (1, 2, 90)


def test_resize_with_pad_to_multiple_of_and_other_heads():
    ours = FixedHeadForMaskedLM(fh_config(head_dim=12)).eval()
    ours.resize_token_embeddings(101, pad_to_multiple_of=8)  # 104 rows
    assert ours(input_ids=torch.tensor([[103]])).logits.shape == (1, 1, 104)
    clf = FixedHeadForSequenceClassification(fh_config(head_dim=12, num_labels=2)).eval()
    clf.resize_token_embeddings(120)
    assert clf(input_ids=torch.tensor([[119, 3]])).logits.shape == (1, 2)
    with pytest.raises(ValueError, match=r"token id 120, outside the vocabulary \[0, 120\)"):
        clf(input_ids=torch.tensor([[120]]))


def test_every_table_replaced_after_construction_is_the_one_checked():
    model = FixedHeadModel(fh_config(head_dim=12)).eval()
    model.set_input_embeddings(torch.nn.Embedding(130, 32))
    model.embeddings.position_embeddings = torch.nn.Embedding(24, 32)
    model.embeddings.token_type_embeddings = torch.nn.Embedding(3, 32)
    ids = torch.tensor([[129] * 20])  # 20 > the config's 16 positions, < the new table's 24
    out = model(input_ids=ids, token_type_ids=torch.full((1, 20), 2), position_ids=torch.arange(20)[None])
    assert out.last_hidden_state.shape == (1, 20, 32)
    with pytest.raises(ValueError, match=r"token id 130, outside the vocabulary \[0, 130\)"):
        model(input_ids=torch.tensor([[130]]))
    with pytest.raises(ValueError, match="sequence length 25 exceeds max_position_embeddings=24"):
        model(input_ids=torch.ones(1, 25, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token_type_ids hold 3, outside \[0, type_vocab_size=3\)"):
        model(input_ids=torch.ones(1, 4, dtype=torch.long), token_type_ids=torch.tensor([[0, 1, 2, 3]]))


# ------------------------------------------------------------------ 2. masked-LM output shape
def _mlm_eval_dataset(n=10, seq=8, vocab=100, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        ids = torch.randint(5, vocab, (seq,), generator=g)
        labels = torch.full((seq,), -100)
        k = 1 + i % 3  # a different number of labelled positions in every batch
        pos = torch.randperm(seq, generator=g)[:k]
        labels[pos] = ids[pos]
        ids = ids.clone()
        ids[pos] = 4  # [MASK]
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def preprocess_logits_for_metrics(logits, labels):
    """run_mlm.py's own."""
    if isinstance(logits, tuple):
        logits = logits[0]
    return logits.argmax(dim=-1)


def compute_metrics(eval_preds):
    """run_mlm.py's own (its ``evaluate.load("accuracy")`` written out)."""
    preds, labels = eval_preds
    labels = labels.reshape(-1)
    preds = preds.reshape(-1)
    mask = labels != -100
    return {"accuracy": float((preds[mask] == labels[mask]).mean())}


def test_trainer_evaluation_with_run_mlm_metrics_matches_bert(tmp_path):
    from transformers import Trainer, TrainingArguments

    bert, ours = pair(BertForMaskedLM)
    data = _mlm_eval_dataset()
    results = {}
    for name, model in (("bert", bert), ("ours", ours)):
        args = TrainingArguments(
            output_dir=str(tmp_path / name), per_device_eval_batch_size=3, report_to=[], use_cpu=True, disable_tqdm=True
        )
        trainer = Trainer(
            model=model,
            args=args,
            eval_dataset=data,
            compute_metrics=compute_metrics,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        )
        results[name] = trainer.evaluate()
    assert "eval_accuracy" in results["ours"]
    assert results["ours"]["eval_accuracy"] == results["bert"]["eval_accuracy"]
    assert results["ours"]["eval_loss"] == pytest.approx(results["bert"]["eval_loss"], rel=1e-5)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_mlm_logits_with_labels_have_berts_shape_and_values_where_scored(head_dim):
    from transformers.trainer_pt_utils import LabelSmoother

    bert, ours = pair(BertForMaskedLM)
    ids = torch.randint(5, 100, (3, 9))
    labels = torch.full((3, 9), -100)
    labels[0, 1], labels[0, 7], labels[2, 4] = 11, 12, 13
    want, got = bert(input_ids=ids, labels=labels), ours(input_ids=ids, labels=labels)
    assert got.logits.shape == want.logits.shape == (3, 9, 100)
    scored = labels != -100
    torch.testing.assert_close(got.logits[scored], want.logits[scored], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.loss, want.loss, atol=1e-6, rtol=1e-5)
    # the Trainer's label smoothing reads the logits (and needs their gradient): same loss as BERT's
    smooth = LabelSmoother(epsilon=0.1)
    loss = smooth(got, labels)
    torch.testing.assert_close(loss, smooth(want, labels), atol=1e-5, rtol=1e-5)
    loss.backward()
    assert ours.cls.dense.weight.grad is not None and ours.cls.dense.weight.grad.abs().sum() > 0
    fixed = FixedHeadForMaskedLM(fh_config(head_dim=head_dim)).eval()
    assert fixed(input_ids=ids, labels=labels).logits.shape == (3, 9, 100)


# ------------------------------------------------------------------ 3. problem_type
@pytest.mark.parametrize(
    "num_labels,problem_type,labels",
    [
        # the issue's inputs: multi-label with float multi-hot [4, 3]; regression with 2 outputs
        (3, "multi_label_classification", torch.tensor([[1.0, 0, 1], [0, 0, 0], [0, 1, 1], [1, 1, 1]])),
        (2, "regression", torch.tensor([[0.5, -1.0], [2.0, 0.0], [1.5, 1.5], [-0.25, 3.0]])),
        (1, "regression", torch.tensor([0.5, 1.0, 4.2, 3.0])),
        (3, "single_label_classification", torch.tensor([0, 2, 1, 2])),
        (3, "single_label_classification", torch.tensor([0, -100, 1, 2])),  # -100 is not scored
        # problem_type unset: inferred from num_labels and the labels' dtype, as BERT does
        (3, None, torch.tensor([[1.0, 0, 1], [0, 0, 0], [0, 1, 1], [1, 1, 1]])),
        (3, None, torch.tensor([0, 2, 1, 2])),
        (3, None, torch.tensor([0, 2, 1, 2], dtype=torch.int32)),
        (1, None, torch.tensor([0.5, 1.0, 4.2, 3.0])),
        (1, None, torch.tensor([[0.5], [1.0], [4.2], [3.0]])),
    ],
)
def test_sequence_classification_loss_matches_bert(num_labels, problem_type, labels):
    bert, ours = pair(BertForSequenceClassification, num_labels=num_labels, problem_type=problem_type)
    ids = torch.randint(5, 100, (4, 7))
    # BERT infers single-label classification from int32 labels too, then its cross-entropy
    # refuses them (it wants int64); ours takes them, and must match BERT given int64
    want = bert(input_ids=ids, labels=labels.long() if labels.dtype == torch.int32 else labels)
    got = ours(input_ids=ids, labels=labels)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.loss, want.loss, atol=1e-6, rtol=1e-5)
    assert ours.config.problem_type == bert.config.problem_type  # inferred and recorded alike


def test_sequence_classification_labels_are_checked_for_the_problem_type():
    clf = FixedHeadForSequenceClassification(fh_config(head_dim=12, num_labels=3)).eval()
    ids = torch.randint(5, 100, (4, 7))
    with pytest.raises(ValueError, match=r"labels hold class 3, outside \[0, num_labels=3\)"):
        clf(input_ids=ids, labels=torch.tensor([0, 1, 3, 2]))
    clf.config.problem_type = "multi_label_classification"
    with pytest.raises(ValueError, match=r"multi-hot \[batch, num_labels\] = \(4, 3\), got \(12,\)"):
        clf(input_ids=ids, labels=torch.ones(12))
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\], got 2.0"):
        clf(input_ids=ids, labels=torch.full((4, 3), 2.0))
    clf.config.problem_type = "regression"
    with pytest.raises(ValueError, match=r"regression labels must have shape \(4, 3\), got \(4,\)"):
        clf(input_ids=ids, labels=torch.ones(4))
    with pytest.raises(ValueError, match=r"labels holds non-finite values \(first at index \(1, 0\): nan\)"):
        clf(input_ids=ids, labels=torch.tensor([[0.0] * 3, [float("nan"), 0, 0], [0.0] * 3, [0.0] * 3]))
    clf.config.problem_type = "single_label_classification"
    with pytest.raises(ValueError, match="class ids"):
        clf(input_ids=ids, labels=torch.ones(4))
    with pytest.raises(ValueError, match="problem_type must be one of"):
        fh_config(num_labels=3, problem_type="multilabel")


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
NON_DEFAULT = dict(
    hidden_act="gelu_new",
    layer_norm_eps=1e-6,
    type_vocab_size=3,
    pad_token_id=7,
    initializer_range=0.05,
    classifier_dropout=0.3,
    chunk_size_feed_forward=4,
    num_labels=3,
    problem_type="single_label_classification",
    attn_implementation="eager",
)


@pytest.mark.parametrize("bert_cls", [BertModel, BertForMaskedLM, BertForSequenceClassification])
def test_every_head_with_a_counterpart_converts_exactly(bert_cls):
    bert, ours = pair(bert_cls, **NON_DEFAULT)
    expected_type = {
        BertModel: FixedHeadModel,
        BertForMaskedLM: FixedHeadForMaskedLM,
        BertForSequenceClassification: FixedHeadForSequenceClassification,
    }[bert_cls]
    assert type(ours) is expected_type
    for name in convert.CARRIED:
        assert getattr(ours.config, name) == getattr(bert.config, name), name
    assert ours.config._attn_implementation == "eager" and ours.config.head_dim is None
    ids = torch.randint(0, 100, (2, 12))  # a multiple of chunk_size_feed_forward, as BERT requires
    types = torch.randint(0, 3, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 6:] = 0
    with torch.no_grad():
        want, got = (
            bert(input_ids=ids, token_type_ids=types, attention_mask=mask),
            ours(input_ids=ids, token_type_ids=types, attention_mask=mask),
        )
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
        torch.testing.assert_close(
            ours(input_ids=ids).last_hidden_state, bert(input_ids=ids).last_hidden_state, atol=1e-5, rtol=1e-5
        )


def test_every_bert_config_field_is_classified():
    """A newer transformers adding a BertConfig field fails here until model/from_bert.py classifies it."""
    known = set(convert.CARRIED) | set(convert.REFUSED_UNLESS_DEFAULT) | set(convert.NO_EFFECT)
    assert convert.bert_config_fields() <= known, sorted(convert.bert_config_fields() - known)
    assert not set(convert.CARRIED) & set(convert.NO_EFFECT)


def test_unclassified_or_unsupported_fields_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="add_cross_attention=True"):
        from_bert(BertForMaskedLM(bert_config(is_decoder=True, add_cross_attention=True)))
    with pytest.raises(ValueError, match="relative_key"):
        from_bert(BertModel(bert_config(position_embedding_type="relative_key")))
    # a field from_bert.py does not know (simulated by forgetting one) is refused unless at its default
    monkeypatch.setattr(convert, "CARRIED", tuple(f for f in convert.CARRIED if f != "layer_norm_eps"))
    from_bert(BertModel(bert_config()))
    with pytest.raises(ValueError, match="layer_norm_eps=1e-06 is not known"):
        from_bert(BertModel(bert_config(layer_norm_eps=1e-6)))


def test_heads_without_a_counterpart_are_refused_by_name():
    with pytest.raises(
        TypeError,
        match="BertModel, BertForMaskedLM, BertLMHeadModel or BertForSequenceClassification.*BertForPreTraining",
    ):
        from_bert(BertForPreTraining(bert_config()))


# ------------------------------------------------------------------ 5. tensor arguments
def test_position_and_token_type_ids_in_every_shape_bert_accepts():
    bert, ours = pair(BertModel)
    ids = torch.randint(0, 100, (2, 20))  # longer than the 16 positions: fine with explicit position_ids
    for pos in (torch.arange(20) % 16, (torch.arange(20) % 16)[None], torch.stack([torch.arange(20) % 16] * 2)):
        for types in (torch.tensor([0, 1] * 10), torch.tensor([[0, 1] * 10]), torch.randint(0, 2, (2, 20))):
            with torch.no_grad():
                want = bert(input_ids=ids, position_ids=pos, token_type_ids=types).last_hidden_state
                got = ours(input_ids=ids, position_ids=pos, token_type_ids=types).last_hidden_state
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ 6. compile and export
def _inputs(batch=2, seq=8, vocab=100):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, 5:] = 0
    labels = torch.full((batch, seq), -100)
    labels[0, 3], labels[1, 1] = 5, 7
    return ids, mask, labels


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_torch_compile_fullgraph(head_dim):
    """No graph break anywhere: inference, and a training step with labels (backend aot_eager:
    dynamo's graph capture and AOT autograd, without inductor's C++ compile time)."""
    torch._dynamo.reset()
    ids, mask, labels = _inputs()
    for cls, kw in ((FixedHeadForMaskedLM, {}), (FixedHeadForSequenceClassification, {"num_labels": 3})):
        model = cls(fh_config(head_dim=head_dim, **kw)).eval()
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        with torch.no_grad():
            torch.testing.assert_close(
                compiled(input_ids=ids, attention_mask=mask).logits, model(input_ids=ids, attention_mask=mask).logits
            )
        model.train()
        lab = labels if cls is FixedHeadForMaskedLM else torch.tensor([0, 2])
        torch.manual_seed(0)
        out = compiled(input_ids=ids, attention_mask=mask, labels=lab)
        out.loss.backward()
        model.eval()
        with torch.no_grad():  # the compiled path computes what eager does (dropout aside)
            eager = model(input_ids=ids, attention_mask=mask, labels=lab)
            again = compiled(input_ids=ids, attention_mask=mask, labels=lab)
        torch.testing.assert_close(again.loss, eager.loss)
        torch.testing.assert_close(again.logits, eager.logits)
    torch._dynamo.reset()


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_torch_export(head_dim):
    ids, mask, labels = _inputs()
    model = FixedHeadForMaskedLM(fh_config(head_dim=head_dim)).eval()
    for kwargs in (
        dict(input_ids=ids),
        dict(input_ids=ids, attention_mask=mask),
        dict(input_ids=ids, attention_mask=mask, labels=labels),
    ):
        exported = torch.export.export(model, (), kwargs)
        got, want = exported.module()(**kwargs), model(**kwargs)
        torch.testing.assert_close(got.logits, want.logits)
        if "labels" in kwargs:
            torch.testing.assert_close(got.loss, want.loss)
    base = FixedHeadModel(fh_config(head_dim=head_dim)).eval()
    exported = torch.export.export(base, (), dict(input_ids=ids, attention_mask=mask))
    torch.testing.assert_close(
        exported.module()(input_ids=ids, attention_mask=mask).last_hidden_state,
        base(input_ids=ids, attention_mask=mask).last_hidden_state,
    )


def test_compiled_model_still_refuses_wrong_shapes():
    torch._dynamo.reset()
    model = FixedHeadModel(fh_config(head_dim=12)).eval()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    ids = torch.randint(0, 100, (2, 8))
    with pytest.raises(Exception, match=r"attention_mask must have shape \[batch, seq\] = \(2, 8\), got \(2, 5\)"):
        compiled(input_ids=ids, attention_mask=torch.ones(2, 5))
    torch._dynamo.reset()


def test_value_checks_run_where_host_reads_are_free():
    cpu, meta = torch.ones(1), torch.ones(1, device="meta")
    assert checks.host_reads_allowed(cpu) and not checks.host_reads_allowed(meta)  # meta stands in for a GPU
    previous = checks.set_value_checks("always")
    try:
        assert checks.host_reads_allowed(meta)
        checks.set_value_checks("never")
        assert not checks.host_reads_allowed(cpu)
        with pytest.raises(IndexError):  # no check: PyTorch's own error
            FixedHeadModel(fh_config())(input_ids=torch.tensor([[100]]))
    finally:
        checks.set_value_checks(previous)
    with pytest.raises(ValueError, match="mode must be one of"):
        checks.set_value_checks("sometimes")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_training_step_host_syncs():
    """The bare encoder's step makes no device-to-host synchronisation; the masked-LM step one
    (finding the labelled positions)."""
    ids, mask, labels = (t.cuda() for t in _inputs())

    def syncs(model, **kwargs):
        model.cuda().train()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = model(input_ids=ids, attention_mask=mask, **kwargs)
                (out.loss if out.loss is not None else out.last_hidden_state.sum()).backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught)

    assert syncs(FixedHeadModel(fh_config(head_dim=12))) == 0
    assert syncs(FixedHeadForMaskedLM(fh_config(head_dim=12)), labels=labels) == 1


# ------------------------------------------------------------------ gradient checkpointing
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gradient_checkpointing_gives_the_plain_gradients(head_dim):
    torch.manual_seed(0)
    plain = FixedHeadForMaskedLM(
        fh_config(head_dim=head_dim, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    ).train()
    ckpt = copy.deepcopy(plain)
    ckpt.activation_checkpointing_enable()
    assert ckpt.is_activation_checkpointing and not plain.is_activation_checkpointing
    ids, mask, labels = _inputs()
    losses = []
    for model in (plain, ckpt):
        torch.manual_seed(1)  # the same dropout masks; checkpointing replays them in the recompute
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        losses.append(out.loss)
    torch.testing.assert_close(losses[1], losses[0])
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_gradient_checkpointing_old_name_and_trainer(tmp_path):
    from transformers import Trainer, TrainingArguments

    model = FixedHeadForSequenceClassification(fh_config(head_dim=12, num_labels=2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers 5.24 deprecates the old name
        model.gradient_checkpointing_enable()
    assert model.is_activation_checkpointing
    model.activation_checkpointing_disable()
    assert not model.is_activation_checkpointing
    data = [{"input_ids": torch.randint(5, 100, (8,)), "labels": torch.tensor(i % 2)} for i in range(8)]
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        activation_checkpointing=True,
        save_strategy="no",
    )
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    assert model.is_activation_checkpointing
    assert torch.isfinite(torch.tensor(trainer.state.log_history[-1]["train_loss"]))


def test_gradient_checkpointing_option_of_pretrain_and_finetune(small_real_corpus, tmp_path):
    """``--gradient-checkpointing`` reaches the Trainer; the run is the same run (same held-out loss,
    dropout on; and a resume may switch it)."""
    from dataclasses import replace

    from _tiny_run import tiny_config, tiny_data, tiny_settings
    from fixedhead.cli import build_parser
    from fixedhead.training import pretrain
    from fixedhead.training.identity import run_settings_record

    args = build_parser().parse_args(["pretrain", "--output-dir", "x", "--gradient-checkpointing"])
    assert args.gradient_checkpointing
    args = build_parser().parse_args(["finetune", "--task", "sst2", "--model", "m", "--activation-checkpointing"])
    assert args.gradient_checkpointing
    settings = tiny_settings(max_steps=6, eval_steps=6, save_steps=6)
    assert replace(settings, gradient_checkpointing=True).training_arguments(tmp_path).activation_checkpointing
    config = tiny_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, num_hidden_layers=2)
    assert run_settings_record(config, settings, None) == run_settings_record(
        config, replace(settings, gradient_checkpointing=True), None
    )
    data = tiny_data(small_real_corpus, tmp_path / "tok")
    plain = pretrain(config, data, tmp_path / "plain", settings)
    ckpt = pretrain(config, data, tmp_path / "ckpt", replace(settings, gradient_checkpointing=True))
    assert ckpt["heldout_loss"] == pytest.approx(plain["heldout_loss"], abs=1e-5)


def test_masked_lm_loss_averages_over_the_global_batch_when_the_trainer_says_so():
    # the Trainer passes num_items_in_batch (masked tokens in the whole global batch) to models that
    # accept loss kwargs; the loss is then the summed cross-entropy over that count
    torch.manual_seed(0)
    cfg = FixedHeadConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = FixedHeadForMaskedLM(cfg).eval()
    assert model.accepts_loss_kwargs
    ids = torch.randint(0, 50, (2, 8))
    labels = torch.full_like(ids, -100)
    labels[0, 1], labels[1, 3], labels[1, 5] = 4, 7, 9
    with torch.no_grad():
        out = model(ids, labels=labels)
        scaled = model(ids, labels=labels, num_items_in_batch=6)  # as if another process held 3 more
    keep = labels != -100
    total = torch.nn.functional.cross_entropy(out.logits[keep], labels[keep], reduction="sum")
    torch.testing.assert_close(out.loss, total / 3)
    torch.testing.assert_close(scaled.loss, total / 6)
