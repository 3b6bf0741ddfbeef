"""What every theorem module shares: checks of attention matrices and sizes, numerical rank, one thread."""

from __future__ import annotations

import contextlib
import numbers

import numpy as np
import torch

#: default tolerance on |row sum − 1| of an attention matrix
ROW_SUM_TOL = 1e-8


def _check_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return int(value)


def _as_matrix(name: str, a, square: bool = False) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} has non-finite entries (nan or inf)")
    if square and (a.shape[0] != a.shape[1] or a.shape[0] == 0):
        raise ValueError(f"{name} must be a non-empty square [n, n] matrix, got shape {a.shape}")
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
    """Validate an attention matrix P [n, n] and return it as float64 (not renormalised).

    Rows are queries (the transpose of the paper's column-stochastic P): entries > 0 (Theorem 1 takes log P),
    each row summing to 1 within ``row_sum_tol``. Raises ValueError naming the first bad entry or row.
    """
    P = _as_matrix("P", P, square=True)
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


@contextlib.contextmanager
def _single_thread():
    """Run the dense maths on one BLAS/torch thread: on a busy 2-core machine spinning OpenBLAS threads made
    a 1024×1024 SVD take 11–20 s instead of 1.6 s. A context manager or decorator."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        from threadpoolctl import threadpool_limits

        blas = threadpool_limits(1)
    except ImportError:  # optional: only a speed matter
        blas = None
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if blas is not None:
            blas.restore_original_limits()


def _one_thread(fn):
    return _single_thread()(fn)


def _numerical_rank(s: np.ndarray, shape: tuple[int, int], rtol: float | None) -> int:
    if s.size == 0 or s[0] == 0.0:
        return 0
    if rtol is None:
        rtol = max(shape) * np.finfo(np.float64).eps
    return int(np.sum(s > rtol * s[0]))


def numerical_rank(matrix, rtol: float | None = None) -> int:
    """Number of singular values of a 2-D ``matrix`` above ``rtol · σ_max`` (float64; default
    max(shape) · eps, NumPy's ``matrix_rank`` rule)."""
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"numerical_rank needs a 2-D matrix, got shape {m.shape}")
    return _numerical_rank(np.linalg.svd(m, compute_uv=False), m.shape, rtol)
