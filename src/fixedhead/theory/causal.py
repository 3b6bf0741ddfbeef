"""Causal attention (beyond the paper): query i sees keys 0..i only.

Only the lower triangle of the logits is constrained, so the exact threshold is the minimum rank
of a *completion* (:func:`complete_causal_logits`, Woerdeman 1987): ⌈(n − 1)/2⌉ for a generic P
(:func:`causal_threshold`), anywhere from 1 to n − 1 for special ones.
:func:`causal_logit_lower_bounds` and :func:`fit_causal_logits` bracket the best a smaller causal
head can do. ``causal=True`` in :mod:`fixedhead.theory.theorem1` uses these.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np

from .common import ROW_SUM_TOL, _as_matrix, _check_int, _check_row_sums, _one_thread


def causal_threshold(n: int) -> int:
    """⌈(n − 1)/2⌉: the head size that represents a *generic* causal attention pattern on n tokens
    exactly — what :func:`min_head_dim` with ``causal=True`` returns for a generic P (special P
    need anything from 1 to n − 1; see :func:`complete_causal_logits`).

    Raises:
        ValueError: n not a positive int.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    return math.ceil((n - 1) / 2)


def check_causal_attention(P, row_sum_tol: float = ROW_SUM_TOL) -> np.ndarray:
    """Validate a causal (decoder) head's attention matrix and return it as float64.

    Args:
        P: [n, n], rows are queries; query i sees keys 0..i only, so P[i, j] > 0 for j <= i and
            P[i, j] = 0 for j > i (|P[i, j]| <= ``row_sum_tol`` is accepted there and set to 0),
            and Σ_{j<=i} P[i, j] = 1 within ``row_sum_tol`` (absolute). Row 0 is therefore [1, 0, …].

    Returns:
        P as a float64 [n, n] array, exactly 0 above the diagonal (not renormalised).

    Raises:
        ValueError: P not square or non-finite, an entry above the diagonal that is not 0, an entry
            on or below it that is <= 0 (log P must exist where the query looks), or a row sum off
            by more than ``row_sum_tol``.
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
    """Minimum rank of a completion of the lower triangle of D (Woerdeman's count), and its threshold.

    Σ_j rank D[j:, :j+1] − Σ_j rank D[j:, :j], singular values counted above one absolute
    threshold τ = rtol · (largest singular value of any block). With a common τ, each term
    rank D[j:, :j+1] − rank D[j:, :j] is 0 or 1 (deleting a column interlaces singular values).
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
    """Result of :func:`complete_causal_logits`.

    Attributes:
        logits: [n, n] float64 logits of rank ``head_dim`` (0 when the rank is 0) whose masked
            softmax is P; row 0 and column 0 are 0, the entries above the diagonal are the completion.
        head_dim: the exact causal threshold, ``min_head_dim(P, causal=True)``.
        error: max over constrained entries (j <= i) of |(logits[i, j] − logits[i, 0]) −
            (log P[i, j] − log P[i, 0])| in nats: float rounding (~1e-15 relative).
    """

    logits: np.ndarray
    head_dim: int
    error: float


@_one_thread
def complete_causal_logits(P, rtol: float | None = None, row_sum_tol: float = ROW_SUM_TOL) -> CausalCompletion:
    """Minimum-rank logits for a causal head: the exact causal threshold r and its witness (beyond the paper,
    whose Theorem 1 is bidirectional; the derivation, after Woerdeman 1987, is in docs/theory.md). Generic P
    need r = ⌈(n − 1)/2⌉, special ones 0 to n − 1.

    Ranks count singular values above τ = ``rtol`` × the largest singular value of the blocks
    D[j:, :j+1]; the fill uses pseudo-inverses truncated at τ and the filled logits are cut to rank r by SVD.

    Args:
        P: [n, n] causal attention, rows = queries (:func:`check_causal_attention`).
        rtol: relative rank tolerance; default n · float64 eps.

    Returns:
        :class:`CausalCompletion` (logits [n, n], head_dim = max(1, r), error in nats).

    Raises:
        ValueError: see :func:`check_causal_attention`.
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
    """Certified lower bounds on the logit-space error of a causal head of every size k = 0..n.

    The causal analogue of :func:`logit_errors`: the error of a size-k head is

        e_k = inf over L with rank(L) <= k and c ∈ R^n of (Σ_i Σ_{j<=i} (L[i, j] − log P[i, j] − c_i)²)^{1/2},

    only the entries a query sees counting. There is no closed form (a weighted low-rank
    problem), but every block of rows t..n−1 and columns 0..t is fully seen, so by Eckart–Young
    on that block with its rows centred (C_t), e_k >= sqrt(Σ_{i>k} σ_i(C_t)²) for each t; the
    bound is the largest over t. For generic P the middle block (t = ⌊n/2⌋) has centred rank
    ⌈(n − 1)/2⌉ = min_head_dim(P, causal=True), so the bound one below the threshold is > 0: a
    smaller head cannot fit P. (It can be 0 below the threshold for special P: see
    :func:`complete_causal_logits`.) :func:`fit_causal_logits` gives the matching upper bound.

    Args:
        P: [n, n] causal attention (see :func:`check_causal_attention`).

    Returns:
        [n + 1] float64, entry k a lower bound on e_k in nats; entry 0 is e_0 itself.

    Raises:
        ValueError: see :func:`check_causal_attention`.
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
    """Result of :func:`fit_causal_logits` (errors in nats, as in :func:`causal_logit_lower_bounds`).

    Attributes:
        logits: [n, n] float64 of rank <= head_dim (entries above the diagonal are masked anyway).
        error: the achieved e_k of ``logits`` (an upper bound on the minimum).
        lower_bound: the certified lower bound on the minimum.
        restart_errors: the error reached from each start (completion SVD first).
    """

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
    """The closest logits a causal head of size ``head_dim`` reaches (numerically), with a lower bound.

    At or above the exact threshold (:func:`min_head_dim` with ``causal=True``) this is the exact
    completion of :func:`complete_causal_logits` (error ~1e-15). Below it, minimises e_k (see
    :func:`causal_logit_lower_bounds`) over logits A B^T by variable projection: for keys B the best
    queries A and shifts solve one small least-squares problem per query, and SciPy's L-BFGS-B
    optimises B, from the truncated SVD of the completion and ``restarts`` random starts. The
    problem is non-convex, so the error is achieved, an upper bound; the lower bound is
    certified. One below the generic threshold the two agreed to 4+ digits in every case tried.

    Args:
        P: [n, n] causal attention. head_dim: head size >= 1. restarts: extra random starts >= 0.
        seed: seed of those starts. max_iter: L-BFGS-B iterations per start.
        rtol: rank tolerance of the completion (see :func:`complete_causal_logits`).

    Returns:
        :class:`CausalLogitFit`.

    Raises:
        ValueError: see :func:`check_causal_attention`; head_dim, restarts or max_iter not ints in range.
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
