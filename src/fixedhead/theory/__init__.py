"""The paper's theorems as code (Bhojanapalli et al., ICML 2020, Section 3), in float64 NumPy/PyTorch.

Rows are tokens: X ∈ R^{n×d} (the paper's Xᵀ), W_q, W_k ∈ R^{d×d_p}, logits L = (X W_q)(X W_k)ᵀ / √d_p,
P = softmax(L) row by row, so ``P_here = P_paper^T`` (the paper's P is column-stochastic).
:mod:`~fixedhead.theory.theorem1` (one head), :mod:`~fixedhead.theory.causal` (causal heads, beyond the
paper), :mod:`~fixedhead.theory.theorem2` (the witness). Imports nothing from the rest of fixedhead.
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
