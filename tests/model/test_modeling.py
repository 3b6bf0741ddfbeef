import pytest
import torch
from transformers import BertConfig, BertForMaskedLM

from fixedhead.model.configuration import FixedHeadConfig
from fixedhead.model.from_bert import from_bert
from fixedhead.model.modeling import (
    FixedHeadForMaskedLM,
    FixedHeadModel,
)


def tiny(**kw):
    base = dict(
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
    )
    return FixedHeadConfig(**{**base, **kw})


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize(
    "hidden,layers,heads,seq",
    [(32, 1, 4, 10), (64, 2, 8, 17), (48, 3, 3, 33), (128, 2, 16, 24)],
)
def test_parity_with_transformers_bert(impl, hidden, layers, heads, seq):
    """Standard head size here is exactly transformers' BERT: same weights, same logits."""
    bc = BertConfig(
        vocab_size=211,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=64,
        attn_implementation=impl,
    )
    bert = BertForMaskedLM(bc).eval()
    ours = from_bert(bert).eval()
    ids = torch.randint(0, 211, (4, seq))
    mask = torch.ones(4, seq, dtype=torch.long)
    mask[1, seq // 2 :] = 0
    mask[3, 2:] = 0
    types = torch.randint(0, 2, (4, seq))
    with torch.no_grad():
        want = bert(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        got = ours(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    real = mask.bool()
    assert (got - want)[real].abs().max() < 1e-5
    assert torch.isfinite(got).all()


def test_output_attentions_shape_and_rows():
    model = FixedHeadModel(tiny(num_attention_heads=6, head_dim=20)).eval()
    out = model(input_ids=torch.randint(0, 97, (2, 11)), output_attentions=True, output_hidden_states=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 6, 11, 11)
    torch.testing.assert_close(out.attentions[0].sum(-1), torch.ones(2, 6, 11))
    assert len(out.hidden_states) == 3
    assert out.pooler_output.shape == (2, 32)


def test_padding_does_not_change_real_tokens_in_model():
    model = FixedHeadModel(tiny(head_dim=24)).eval()
    ids = torch.randint(5, 97, (1, 6))
    alone = model(input_ids=ids).last_hidden_state
    padded = model(
        input_ids=torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], 1),
        attention_mask=torch.tensor([[1] * 6 + [0] * 4]),
    ).last_hidden_state
    torch.testing.assert_close(padded[:, :6], alone, atol=1e-5, rtol=1e-5)


def test_mlm_loss_only_at_labelled_positions_matches_full_logits():
    model = FixedHeadForMaskedLM(tiny(head_dim=16)).eval()
    ids = torch.randint(0, 97, (3, 12))
    labels = torch.full((3, 12), -100)
    labels[0, 2], labels[1, 5], labels[2, 11], labels[2, 0] = 3, 7, 9, 1
    out = model(input_ids=ids, labels=labels)
    full = model(input_ids=ids).logits
    assert out.logits.shape == full.shape == (3, 12, 97)  # BertForMaskedLM's shape, labels or not
    scored = labels != -100
    torch.testing.assert_close(out.logits[scored], full[scored])  # the output layer ran there ...
    assert torch.all(out.logits[~scored] == 0)  # ... and only there
    want = torch.nn.functional.cross_entropy(full.view(-1, 97), labels.view(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, want)
    nothing = model(input_ids=ids, labels=torch.full((3, 12), -100))
    assert nothing.loss.item() == 0.0


def test_tied_embeddings_survive_save_and_load(tmp_path):
    model = FixedHeadForMaskedLM(tiny(head_dim=40, num_attention_heads=3)).eval()
    assert model.cls.decoder.weight is model.fixedhead.embeddings.word_embeddings.weight
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    loaded = FixedHeadForMaskedLM.from_pretrained(tmp_path).eval()
    assert loaded.config.head_dim == 40 and loaded.config.is_fixed_head
    assert loaded.cls.decoder.weight is loaded.fixedhead.embeddings.word_embeddings.weight
    ids = torch.randint(0, 97, (2, 9))
    torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_fixed_head_needs_no_divisibility():
    cfg = tiny(hidden_size=1024, num_attention_heads=12, head_dim=128)
    assert cfg.attention_head_size == 128 and cfg.is_fixed_head
