"""The readable equation (attention.multi_head_attention) is what MultiHeadAttention computes."""

import pytest
import torch

from fixedhead.model.attention import MultiHeadAttention, multi_head_attention


@pytest.mark.parametrize("hidden, heads, head_dim", [(32, 4, None), (32, 4, 16), (24, 8, 5)])
@pytest.mark.parametrize("use_sdpa", [True, False])
def test_module_equals_the_equation(hidden, heads, head_dim, use_sdpa):
    torch.manual_seed(0)
    layer = MultiHeadAttention(hidden, heads, head_dim=head_dim, bias=False).eval()
    x = torch.randn(2, 7, hidden)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    w_q, w_k, w_v = layer.qkv.weight.chunk(3, dim=0)  # the fused projection holds q, k, v in that order
    expected = multi_head_attention(x, w_q, w_k, w_v, layer.out_proj.weight, heads, padding_mask=mask)
    with torch.no_grad():
        got, _ = layer(x, attention_mask=mask, use_sdpa=use_sdpa)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_logit_rank_is_capped_by_the_head_size():
    # Section 3 in one line: each head's logit matrix has rank <= d_p, whatever n is
    torch.manual_seed(1)
    n, d, h, dp = 24, 32, 4, 3
    x = torch.randn(1, n, d, dtype=torch.float64)
    w = torch.randn(h * dp, d, dtype=torch.float64)
    q = (x @ w.T).view(1, n, h, dp).transpose(1, 2)
    k = (x @ torch.randn(h * dp, d, dtype=torch.float64).T).view(1, n, h, dp).transpose(1, 2)
    logits = q @ k.transpose(-1, -2)
    assert all(int(torch.linalg.matrix_rank(logits[0, i])) == dp for i in range(h))
