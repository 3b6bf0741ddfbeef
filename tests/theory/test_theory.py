"""Tests of fixedhead.theory: Theorem 1 (exact representation and the sharp n − 1 threshold), the
best small head in logit and probability space, the paper's counterexample, Theorem 2, and the
``fixedhead bottleneck`` command. Rows are tokens/queries (the transpose of the paper's columns)."""

from __future__ import annotations

import csv
import itertools
import json
import math

import numpy as np
import pytest
import torch

from fixedhead import theory as th
from fixedhead.cli import main
from fixedhead.studies import bottleneck
from fixedhead.theory.theorem2 import random_layer


def softmax_rows(L):
    L = L - L.max(axis=1, keepdims=True)
    E = np.exp(L)
    return E / E.sum(axis=1, keepdims=True)


def low_rank_logits(n, r, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, r)) @ rng.standard_normal((r, n))


# ------------------------------------------------------------------------- item 1: represent
@pytest.mark.parametrize("n,extra", [(2, 0), (7, 3), (64, 0), (64, 10), (256, 5)])
def test_represent_reconstructs_random_P(n, extra):
    rng = np.random.default_rng(n + extra)
    X = rng.standard_normal((n, n + extra))
    P = th.random_attention(n, temperature=0.7, seed=n)
    W_q, W_k = th.represent(X, P)
    assert W_q.shape == W_k.shape == (n + extra, n - 1)  # head_dim=None -> min_head_dim = n - 1
    err = np.abs(th.head_attention(X, W_q, W_k) - P).max()
    assert err <= 1e-8


def test_represent_with_paper_head_dim_n_and_larger():
    n = 12
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 20))
    P = th.random_attention(n, seed=3)
    for k in (n, n + 5):  # the paper's sufficient d_p >= n, and beyond (zero-padded columns)
        W_q, W_k = th.represent(X, P, head_dim=k)
        assert W_q.shape == (20, k)
        assert np.abs(th.head_attention(X, W_q, W_k) - P).max() <= 1e-8


def test_represent_accepts_torch_and_row_sums_within_tolerance():
    n = 5
    P = th.random_attention(n, seed=1)
    P_off = P.copy()
    P_off[0] *= 1 + 1e-10  # row sum off by 1e-10 < ROW_SUM_TOL
    W_q, W_k = th.represent(torch.eye(n, dtype=torch.float64), torch.from_numpy(P_off))
    assert np.abs(th.head_attention(np.eye(n), W_q, W_k) - P).max() <= 1e-8


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda P, X: (np.where(np.eye(len(P), k=1) > 0, 0.0, P), X), r"entrywise positive.*P\[0, 1\] = 0\.0"),
        (lambda P, X: (P - 2 * P[0, 0] * np.eye(len(P)), X), r"entrywise positive.*P\[0, 0\] = -"),
        (lambda P, X: (P * 1.01, X), r"row 0 summing to 1\.01"),
        (lambda P, X: (P, np.vstack([X[:-1], X[:1]])), r"rank n = 6.*got rank 5"),
        (lambda P, X: (P, X[:, :4]), r"rank n = 6.*got rank 4.*\(6, 4\)"),
        (lambda P, X: (P[:5, :5] / P[:5, :5].sum(1, keepdims=True), X), r"n = X.shape\[0\] = 6"),
        (lambda P, X: (P[:, :5], X), r"square"),
        (lambda P, X: (np.full_like(P, np.nan), X), r"non-finite"),
    ],
)
def test_represent_rejects_bad_input(mutate, match):
    n = 6
    rng = np.random.default_rng(0)
    P, X = mutate(th.random_attention(n, seed=0), rng.standard_normal((n, 8)))
    with pytest.raises(ValueError, match=match):
        th.represent(X, P)


def test_random_attention_validates_temperature():
    P = th.random_attention(5, temperature=0.05, seed=0)
    assert np.all(P > 0) and np.allclose(P.sum(1), 1)
    for bad in (0.0, -1.0, math.inf, True):
        with pytest.raises(ValueError, match="temperature"):
            th.random_attention(5, temperature=bad)
    with pytest.raises(ValueError, match="temperature=0.0001 is so low"):
        th.random_attention(50, temperature=1e-4)


def test_represent_rejects_bad_head_dim():
    n = 6
    P = th.random_attention(n, seed=0)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="head_dim"):
            th.represent(np.eye(n), P, head_dim=bad)


