"""The paper's theorems as code (Bhojanapalli et al., ICML 2020, Section 3): float64 NumPy/PyTorch.

Convention. Rows are tokens: an input sequence is X ∈ R^{n×d} (the paper's X^T), a head's query and
key maps are W_q, W_k ∈ R^{d×d_p} (the transposes of the paper's W_q, W_k ∈ R^{d_p×d}), its logits
are L = (X W_q)(X W_k)^T / √d_p ∈ R^{n×n}, and the attention matrix P = softmax(L) is taken row by
row, so P[i, j] is how much query i attends to key j and every *row* sums to 1. This is the
transpose of the paper's column-stochastic P (PAPER.md); ``P_here = P_paper^T``.

What is here:

* :func:`represent` — Theorem 1's construction: weights whose head reproduces a given P exactly.
* :func:`min_head_dim` — the sharp threshold: the smallest head size that can represent P on a
  rank-n input is rank(log P · (I − 11^T/n)) ≤ n − 1, one less than the paper's sufficient d_p ≥ n
  (the paper's free diagonal D_0 is a per-query shift of the logits that softmax ignores).
* :func:`best_logits`, :func:`logit_errors` — the best a head of size d_p < rank can do in logit
  space (truncated SVD, Eckart–Young), and :func:`fit_head` — the best it can do in probability
  space (row-wise KL, numerically).
* Causal attention (beyond the paper; ``causal=True`` in :func:`min_head_dim`, :func:`represent`,
  :func:`head_attention`, :func:`random_attention`): query i sees keys 0..i only, so only the lower
  triangle of the logits is constrained and the exact threshold is a minimum-rank *completion*
  (:func:`complete_causal_logits`, Woerdeman 1987): ⌈(n − 1)/2⌉ for generic P, but anywhere from
  1 to n − 1 for special ones. :func:`causal_logit_lower_bounds` and :func:`fit_causal_logits`
  bracket the best a smaller causal head can do.
* :func:`theorem2_witness`, :func:`theorem2_demo` — Theorem 2: a fixed-head layer that no standard
  multi-head layer equals, shown numerically.

Mathematics only: no files, no plots, no progress bars (the ``fixedhead bottleneck`` experiment
around these functions is :mod:`fixedhead.experiments.bottleneck`). This module stands alone
(NumPy, SciPy, PyTorch); it imports nothing from the rest of the package.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

#: default tolerance on |row sum − 1| of an attention matrix
ROW_SUM_TOL = 1e-8


# ------------------------------------------------------------------------------ validation
def _check_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return int(value)


def _as_matrix(name: str, a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} has non-finite entries (nan or inf)")
    return a


def _check_row_sums(P: np.ndarray, row_sum_tol: float) -> None:
    """Raise ValueError naming the first row (query) of P that does not sum to 1 within ``row_sum_tol``."""
    dev = np.abs(P.sum(axis=1) - 1.0)
    if np.any(dev > row_sum_tol):
        i = int(np.argmax(dev))
        raise ValueError(
            f"each row of P (one query) must sum to 1 within {row_sum_tol:g}, got row {i} summing to "
            f"{float(P[i].sum())!r}; rows are queries here (the transpose of the paper's columns)"
        )


def check_attention(P, row_sum_tol: float = ROW_SUM_TOL) -> np.ndarray:
    """Validate an attention matrix and return it as float64.

    Args:
        P: [n, n], entrywise positive, each row (query) summing to 1 within ``row_sum_tol``
            (absolute). Row-stochastic: the transpose of the paper's column-stochastic P.
        row_sum_tol: tolerance on |Σ_j P[i, j] − 1|.

    Returns:
        P as a float64 [n, n] array (not renormalised).

    Raises:
        ValueError: P not square, non-finite, with an entry <= 0 (log P must exist, as Theorem 1
            requires), or with a row sum off by more than ``row_sum_tol``.
    """
    P = _as_matrix("P", P)
    if P.shape[0] != P.shape[1] or P.shape[0] == 0:
        raise ValueError(f"P must be a non-empty square [n, n] matrix, got shape {P.shape}")
    if np.any(P <= 0):
        i, j = np.argwhere(P <= 0)[0]
        low = np.tri(P.shape[0], dtype=bool)
        hint = (
            ("; it is zero above the diagonal and positive on and below it: for causal attention pass causal=True")
            if np.all(P[low] > 0) and np.all(P[~low] == 0)
            else ""
        )
        raise ValueError(
            f"P must be entrywise positive (Theorem 1 takes log P), got P[{i}, {j}] = {float(P[i, j])!r}{hint}"
        )
    _check_row_sums(P, row_sum_tol)
    return P


class _single_thread:
    """Run this module's dense maths on one BLAS/torch thread, restoring the settings after.

    The matrices here are small (n <= ~1024): on a busy 2-core machine OpenBLAS threads that
    spin-wait made a 1024×1024 SVD take 11–20 s instead of 1.6 s single-threaded, and made
    L-BFGS on 64×64 problems several times slower. Usable as a context manager or decorator.
    """

    def __enter__(self):
        self._torch = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            from threadpoolctl import threadpool_limits

            self._blas = threadpool_limits(1)
        except ImportError:  # optional: only a speed matter
            self._blas = None
        return self

    def __exit__(self, *exc):
        torch.set_num_threads(self._torch)
        if self._blas is not None:
            self._blas.restore_original_limits()
        return False


def _one_thread(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _single_thread():
            return fn(*args, **kwargs)

    return wrapper


# ------------------------------------------------------------------------------- Theorem 1
def centred_log_attention(P, row_sum_tol: float = ROW_SUM_TOL) -> np.ndarray:
    """The per-query-centred log attention C = log P · (I − 11^T/n).

    Each row (query) of log P minus that row's mean, i.e. log P[i, j] − (1/n) Σ_k log P[i, k].
    This is the paper's log(P D_0) with the free per-query diagonal D_0 chosen as the inverse
    geometric mean of each query's probabilities (Theorem 1 proof). Softmax is invariant to
    adding a per-row constant, so softmax(C) = P, and C is the representative of the logits of P
    whose rows are orthogonal to the all-ones vector.

    Args:
        P: [n, n] attention matrix, see :func:`check_attention`.

    Returns:
        C: [n, n] float64, C @ 1 = 0 (so rank(C) <= n − 1), in nats.

    Raises:
        ValueError: see :func:`check_attention`.
    """
    P = check_attention(P, row_sum_tol)
    logp = np.log(P)
    return logp - logp.mean(axis=1, keepdims=True)


def _numerical_rank(s: np.ndarray, shape: tuple[int, int], rtol: float | None) -> int:
    if s.size == 0 or s[0] == 0.0:
        return 0
    if rtol is None:
        rtol = max(shape) * np.finfo(np.float64).eps
    return int(np.sum(s > rtol * s[0]))


def numerical_rank(matrix, rtol: float | None = None) -> int:
    """Number of singular values of a 2-D ``matrix`` above ``rtol · σ_max`` (0 for a zero matrix);
    ``rtol`` defaults to max(shape) · float64 eps (NumPy's ``matrix_rank`` rule). Computed in float64.

    Raises:
        ValueError: ``matrix`` not 2-D.
    """
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"numerical_rank needs a 2-D matrix, got shape {m.shape}")
    return _numerical_rank(np.linalg.svd(m, compute_uv=False), m.shape, rtol)


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


@_one_thread
def min_head_dim(P, rtol: float | None = None, row_sum_tol: float = ROW_SUM_TOL, *, causal: bool = False) -> int:
    """Smallest head size d_p that represents P exactly on an input X of rank n (sharp Theorem 1).

    ``causal=True``: the same for a causal head (query i sees keys 0..i only), where only the
    lower triangle of P is given; see :func:`complete_causal_logits` for the derivation. It is the
    minimum rank of a completion of the lower-triangular log-differences, counted column by column
    with the same ``rtol`` rule: ⌈(n − 1)/2⌉ for generic P, but anything from 1 (e.g. uniform
    over the prefix, ALiBi-like or key-only logits) to n − 1 (e.g. every query favouring itself by
    one logit margin over an otherwise uniform past) for special P. Bidirectional (default):

    A head's logits on X ∈ R^{n×d} of rank n can be any n×n matrix of rank <= d_p (Theorem 1's
    proof, via a right inverse of X), and softmax(L) = P iff L = log P + c 1^T for some per-query
    shift c ∈ R^n (the paper's D_0). Writing C = log P (I − 11^T/n) (each row of log P centred by
    its own mean, :func:`centred_log_attention`), L (I − 11^T/n) = C for every such L, so
    rank(L) >= rank(C), with equality at c = row means. Hence the threshold is exactly rank(C),
    which is at most n − 1 (C 1 = 0): one less than the paper's sufficient condition d_p >= n.

    Args:
        P: [n, n] attention matrix, rows (queries) summing to 1, entries > 0; with ``causal=True``
            lower-triangular instead (see :func:`check_causal_attention`).
        rtol: singular values of C below ``rtol · σ_max(C)`` count as zero; default
            n · float64 eps (NumPy's ``matrix_rank`` rule). Causal: singular values of the
            staircase blocks below ``rtol`` times the largest of them count as zero.
        causal: P is a causal (decoder) head's attention.

    Returns:
        rank(C), or 1 when C = 0 (every row uniform: a head of size 1 with zero weights), since a
        head has at least one dimension. Causal: the minimum completion rank, or 1 when it is 0.

    Raises:
        ValueError: see :func:`check_attention` (:func:`check_causal_attention` when causal).
    """
    if causal:
        D = _causal_differences(check_causal_attention(P, row_sum_tol))
        return max(1, _causal_rank(D, rtol)[0])
    C = centred_log_attention(P, row_sum_tol)
    s = np.linalg.svd(C, compute_uv=False)
    return max(1, _numerical_rank(s, C.shape, rtol))


def head_attention(X, W_q, W_k, *, causal: bool = False) -> np.ndarray:
    """One head's attention softmax((X W_q)(X W_k)^T / √d_p), row-wise (rows are queries).

    Args:
        X: [n, d] input (rows are tokens). W_q, W_k: [d, d_p] (transposes of the paper's maps).
        causal: mask keys after the query (logits above the diagonal set to −inf), as a decoder does.

    Returns:
        [n, n] float64 attention, each row summing to 1 (exactly 0 above the diagonal if causal).

    Raises:
        ValueError: shapes that do not chain.
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
    """Theorem 1's construction: W_q, W_k with softmax((X W_q)(X W_k)^T / √head_dim) = P exactly.

    Construction (paper Theorem 1 proof, rows-are-tokens form). X has rank n, so it has a right
    inverse X^+ = X^T (X X^T)^{-1} with X X^+ = I_n (the paper's left inverse of its X ∈ R^{d×n}).
    Take the logit target C = log P (I − 11^T/n), i.e. log P with the free per-query shift
    (the paper's D_0) chosen as minus each row's mean (:func:`centred_log_attention`); factor
    C = A B^T with A, B ∈ R^{n×head_dim} by SVD; set W_q = head_dim^{1/4} X^+ A and
    W_k = head_dim^{1/4} X^+ B. Then (X W_q)(X W_k)^T / √head_dim = A B^T = C and softmax(C) = P.

    ``causal=True`` (beyond the paper): the same construction on the minimum-rank completed
    logits of :func:`complete_causal_logits` instead of C, so that the *masked* softmax
    (:func:`head_attention` with ``causal=True``) reproduces the lower-triangular P, row 0 included,
    with a head of size ``min_head_dim(P, causal=True)`` (⌈(n − 1)/2⌉ for a generic P).

    Args:
        X: [n, d] input sequence, rows are tokens, rank n (so d >= n).
        P: [n, n] target attention, entries > 0, each row (query) summing to 1 within
            ``row_sum_tol`` (absolute); causal: see :func:`check_causal_attention`.
        head_dim: the head size d_p; None picks the smallest that works, :func:`min_head_dim`
            (≤ n − 1). Any head_dim >= min_head_dim(P) works (extra columns are zero).
        causal: P is a causal head's attention (zero above the diagonal).

    Returns:
        (W_q, W_k), each float64 [d, head_dim]. On random inputs the max-abs error of the
        reconstructed P is ~1e-12 (tests check <= 1e-8 up to n = 256; causal <= 1e-10 up to
        n = 128, on random and structured P).

    Raises:
        ValueError: P has an entry <= 0 (causal: on or below the diagonal, or one above it that
            is not 0), a row not summing to 1, or is not [n, n] with n the number of rows of X;
            X has rank < n; head_dim < min_head_dim(P) (no head of that size represents P on any
            input, Theorem 1 sharpened) or not a positive int.
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
    if head_dim is None:
        head_dim = needed
    head_dim = _check_int("head_dim", head_dim)
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
    """Minimal logit-space error of a head of every size k = 0..n (Eckart–Young on centred log P).

    The quantity minimised, for each k, is the Frobenius distance from log P to the logits a
    head of size k can produce, *modulo the per-query shift softmax ignores*:

        e_k = min over L with rank(L) <= k and c ∈ R^n of ||L − (log P + c 1^T)||_F
            = sqrt(Σ_{i>k} σ_i(C)²),   C = log P (I − 11^T/n).

    (For fixed L the best c is the row mean of L − log P, leaving ||L(I − 11^T/n) − C||_F, and
    L(I − 11^T/n) ranges over all rank-<=k matrices with rows ⊥ 1, which contain C's truncated
    SVD.) On an input of rank n every rank-<=k logit matrix is reachable, so e_k is the exact
    bottleneck of a size-k head in logit space (paper Theorem 1). e_k = 0 iff k >= rank(C).

    Args:
        P: [n, n] attention, rows (queries) summing to 1, entries > 0.

    Returns:
        [n + 1] float64 array, entry k = e_k in nats (absolute, not normalised; e_0 = ||C||_F).

    Raises:
        ValueError: see :func:`check_attention`.
    """
    C = centred_log_attention(P, row_sum_tol)
    s = np.linalg.svd(C, compute_uv=False)
    tail = np.concatenate([np.cumsum((s**2)[::-1])[::-1], [0.0]])  # tail[k] = Σ_{i>=k} σ_i² (0-based)
    return np.sqrt(np.maximum(tail, 0.0))


@_one_thread
def best_logits(P, head_dim: int, row_sum_tol: float = ROW_SUM_TOL) -> BestLogits:
    """The closest logits a head of size ``head_dim`` can produce on a rank-n input, and the error.

    Returns the truncated SVD of C = log P (I − 11^T/n) (rank <= head_dim, rows ⊥ 1) and
    e = min_{rank(L) <= head_dim, c ∈ R^n} ||L − (log P + c 1^T)||_F, see :func:`logit_errors`
    for the exact statement. Theorem 1 (paper, Section 3) in logit space.

    Args:
        P: [n, n] attention, rows (queries) summing to 1, entries > 0.
        head_dim: d_p >= 1.

    Returns:
        BestLogits(logits [n, n] float64, error in nats).

    Raises:
        ValueError: see :func:`check_attention`; head_dim not a positive int.
    """
    head_dim = _check_int("head_dim", head_dim)
    C = centred_log_attention(P, row_sum_tol)
    A, B = _svd_factors(C, head_dim)
    L = A @ B.T
    return BestLogits(L, float(np.linalg.norm(L - C)))


def mean_row_kl(P, Q) -> float:
    """Mean over queries of KL(P[i] || Q[i]) = (1/n) Σ_i Σ_j P_ij log(P_ij / Q_ij), in nats.

    Args:
        P, Q: [n, n] row-stochastic (rows are queries), Q > 0 wherever P > 0.

    Raises:
        ValueError: shapes differ.
    """
    P, Q = _as_matrix("P", P), _as_matrix("Q", Q)
    if P.shape != Q.shape:
        raise ValueError(f"P and Q must have the same shape, got {P.shape} and {Q.shape}")
    return float(np.sum(P * (np.log(P) - np.log(Q))) / P.shape[0])


@dataclass
class HeadFit:
    """Result of :func:`fit_head`.

    Attributes:
        W_q, W_k: [d, head_dim] float64, the best weights found.
        attention: [n, n] the achieved softmax((X W_q)(X W_k)^T/√head_dim), rows sum to 1.
        kl: mean row KL(P || attention) in nats (the bottleneck in probability space).
        kl_svd_init: the same for the SVD initialisation (truncated SVD of centred log P).
        max_abs_error: max |attention − P|.
        restart_kls: KL reached from each start (SVD start first).
    """

    W_q: np.ndarray
    W_k: np.ndarray
    attention: np.ndarray
    kl: float
    kl_svd_init: float
    max_abs_error: float
    restart_kls: list[float] = field(default_factory=list)


def _minimise_kl(Xt: torch.Tensor | None, Pt: torch.Tensor, Z0: np.ndarray, max_iter: int) -> np.ndarray:
    """torch L-BFGS on Z = [W_q, W_k] ([2, d, k]) for the mean row KL(P || softmax(X W_q W_k^T X^T/√k)).

    ``Xt=None`` means X = I (d = n). Returns the final Z as a NumPy array.
    """
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
    """Best one-head fit of P in probability space: minimise the mean row KL(P || softmax(L)).

    Minimises (1/n) Σ_i KL(P[i] || softmax(X W_q (X W_k)^T / √head_dim)[i]) (nats) over W_q,
    W_k ∈ R^{d×head_dim} with ``torch.optim.LBFGS`` (float64, strong-Wolfe line search),
    starting from the logit-space optimum (the truncated SVD of :func:`best_logits`, mapped
    through the pseudo-inverse of X) and from ``restarts`` further random starts; returns the
    best. This is the low-rank bottleneck of paper Theorem 1 measured on probabilities. X need
    not have rank n (e.g. the paper's counterexample); then only logits X W_q W_k^T X^T are
    reachable. The returned KL is achieved by the returned weights, so it is an upper bound on
    the true minimum (the problem is non-convex in W_q, W_k).

    Args:
        X: [n, d] input, rows are tokens.
        P: [n, n] target attention, rows (queries) sum to 1, entries > 0.
        head_dim: head size d_p >= 1.
        restarts: number of extra random initialisations (>= 0).
        seed: seed of the random starts.
        max_iter: L-BFGS iterations per start (it stops earlier once the loss stops changing).

    Returns:
        :class:`HeadFit`. For head_dim >= min_head_dim(P) and rank-n X the SVD start is already
        exact (kl ≈ 0 up to float rounding, which can make it ~ ±1e-16).

    Raises:
        ValueError: bad P (see :func:`check_attention`), P not [n, n] for X's n, head_dim or
            restarts or max_iter not ints in range.
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
    """A random entrywise-positive attention matrix P = softmax(G / temperature), G_ij ~ N(0, 1).

    Rows are queries and sum to 1. Lower temperature = more peaked rows. Generic: the centred
    log P = G (I − 11^T/n) / temperature has rank n − 1 with probability 1.

    ``causal=True``: the masked softmax of the same G (row i over keys 0..i, 0 above the diagonal),
    so a seed gives the bidirectional and the causal attention of one set of logits. Generic too:
    ``min_head_dim(P, causal=True)`` = ⌈(n − 1)/2⌉ with probability 1.

    Args:
        n: sequence length >= 1. temperature: > 0. seed: NumPy seed. causal: mask keys after the query.

    Returns:
        [n, n] float64.

    Raises:
        ValueError: n not a positive int, temperature not a positive finite number or so low
            that an entry of P (on or below the diagonal if causal) underflows to 0.
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


# ------------------------------------------------------- causal attention (beyond the paper)
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
    P = _as_matrix("P", P)
    if P.shape[0] != P.shape[1] or P.shape[0] == 0:
        raise ValueError(f"P must be a non-empty square [n, n] matrix, got shape {P.shape}")
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
    """Minimum-rank logits for a causal head: the exact causal threshold and its witness.

    Beyond the paper (its Theorem 1 is bidirectional). Rows are queries, 0-based; a causal head
    applies softmax to row i of its logits S over keys j <= i only.

    Derivation. (1) The masked softmax of S is P iff S[i, j] − S[i, 0] = log P[i, j] − log P[i, 0]
    for 1 <= j <= i; everything above the diagonal, and one shift per query, is free. (2) Right-
    multiplying S by the invertible map that subtracts column 0 from every other column keeps
    rank(S) and gives [S[:, 0] | M] with M[i, j−1] = S[i, j] − S[i, 0]. Column 0 and row 0 of M are
    unconstrained, and a free row or column is best set to 0, so the smallest rank(S) is the
    minimum rank of a completion of the (n−1)×(n−1) lower-triangular partial matrix
    D[i, j] = log P[i+1, j+1] − log P[i+1, 0], j <= i (entries above the diagonal unknown).
    (3) For that pattern the minimum is r = Σ_j rank D[j:, :j+1] − Σ_j rank D[j:, :j], exactly, for
    every D (Woerdeman 1987, who proves it for all triangular patterns). Here the proof is short:
    in any completion, column j is outside the span of columns 0..j−1 whenever its known part
    D[j:, j] is outside the span of D[j:, :j], so the rank is at least r; and filling column j's
    unknown part with A_j D[j:, :j]^+ D[j:, j] (A_j = the completed rows 0..j−1 of columns 0..j−1)
    adds a new direction only in that case, so r is attained. (4) For generic P the blocks have
    full rank, so column j adds one iff j + 1 <= n − 1 − j: r = ⌈(n − 1)/2⌉. Special P range from
    r = 0 (each row uniform over its prefix) to r = n − 1 (D diagonal: every query favours itself
    by the same margin; then every column is new).

    Not closed: for such special P the infimum of the error of a smaller head can be 0 without
    being attained — heads far below r fit P as closely as wanted with weights that grow without
    bound (e.g. "attend to self" with margin a: r = n − 1, yet the rank-1 logits a·λ^{i−j} fit it
    to O(λ)). Every P is a limit of generic ones, so ⌈(n − 1)/2⌉ dimensions always suffice in
    that approximate sense; :func:`causal_logit_lower_bounds` certifies when they are also needed.

    Numerics: ranks count singular values above τ = ``rtol`` × the largest singular value of the
    blocks D[j:, :j+1]; the fill uses pseudo-inverses truncated at the same τ, and the filled D is
    cut to rank r by SVD (removing rounding only).

    Reference: H. J. Woerdeman, "The lower order of lower triangular operators and minimal rank
    extensions", Integral Equations and Operator Theory 10 (1987) 859–879.

    Args:
        P: [n, n] causal attention (see :func:`check_causal_attention`).
        rtol: relative rank tolerance; default n · float64 eps (as :func:`min_head_dim`).

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


# ------------------------------------------------------------------------------- Theorem 2
@dataclass
class MultiHeadWeights:
    """Weights of one bias-free multi-head attention layer (paper Section 2 / Section 4).

    Rows are tokens. For an input X ∈ R^{n×d} the layer computes

        out(X) = Σ_i softmax(X W_q[i] (X W_k[i])^T / √d_p) X W_v[i] W_o[i]   ∈ R^{n×d},

    which is the paper's W_o · Concat_i(W_v^i X · Softmax[(W_k^i X)^T (W_q^i X)/√d_p]) transposed,
    with the paper's W_o ∈ R^{d×h·d_p} split into per-head blocks W_o[i] ∈ R^{d_p×d} (transposed).
    A standard layer has d_p = d/h; a fixed-head layer any d_p. No biases, residual or LayerNorm:
    Theorem 2 is about the attention map itself.

    Attributes:
        W_q, W_k, W_v: [h, d, d_p] float64 tensors. W_o: [h, d_p, d].
    """

    W_q: torch.Tensor
    W_k: torch.Tensor
    W_v: torch.Tensor
    W_o: torch.Tensor

    @property
    def num_attention_heads(self) -> int:
        return self.W_q.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.W_q.shape[1]

    @property
    def head_dim(self) -> int:
        return self.W_q.shape[2]

    def flat(self) -> torch.Tensor:
        return torch.cat([w.reshape(-1) for w in (self.W_q, self.W_k, self.W_v, self.W_o)])

    @staticmethod
    def from_flat(z: torch.Tensor, num_attention_heads: int, hidden_size: int, head_dim: int) -> MultiHeadWeights:
        h, d, e = num_attention_heads, hidden_size, head_dim
        m = h * d * e
        return MultiHeadWeights(
            z[:m].view(h, d, e), z[m : 2 * m].view(h, d, e), z[2 * m : 3 * m].view(h, d, e), z[3 * m :].view(h, e, d)
        )


def multihead(X: torch.Tensor, w: MultiHeadWeights) -> torch.Tensor:
    """Apply the layer of :class:`MultiHeadWeights` to a batch of sequences.

    Args:
        X: [batch, n, d] (rows are tokens). w: the layer's weights.

    Returns:
        [batch, n, d], Σ_i softmax(X W_q[i] (X W_k[i])^T / √d_p) X W_v[i] W_o[i].

    Raises:
        ValueError: X not [batch, n, w.hidden_size].
    """
    if X.dim() != 3 or X.shape[-1] != w.hidden_size:
        raise ValueError(f"X must be [batch, n, {w.hidden_size}], got {tuple(X.shape)}")
    q = torch.einsum("bnd,hde->bhne", X, w.W_q)
    k = torch.einsum("bnd,hde->bhne", X, w.W_k)
    v = torch.einsum("bnd,hde->bhne", X, w.W_v)
    att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(w.head_dim), dim=-1)  # [b, h, query, key]
    return torch.einsum("bhne,hed->bnd", att @ v, w.W_o)


def embed_standard(w: MultiHeadWeights, head_dim: int) -> MultiHeadWeights:
    """Theorem 2, first part: a layer with head size d_p' is a fixed-head layer for any d_p >= d_p'.

    Pads every head with zero columns up to ``head_dim`` and rescales W_q by √(head_dim/d_p')
    so the logits, which are divided by √head_dim instead of √d_p', are unchanged. The result
    computes exactly the same function (up to float rounding).

    Args:
        w: a layer (typically standard, d_p' = d/h). head_dim: target head size >= w.head_dim.

    Returns:
        MultiHeadWeights with the same h and d and head size ``head_dim``.

    Raises:
        ValueError: head_dim < w.head_dim.
    """
    head_dim = _check_int("head_dim", head_dim)
    if head_dim < w.head_dim:
        raise ValueError(f"head_dim={head_dim} is smaller than the layer's head size {w.head_dim}")
    pad = head_dim - w.head_dim

    def cols(t):
        return torch.nn.functional.pad(t, (0, pad))

    return MultiHeadWeights(
        cols(w.W_q) * math.sqrt(head_dim / w.head_dim),
        cols(w.W_k),
        cols(w.W_v),
        torch.nn.functional.pad(w.W_o, (0, 0, 0, pad)),
    )


def _random_layer(num_attention_heads: int, hidden_size: int, head_dim: int, gen: torch.Generator) -> MultiHeadWeights:
    h, d, e = num_attention_heads, hidden_size, head_dim
    r = lambda *shape, fan: torch.randn(*shape, generator=gen, dtype=torch.float64) / math.sqrt(fan)  # noqa: E731
    return MultiHeadWeights(r(h, d, e, fan=d), r(h, d, e, fan=d), r(h, d, e, fan=d), r(h, e, d, fan=h * e))


def theorem2_witness(
    hidden_size: int = 4, num_attention_heads: int = 4, head_dim: int = 2, *, logit_scale: float = 2.0, seed: int = 0
) -> MultiHeadWeights:
    """The paper's Theorem 2 witness: a fixed-head layer no standard multi-head layer equals.

    All h heads share one rank-d_p bilinear form U = W_q[i] W_k[i]^T ∈ R^{d×d} (the paper's
    (V_k^i)^T V_q^i, transposed): W_q[i] = Q R_i and W_k[i] = K R_i^{-T} with one random
    Q, K ∈ R^{d×d_p} and a different random invertible R_i per head, so the heads' weights differ
    but their attention is identical. The combined value/output map
    M = Σ_i W_v[i] W_o[i] (the paper's V_o·[V_v^1; …; V_v^h]) is random and checked to have full
    rank d. Hence out(X) = softmax(X U X^T/√d_p) X M. U is scaled so that for X with N(0, 1)
    entries the logits have standard deviation ``logit_scale`` (E[(x^T U y)²] = ||U||_F²).

    Theorem 2 needs n >= 2, d >= d_p and h > d/d_p (i.e. h·d_p > d, so the standard head size
    d/h is smaller than d_p).

    Args:
        hidden_size: d. num_attention_heads: h. head_dim: d_p. logit_scale: > 0. seed: torch seed.

    Returns:
        MultiHeadWeights with W_q, W_k, W_v [h, d, d_p] and W_o [h, d_p, d].

    Raises:
        ValueError: sizes not positive ints, d < d_p, or h·d_p <= d (then the theorem does not
            apply: a standard layer has heads at least as large); logit_scale <= 0.
    """
    d = _check_int("hidden_size", hidden_size)
    h = _check_int("num_attention_heads", num_attention_heads)
    e = _check_int("head_dim", head_dim)
    if d < e:
        raise ValueError(f"Theorem 2 needs hidden_size >= head_dim, got hidden_size={d}, head_dim={e}")
    if h * e <= d:
        raise ValueError(
            f"Theorem 2 needs num_attention_heads > hidden_size/head_dim, got num_attention_heads={h}, "
            f"hidden_size={d}, head_dim={e} (h·d_p = {h * e} <= d = {d}: standard heads of size d/h >= d_p)"
        )
    if isinstance(logit_scale, bool) or not (isinstance(logit_scale, numbers.Real) and 0 < logit_scale < math.inf):
        raise ValueError(f"logit_scale must be a positive finite number, got {logit_scale!r}")
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    Q, K = randn(d, e), randn(d, e)
    U = Q @ K.T
    Q = Q * (logit_scale * math.sqrt(e) / torch.linalg.norm(U))
    W_q, W_k = [], []
    for _ in range(h):
        R = randn(e, e) + 2.0 * torch.eye(e, dtype=torch.float64)  # well-conditioned, invertible a.s.
        W_q.append(Q @ R)
        W_k.append(K @ torch.linalg.inv(R).T)
    W_v = randn(h, d, e) / math.sqrt(d)
    W_o = randn(h, e, d) / math.sqrt(h * e)
    w = MultiHeadWeights(torch.stack(W_q), torch.stack(W_k), W_v, W_o)
    M = torch.einsum("hde,hef->df", W_v, W_o)
    if torch.linalg.matrix_rank(M) < d:  # probability 0; say so rather than return a non-witness
        raise ValueError(f"seed={seed} drew a rank-deficient value/output map; use another seed")
    return w


def _relative_error(Y_hat: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    return ((Y_hat - Y) ** 2).sum() / (Y**2).sum()


@_one_thread
def fit_multihead(
    X: torch.Tensor,
    Y: torch.Tensor,
    num_attention_heads: int,
    head_dim: int,
    *,
    restarts: int = 8,
    seed: int = 0,
    max_iter: int = 1000,
    tol_change: float = 1e-14,
    init: MultiHeadWeights | None = None,
):
    """Fit a bias-free multi-head layer (h heads of size d_p) to input/output pairs.

    Minimises the relative squared error Σ_b ||out(X_b) − Y_b||_F² / Σ_b ||Y_b||_F² with
    ``torch.optim.LBFGS`` (float64) from ``restarts`` random initialisations (plus ``init`` if
    given) and keeps the best. Used for Theorem 2 (paper Section 4).

    Args:
        X: [batch, n, d] inputs. Y: [batch, n, d] targets.
        num_attention_heads: h. head_dim: d_p (d/h for a standard layer).
        restarts: random starts (>= 0; >= 1 if no ``init``). seed: torch seed of the starts.
        max_iter: L-BFGS iterations per start. init: an extra starting layer.

    Returns:
        (best MultiHeadWeights, its relative error, list of every start's relative error).

    Raises:
        ValueError: X and Y shapes differ or are not [batch, n, d]; no start at all.
    """
    if X.dim() != 3 or X.shape != Y.shape:
        raise ValueError(f"X and Y must both be [batch, n, d], got {tuple(X.shape)} and {tuple(Y.shape)}")
    h, e = _check_int("num_attention_heads", num_attention_heads), _check_int("head_dim", head_dim)
    restarts = _check_int("restarts", restarts, minimum=0)
    if restarts == 0 and init is None:
        raise ValueError("need restarts >= 1 or an init")
    d = X.shape[-1]
    gen = torch.Generator().manual_seed(seed)
    starts = ([init.flat()] if init is not None else []) + [_random_layer(h, d, e, gen).flat() for _ in range(restarts)]
    errors, best = [], None
    for z0 in starts:
        z = z0.clone().requires_grad_(True)
        opt = torch.optim.LBFGS(
            [z],
            lr=1.0,
            max_iter=max_iter,
            max_eval=2 * max_iter,
            tolerance_grad=1e-14,
            tolerance_change=tol_change,
            history_size=20,
            line_search_fn="strong_wolfe",
        )

        def closure(opt=opt, z=z):  # this start's optimiser and weights (LBFGS calls closure() bare)
            opt.zero_grad()
            loss = _relative_error(multihead(X, MultiHeadWeights.from_flat(z, h, d, e)), Y)
            loss.backward()
            return loss

        opt.step(closure)
        with torch.no_grad():
            err = float(_relative_error(multihead(X, MultiHeadWeights.from_flat(z, h, d, e)), Y))
        errors.append(err if math.isfinite(err) else math.inf)
        if best is None or errors[-1] < best[1]:
            best = (z.detach().clone(), errors[-1])
    return MultiHeadWeights.from_flat(best[0], h, d, e), best[1], errors


@dataclass
class Theorem2Result:
    """Numbers of :func:`theorem2_demo` (relative squared errors Σ||out − target||² / Σ||target||²).

    Attributes:
        hidden_size, num_attention_heads, head_dim, seq_len, num_inputs: the sizes (d, h, d_p, n, inputs).
        standard_errors: training error reached from each random start by a standard layer
            (h heads of size d/h), sorted ascending.
        standard_error: the best of them; standard_test_error: that layer on held-out inputs.
        fixed_exact_error: the witness's own weights (a fixed-head layer of this shape) on the
            held-out inputs: 0 up to rounding, by construction.
        fixed_fit_error, fixed_fit_test_error: a fixed-head layer (h heads of size d_p) fitted by
            the same optimiser from a perturbed witness (every weight + 10 % noise).
    """

    hidden_size: int
    num_attention_heads: int
    head_dim: int
    seq_len: int
    num_inputs: int
    standard_errors: list[float]
    standard_error: float
    standard_test_error: float
    fixed_exact_error: float
    fixed_fit_error: float
    fixed_fit_test_error: float


@_one_thread
def theorem2_demo(
    hidden_size: int = 4,
    num_attention_heads: int = 4,
    head_dim: int = 2,
    seq_len: int = 4,
    *,
    num_inputs: int = 64,
    logit_scale: float = 2.0,
    restarts: int = 4,
    max_iter: int = 300,
    fixed_max_iter: int = 1000,
    seed: int = 0,
) -> Theorem2Result:
    """Theorem 2 numerically: the witness is fitted exactly by a fixed-head layer, not by a standard one.

    Builds :func:`theorem2_witness` (d = ``hidden_size``, h = ``num_attention_heads``, d_p = ``head_dim``),
    draws ``num_inputs`` training and as many held-out sequences X ∈ R^{n×d} with N(0, 1) entries,
    and fits (a) a standard layer, h heads of size d/h, from ``restarts`` random starts — its
    best relative error stays clearly above 0 (e.g. ≈ 0.05 train / 0.08 held-out with the
    defaults, where d/h = 1 < d_p = 2); and (b) a fixed-head layer, h heads of size d_p, which
    contains the witness: its exact error is 0 by construction, and the same optimiser started
    from a perturbed witness converges back to ≲ 1e-8. Default sizes d = h = 4, d_p = 2, n = 4:
    the smallest with h > d/d_p and a standard head size (1) below d_p, small enough to fit in
    seconds; 64 sequences × 4 tokens × 4 outputs = 1024 targets against 64 standard-layer
    parameters, so a small error cannot come from interpolation.

    Args:
        hidden_size, num_attention_heads, head_dim, seq_len: d, h, d_p, n (needs h·d_p > d, d % h == 0,
            n >= 2). num_inputs: training (and held-out) sequences. logit_scale: see
            :func:`theorem2_witness`. restarts, max_iter: standard-layer fits.
            fixed_max_iter: iterations of the fixed-head fit. seed: seeds everything.

    Returns:
        :class:`Theorem2Result`.

    Raises:
        ValueError: sizes violating the theorem's hypotheses (see :func:`theorem2_witness`),
            hidden_size not divisible by num_attention_heads, seq_len < 2.
    """
    w = theorem2_witness(hidden_size, num_attention_heads, head_dim, logit_scale=logit_scale, seed=seed)
    seq_len = _check_int("seq_len", seq_len, minimum=2)
    num_inputs = _check_int("num_inputs", num_inputs)
    if hidden_size % num_attention_heads:
        raise ValueError(
            f"a standard layer needs hidden_size % num_attention_heads == 0, "
            f"got {hidden_size} and {num_attention_heads}"
        )
    gen = torch.Generator().manual_seed(seed + 1)
    X = torch.randn(num_inputs, seq_len, hidden_size, generator=gen, dtype=torch.float64)
    X_test = torch.randn(num_inputs, seq_len, hidden_size, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        Y, Y_test = multihead(X, w), multihead(X_test, w)
    std, std_err, std_errs = fit_multihead(
        X, Y, num_attention_heads, hidden_size // num_attention_heads, restarts=restarts, seed=seed, max_iter=max_iter
    )
    z = w.flat()
    noisy = z + 0.1 * z.abs() * torch.randn(z.shape, generator=gen, dtype=torch.float64)
    init = MultiHeadWeights.from_flat(noisy, num_attention_heads, hidden_size, head_dim)
    fixed, fixed_err, _ = fit_multihead(
        X, Y, num_attention_heads, head_dim, restarts=0, init=init, max_iter=fixed_max_iter, tol_change=0.0
    )
    with torch.no_grad():
        return Theorem2Result(
            hidden_size,
            num_attention_heads,
            head_dim,
            seq_len,
            num_inputs,
            sorted(std_errs),
            std_err,
            float(_relative_error(multihead(X_test, std), Y_test)),
            float(_relative_error(multihead(X_test, w), Y_test)),
            fixed_err,
            float(_relative_error(multihead(X_test, fixed), Y_test)),
        )
