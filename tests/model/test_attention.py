import math

import pytest
import torch

from fixedhead.model.attention import MultiHeadAttention, padding_mask_to_bias


def reference_attention(mha: MultiHeadAttention, x: torch.Tensor, mask: torch.Tensor | None):
    """Float64 reference written from the paper's formula, head by head (no fused reshapes)."""
    x = x.double()
    w = mha.qkv.weight.double()
    b = mha.qkv.bias.double()
    h, dp, inner = mha.num_attention_heads, mha.head_dim, mha.inner_size
    outs = []
    for i in range(h):
        sl = slice(i * dp, (i + 1) * dp)
        q = x @ w[:inner][sl].T + b[:inner][sl]
        k = x @ w[inner : 2 * inner][sl].T + b[inner : 2 * inner][sl]
        v = x @ w[2 * inner :][sl].T + b[2 * inner :][sl]
        logits = q @ k.transpose(-1, -2) / math.sqrt(dp)  # [batch, query, key]
        if mask is not None:
            logits = logits.masked_fill(~mask.bool()[:, None, :], float("-inf"))
        outs.append(torch.softmax(logits, -1) @ v)
    ctx = torch.cat(outs, -1)
    return ctx @ mha.out_proj.weight.double().T + mha.out_proj.bias.double()


SHAPES = [
    (64, 4, None),  # standard, d_p = 16
    (64, 16, None),  # standard, d_p = 4
    (48, 5, 16),  # fixed, h does not divide d
    (32, 8, 64),  # fixed, head_dim > hidden
    (40, 3, 31),  # odd head size
    (16, 1, 96),
]


@pytest.mark.parametrize("hidden,heads,head_dim", SHAPES)
def test_shapes_and_reference(hidden, heads, head_dim):
    mha = MultiHeadAttention(hidden, heads, head_dim).eval()
    dp = head_dim or hidden // heads
    assert mha.qkv.weight.shape == (3 * heads * dp, hidden)
    assert mha.out_proj.weight.shape == (hidden, heads * dp)
    x = torch.randn(3, 7, hidden)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 1:] = 0
    out, probs = mha(x, mask, output_attentions=True)
    assert out.shape == (3, 7, hidden)
    assert probs.shape == (3, heads, 7, 7)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, heads, 7))
    assert torch.all(probs[1, :, :, 4:] == 0)
    ref = reference_attention(mha, x, mask)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("hidden,heads,head_dim", SHAPES)
def test_sdpa_and_eager_agree(hidden, heads, head_dim):
    mha = MultiHeadAttention(hidden, heads, head_dim).eval()
    x = torch.randn(2, 9, hidden)
    mask = torch.ones(2, 9)
    mask[0, 6:] = 0
    sdpa, _ = mha(x, mask, use_sdpa=True)
    eager, _ = mha(x, mask, use_sdpa=False)
    torch.testing.assert_close(sdpa, eager, atol=1e-5, rtol=1e-5)


def test_mask_errors():
    with pytest.raises(ValueError, match="shape"):
        padding_mask_to_bias(torch.ones(2, 3, 4), torch.float32)
    with pytest.raises(ValueError, match="only 0"):
        padding_mask_to_bias(torch.tensor([[1, 2]]), torch.float32)
    assert padding_mask_to_bias(torch.ones(2, 3), torch.float32) is None