@pytest.mark.slow
def test_represent_n1024_is_exact_and_fast():
    import time

    n = 1024
    X = np.random.default_rng(0).standard_normal((n, n))
    P = th.random_attention(n, seed=0)
    t = time.perf_counter()
    W_q, W_k = th.represent(X, P)
    elapsed = time.perf_counter() - t
    assert W_q.shape == (n, n - 1)
    assert np.abs(th.head_attention(X, W_q, W_k) - P).max() <= 1e-8
    assert elapsed < 20  # ~1.5 s idle, ~4 s with the 2 cores oversubscribed 4x


# ----------------------------------------------------------------------- item 2: min_head_dim
@pytest.mark.parametrize("n", [2, 3, 10, 40])
def test_min_head_dim_of_random_positive_P_is_n_minus_1(n):
    for seed in range(3):
        assert th.min_head_dim(th.random_attention(n, temperature=1.5, seed=seed)) == n - 1


@pytest.mark.parametrize("n,r", [(12, 1), (20, 4), (32, 7)])
def test_min_head_dim_of_softmax_of_rank_r_logits_is_r(n, r):
    L = low_rank_logits(n, r, seed=r)
    assert np.linalg.matrix_rank(L) == r
    assert th.min_head_dim(softmax_rows(L)) == r
    # a per-query shift c 1^T raises rank(L) to r + 1 but not the threshold (softmax ignores it)
    shifted = L + np.random.default_rng(100).standard_normal((n, 1)) * np.ones((1, n))
    assert np.linalg.matrix_rank(shifted) == r + 1
    assert th.min_head_dim(softmax_rows(shifted)) == r


def test_min_head_dim_drops_when_all_ones_is_in_the_row_space():
    # L = A B^T with B's last column all ones: L's row space contains 1, so the centred matrix
    # L (I - 11^T/n) has rank r - 1 (the non-generic case the docstring warns about)
    n, r = 16, 5
    rng = np.random.default_rng(0)
    B = np.hstack([rng.standard_normal((n, r - 1)), np.ones((n, 1))])
    L = rng.standard_normal((n, r)) @ B.T
    assert np.linalg.matrix_rank(L) == r
    assert th.min_head_dim(softmax_rows(L)) == r - 1


def test_min_head_dim_uniform_P_is_1():
    assert th.min_head_dim(np.full((5, 5), 0.2)) == 1


@pytest.mark.parametrize("n,r", [(10, 3), (24, 9), (9, 8)])
def test_represent_succeeds_at_min_head_dim_and_fails_one_below(n, r):
    P = softmax_rows(low_rank_logits(n, r, seed=n)) if r < n - 1 else th.random_attention(n, seed=2)
    k = th.min_head_dim(P)
    assert k == r
    X = np.random.default_rng(n).standard_normal((n, n + 2))
    W_q, W_k = th.represent(X, P, head_dim=k)
    assert W_q.shape == (n + 2, k)
    assert np.abs(th.head_attention(X, W_q, W_k) - P).max() <= 1e-8
    with pytest.raises(ValueError, match=rf"head_dim={k - 1} is too small.*rank {k}"):
        th.represent(X, P, head_dim=k - 1)


# ----------------------------------------------------------------- item 3: best small head
@pytest.mark.parametrize("n,r", [(16, None), (24, 6)])
def test_logit_error_zero_from_threshold_and_strictly_decreasing_below(n, r):
    P = th.random_attention(n, seed=5) if r is None else softmax_rows(low_rank_logits(n, r, seed=1))
    k_min = th.min_head_dim(P)
    e = th.logit_errors(P)
    assert e.shape == (n + 1,)
    assert np.all(e[k_min:] <= 1e-9)
    assert np.all(np.diff(e[: k_min + 1]) < 0)  # e_0 > e_1 > ... > e_{k_min}
    assert e[k_min - 1] > 1e-3
    for k in (1, k_min - 1, k_min, n):
        L, err = th.best_logits(P, k)
        assert np.linalg.matrix_rank(L) <= k
        assert err == pytest.approx(e[k], abs=1e-9)
        assert np.allclose(softmax_rows(L), P, atol=1e-9) == (k >= k_min)


