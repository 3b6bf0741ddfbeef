"""Theorem 1 (paper, Section 3): what one head of size d_p can represent.

:func:`represent` builds the exact weights, :func:`min_head_dim` is the sharp threshold, :func:`best_logits` /
:func:`logit_errors` (logit space) and :func:`fit_head` (KL) are the best a smaller head does.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from .causal import _causal_differences, _causal_rank, check_causal_attention, complete_causal_logits
from .common import ROW_SUM_TOL, _as_matrix, _check_int, _numerical_rank, _one_thread, check_attention


def centred_log_attention(P, row_sum_tol: float = ROW_SUM_TOL) -> np.ndarray:
    """The per-query-centred log attention C = log P (I − 11ᵀ/n), [n, n] float64 in nats.

    The paper's log(P D_0) with D_0 the inverse geometric mean of each query's row (Theorem 1 proof):
    softmax(C) = P and C 1 = 0, so rank(C) ≤ n − 1.
    """
    P = check_attention(P, row_sum_tol)
    logp = np.log(P)
    return logp - logp.mean(axis=1, keepdims=True)


@_one_thread
def min_head_dim(P, rtol: float | None = None, row_sum_tol: float = ROW_SUM_TOL, *, causal: bool = False) -> int:
    """Smallest head size d_p that represents P exactly on an input of rank n (Theorem 1, sharpened).

    softmax(L) = P iff L = log P + c 1ᵀ, and L (I − 11ᵀ/n) = C (:func:`centred_log_attention`), so the
    threshold is max(1, rank(C)) ≤ n − 1, one less than the paper's sufficient d_p ≥ n. ``causal=True``:
    the minimum completion rank of the lower-triangular log-differences (:func:`complete_causal_logits`),
    ⌈(n − 1)/2⌉ for generic P. ``rtol``: singular values below rtol · σ_max count as zero (default
    n · float64 eps, NumPy's ``matrix_rank`` rule).
    """
    if causal:
        D = _causal_differences(check_causal_attention(P, row_sum_tol))
        return max(1, _causal_rank(D, rtol)[0])
    C = centred_log_attention(P, row_sum_tol)
    s = np.linalg.svd(C, compute_uv=False)
    return max(1, _numerical_rank(s, C.shape, rtol))


def head_attention(X, W_q, W_k, *, causal: bool = False) -> np.ndarray:
    """One head's attention softmax((X W_q)(X W_k)ᵀ / √d_p), [n, n] float64, rows are queries.

    X [n, d], W_q and W_k [d, d_p] (transposes of the paper's maps); ``causal`` masks keys after the query.
    """
    X, W_q, W_k = _as_matrix("X", X), _as_matrix("W_q", W_q), _as_matrix("W_k", W_k)
    if W_q.shape != W_k.shape or W_q.shape[0] != X.shape[1]:
        raise ValueError(f"need X [n, d] and W_q, W_k [d, d_p], got {X.shape}, {W_q.shape}, {W_k.shape}")
    L = (X @ W_q) @ (X @ W_k).T / math.sqrt(W_q.shape[1])
    if causal:
        L = np.where(np.tri(L.shape[0], dtype=bool), L, -np.inf)
    L = L - L.max(axis=1, keepdims=True)
    E = np.exp(L)
    return E / E.sum(axis=1, keepdims=True)


def _svd_factors(C: np.ndarray, k: int, svd=None) -> tuple[np.ndarray, np.ndarray]:
    """A, B ∈ R^{n×k} with A B^T = best rank-k approximation of C (zero columns beyond n)."""
    U, s, Vt = np.linalg.svd(C) if svd is None else svd
    m = min(k, C.shape[0])
    r = np.sqrt(s[:m])
    A = np.zeros((C.shape[0], k))
    B = np.zeros((C.shape[0], k))
    A[:, :m] = U[:, :m] * r
    B[:, :m] = Vt[:m].T * r
    return A, B


@_one_thread
def represent(X, P, head_dim: int | None = None, row_sum_tol: float = ROW_SUM_TOL, *, causal: bool = False):
    """Theorem 1's construction: W_q, W_k [d, head_dim] with softmax((X W_q)(X W_k)ᵀ / √head_dim) = P.

    X [n, d] of rank n has the right inverse X⁺; factor C (:func:`centred_log_attention`) = A Bᵀ by SVD and set
    W_q = head_dim^{1/4} X⁺ A, W_k = head_dim^{1/4} X⁺ B. ``head_dim=None`` takes :func:`min_head_dim`; extra
    columns are zero. ``causal`` (beyond the paper) factors :func:`complete_causal_logits`' completion instead.
    P is reproduced to ~1e-12.

    Raises:
        ValueError: X of rank < n, or head_dim < min_head_dim(P) (no head of that size represents P on any input).
    """
    X = _as_matrix("X", X)
    P = check_causal_attention(P, row_sum_tol) if causal else check_attention(P, row_sum_tol)
    n, d = X.shape
    if P.shape[0] != n:
        raise ValueError(f"P must be [n, n] with n = X.shape[0] = {n} tokens, got shape {P.shape}")
    # one SVD of X gives both its rank and its pseudo-inverse (= a right inverse when rank is n)
    Ux, sx, Vxt = np.linalg.svd(X, full_matrices=False)
    rank_x = _numerical_rank(sx, X.shape, None)
    if rank_x < n:
        raise ValueError(
            f"X must have rank n = {n} (its rows, the tokens, linearly independent; needs d >= n) "
            f"for exact representation, got rank {rank_x} with X of shape {X.shape}"
        )
    if causal:
        completion = complete_causal_logits(P, row_sum_tol=row_sum_tol)
        C, needed = completion.logits, completion.head_dim
        why = "a completion of its lower-triangular log-differences needs rank"
    else:
        C = centred_log_attention(P, row_sum_tol)
        why = "the per-query-centred log P has rank"
    svd = np.linalg.svd(C)
    if not causal:
        needed = max(1, _numerical_rank(svd[1], C.shape, None))
    head_dim = needed if head_dim is None else _check_int("head_dim", head_dim)
    if head_dim < needed:
        raise ValueError(
            f"head_dim={head_dim} is too small to represent P exactly: {why} {needed} "
            f"(min_head_dim{'(causal=True)' if causal else ''}), and a head's logits have rank <= head_dim"
        )
    A, B = _svd_factors(C, head_dim, svd)
    x_pinv = Vxt.T / sx  # [d, n]: X^+ = V S^{-1} U^T
    scale = head_dim**0.25
    W_q = scale * (x_pinv @ (Ux.T @ A))
    W_k = scale * (x_pinv @ (Ux.T @ B))
    return W_q, W_k


class BestLogits(NamedTuple):
    """Result of :func:`best_logits`: ``logits`` [n, n] of rank <= head_dim, ``error`` in nats."""

    logits: np.ndarray
    error: float


@_one_thread
def logit_errors(P, row_sum_tol: float = ROW_SUM_TOL) -> np.ndarray:
    """e_k, the least logit-space error of a head of size k, for k = 0..n: [n + 1] float64, in nats.

        e_k = min over rank(L) <= k and c ∈ R^n of ||L − (log P + c 1ᵀ)||_F = sqrt(Σ_{i>k} σ_i(C)²)

    with C = log P (I − 11ᵀ/n) (Eckart–Young; softmax ignores the per-query shift c). On an input of
    rank n every rank-k logit matrix is reachable, so e_k is a size-k head's exact bottleneck (Theorem 1).
    """
    C = centred_log_attention(P, row_sum_tol)
    s = np.linalg.svd(C, compute_uv=False)
    tail = np.concatenate([np.cumsum((s**2)[::-1])[::-1], [0.0]])  # tail[k] = Σ_{i>=k} σ_i² (0-based)
    return np.sqrt(np.maximum(tail, 0.0))


@_one_thread
def best_logits(P, head_dim: int, row_sum_tol: float = ROW_SUM_TOL) -> BestLogits:
    """The closest logits a head of size ``head_dim`` produces on a rank-n input, and the error.

    The truncated SVD of C = log P (I − 11ᵀ/n); the error is :func:`logit_errors`' e_{head_dim}, in nats.
    """
    head_dim = _check_int("head_dim", head_dim)
    C = centred_log_attention(P, row_sum_tol)
    A, B = _svd_factors(C, head_dim)
    L = A @ B.T
    return BestLogits(L, float(np.linalg.norm(L - C)))


def mean_row_kl(P, Q) -> float:
    """Mean over queries of KL(P[i] || Q[i]) for [n, n] row-stochastic P, Q, in nats."""
    P, Q = _as_matrix("P", P), _as_matrix("Q", Q)
    if P.shape != Q.shape:
        raise ValueError(f"P and Q must have the same shape, got {P.shape} and {Q.shape}")
    return float(np.sum(P * (np.log(P) - np.log(Q))) / P.shape[0])


@dataclass
class HeadFit:
    """Result of :func:`fit_head`: weights [d, head_dim], the attention they give, its mean row KL to P
    (``kl``, nats), the same for the SVD start (``kl_svd_init``), max |attention − P| and each start's KL."""

    W_q: np.ndarray
    W_k: np.ndarray
    attention: np.ndarray
    kl: float
    kl_svd_init: float
    max_abs_error: float
    restart_kls: list[float] = field(default_factory=list)


def _minimise_kl(Xt: torch.Tensor | None, Pt: torch.Tensor, Z0: np.ndarray, max_iter: int) -> np.ndarray:
    """L-BFGS on Z = [W_q, W_k] ([2, d, k]) for the mean row KL to P; ``Xt=None`` means X = I."""
    n, k = Pt.shape[0], Z0.shape[-1]
    logP = torch.log(Pt)
    Z = torch.tensor(Z0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [Z],
        lr=1.0,
        max_iter=max_iter,
        max_eval=2 * max_iter,
        tolerance_grad=1e-12,
        tolerance_change=1e-16,
        history_size=10,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        Q, K = (Z[0], Z[1]) if Xt is None else (Xt @ Z[0], Xt @ Z[1])
        loss = (Pt * (logP - torch.log_softmax(Q @ K.T / math.sqrt(k), dim=1))).sum() / n
        loss.backward()
        return loss

    opt.step(closure)
    return Z.detach().numpy().copy()


@_one_thread
def fit_head(
    X, P, head_dim: int, *, restarts: int = 0, seed: int = 0, max_iter: int = 1000, row_sum_tol: float = ROW_SUM_TOL
) -> HeadFit:
    """Best one-head fit of P in probability space: minimise the mean row KL(P || softmax(L)), in nats.

    L-BFGS (float64) over W_q, W_k [d, head_dim], from the logit-space optimum (:func:`best_logits` mapped
    through X's pseudo-inverse) and ``restarts`` random starts; the best is returned. X [n, d] need not have
    rank n. The problem is non-convex, so the KL is an upper bound on the true minimum; for
    head_dim >= min_head_dim(P) and rank-n X the SVD start is already exact.
    """
    X = _as_matrix("X", X)
    P = check_attention(P, row_sum_tol)
    n, d = X.shape
    if P.shape[0] != n:
        raise ValueError(f"P must be [n, n] with n = X.shape[0] = {n} tokens, got shape {P.shape}")
    head_dim = _check_int("head_dim", head_dim)
    restarts = _check_int("restarts", restarts, minimum=0)
    max_iter = _check_int("max_iter", max_iter)

    A, B = _svd_factors(centred_log_attention(P, row_sum_tol), head_dim)
    x_pinv = np.linalg.pinv(X)
    scale = head_dim**0.25
    starts = [np.stack([scale * x_pinv @ A, scale * x_pinv @ B])]
    rng = np.random.default_rng(seed)
    for _ in range(restarts):
        starts.append(rng.standard_normal((2, d, head_dim)) * scale / math.sqrt(d))
    identity = n == d and np.array_equal(X, np.eye(n))
    Xt, Pt = (None if identity else torch.from_numpy(X)), torch.from_numpy(P)
    start_kls, restart_kls, fits = [], [], []
    for Z0 in starts:
        start_kl = mean_row_kl(P, head_attention(X, Z0[0], Z0[1]))
        Z = _minimise_kl(Xt, Pt, Z0, max_iter)
        kl = mean_row_kl(P, head_attention(X, Z[0], Z[1])) if np.all(np.isfinite(Z)) else math.inf
        if not kl <= start_kl:  # never return something worse than the start (or nan)
            Z, kl = Z0, start_kl
        start_kls.append(start_kl)
        restart_kls.append(kl)
        fits.append(Z)
    best = int(np.argmin(restart_kls))
    W_q, W_k = fits[best][0].copy(), fits[best][1].copy()
    att = head_attention(X, W_q, W_k)
    return HeadFit(W_q, W_k, att, restart_kls[best], start_kls[0], float(np.max(np.abs(att - P))), restart_kls)


def random_attention(n: int, temperature: float = 1.0, seed: int = 0, *, causal: bool = False) -> np.ndarray:
    """A random positive attention matrix softmax(G / temperature), G_ij ~ N(0, 1): [n, n] float64.

    Generic: rank(C) = n − 1 with probability 1. ``causal=True``: the masked softmax of the same G, so one
    seed gives both; ``min_head_dim(P, causal=True)`` = ⌈(n − 1)/2⌉ with probability 1.

    Raises:
        ValueError: temperature so low that an entry of P underflows to 0.
    """
    n = _check_int("n", n)
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not (0 < temperature < math.inf):
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
    G = np.random.default_rng(seed).standard_normal((n, n)) / temperature
    seen = np.tri(n, dtype=bool) if causal else np.ones((n, n), dtype=bool)
    G = np.where(seen, G, -np.inf)
    G = G - G.max(axis=1, keepdims=True)
    E = np.exp(G)
    if np.any(E[seen] == 0.0):
        raise ValueError(f"temperature={temperature!r} is so low that entries of P underflow to 0 in float64")
    return E / E.sum(axis=1, keepdims=True)
