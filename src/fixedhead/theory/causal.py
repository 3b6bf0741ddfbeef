"""Causal attention (beyond the paper): query i sees keys 0..i only.

Only the lower triangle of the logits is constrained, so the exact threshold is the minimum rank of a
completion (Woerdeman 1987; derivation in docs/theory.md): ⌈(n − 1)/2⌉ for a generic P, 1 to n − 1 for special
ones. :func:`causal_logit_lower_bounds` and :func:`fit_causal_logits` bracket what a smaller causal head does.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np

from .common import ROW_SUM_TOL, _as_matrix, _check_int, _check_row_sums, _one_thread


def causal_threshold(n: int) -> int:
    """⌈(n − 1)/2⌉: the head size that represents a generic causal attention pattern on n tokens exactly."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    return math.ceil((n - 1) / 2)


def check_causal_attention(P, row_sum_tol: float = ROW_SUM_TOL) -> np.ndarray:
    """Validate a causal head's attention P [n, n] (rows are queries) and return it as float64.

    P[i, j] > 0 for j <= i, 0 above the diagonal (|P[i, j]| <= ``row_sum_tol`` is set to 0), and each row sums
    to 1 within ``row_sum_tol``. Raises ValueError naming the first entry or row that breaks a rule.
    """
    P = _as_matrix("P", P, square=True)
    seen = np.tri(P.shape[0], dtype=bool)
    bad = ~seen & (np.abs(P) > row_sum_tol)
    if np.any(bad):
        i, j = np.argwhere(bad)[0]
        raise ValueError(
            f"a causal P must be 0 above the diagonal (query i sees keys 0..i only), got P[{i}, {j}] = "
            f"{float(P[i, j])!r}"
        )
    if np.any(seen & (P <= 0)):
        i, j = np.argwhere(seen & (P <= 0))[0]
        raise ValueError(
            f"a causal P must be positive on and below the diagonal (log P is taken there), got "
            f"P[{i}, {j}] = {float(P[i, j])!r}"
        )
    P = np.where(seen, P, 0.0)
    _check_row_sums(P, row_sum_tol)
    return P


def _causal_log(P: np.ndarray) -> np.ndarray:
    """log P on and below the diagonal, 0 above (P already checked)."""
    seen = np.tri(P.shape[0], dtype=bool)
    return np.where(seen, np.log(np.where(seen, P, 1.0)), 0.0)


def _causal_differences(P: np.ndarray) -> np.ndarray:
    """D [n − 1, n − 1]: D[i, j] = log P[i+1, j+1] − log P[i+1, 0] for j <= i, 0 above (P checked)."""
    logp = _causal_log(P)
    return np.tril(logp[1:, 1:] - logp[1:, :1])


def _causal_rank(D: np.ndarray, rtol: float | None) -> tuple[int, float]:
    """Minimum rank of a completion of D's lower triangle (Woerdeman's count), and its threshold τ.

    Σ_j rank D[j:, :j+1] − Σ_j rank D[j:, :j], with one absolute τ = rtol · (largest singular value of any
    block), so each term's difference is 0 or 1 (deleting a column interlaces singular values).
    """
    m = D.shape[0]
    if m == 0:
        return 0, 0.0
    if rtol is None:
        rtol = (m + 1) * np.finfo(np.float64).eps  # n · eps, as for the bidirectional rank
    full = [np.linalg.svd(D[j:, : j + 1], compute_uv=False) for j in range(m)]
    part = [np.linalg.svd(D[j:, :j], compute_uv=False) for j in range(1, m)]
    scale = max(float(s[0]) for s in full)
    if scale == 0.0:
        return 0, 0.0
    tau = rtol * scale
    rank = sum(int(np.sum(s > tau)) for s in full) - sum(int(np.sum(s > tau)) for s in part)
    return rank, tau


class CausalCompletion(NamedTuple):
    """Result of :func:`complete_causal_logits`: ``logits`` [n, n] of rank ``head_dim`` whose masked softmax is P
    (row and column 0 are 0), ``head_dim`` the exact causal threshold, ``error`` the largest mismatch of a seen
    log-difference, in nats (float rounding)."""

    logits: np.ndarray
    head_dim: int
    error: float


@_one_thread
def complete_causal_logits(P, rtol: float | None = None, row_sum_tol: float = ROW_SUM_TOL) -> CausalCompletion:
    """Minimum-rank logits for a causal head: the exact causal threshold r and its witness.

    Ranks count singular values above τ = ``rtol`` (default n · float64 eps) × the largest singular value of
    the blocks D[j:, :j+1]; the fill uses pseudo-inverses truncated at τ, then an SVD cuts the logits to rank r.
    """
    P = check_causal_attention(P, row_sum_tol)
    n = P.shape[0]
    D = _causal_differences(P)
    rank, tau = _causal_rank(D, rtol)
    M = D.copy()
    for j in range(1, n - 1):  # fill column j above the diagonal: X_j = A_j O_j^+ C_j
        U, s, Vt = np.linalg.svd(M[j:, :j], full_matrices=False)  # O_j: known data only
        k = int(np.sum(s > tau))
        y = Vt[:k].T @ ((U[:, :k].T @ M[j:, j]) / s[:k])
        M[:j, j] = M[:j, :j] @ y
    S = np.zeros((n, n))
    if rank > 0:
        U, s, Vt = np.linalg.svd(M)
        S[1:, 1:] = (U[:, :rank] * s[:rank]) @ Vt[:rank]
    error = float(np.max(np.abs(np.tril(S[1:, 1:] - D)), initial=0.0))
    return CausalCompletion(S, max(1, rank), error)


