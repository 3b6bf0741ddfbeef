"""Theorem 2 (paper, Section 4): a fixed-head layer that no standard multi-head layer equals.

:func:`theorem2_witness` builds it; :func:`theorem2_demo` shows it numerically by fitting both
kinds of layer (:func:`fit_multihead`) to its outputs.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from .common import _check_int, _one_thread


@dataclass
class MultiHeadWeights:
    """One bias-free multi-head attention layer (paper Sections 2 and 4), rows are tokens:

        out(X) = Σ_i softmax(X W_q[i] (X W_k[i])ᵀ / √d_p) X W_v[i] W_o[i]   ∈ R^{n×d}

    (the paper's W_o · Concat_i(...) transposed, W_o split per head). W_q, W_k, W_v [h, d, d_p], W_o [h, d_p, d],
    float64. No residual or LayerNorm: Theorem 2 is about the attention map itself.
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
    """Apply the layer ``w`` to X [batch, n, d]: [batch, n, d] (the formula in :class:`MultiHeadWeights`)."""
    if X.dim() != 3 or X.shape[-1] != w.hidden_size:
        raise ValueError(f"X must be [batch, n, {w.hidden_size}], got {tuple(X.shape)}")
    q = torch.einsum("bnd,hde->bhne", X, w.W_q)
    k = torch.einsum("bnd,hde->bhne", X, w.W_k)
    v = torch.einsum("bnd,hde->bhne", X, w.W_v)
    att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(w.head_dim), dim=-1)  # [b, h, query, key]
    return torch.einsum("bhne,hed->bnd", att @ v, w.W_o)


def embed_standard(w: MultiHeadWeights, head_dim: int) -> MultiHeadWeights:
    """Theorem 2, first part: a layer with head size d_p' is a fixed-head layer for any d_p >= d_p'.

    Pads every head with zero columns up to ``head_dim`` and scales W_q by √(head_dim/d_p') so the logits,
    now divided by √head_dim, are unchanged: the same function up to rounding.
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


def random_layer(num_attention_heads: int, hidden_size: int, head_dim: int, gen: torch.Generator) -> MultiHeadWeights:
    """A multi-head layer of h heads of size d_p on d with N(0, 1/fan-in) weights (float64): where a fit starts."""
    h, d, e = num_attention_heads, hidden_size, head_dim
    r = lambda *shape, fan: torch.randn(*shape, generator=gen, dtype=torch.float64) / math.sqrt(fan)  # noqa: E731
    return MultiHeadWeights(r(h, d, e, fan=d), r(h, d, e, fan=d), r(h, d, e, fan=d), r(h, e, d, fan=h * e))


def theorem2_witness(
    hidden_size: int = 4, num_attention_heads: int = 4, head_dim: int = 2, *, logit_scale: float = 2.0, seed: int = 0
) -> MultiHeadWeights:
    """The paper's Theorem 2 witness: a fixed-head layer no standard multi-head layer equals.

    All h heads share one rank-d_p bilinear form U = W_q[i] W_k[i]ᵀ (W_q[i] = Q R_i, W_k[i] = K R_i^{-T}, one
    random invertible R_i per head), so their attention is identical; the value/output map Σ_i W_v[i] W_o[i]
    is random with full rank d. U is scaled so logits on N(0, 1) inputs have standard deviation
    ``logit_scale``. The theorem needs d >= d_p and h·d_p > d (standard heads d/h smaller than d_p).

    Raises:
        ValueError: d < d_p or h·d_p <= d (the theorem does not apply).
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
    """Fit a bias-free layer of h heads of size d_p to X, Y [batch, n, d] (Theorem 2, Section 4).

    Minimises Σ_b ||out(X_b) − Y_b||_F² / Σ_b ||Y_b||_F² with L-BFGS (float64) from ``restarts`` random starts
    (plus ``init``) and returns (the best weights, its relative error, every start's error).
    """
    if X.dim() != 3 or X.shape != Y.shape:
        raise ValueError(f"X and Y must both be [batch, n, d], got {tuple(X.shape)} and {tuple(Y.shape)}")
    h, e = _check_int("num_attention_heads", num_attention_heads), _check_int("head_dim", head_dim)
    restarts = _check_int("restarts", restarts, minimum=0)
    if restarts == 0 and init is None:
        raise ValueError("need restarts >= 1 or an init")
    d = X.shape[-1]
    gen = torch.Generator().manual_seed(seed)
    starts = ([init.flat()] if init is not None else []) + [random_layer(h, d, e, gen).flat() for _ in range(restarts)]
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
    """Numbers of :func:`theorem2_demo`, relative squared errors Σ||out − target||² / Σ||target||².

    ``standard_errors``: each start's training error for a standard layer (sorted), the best and its held-out
    error; ``fixed_exact_error``: the witness itself on held-out inputs (0 up to rounding); ``fixed_fit_*``: a
    fixed-head layer fitted from the witness with 10 % noise on every weight.
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

    Draws ``num_inputs`` training and as many held-out X [n, d] with N(0, 1) entries and fits a standard layer
    (best error ≈ 0.05 train / 0.08 held-out with the defaults) and a fixed-head layer from a perturbed witness
    (≲ 1e-8). The defaults d = h = 4, d_p = 2, n = 4 are the smallest with h > d/d_p; 1024 targets against 64
    standard-layer parameters rule out interpolation.
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
