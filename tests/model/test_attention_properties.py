"""Property-based tests (hypothesis) of MultiHeadAttention against the paper's formula in float64.

The reference is written in the paper's own convention (Section 2 and 4): tokens are the
*columns* of X ∈ R^{d×n}; per head, head_i(X) = W_v^i X · Softmax[(W_k^i X)^T (W_q^i X) / √d_p]
with the Softmax taken over each column (keys index rows), and MultiHead(X) = W_o·Concat_i
head_i(X). Padding keys get -inf logits; a query whose keys are all padding attends uniformly
(the module's documented behaviour). The module is batch-first with row-stochastic
probabilities, so the reference's P is the transpose of the module's.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fixedhead.model.attention import MultiHeadAttention, resolve_head_dim

pytestmark = pytest.mark.usefixtures("one_thread")

PROFILE = settings(max_examples=100, deadline=None, derandomize=True)


def paper_attention(mha: MultiHeadAttention, x: torch.Tensor, mask: torch.Tensor):
    """Float64 reference. x: [batch, n, d]; mask: [batch, n] (1 = token). Returns (out, P_paper)."""
    h, dp = mha.num_attention_heads, mha.head_dim
    W = mha.qkv.weight.detach().double()  # rows: [W_q^1..W_q^h ; W_k^1.. ; W_v^1..], each d_p × d
    b = mha.qkv.bias.detach().double()
    Wq, Wk, Wv = W.split(h * dp)
    bq, bk, bv = b.split(h * dp)
    Wo, bo = mha.out_proj.weight.detach().double(), mha.out_proj.bias.detach().double()
    outs, probs = [], []
    for xb, mb in zip(x.double(), mask, strict=True):
        X = xb.T  # d × n: tokens are columns
        n = X.shape[1]
        heads, P_heads = [], []
        for i in range(h):
            rows = slice(i * dp, (i + 1) * dp)
            Q = Wq[rows] @ X + bq[rows, None]  # d_p × n
            K = Wk[rows] @ X + bk[rows, None]
            V = Wv[rows] @ X + bv[rows, None]
            logits = K.T @ Q / math.sqrt(dp)  # n × n: [key, query]
            if bool(mb.any()):
                logits = logits.masked_fill(~mb.bool()[:, None], -math.inf)
                P = torch.softmax(logits, dim=0)  # column-stochastic, as in the paper
            else:
                P = torch.full((n, n), 1.0 / n, dtype=torch.float64)
            heads.append(V @ P)  # d_p × n
            P_heads.append(P)
        out = Wo @ torch.cat(heads, dim=0) + bo[:, None]  # d × n
        outs.append(out.T)
        probs.append(torch.stack(P_heads))
    return torch.stack(outs), torch.stack(probs)  # [batch, n, d], [batch, h, key, query]


@st.composite
def attention_case(draw):
    heads = draw(st.integers(1, 6))
    if draw(st.booleans()):
        head_dim = None
        hidden = heads * draw(st.integers(1, 8))
    else:
        head_dim = draw(st.integers(1, 40))
        hidden = draw(st.integers(1, 24))
    batch, seq = draw(st.integers(1, 3)), draw(st.integers(1, 9))
    mask_bits = draw(st.lists(st.lists(st.booleans(), min_size=seq, max_size=seq), min_size=batch, max_size=batch))
    mask_dtype = draw(st.sampled_from([torch.bool, torch.long, torch.float32]))
    return dict(
        hidden=hidden,
        heads=heads,
        head_dim=head_dim,
        batch=batch,
        seq=seq,
        mask=torch.tensor(mask_bits).to(mask_dtype),
        seed=draw(st.integers(0, 2**31 - 1)),
        use_sdpa=draw(st.booleans()),
    )


@PROFILE
@given(attention_case())
def test_matches_the_papers_formula_in_float64(case):
    torch.manual_seed(case["seed"])
    mha = MultiHeadAttention(case["hidden"], case["heads"], case["head_dim"]).eval()
    x = torch.randn(case["batch"], case["seq"], case["hidden"])
    with torch.no_grad():
        out, _ = mha(x, case["mask"], use_sdpa=case["use_sdpa"])
        eager, probs = mha(x, case["mask"], output_attentions=True)
    ref, P = paper_attention(mha, x, case["mask"])
    assert out.shape == (case["batch"], case["seq"], case["hidden"])
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(eager.double(), ref, atol=1e-4, rtol=1e-4)
    # probabilities: [batch, head, query, key] is the transpose of the paper's [key, query]
    torch.testing.assert_close(probs.double(), P.transpose(-1, -2), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs.sum(-1)))


@PROFILE
@given(hidden=st.integers(1, 64), heads=st.integers(1, 16), head_dim=st.one_of(st.none(), st.integers(1, 64)))
def test_head_size_is_decoupled_exactly_when_an_int_is_given(hidden, heads, head_dim):
    if head_dim is None and hidden % heads:
        with pytest.raises(ValueError, match=f"hidden_size={hidden} and num_attention_heads={heads}"):
            MultiHeadAttention(hidden, heads, head_dim)
        return
    mha = MultiHeadAttention(hidden, heads, head_dim)
    dp = head_dim if head_dim is not None else hidden // heads
    assert mha.head_dim == dp == resolve_head_dim(hidden, heads, head_dim)
    # q, k, v: d -> h·d_p each; output: h·d_p -> d (paper Section 4: 4·h·d_p·d weights)
    assert mha.qkv.weight.shape == (3 * heads * dp, hidden)
    assert mha.out_proj.weight.shape == (hidden, heads * dp)
    assert mha.scale == pytest.approx(1 / math.sqrt(dp))


@PROFILE
@given(attention_case(), st.integers(1, 4))
def test_padding_keys_never_change_real_tokens(case, extra):
    """Appending padded keys (with any content) leaves every real token's output unchanged."""
    torch.manual_seed(case["seed"])
    mha = MultiHeadAttention(case["hidden"], case["heads"], case["head_dim"]).eval()
    x = torch.randn(case["batch"], case["seq"], case["hidden"])
    padded = torch.cat([x, 1e3 * torch.randn(case["batch"], extra, case["hidden"])], dim=1)
    mask = torch.cat([torch.ones(case["batch"], case["seq"]), torch.zeros(case["batch"], extra)], dim=1)
    with torch.no_grad():
        alone, _ = mha(x, use_sdpa=case["use_sdpa"])
        out, _ = mha(padded, mask, use_sdpa=case["use_sdpa"])
    torch.testing.assert_close(out[:, : case["seq"]], alone, atol=1e-4, rtol=1e-4)