def _causal_logit_error(L: np.ndarray, logp: np.ndarray) -> float:
    """sqrt(Σ_i min_c Σ_{j<=i} (L[i, j] − log P[i, j] − c)²): the best shift per query is the mean."""
    n = L.shape[0]
    seen = np.tri(n, dtype=bool)
    R = np.where(seen, L - logp, 0.0)
    R = np.where(seen, R - (R.sum(axis=1) / np.arange(1, n + 1))[:, None], 0.0)
    return float(np.sqrt(np.sum(R**2)))


@_one_thread
def causal_logit_lower_bounds(P, row_sum_tol: float = ROW_SUM_TOL) -> np.ndarray:
    """Certified lower bounds on a causal head's logit-space error for every size k = 0..n: [n + 1], nats.

    The causal :func:`logit_errors`: e_k = inf over rank(L) <= k and c of (Σ_i Σ_{j<=i} (L[i, j] − log P[i, j] −
    c_i)²)^{1/2}. Every block of rows t..n−1 and columns 0..t is fully seen, so Eckart–Young on it (rows
    centred) bounds e_k for each t; the bound is the largest over t (entry 0 is e_0 itself). For generic P
    the bound one below the threshold is > 0.
    """
    P = check_causal_attention(P, row_sum_tol)
    n = P.shape[0]
    logp = _causal_log(P)
    bound = np.zeros(n + 1)
    for t in range(n):
        block = logp[t:, : t + 1]
        s = np.linalg.svd(block - block.mean(axis=1, keepdims=True), compute_uv=False)
        tail = np.sqrt(np.maximum(np.cumsum((s**2)[::-1])[::-1], 0.0))  # tail[k] = sqrt(Σ_{i>=k} σ_i²)
        bound[: tail.size] = np.maximum(bound[: tail.size], tail)
    bound[0] = _causal_logit_error(np.zeros((n, n)), logp)
    return bound


class CausalLogitFit(NamedTuple):
    """Result of :func:`fit_causal_logits`, in nats: ``logits`` [n, n] of rank <= head_dim, the achieved
    ``error`` (an upper bound), the certified ``lower_bound`` and each start's error (completion first)."""

    logits: np.ndarray
    error: float
    lower_bound: float
    restart_errors: list[float]


def _causal_queries(B: np.ndarray, logp: np.ndarray) -> np.ndarray:
    """For keys B [n, k], the best [a_i, c_i] per query i: least squares over keys j <= i (tiny ridge)."""
    n, k = B.shape
    W = np.hstack([B, np.ones((n, 1))])  # [n, k+1]: key j's features and the shift
    G = np.cumsum(W[:, :, None] * W[:, None, :], axis=0)  # G[i] = Σ_{j<=i} w_j w_j^T
    ridge = 1e-12 * np.trace(G, axis1=1, axis2=2) / (k + 1)
    return np.linalg.solve(G + ridge[:, None, None] * np.eye(k + 1), (logp @ W)[:, :, None])[:, :, 0]


def _fit_causal_keys(logp: np.ndarray, B0: np.ndarray, max_iter: int) -> np.ndarray:
    """Variable projection: minimise over keys B the causal error with queries and shifts solved exactly."""
    from scipy.optimize import minimize

    n, k = B0.shape
    seen = np.tri(n, dtype=bool)

    def loss_and_grad(b):
        B = b.reshape(n, k)
        x = _causal_queries(B, logp)
        R = np.where(seen, x[:, :k] @ B.T + x[:, k:] - logp, 0.0)
        return float(np.sum(R**2)), (2.0 * R.T @ x[:, :k]).ravel()  # envelope theorem: x is optimal

    res = minimize(
        loss_and_grad,
        B0.ravel(),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": max_iter, "maxcor": 20, "ftol": 1e-15, "gtol": 1e-12},
    )
    return res.x.reshape(n, k)


@_one_thread
def fit_causal_logits(
    P,
    head_dim: int,
    *,
    restarts: int = 0,
    seed: int = 0,
    max_iter: int = 300,
    rtol: float | None = None,
    row_sum_tol: float = ROW_SUM_TOL,
) -> CausalLogitFit:
    """The closest logits a causal head of size ``head_dim`` reaches, with a certified lower bound.

    At or above the threshold: the exact completion. Below it, variable projection: for keys B the best
    queries and shifts solve one least-squares problem per query, and SciPy's L-BFGS-B optimises B from the
    completion's truncated SVD and ``restarts`` random starts. Non-convex, so the error is an upper bound; one
    below the generic threshold it matched the lower bound to 4+ digits in every case tried.
    """
    P = check_causal_attention(P, row_sum_tol)
    k = _check_int("head_dim", head_dim)
    restarts = _check_int("restarts", restarts, minimum=0)
    max_iter = _check_int("max_iter", max_iter)
    n = P.shape[0]
    logp = _causal_log(P)
    lower = float(causal_logit_lower_bounds(P)[min(k, n)])
    completion = complete_causal_logits(P, rtol)
    if k >= completion.head_dim:
        err = _causal_logit_error(completion.logits, logp)
        return CausalLogitFit(completion.logits, err, lower, [err])
    _, s, Vt = np.linalg.svd(completion.logits)
    starts = [Vt[:k].T * np.sqrt(s[:k])]
    rng = np.random.default_rng(seed)
    starts += [rng.standard_normal((n, k)) for _ in range(restarts)]
    errors, best = [], None
    for B0 in starts:
        B = _fit_causal_keys(logp, B0, max_iter)
        L = _causal_queries(B, logp)[:, :k] @ B.T
        err = _causal_logit_error(L, logp) if np.all(np.isfinite(L)) else math.inf
        errors.append(err)
        if best is None or err < best[1]:
            best = (L, err)
    return CausalLogitFit(best[0], best[1], lower, errors)
