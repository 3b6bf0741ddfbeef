"""The paper's theorems as code (Bhojanapalli et al., ICML 2020, Section 3): float64 NumPy/PyTorch.

Convention. Rows are tokens: an input sequence is X ∈ R^{n×d} (the paper's X^T), a head's query and
key maps are W_q, W_k ∈ R^{d×d_p} (the transposes of the paper's W_q, W_k ∈ R^{d_p×d}), its logits
are L = (X W_q)(X W_k)^T / √d_p ∈ R^{n×n}, and the attention matrix P = softmax(L) is taken row by
row, so P[i, j] is how much query i attends to key j and every *row* sums to 1. This is the
transpose of the paper's column-stochastic P (PAPER.md); ``P_here = P_paper^T``.

What is here, one module per part of the paper (import the names from :mod:`fixedhead.theory`):

* :mod:`~fixedhead.theory.theorem1` — :func:`represent`, Theorem 1's construction: weights whose
  head reproduces a given P exactly. :func:`min_head_dim`, the sharp threshold: the smallest head
  size that can represent P on a rank-n input is rank(log P · (I − 11^T/n)) ≤ n − 1, one less
  than the paper's sufficient d_p ≥ n (the paper's free diagonal D_0 is a per-query shift of the
  logits that softmax ignores). :func:`best_logits`, :func:`logit_errors`: the best a head of size
  d_p < rank can do in logit space (truncated SVD, Eckart–Young), and :func:`fit_head`: the best
  it can do in probability space (row-wise KL, numerically).
* :mod:`~fixedhead.theory.causal` — causal attention (beyond the paper; ``causal=True`` in
  :func:`min_head_dim`, :func:`represent`, :func:`head_attention`, :func:`random_attention`):
  query i sees keys 0..i only, so only the lower triangle of the logits is constrained and the
  exact threshold is a minimum-rank *completion* (:func:`complete_causal_logits`, Woerdeman
  1987): ⌈(n − 1)/2⌉ for generic P (:func:`causal_threshold`), but anywhere from 1 to n − 1 for
  special ones. :func:`causal_logit_lower_bounds` and :func:`fit_causal_logits` bracket the best
  a smaller causal head can do.
* :mod:`~fixedhead.theory.theorem2` — :func:`theorem2_witness`, :func:`theorem2_demo`: Theorem 2,
  a fixed-head layer that no standard multi-head layer equals, shown numerically.
* :mod:`~fixedhead.theory.common` — what they share: :func:`check_attention`,
  :func:`numerical_rank`, :data:`ROW_SUM_TOL`.

Mathematics only: no files, no plots, no progress bars (the ``fixedhead bottleneck`` experiment
around these functions is :mod:`fixedhead.studies.bottleneck`). This package stands alone
(NumPy, SciPy, PyTorch); it imports nothing from the rest of fixedhead (tests/test_layering.py).
"""

from .causal import (
    CausalCompletion,
    CausalLogitFit,
    causal_logit_lower_bounds,
    causal_threshold,
    check_causal_attention,
    complete_causal_logits,
    fit_causal_logits,
)
from .common import (
    ROW_SUM_TOL,
    check_attention,
    numerical_rank,
)
from .theorem1 import (
    BestLogits,
    HeadFit,
    best_logits,
    centred_log_attention,
    fit_head,
    head_attention,
    logit_errors,
    mean_row_kl,
    min_head_dim,
    random_attention,
    represent,
)
from .theorem2 import (
    MultiHeadWeights,
    Theorem2Result,
    embed_standard,
    fit_multihead,
    multihead,
    theorem2_demo,
    theorem2_witness,
)

__all__ = [
    "ROW_SUM_TOL",
    "check_attention",
    "numerical_rank",
    "BestLogits",
    "HeadFit",
    "best_logits",
    "centred_log_attention",
    "fit_head",
    "head_attention",
    "logit_errors",
    "mean_row_kl",
    "min_head_dim",
    "random_attention",
    "represent",
    "CausalCompletion",
    "CausalLogitFit",
    "causal_logit_lower_bounds",
    "causal_threshold",
    "check_causal_attention",
    "complete_causal_logits",
    "fit_causal_logits",
    "MultiHeadWeights",
    "Theorem2Result",
    "embed_standard",
    "fit_multihead",
    "multihead",
    "theorem2_demo",
    "theorem2_witness",
]