def test_logit_error_is_the_minimum_over_rank_k_logits_and_row_shifts():
    # e_k <= distance (modulo row shifts) from log P of any other rank-k matrix
    n, k = 10, 4
    P = th.random_attention(n, seed=7)
    logP = np.log(P)
    e_k = th.logit_errors(P)[k]
    L_best, _ = th.best_logits(P, k)
    U, s, Vt = np.linalg.svd(L_best)
    A, B = U[:, :k] * s[:k], Vt[:k].T  # L_best = A B^T
    J = np.eye(n) - np.ones((n, n)) / n

    def dist_mod_shift(L):  # min_c ||L - logP - c 1^T||_F: the best c is the row mean
        return np.linalg.norm((L - logP) @ J)

    assert dist_mod_shift(L_best) == pytest.approx(e_k, rel=1e-12)
    rng = np.random.default_rng(0)
    for _ in range(50):
        scale = rng.choice([1e-3, 0.1, 3.0])
        L = (A + scale * rng.standard_normal((n, k))) @ (B + scale * rng.standard_normal((n, k))).T
        assert np.linalg.matrix_rank(L) <= k
        assert dist_mod_shift(L) >= e_k - 1e-12


def test_fit_head_improves_on_svd_and_is_exact_from_the_threshold():
    n = 8
    P = th.random_attention(n, seed=11)
    X = np.random.default_rng(0).standard_normal((n, 9))  # any rank-n input
    kls = []
    for k in range(1, n + 1):
        fit = th.fit_head(X, P, k, max_iter=300)
        assert fit.W_q.shape == (9, k)
        assert fit.kl == pytest.approx(th.mean_row_kl(P, fit.attention), abs=1e-14)
        assert np.allclose(fit.attention.sum(1), 1.0)
        assert fit.kl <= fit.kl_svd_init + 1e-15
        kls.append(fit.kl)
        if k < n - 1:
            assert fit.kl > 1e-6 and fit.max_abs_error > 1e-4
            assert fit.kl < 0.9 * fit.kl_svd_init  # the KL optimum is not the logit optimum
        else:
            assert abs(fit.kl) <= 1e-12 and fit.max_abs_error <= 1e-8
    assert all(b <= a + 1e-9 for a, b in itertools.pairwise(kls))  # more head dims never hurt


def test_fit_head_does_not_depend_on_which_rank_n_input():
    n, k = 6, 3
    P = th.random_attention(n, seed=4)
    a = th.fit_head(np.eye(n), P, k).kl
    b = th.fit_head(np.random.default_rng(1).standard_normal((n, 11)), P, k).kl
    assert a == pytest.approx(b, rel=1e-5)


# -------------------------------------------------------------- item 4: paper's counterexample
def test_paper_counterexample_d1_n2():
    # paper: X = [1, 0] (d = 1, n = 2), P = [[0.5, 0.75], [0.5, 0.25]] column-stochastic;
    # rows-are-queries here, so X = [[1], [0]] and P is its transpose
    X = np.array([[1.0], [0.0]])
    P = np.array([[0.5, 0.5], [0.75, 0.25]])
    # the second token's logits are 0 whatever the weights: its attention is always uniform
    bound = 0.5 * (0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5))  # mean over 2 rows
    assert bound > 0.06
    rng = np.random.default_rng(0)
    for _ in range(200):
        W_q, W_k = rng.standard_normal((2, 1, 1)) * rng.uniform(0.1, 5)
        A = th.head_attention(X, W_q, W_k)
        assert np.allclose(A[1], [0.5, 0.5], atol=0)
        assert th.mean_row_kl(P, A) >= bound - 1e-15
    fit = th.fit_head(X, P, head_dim=1, restarts=5, seed=0)
    assert min(fit.restart_kls) >= bound - 1e-12  # every fit keeps a positive error
    assert fit.kl == pytest.approx(bound, abs=1e-9)  # and the first row is fitted exactly
    assert np.allclose(fit.attention, [[0.5, 0.5], [0.5, 0.5]], atol=1e-6)
    with pytest.raises(ValueError, match="rank n = 2"):
        th.represent(X, P, head_dim=1)
    # a first row that needs non-zero weights: still exact there, still stuck on the second
    P2 = np.array([[0.9, 0.1], [0.75, 0.25]])
    fit2 = th.fit_head(X, P2, head_dim=1, restarts=3, seed=1)
    assert fit2.kl == pytest.approx(bound, abs=1e-9)
    assert np.allclose(fit2.attention[0], [0.9, 0.1], atol=1e-6)


