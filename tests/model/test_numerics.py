"""Numerics: bf16 autocast training on CPU for head sizes up to 512, and fully masked rows.

Documented tolerance (docs/reliability.md, "Numerics"): with ``torch.autocast("cpu", dtype=torch.bfloat16)``
the model's outputs stay within 0.03 (absolute) of float32 on the final hidden states, which
are LayerNorm-ed to unit scale, within 0.02 on the MLM logits, and within 0.01 nats on the MLM
loss, for head sizes 8 to 512. (Measured: at most 0.012, 0.007 and 0.001 on these models.)
"""

from __future__ import annotations

import pytest
import torch

from fixedhead.model.attention import MultiHeadAttention
from fixedhead.model.configuration import FixedHeadConfig
from fixedhead.model.modeling import FixedHeadForMaskedLM

HIDDEN_TOL, LOGIT_TOL, LOSS_TOL = 0.03, 0.02, 0.01
pytestmark = pytest.mark.usefixtures("one_thread")


def _config(head_dim):
    return FixedHeadConfig(
        vocab_size=200,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        head_dim=head_dim,
        intermediate_size=128,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def _assert_every_parameter_has_a_finite_gradient(model):
    grads = dict(model.named_parameters())
    missing = [name for name, p in grads.items() if p.grad is None]
    assert not missing, f"no gradient reached {missing}"
    bad = [name for name, p in grads.items() if not torch.isfinite(p.grad).all()]
    assert not bad, f"non-finite gradients in {bad}"


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (6, 24), generator=g)
    labels = torch.where(torch.rand(6, 24, generator=g) < 0.2, ids, -100)
    mask = torch.ones(6, 24, dtype=torch.long)
    mask[1, 15:] = 0
    mask[2] = 0  # a row that is all padding
    return ids, labels, mask


@pytest.mark.parametrize("head_dim", [None, 8, 64, 512])  # None: the standard d/h = 16
def test_bf16_autocast_training_is_stable_and_close_to_fp32(head_dim):
    model = FixedHeadForMaskedLM(_config(head_dim))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids, labels, mask = _batch()
    losses = []
    for _ in range(8):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        _assert_every_parameter_has_a_finite_gradient(model)  # padding, an all-padding row, bf16
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.item())
    assert all(map(lambda x: x == x and abs(x) < 1e4, losses)), losses
    assert losses[-1] < losses[0] - 0.5, losses  # it learns, it does not merely survive

    model.eval()
    with torch.no_grad():
        ref_hidden = model.fixedhead(input_ids=ids, attention_mask=mask).last_hidden_state
        ref_logits = model(input_ids=ids, attention_mask=mask).logits
        ref_loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = model.fixedhead(input_ids=ids, attention_mask=mask).last_hidden_state
            logits = model(input_ids=ids, attention_mask=mask).logits
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    assert logits.dtype == torch.bfloat16  # autocast really ran the projections in bf16
    assert (hidden.float() - ref_hidden).abs().max() <= HIDDEN_TOL
    assert (logits.float() - ref_logits).abs().max() <= LOGIT_TOL
    assert abs(loss.item() - ref_loss.item()) <= LOSS_TOL


@pytest.mark.parametrize("use_sdpa", [True, False], ids=["sdpa", "eager"])
@pytest.mark.parametrize("mode", ["fp32", "bf16", "bf16-autocast"])
def test_fully_masked_rows_are_finite_and_uniform(mode, use_sdpa):
    """A query whose keys are all padding attends uniformly (its output is the mean value vector)."""
    mha = MultiHeadAttention(64, 4, 512).eval()
    x = torch.randn(2, 6, 64)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    if mode == "bf16":
        mha, x = mha.to(torch.bfloat16), x.to(torch.bfloat16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16-autocast"):
        out, _ = mha(x, mask, use_sdpa=use_sdpa)
        # uniform attention over all 6 keys, computed without any mask
        v = torch.nn.functional.linear(x, mha.qkv.weight[2 * mha.inner_size :], mha.qkv.bias[2 * mha.inner_size :])
        expected = mha.out_proj(v.mean(1, keepdim=True).expand_as(v))
    assert torch.isfinite(out).all()
    tol = 1e-5 if mode == "fp32" else 0.02
    torch.testing.assert_close(out[1].float(), expected[1].float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fully_masked_row_has_finite_gradients(dtype):
    model = FixedHeadForMaskedLM(_config(32)).to(dtype)
    ids, labels, mask = _batch()
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(out.logits).all()
    _assert_every_parameter_has_a_finite_gradient(model)