# ---------------------------------------------------------------------------- item 5: Theorem 2
def test_theorem2_witness_shares_one_rank_dp_form_and_full_rank_values():
    d, h, e = 4, 4, 2
    w = th.theorem2_witness(d, h, e, seed=3)
    assert w.W_q.shape == (h, d, e) and w.W_o.shape == (h, e, d)
    U = w.W_q @ w.W_k.transpose(1, 2)  # [h, d, d]
    assert torch.allclose(U, U[:1].expand_as(U), atol=1e-12)
    assert torch.linalg.matrix_rank(U[0]) == e
    assert not torch.allclose(w.W_q[0], w.W_q[1])  # the heads' weights differ, only U is shared
    assert torch.linalg.matrix_rank(torch.einsum("hde,hef->df", w.W_v, w.W_o)) == d
    with pytest.raises(ValueError, match=r"num_attention_heads > hidden_size/head_dim.*h·d_p = 4 <= d = 4"):
        th.theorem2_witness(4, 2, 2)
    with pytest.raises(ValueError, match="hidden_size >= head_dim"):
        th.theorem2_witness(2, 4, 3)


def test_theorem2_first_part_standard_layer_is_a_fixed_head_layer():
    d, h = 6, 3
    gen = torch.Generator().manual_seed(0)
    std = random_layer(h, d, d // h, gen)
    X = torch.randn(5, 4, d, generator=gen, dtype=torch.float64)
    for e in (d // h, 3, 7):
        fixed = th.embed_standard(std, e)
        assert fixed.head_dim == e
        assert torch.allclose(th.multihead(X, fixed), th.multihead(X, std), atol=1e-12, rtol=0)


def test_theorem2_standard_layer_cannot_fit_the_witness_fixed_head_layer_can():
    # d = 4, h = 4, d_p = 2 (standard head size d/h = 1 < d_p), n = 4 tokens, 64 sequences,
    # 4 random restarts of the standard fit. Achieved (seed 0): standard ≈ 0.050 train / 0.083
    # held-out relative squared error, every restart >= 0.049; fixed-head 0 exactly (the witness)
    # and ≈ 4e-11 when refitted from a perturbed witness.
    r = th.theorem2_demo(hidden_size=4, num_attention_heads=4, head_dim=2, seq_len=4, num_inputs=64, restarts=4, seed=0)
    assert (r.hidden_size, r.num_attention_heads, r.head_dim, r.seq_len) == (4, 4, 2, 4)
    assert len(r.standard_errors) == 4
    assert min(r.standard_errors) == r.standard_error > 0.02
    assert r.standard_test_error > 0.02
    assert r.fixed_exact_error <= 1e-25
    assert r.fixed_fit_error < 1e-8 and r.fixed_fit_test_error < 1e-8
    assert r.standard_error > 1e5 * r.fixed_fit_error


@pytest.mark.slow
def test_theorem2_optimiser_controls():
    # the standard fit's error is not an optimiser artefact: the same optimiser fits a random
    # standard-layer target to ~0, and fits the witness with a fixed-head layer from random starts
    d, h, e, n = 4, 4, 2, 4
    gen = torch.Generator().manual_seed(5)
    X = torch.randn(64, n, d, generator=gen, dtype=torch.float64)
    target = random_layer(h, d, d // h, gen)
    target.W_q *= 3
    with torch.no_grad():
        Y = th.multihead(X, target)
    _, err, _ = th.fit_multihead(X, Y, h, d // h, restarts=6, seed=1, max_iter=2000, tol_change=0.0)
    assert err < 1e-8
    w = th.theorem2_witness(d, h, e, seed=0)
    with torch.no_grad():
        Y = th.multihead(X, w)
    _, err, _ = th.fit_multihead(X, Y, h, e, restarts=4, seed=1, max_iter=2000, tol_change=0.0)
    assert err < 1e-8


# ------------------------------------------------------------------- item 6: the CLI command
def test_cli_bottleneck_writes_sane_csv_and_png(tmp_path, capsys):
    out = tmp_path / "bn"
    rc = main(["bottleneck", "--n", "4", "6", "--seeds", "0", "1", "--output-dir", str(out), "--no-progress"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "logit error" in printed and "bottleneck.csv" in printed
    png = (out / "bottleneck.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    record = json.loads((out / "results.json").read_text())  # what was run, with what
    assert record["meta"]["command"] == f"fixedhead bottleneck --n 4 6 --seeds 0 1 --output-dir {out} --no-progress"
    assert record["options"]["n"] == [4, 6] and record["meta"]["torch"] and record["meta"]["transformers"]
    with open(out / "bottleneck.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == bottleneck.SWEEP_COLUMNS
    assert len(rows) == (4 + 6) * 2
    for r in rows:
        n, k = int(r["n"]), int(r["head_dim"])
        le, kl, kl_svd = float(r["logit_error"]), float(r["kl_fit"]), float(r["kl_svd"])
        assert int(r["min_head_dim"]) == n - 1
        assert kl <= kl_svd + 1e-15
        if k >= n - 1:
            assert le <= 1e-9 and abs(kl) <= 1e-12
        else:
            assert le > 1e-3 and kl > 1e-8
    # the CSV's KL is fit_head's
    P = th.random_attention(6, 1.0, seed=1)
    row = next(r for r in rows if r["n"] == "6" and r["seed"] == "1" and r["head_dim"] == "2")
    assert float(row["kl_fit"]) == pytest.approx(th.fit_head(np.eye(6), P, 2, max_iter=100).kl, rel=1e-9)


def test_cli_bottleneck_rejects_bad_n(tmp_path, capsys):
    rc = main(["bottleneck", "--n", "1", "--output-dir", str(tmp_path), "--no-progress"])
    assert rc == 2
    assert "n must be an int >= 2, got 1" in capsys.readouterr().err


def test_bottleneck_options_are_one_plan_in_any_order_and_refuse_a_repeat():
    from fixedhead.studies.bottleneck import BottleneckOptions

    assert BottleneckOptions(n=(8, 4), seeds=(2, 0)) == BottleneckOptions(n=(4, 8), seeds=(0, 2))
    for bad, message in [(dict(seeds=(1, 1)), "seeds must be distinct"), (dict(n=(4, 4)), "n must be distinct")]:
        with pytest.raises(ValueError, match=message):
            BottleneckOptions(**bad)


# ------------------------------------------------- item 7: causal attention (beyond the paper)
def causal_softmax_rows(L):
    return softmax_rows(np.where(np.tri(len(L), dtype=bool), L, -np.inf))


def causal_cases(n, seed=0):
    """Causal P of known threshold: (name, P, min_head_dim(P, causal=True)); m = n − 1."""
    rng = np.random.default_rng(seed)
    i = np.arange(n)
    half = math.ceil((n - 1) / 2)
    yield "random", th.random_attention(n, seed=seed, causal=True), max(1, half)
    yield "peaked T=0.1", th.random_attention(n, temperature=0.1, seed=seed, causal=True), max(1, half)
    yield "uniform over the prefix", causal_softmax_rows(np.zeros((n, n))), 1  # rank 0
    yield "key-only logits", causal_softmax_rows(np.ones((n, 1)) @ rng.standard_normal((1, n))), 1
    yield "ALiBi-like -(i - j)/2", causal_softmax_rows(-0.5 * (i[:, None] - i[None, :])), 1
    yield "sink on token 0", causal_softmax_rows(np.hstack([3 * np.ones((n, 1)), np.zeros((n, n - 1))])), 1
    for r in (1, 2, 3):
        yield f"rank-{r} logits", causal_softmax_rows(low_rank_logits(n, r, seed + r)), min(r, max(1, half))
    G = rng.standard_normal((n, n))
    G[n // 2 :] = G[n // 2]  # the second half of the queries share one logit row
    yield "repeated query rows", causal_softmax_rows(G), None  # threshold checked by the search only
    yield "attend to self (+3)", causal_softmax_rows(3.0 * np.eye(n)), max(1, n - 1)
    yield "previous token (+4)", causal_softmax_rows(4.0 * np.eye(n, k=-1)), max(1, n - 2)


def brute_force_causal_error(P, k, restarts=8, seed=0, max_nfev=400):
    """Smallest causal logit error of rank-k logits A B^T (+ a shift c per query) that a search from
    random starts finds: e = min ||(A B^T)_ij + c_i − log P_ij||_2 over the seen entries j <= i, by
    SciPy's trust-region least squares on (A, B, c). Independent of fixedhead.theory."""
    from scipy.optimize import least_squares

    n = len(P)
    ii, jj = np.tril_indices(n)
    target = np.log(P[ii, jj])
    rows = np.arange(ii.size)

    def split(z):
        return z[: n * k].reshape(n, k), z[n * k : 2 * n * k].reshape(n, k), z[2 * n * k :]

    def residual(z):
        A, B, c = split(z)
        return np.einsum("pk,pk->p", A[ii], B[jj]) + c[ii] - target

    def jacobian(z):
        A, B, _ = split(z)
        J = np.zeros((ii.size, 2 * n * k + n))
        for q in range(k):
            J[rows, ii * k + q] = B[jj, q]
            J[rows, n * k + jj * k + q] = A[ii, q]
        J[rows, 2 * n * k + ii] = 1.0
        return J

    rng = np.random.default_rng(seed)
    best = math.inf
    for _ in range(restarts):
        fit = least_squares(
            residual,
            rng.standard_normal(2 * n * k + n),
            jac=jacobian,
            method="trf",
            xtol=1e-15,
            ftol=1e-15,
            gtol=1e-15,
            max_nfev=max_nfev,
        )
        best = min(best, float(np.linalg.norm(fit.fun)))
        if best <= 1e-12:  # ~10-25 % of single starts end in a spurious local minimum; stop at a zero
            break
    return best


def test_random_causal_attention_is_the_masked_softmax_of_the_same_logits():
    n = 6
    P, Pb = th.random_attention(n, seed=3, causal=True), th.random_attention(n, seed=3)
    assert np.all(P[~np.tri(n, dtype=bool)] == 0) and np.all(P[np.tri(n, dtype=bool)] > 0)
    assert np.allclose(P.sum(1), 1, atol=1e-15)
    for i in range(n):
        assert np.allclose(P[i, : i + 1], Pb[i, : i + 1] / Pb[i, : i + 1].sum(), atol=1e-15)
    assert np.array_equal(th.check_causal_attention(P), P)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9, 16, 33, 64])
def test_causal_min_head_dim_of_random_P_is_ceil_half_of_n_minus_1(n):
    for seed in range(3):
        for temperature in (1.0, 0.3):
            P = th.random_attention(n, temperature=temperature, seed=seed, causal=True)
            assert th.min_head_dim(P, causal=True) == max(1, math.ceil((n - 1) / 2))
    assert th.min_head_dim(th.random_attention(n, seed=0)) == max(1, n - 1)  # the same logits, unmasked


@pytest.mark.parametrize("n", [2, 3, 8, 17, 64, 128])
def test_causal_represent_is_exact_at_the_threshold(n):
    P = th.random_attention(n, temperature=0.7, seed=n, causal=True)
    r = max(1, math.ceil((n - 1) / 2))
    X = np.random.default_rng(n).standard_normal((n, n + 3))
    W_q, W_k = th.represent(X, P, causal=True)
    assert W_q.shape == W_k.shape == (n + 3, r)
    A = th.head_attention(X, W_q, W_k, causal=True)
    assert np.abs(A - P).max() <= 1e-10
    assert np.all(A[~np.tri(n, dtype=bool)] == 0) and A[0, 0] == 1.0  # row 0 included
    W_q, W_k = th.represent(X, P, head_dim=r + 2, causal=True)
    assert np.abs(th.head_attention(X, W_q, W_k, causal=True) - P).max() <= 1e-10
    if r > 1:
        with pytest.raises(ValueError, match=rf"head_dim={r - 1} is too small.*completion.*{r}.*causal=True"):
            th.represent(X, P, head_dim=r - 1, causal=True)
    # the unmasked head of the same size cannot: its threshold is n - 1
    if n > 2:
        with pytest.raises(ValueError, match="entrywise positive.*pass causal=True"):
            th.represent(X, P)


@pytest.mark.parametrize("n", [4, 5, 8, 9, 16, 17, 32, 33, 64])
def test_causal_head_one_below_the_threshold_cannot_fit(n):
    # certified: Eckart–Young on the fully seen middle block; achieved: the variable-projection fit
    P = th.random_attention(n, seed=0, causal=True)
    r = th.min_head_dim(P, causal=True)
    lower = th.causal_logit_lower_bounds(P)
    assert lower.shape == (n + 1,)
    assert lower[r - 1] > 0.01  # bounded away from zero
    assert np.all(lower[r:] <= 1e-12)
    below, at = th.fit_causal_logits(P, r - 1), th.fit_causal_logits(P, r)
    assert below.lower_bound == lower[r - 1]
    assert below.error >= lower[r - 1] - 1e-12
    assert np.linalg.matrix_rank(below.logits) <= r - 1
    if n % 2 == 0:  # one middle block: the bound is attained one below the threshold
        assert below.error == pytest.approx(lower[r - 1], rel=1e-6)
    else:  # two middle blocks of that rank: within 30 % here
        assert below.error <= 1.3 * lower[r - 1]
    assert at.error <= 1e-10 and np.linalg.matrix_rank(at.logits) == r
    # the certified bound below the threshold, for every k: the fit never beats it
    for k in range(1, r, max(1, r // 4)):
        assert th.fit_causal_logits(P, k, max_iter=50).error >= lower[k] - 1e-12


@pytest.mark.parametrize("n", [6, 24])
def test_causal_min_head_dim_of_structured_P_and_exact_construction(n):
    X = np.random.default_rng(1).standard_normal((n, n))
    for name, P, expected in causal_cases(n, seed=1):
        r = th.min_head_dim(P, causal=True)
        if expected is not None:
            assert r == expected, name
        completion = th.complete_causal_logits(P)
        assert completion.head_dim == r and completion.error <= 1e-10, name
        assert np.linalg.matrix_rank(completion.logits) == (0 if "uniform" in name else r), name
        W_q, W_k = th.represent(X, P, causal=True)
        assert W_q.shape[1] == r, name
        assert np.abs(th.head_attention(X, W_q, W_k, causal=True) - P).max() <= 1e-10, name


def test_causal_min_head_dim_ignores_a_per_query_shift_and_a_constant_key_direction():
    n, r = 30, 4
    L = low_rank_logits(n, r, seed=5)
    assert th.min_head_dim(causal_softmax_rows(L), causal=True) == r
    shifted = L + np.random.default_rng(6).standard_normal((n, 1))  # rank r + 1, same softmax
    assert th.min_head_dim(causal_softmax_rows(shifted), causal=True) == r
    rng = np.random.default_rng(7)  # a key factor with an all-ones column: one direction is a shift
    B = np.hstack([rng.standard_normal((n, r - 1)), np.ones((n, 1))])
    assert th.min_head_dim(causal_softmax_rows(rng.standard_normal((n, r)) @ B.T), causal=True) == r - 1
    big = low_rank_logits(n, 20, seed=8)  # rank 20 logits: capped by the generic ⌈(n−1)/2⌉ = 15
    assert th.min_head_dim(causal_softmax_rows(big), causal=True) == 15


@pytest.mark.parametrize("n", [3, 4, 5, 6])
def test_causal_threshold_agrees_with_a_brute_force_search(n):
    # an independent least-squares search from random starts reaches float rounding at
    # the threshold and never gets below the certified bound one under it (which is > 0 here)
    for name, P, _ in causal_cases(n, seed=n):
        r = th.min_head_dim(P, causal=True)
        lower = th.causal_logit_lower_bounds(P)
        if lower[r - 1] <= 1e-9 and r > 1:
            continue  # not closed (attend to self, previous token): see the next test
        assert brute_force_causal_error(P, r) <= 1e-8, name
        if r > 1:
            assert lower[r - 1] > 1e-3, name
            assert brute_force_causal_error(P, r - 1, restarts=3) >= lower[r - 1] - 1e-9, name


def test_causal_exact_threshold_is_not_closed_attend_to_self():
    # "attend to self": every query gives itself logit +a over its past. Exactly, every column of the
    # completion problem is new (D = a I), so the threshold is n − 1; yet rank-1 logits
    # a λ^(i−j) (free above the diagonal) fit it to O(λ), with weights growing like λ^-(n−1)
    n, a = 6, 3.0
    P = causal_softmax_rows(a * np.eye(n))
    assert th.min_head_dim(P, causal=True) == n - 1
    lower = th.causal_logit_lower_bounds(P)
    assert lower[1] <= 1e-12 and lower[0] > 1
    X = np.eye(n)
    with pytest.raises(ValueError, match="too small"):
        th.represent(X, P, head_dim=n - 2, causal=True)
    errors = []
    for lam in (1e-1, 1e-2, 1e-3):
        u, v = lam ** np.arange(n), lam ** -np.arange(n)
        W_q, W_k = (a * u)[:, None], v[:, None]  # d_p = 1: logits a u v^T = a λ^(i−j)
        errors.append(np.abs(th.head_attention(X, W_q, W_k, causal=True) - P).max())
    assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-3
    # the previous-token pattern is another: exact n − 2, certified bound at 2 already 0
    P = causal_softmax_rows(4.0 * np.eye(n, k=-1))
    assert th.min_head_dim(P, causal=True) == n - 2
    assert th.causal_logit_lower_bounds(P)[2] <= 1e-12


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda P: P + 0.1 * np.eye(len(P), k=1), r"0 above the diagonal.*P\[0, 1\] = 0\.1"),
        (lambda P: np.where(np.eye(len(P)) > 0, 0.0, P), r"positive on and below the diagonal.*P\[0, 0\] = 0\.0"),
        (lambda P: P * np.where(np.arange(len(P)) == 2, 1.01, 1.0)[:, None], r"row 2 summing to 1\.0(1|099)"),
        (lambda P: P[:, :4], r"square"),
        (lambda P: np.full_like(P, np.nan), r"non-finite"),
    ],
)
def test_causal_rejects_bad_input(mutate, match):
    P = mutate(th.random_attention(5, seed=0, causal=True))
    for f in (
        lambda: th.min_head_dim(P, causal=True),
        lambda: th.represent(np.eye(5), P, causal=True),
        lambda: th.complete_causal_logits(P),
        lambda: th.causal_logit_lower_bounds(P),
        lambda: th.fit_causal_logits(P, 1),
    ):
        with pytest.raises(ValueError, match=match):
            f()


def test_causal_accepts_rounding_above_the_diagonal_and_validates_fit_args():
    P = th.random_attention(5, seed=0, causal=True)
    noisy = P + 1e-12 * np.triu(np.ones((5, 5)), k=1)
    assert np.array_equal(th.check_causal_attention(noisy), P)
    assert th.min_head_dim(noisy, causal=True) == 2
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="head_dim"):
            th.fit_causal_logits(P, bad)
    with pytest.raises(ValueError, match="restarts"):
        th.fit_causal_logits(P, 1, restarts=-1)
    with pytest.raises(ValueError, match="entrywise positive.*pass causal=True"):
        th.min_head_dim(P)


def test_cli_bottleneck_causal_side_by_side(tmp_path, capsys):
    out = tmp_path / "bn"
    rc = main(
        ["bottleneck", "--causal", "--n", "4", "7", "--seeds", "0", "1", "--output-dir", str(out), "--no-progress"]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "causal" in printed and "bidirectional" in printed
    assert (out / "bottleneck.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(out / "bottleneck.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == (4 + 7) * 2 * 2
    causal = [r for r in rows if r["mask"] == "causal"]
    assert len(causal) == (4 + 7) * 2
    for r in causal:
        n, k = int(r["n"]), int(r["head_dim"])
        t = int(r["min_head_dim"])
        le, lo = float(r["logit_error"]), float(r["logit_error_lower"])
        assert t == math.ceil((n - 1) / 2)
        assert le >= lo - 1e-12 and math.isnan(float(r["kl_svd"]))
        if k >= t:
            assert le <= 1e-10 and lo <= 1e-10 and abs(float(r["kl_fit"])) <= 1e-12
        else:
            assert lo > 1e-3 and float(r["kl_fit"]) > 1e-8
    for r in rows:
        if r["mask"] == "bidirectional":
            assert int(r["min_head_dim"]) == int(r["n"]) - 1
            assert r["logit_error"] == r["logit_error_lower"]


@pytest.mark.slow
def test_causal_n512_is_exact_and_fast():
    import time

    n = 512
    P = th.random_attention(n, seed=0, causal=True)
    t = time.perf_counter()
    W_q, W_k = th.represent(np.eye(n), P, causal=True)
    elapsed = time.perf_counter() - t
    assert W_q.shape == (n, 256)
    assert np.abs(th.head_attention(np.eye(n), W_q, W_k, causal=True) - P).max() <= 1e-9
    assert elapsed < 120


@pytest.mark.slow
@pytest.mark.parametrize("n", [7, 8])
def test_causal_threshold_agrees_with_a_longer_brute_force_search(n):
    for seed in range(3):
        for name, P, _ in causal_cases(n, seed=seed):
            r = th.min_head_dim(P, causal=True)
            lower = th.causal_logit_lower_bounds(P)
            if lower[r - 1] <= 1e-9 and r > 1:
                continue
            assert brute_force_causal_error(P, r, seed=seed, max_nfev=2000) <= 1e-8, (name, seed)
            if r > 1:
                assert brute_force_causal_error(P, r - 1, restarts=4, seed=seed, max_nfev=2000) >= lower[r - 1] - 1e-9
