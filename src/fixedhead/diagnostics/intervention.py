"""Rank intervention: how much of its heads' logit rank does a trained model need?

Counting the numerical rank of attention logits (:mod:`fixedhead.diagnostics.analysis`) says what rank a head
*has*; this module measures what rank the model *needs*, by intervention: every head's logits
S = Q Kᵀ · scale ([n queries, n keys], after rotary positions where the model has them) are cut to
rank k before the softmax, and held-out text is scored again. Softmax ignores a per-query shift,
so every cut is free to add one (it is not counted in the rank; the paper's D_0 in Theorem 1,
:func:`fixedhead.theory.min_head_dim`, removes the same shift). Two cuts bracket the rank a model needs:

* the **oracle** (:func:`fit_visible`): per sequence, the best rank-k fit of each head's logits over
  the keys each query may see. A decoder's future keys are hidden, so no rank is spent on them;
  without a mask this is the Eckart–Young truncation of the row-centred logits (:func:`truncate_logits`).
  No fixed weights realise a per-sequence fit, and it is not causal (its factors are shared by all of
  a sequence's queries, so its fit at a position depends on later tokens): the rank it needs is the
  optimistic low end of the band (it is the best fit in squared logit error that a local method
  finds, not a proven bound on the loss).
* the **realisable** cut (:func:`fit_head_maps`, :func:`fit_projections`): each head's queries and
  keys mapped to size k by fixed maps fitted on training text and scored on held-out text, i.e. a
  causal model with query/key heads of size k that exists (as Loki and Eigen Attention project the keys of
  trained LLMs; for rotary models the maps act on the rotated queries and keys, as Loki's do, so
  they cannot be folded into the projection weights there).

The **lookahead** cut, the best rank-k fit of all n × n logits masked afterwards, spends rank on
entries a decoder's queries never see; it is kept to compare with and to read older results by.

:func:`rank_curve` scores held-out text with a cut for k = 1 .. d_p in each layer alone and in all
layers together: the loss against k. The rank a layer *needs* is the smallest k whose loss is within
a tolerance of the full-rank loss (:func:`needed_rank`); ``fixedhead rank-intervention`` reports it as
the band from the oracle to the realisable cut (:func:`needed_band`) at fixed tolerances (0.01 and
0.002 nats) and at the seed-to-seed spread of the full-rank loss.

Works on fixedhead models and on any transformers model whose attention goes through transformers'
attention interface (Llama-style runs included, grouped key heads repeated per query head), and on
modules built from :class:`fixedhead.model.attention.MultiHeadAttention` (e.g. the farthest-point
task's model).
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ..checks import non_negative_int, positive_int
from ..model.attention import SEPARATE_VALUE_SIZE_IMPLEMENTATIONS

RANK_IMPLEMENTATION = "fixedhead_truncated_logits"  # the attention implementation registered below
SEPARATE_VALUE_SIZE_IMPLEMENTATIONS.add(RANK_IMPLEMENTATION)  # it multiplies by the values it gets, of any size
_RANK_ATTR = "_fixedhead_logit_rank"  # (method, rank, maps) on the attention modules being cut, for the duration
PROBE_SWEEPS = 5  # the oracle's sweeps from each of its two starts before it goes on from the better


def truncate_logits(logits: torch.Tensor, rank: int) -> torch.Tensor:
    """The best rank-``rank`` approximation of each row-centred logit matrix.

    Args:
        logits: [..., queries, keys] logits (any leading dimensions), computed in float64 here.
        rank: k ≥ 0; k ≥ min(queries, keys) returns the centred logits unchanged; k = 0 returns
            zeros (uniform attention over the keys the mask leaves).

    Returns:
        float64 [..., queries, keys]: U_k Σ_k V_kᵀ of S_c = S − (row means of S) 1ᵀ, whose softmax
        over keys equals softmax(S) when k ≥ rank S_c.

    Raises:
        ValueError: ``rank`` not an int ≥ 0; ``logits`` with fewer than 2 dimensions.
    """
    non_negative_int("rank", rank)
    if logits.dim() < 2:
        raise ValueError(f"logits must be [..., queries, keys], got shape {tuple(logits.shape)}")
    centred = logits.double() - logits.double().mean(-1, keepdim=True)
    if rank >= min(centred.shape[-2:]):
        return centred
    if rank == 0:
        return torch.zeros_like(centred)
    u, s, vh = torch.linalg.svd(centred, full_matrices=False)
    return (u[..., :rank] * s[..., None, :rank]) @ vh[..., :rank, :]


def truncate_product(query: torch.Tensor, key: torch.Tensor, rank: int) -> torch.Tensor:
    """:func:`truncate_logits` of ``query @ keyᵀ`` computed from the factors: the same matrix, without an
    SVD of the [queries, keys] logits.

    The centred logits are Q K_cᵀ with K_c = K − (mean key) 1ᵀ, of rank ≤ d_p; with the QR factors
    Q = Q_a R_a and K_c = Q_b R_b, their best rank-k approximation is Q_a U_k Σ_k V_kᵀ Q_bᵀ where
    U Σ Vᵀ is the SVD of the small R_a R_bᵀ (d_p × d_p when d_p ≤ n). Same result as the SVD of the
    [n, n] matrix to float64 rounding (tested against it); 17 times faster at n = 128, d_p = 8 on a CPU.

    Args:
        query, key: [..., queries, d_p] and [..., keys, d_p] (the scale already applied to one of them).
        rank: k ≥ 0, as :func:`truncate_logits`.

    Returns:
        float64 [..., queries, keys].
    """
    non_negative_int("rank", rank)
    if rank == 0:
        return torch.zeros(*query.shape[:-1], key.shape[-2], dtype=torch.float64, device=query.device)
    query, key = query.double(), key.double()
    centred_key = key - key.mean(-2, keepdim=True)
    if rank >= min(query.shape[-2], key.shape[-2], query.shape[-1]):
        return query @ centred_key.transpose(-1, -2)
    q_basis, q_r = torch.linalg.qr(query)
    k_basis, k_r = torch.linalg.qr(centred_key)
    u, s, vh = torch.linalg.svd(q_r @ k_r.transpose(-1, -2), full_matrices=False)
    left = (q_basis @ u[..., :rank]) * s[..., None, :rank]
    return left @ (k_basis @ vh[..., :rank, :].transpose(-1, -2)).transpose(-1, -2)


def fit_visible(
    logits: torch.Tensor, visible: torch.Tensor, rank: int, max_iter: int = 100, tol: float = 1e-4
) -> torch.Tensor:
    """The best rank-``rank`` fit of each logit matrix on its visible entries, up to a per-query shift.

    Minimises ‖M ⊙ (S − A Bᵀ − c 1ᵀ)‖_F over A [queries, k], B [keys, k] and the shifts c [queries]
    (softmax ignores a per-query shift, so it is free and not counted in the rank; centring each row
    over its visible keys first would instead add a rank). M is the visibility mask: for a decoder,
    keys up to the query, so no rank is spent on logits the query never sees. Where every entry is
    visible this is :func:`truncate_logits` (Eckart–Young); otherwise there is no closed form, and the
    fit is found by alternating least squares (ALS). A sweep solves each query's (a_i, c_i) and then each
    key's b_j by least squares over its visible entries (a ridge of 1e-12 · the mean diagonal keeps rows
    with fewer visible keys than k + 1 solvable); the step from the previous sweep is then extrapolated
    (A, B and c moved on by α times their change, α growing 1.5-fold while that lowers the residual,
    back to 1 when it does not), and the extrapolated fit is kept only where its visible residual is
    lower, so the residual never rises. ALS starts twice, from the k leading right singular vectors of
    all the row-centred logits (the lookahead cut's key directions) and from those of the visible
    entries alone (each row centred over its visible keys, hidden entries 0) as the keys' factors B;
    each start runs :data:`PROBE_SWEEPS` sweeps and the one with the lower residual goes on. On trained
    heads the first start mostly wins and stops sooner (from the second, one head of a trained model
    stalls at a residual of 168 where the first reaches 0.8); on logits after rotary positions the
    second sometimes does. Residuals come from each query's k + 1 × k + 1 gram G_i and right-hand side
    r_i (Σ_i ‖s_i‖² − 2 ã_i·r_i + ã_iᵀ G_i ã_i over visible entries), not from a pass over the n × n
    entries, so they resolve to about 1e-15 of the visible entries' squared norm. Each matrix stops
    on its own when a sweep lowers its residual by less than the fraction ``tol`` (it has stalled) or
    the residual is below 1e-24 of the visible entries' squared norm (an exact fit), or after
    ``max_iter`` sweeps in all; all matrices (e.g. every head of every sequence) are solved together in
    batched tensor operations, over those still running. ALS is a local method: "best" is the fit it
    reaches. The lookahead fit (:func:`truncate_logits` of all entries, with its best shifts) is kept
    where its visible residual is lower, so the oracle never fits worse than the lookahead cut.

    Args:
        logits: [..., queries, keys] (float64 here).
        visible: bool, broadcastable to ``logits``: True where the query may attend to the key.
        rank: k ≥ 0 (0: the shifts only, i.e. uniform attention over the visible keys).
        max_iter, tol: the stopping rule above.

    Returns:
        float64 [..., queries, keys]: A Bᵀ + c 1ᵀ (hidden entries are whatever the fit gives: mask them).

    Raises:
        ValueError: ``rank`` not an int ≥ 0; ``logits`` with fewer than 2 dimensions.
    """
    non_negative_int("rank", rank)
    if logits.dim() < 2:
        raise ValueError(f"logits must be [..., queries, keys], got shape {tuple(logits.shape)}")
    s = logits.double()
    lead, (nq, nk) = s.shape[:-2], s.shape[-2:]
    visible = visible.to(s.device)
    m = visible.expand_as(s).double()
    if bool(m.all()) or rank >= min(nq, nk):
        return truncate_logits(s, rank) + s.mean(-1, keepdim=True)
    ms = m * s
    counts = m.sum(-1, keepdim=True).clamp(min=1)
    if rank == 0:
        return (ms.sum(-1, keepdim=True) / counts).expand_as(s).clone()
    s, m, ms, counts = (x.reshape(-1, nq, x.shape[-1]) for x in (s, m, ms, counts))
    squares = ms.pow(2).sum(-1)  # [N, queries]: each query's visible logits' squared norm
    norm = squares.sum(-1).clamp(min=1e-300)
    tril = torch.ones(nq, nk, dtype=torch.bool, device=s.device).tril()
    causal = nq == nk and bool((visible == tril).all())  # query i sees keys j ≤ i: grams are running sums
    eye = torch.eye(rank + 1, dtype=s.dtype, device=s.device)

    def gram(design, weights, upper=False):  # per row r: Σ_j w_rj design_j design_jᵀ, [N, R, p, p]
        outer = design[..., :, None] * design[..., None, :]  # [N, J, p, p]
        if causal:  # row r sees j ≤ r (queries), or is seen by j ≥ r (keys, upper): no [R, J] product
            return outer.flip(-3).cumsum(-3).flip(-3) if upper else outer.cumsum(-3)
        weights = weights.transpose(-1, -2) if upper else weights
        return (weights @ outer.flatten(-2)).unflatten(-1, design.shape[-1:] * 2)

    def solve(gram, rhs):  # per row: (gram + ridge) x = rhs
        # a normal number at least: 1e-12 · 1e-300 is subnormal, and LAPACK gives NaN for a row nobody sees
        ridge = (1e-12 * gram.diagonal(dim1=-2, dim2=-1).mean(-1)).clamp(min=1e-300)
        p = gram.shape[-1]
        return torch.linalg.solve(gram + ridge[..., None, None] * eye[:p, :p], rhs[..., None])[..., 0]

    def row_terms(ms, m, b):  # the queries' least squares for keys' factors b: each query's gram and M⊙S B̃
        design = torch.cat([b, torch.ones_like(b[..., :1])], -1)
        return gram(design, m), ms @ design

    def residual_of(squares, a, terms):  # ‖M ⊙ (S − Ã B̃ᵀ)‖² = Σ_i ‖s_i‖² − 2 ã_i·r_i + ã_iᵀ G_i ã_i
        g, rhs = terms
        quadratic = (a * (g @ a[..., None])[..., 0]).sum(-1)
        return (squares - 2 * (a * rhs).sum(-1) + quadratic).sum(-1).clamp(min=0)

    def sweeps(b, ms, m, squares, norm, max_iter):  # ALS from keys' factors b: (Ã, B, visible residual)
        a = torch.zeros(*ms.shape[:-1], rank + 1, dtype=s.dtype, device=s.device)  # [N, queries, k + 1]: a_i, c_i
        residual = torch.full(ms.shape[:1], float("inf"), dtype=s.dtype, device=s.device)
        alpha = torch.ones_like(residual)
        running = torch.arange(ms.shape[0], device=s.device)  # the matrices still iterating
        terms = row_terms(ms, m, b)
        b = b.clone()
        for sweep in range(max_iter):
            msr, mr, sq = ms[running], (None if causal else m[running]), squares[running]
            ar = solve(*terms)
            key_a, shift = ar[..., :rank], ar[..., :rank] * ar[..., rank:]  # target S − c 1ᵀ: Σ_i m_ij a_i c_i
            shift = shift.flip(-2).cumsum(-2).flip(-2) if causal else mr.transpose(-1, -2) @ shift
            br = solve(gram(key_a, mr, upper=True), msr.transpose(-1, -2) @ key_a - shift)
            terms = row_terms(msr, mr, br)
            now = residual_of(sq, ar, terms)
            if sweep:  # extrapolate the step from the last sweep; keep it where it fits better
                step = alpha[running][:, None, None]
                a_far, b_far = ar + step * (ar - a[running]), br + step * (br - b[running])
                terms_far = row_terms(msr, mr, b_far)
                far = residual_of(sq, a_far, terms_far)
                better = far < now
                ar = torch.where(better[:, None, None], a_far, ar)
                br = torch.where(better[:, None, None], b_far, br)
                pick = [better.view(-1, 1, 1, 1), better.view(-1, 1, 1)]  # the gram and the right-hand side
                terms = tuple(torch.where(w, f, t) for w, f, t in zip(pick, terms_far, terms, strict=True))
                alpha[running] = torch.where(better, alpha[running] * 1.5, 1.0)
                now = torch.minimum(far, now)
            previous = residual[running]
            a[running], b[running], residual[running] = ar, br, now
            done = (now <= 1e-24 * norm[running]) | (previous.isfinite() & (previous - now <= tol * previous))
            running, terms = running[~done], tuple(t[~done] for t in terms)
            if not len(running):
                break
        return a, b, residual

    u, sv, vh = torch.linalg.svd(s - s.mean(-1, keepdim=True), full_matrices=False)
    lookahead = (u[..., :rank] * sv[..., None, :rank]) @ vh[..., :rank, :]  # truncate_logits(s, rank)
    visible_filled = torch.linalg.svd(m * (s - ms.sum(-1, keepdim=True) / counts), full_matrices=False)[2]
    starts = torch.cat([vh[..., :rank, :], visible_filled[..., :rank, :]]).transpose(-1, -2)  # [2N, keys, k]
    probe = min(PROBE_SWEEPS, max_iter)
    twice = [None if x is None else torch.cat([x, x]) for x in (ms, None if causal else m, squares, norm)]
    _, b, residual = sweeps(starts, *twice, probe)  # a few sweeps from each start: go on from the better
    n_mats = s.shape[0]
    from_lookahead = residual[:n_mats] <= residual[n_mats:]
    b = torch.where(from_lookahead[:, None, None], b[:n_mats], b[n_mats:])
    a, b, _ = sweeps(b, ms, m, squares, norm, max(max_iter - probe, 1))
    fit = a[..., :rank] @ b.transpose(-1, -2) + a[..., rank:]
    lookahead = lookahead + (m * (s - lookahead)).sum(-1, keepdim=True) / counts  # its best shifts: a candidate
    worse = (m * (s - lookahead)).pow(2).sum((-2, -1)) < (m * (s - fit)).pow(2).sum((-2, -1))
    return torch.where(worse[..., None, None], lookahead, fit).reshape(*lead, nq, nk)


def fit_projections(query_moment: torch.Tensor, key_covariance: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Query and key maps whose first k columns give each head's best rank-k logit form, for every k.

    A head's logit is qᵀk (the scale in q). Replacing it by (qᵀA_k)(B_kᵀk), i.e. queries and keys of
    size k, gives a model that exists (its query and key weights times A_k and B_k). The maps here
    minimise the expected squared logit error E[(qᵀ(I − A_k B_kᵀ)k)²] over queries and keys drawn
    apart, = ‖C_q^{1/2}(I − W)C_k^{1/2}‖_F² with C_q = E[qqᵀ] and C_k = Cov(k) (the mean key only
    adds q·μ, a per-query shift the softmax ignores): W = C_q^{-1/2} U_k Σ_k V_kᵀ C_k^{-1/2} from
    the SVD U Σ Vᵀ of C_q^{1/2} C_k^{1/2} (pseudo-inverse roots: directions the data never use are
    dropped). This is a joint fit of q·kᵀ, not the keys' principal directions alone (Loki, Eigen
    Attention): a key direction with large variance that queries never read costs nothing here. At
    k = rank(C_q^{1/2} C_k^{1/2}) the logits are reproduced exactly on the data's span.

    Args:
        query_moment: [..., d, d], E[qqᵀ] of the (scaled) queries.
        key_covariance: [..., d, d], the covariance of the keys.

    Returns:
        (A, B), float64 [..., d, d]: the cut to k keeps A[..., :k] and B[..., :k]
        (A = C_q^{-1/2} U Σ^{1/2}, B = C_k^{-1/2} V Σ^{1/2}).
    """

    def roots(c):  # C^{1/2} and its pseudo-inverse
        w, v = torch.linalg.eigh(c.double())
        keep = w > w.amax(-1, keepdim=True).clamp(min=1e-300) * 1e-12
        w = w.clamp(min=0)
        half = (v * w.sqrt()[..., None, :]) @ v.transpose(-1, -2)
        inv = (v * torch.where(keep, w.clamp(min=1e-300).rsqrt(), 0.0)[..., None, :]) @ v.transpose(-1, -2)
        return half, inv

    q_half, q_inv = roots(query_moment)
    k_half, k_inv = roots(key_covariance)
    u, s, vh = torch.linalg.svd(q_half @ k_half)
    root = s.sqrt()[..., None, :]
    return q_inv @ (u * root), k_inv @ (vh.transpose(-1, -2) * root)


METHODS = ("oracle", "realisable", "lookahead")


def _visible(attention_mask, module, q_len: int, k_len: int, device, **kwargs) -> torch.Tensor | None:
    """Bool [..., q_len, k_len], True where a query may attend to a key (None: every key)."""
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        raise ValueError(
            f"the rank intervention takes a tensor mask or none, got {type(attention_mask).__name__} "
            "(use attn_implementation 'sdpa' or 'eager' for the model it is applied to)"
        )
    if attention_mask is not None:
        mask = attention_mask[..., :k_len]
        return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", False) if causal is None else causal
    if causal and q_len > 1:
        return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)
    return None


def _truncated_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """An attention implementation (transformers' interface): the module's own product, with the
    logits of a module marked by :func:`truncated_logits` cut to rank k by its method, or (method
    ``"record"``) the scaled queries' and keys' moments added up for :func:`fit_head_maps`. Queries and
    keys arrive here after rotary positions, so every method acts on the rotated q and k."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cut = getattr(module, _RANK_ATTR, None)
    if cut is None:  # a layer left as it is
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=0.0, **kwargs)
    method, rank, maps = cut
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads != heads:  # grouped keys and values: one per query head
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    q = query.double() * scale  # scaled in float64
    q_len, k_len = q.shape[-2], key.shape[-2]
    visible = _visible(attention_mask, module, q_len, k_len, q.device, **kwargs)
    if method == "record":  # [heads, d, d] sums over every position of every sequence
        k = key.double()
        maps["queries"] = maps.get("queries", 0) + torch.einsum("bhnd,bhne->hde", q, q)
        maps["keys"] = maps.get("keys", 0) + torch.einsum("bhnd,bhne->hde", k, k)
        maps["key_sum"] = maps.get("key_sum", 0) + k.sum((0, 2))
        maps["count"] = maps.get("count", 0) + k.shape[0] * k.shape[2]
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=0.0, **kwargs)
    if method == "realisable":
        a, b = maps  # [heads, d, k]: queries and keys of size k
        logits = (q @ a.to(q.device)) @ (key.double() @ b.to(q.device)).transpose(-1, -2)
    elif method == "oracle" and visible is not None:
        logits = q @ key.double().transpose(-1, -2)
        fits = maps.setdefault(rank, []) if maps is not None else []  # this rank's fits, by logits
        if maps is not None and len(maps) > 1:
            for other in [r for r in maps if r != rank]:
                del maps[other]
        fit = next((f for s, f in fits if s.shape == logits.shape and torch.equal(s, logits)), None)
        if fit is None:
            fit = fit_visible(logits, visible, rank)
            fits.append((logits, fit))
        logits = fit
    else:  # lookahead (or nothing hidden): every entry, then masked
        logits = truncate_product(q, key, rank)
    if visible is not None:
        logits = logits.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # a fully masked (padding) row attends to nothing
    context = torch.matmul(probs, value.double()).to(query.dtype)
    return context.transpose(1, 2).contiguous(), probs.to(query.dtype)


def attention_modules(model, inputs: torch.Tensor) -> list[torch.nn.Module]:
    """The model's self-attention modules in the order a forward pass calls them (= layer order),
    found by one forward pass on the first sequence of ``inputs`` (token ids, or hidden states for a
    bare attention module).

    Raises:
        ValueError: a model whose attention the intervention cannot reach.
    """
    from transformers import AttentionInterface

    seen: list = []

    def record(module, *args, **kwargs):
        if all(module is not m for m in seen):
            seen.append(module)
        return _truncated_attention(module, *args, **kwargs)

    AttentionInterface.register(RANK_IMPLEMENTATION, record)
    try:
        with _switched(model), torch.no_grad():
            model(inputs[:1].to(next(model.parameters()).device))
    finally:
        AttentionInterface.register(RANK_IMPLEMENTATION, _truncated_attention)
    if not seen:
        raise ValueError(f"{type(model).__name__}: no attention layer was called through the attention interface")
    return seen


@contextmanager
def _switched(model):
    """The model (or its MultiHeadAttention layers) set to the intervention's implementation, restored after."""
    from ..model.attention import MultiHeadAttention

    if getattr(model, "_supports_attention_backend", False) and hasattr(model, "set_attn_implementation"):
        previous = model.config._attn_implementation
        model.set_attn_implementation(RANK_IMPLEMENTATION)
        try:
            yield
        finally:
            model.set_attn_implementation(previous)
        return
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} has no attention the rank intervention can reach (a fixedhead model, a "
            "transformers model using transformers' attention interface, or a module of MultiHeadAttention layers)"
        )
    configs = [m.config for m in layers]
    for m in layers:
        m.config = _Implementation(RANK_IMPLEMENTATION)
    try:
        yield
    finally:
        for m, config in zip(layers, configs, strict=True):
            m.config = config


class _Implementation:
    """The one config field a bare MultiHeadAttention reads at call time."""

    def __init__(self, name: str):
        self._attn_implementation = name


@contextmanager
def truncated_logits(model, rank: int | None, layers=None, *, modules: list, method: str = "oracle", maps=None):
    """Inside the block, the attention logits of ``layers`` are cut to rank ``rank``.

    Args:
        model: a fixedhead model, a transformers model using the attention interface, or a module
            of :class:`~fixedhead.model.attention.MultiHeadAttention` layers.
        rank: k ≥ 1; 0 for uniform attention over the visible keys (what the model loses without
            attention); None for no truncation (the model as it is, through the same code path).
        layers: indices (in call order) of the layers to truncate; None for all.
        modules: the attention modules in call order (:func:`attention_modules`).
        method: ``"oracle"``: per sequence, the best rank-k fit of each head's visible logits
            (:func:`fit_visible`; without a mask, :func:`truncate_logits`), no fixed weights realise it;
            ``"realisable"``: each head's queries and keys mapped to size k by fixed maps fitted on
            other text (``maps``, from :func:`fit_head_maps`): a model that exists;
            ``"lookahead"``: the best rank-k fit of all n × n logits, future keys included, masked
            afterwards (for a decoder it fits the visible logits no better than the oracle; kept to compare).
        maps: for ``"realisable"``, one (A, B) pair per module ([heads, d_p, d_p], :func:`fit_projections`);
            for ``"oracle"``, optionally one dict per module that keeps the last rank's fits by their
            logits, so the same logits cut to the same rank again (a layer alone after all layers, whose
            inputs are the same) are fitted once (:func:`rank_curve` passes them).

    Raises:
        ValueError: a rank that is not an int ≥ 0, an unknown method, ``maps`` not the method's, a layer index out
            of range, or a model the intervention cannot reach.
    """
    if rank is not None:
        non_negative_int("rank", rank)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")

    def got() -> str:  # what maps holds, for the refusals below
        if maps is None:
            return "got None"
        return f"got {len(maps)} ({', '.join(sorted({type(m).__name__ for m in maps}))}) for {len(modules)} modules"

    if method == "realisable" and (maps is None or len(maps) != len(modules)):
        raise ValueError(
            f"method 'realisable' needs maps: one (A, B) pair per attention module (fit_head_maps); {got()}"
        )
    if (
        method == "oracle"
        and maps is not None
        and not (len(maps) == len(modules) and all(isinstance(m, dict) for m in maps))
    ):
        raise ValueError(
            "method 'oracle' takes maps=None or one dict per attention module (its memo of fits); (A, B) pairs "
            f"from fit_head_maps are the realisable cut's; {got()}"
        )
    chosen = range(len(modules)) if layers is None else list(layers)
    bad = [i for i in chosen if not (isinstance(i, int) and 0 <= i < len(modules))]
    if bad:
        raise ValueError(f"layers must be indices in [0, {len(modules)}), got {bad}")
    for i in chosen:
        cut = None
        if rank is not None:
            given = None if maps is None else maps[i]
            cut = (method, rank, tuple(m[..., :rank] for m in given) if method == "realisable" else given)
        setattr(modules[i], _RANK_ATTR, cut)
    try:
        with _switched(model):
            yield
    finally:
        for m in modules:
            if hasattr(m, _RANK_ATTR):
                delattr(m, _RANK_ATTR)


def fit_head_maps(model, input_ids: torch.Tensor, modules: list, batch_size: int = 8) -> list:
    """:func:`fit_projections` of every head from the scaled queries and keys the model computes on
    ``input_ids`` (after rotary positions, grouped keys repeated per query head; every position).

    Args:
        model, modules: as :func:`truncated_logits`.
        input_ids: [batch, n] token ids (or hidden states for a bare attention module) of text the
            cut is scored apart from (training text).
        batch_size: sequences per forward pass.

    Returns:
        one (A, B) pair per module, float64 [heads, d_p, d_p], on the CPU.
    """
    sums = [{} for _ in modules]
    for m, record in zip(modules, sums, strict=True):
        setattr(m, _RANK_ATTR, ("record", None, record))
    device = next(model.parameters()).device
    try:
        with _switched(model), torch.no_grad():
            for start in range(0, input_ids.shape[0], batch_size):
                model(input_ids[start : start + batch_size].to(device))
    finally:
        for m in modules:
            if hasattr(m, _RANK_ATTR):
                delattr(m, _RANK_ATTR)
    maps = []
    for record in sums:
        count = record["count"]
        mean = record["key_sum"] / count
        covariance = record["keys"] / count - mean[:, :, None] * mean[:, None, :]
        a, b = fit_projections(record["queries"] / count, covariance)
        maps.append((a.cpu(), b.cpu()))
    return maps


def default_ranks(head_dim: int, seq_len: int) -> list[int]:
    """Every k from 1 to min(d_p, n − 1) when that is at most 64; beyond, 1–16 then a geometric grid."""
    top = max(1, min(head_dim, seq_len - 1))
    if top <= 64:
        return list(range(1, top + 1))
    grid = set(range(1, 17)) | {round(16 * 2 ** (i / 4)) for i in range(1, 4 * math.ceil(math.log2(top / 16)) + 1)}
    return sorted(k for k in grid | {top} if k <= top)


def needed_rank(losses: dict[int, float], full: float, band: float, uniform: float | None = None) -> int | None:
    """The smallest k tried whose loss is at most ``full + band``, and every larger k tried too (None when none is):
    a k between two tried reads as the upper one, so with a sparse ``ranks`` the needed rank may be lower than read.

    Args:
        losses: {k: loss in nats}.
        full: the full-rank loss (nats).
        band: the tolerance (nats, ≥ 0), e.g. the seed-to-seed spread of ``full``.
        uniform: the loss at k = 0 (uniform attention over the visible keys), where ``losses`` has none:
            within the band together with every k tried, the needed rank is 0 (the model needs no attention).
    """
    _check_tolerance("band", band)
    if uniform is not None and 0 not in losses:
        losses = {0: uniform} | losses
    within = None
    for k in sorted(losses, reverse=True):
        if losses[k] <= full + band:
            within = k
        else:
            break
    return within


def _check_tolerance(name: str, value) -> float:
    """``value`` as a tolerance in nats; ValueError naming it (and saying why) unless a finite number ≥ 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number >= 0, got {value}, which is not finite")
    if value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return float(value)


def _largest_qk_head_dim(config) -> int:
    """The largest size of a model's queries and keys over its layers, the bound on its logits' rank:
    fixedhead's ``layer_qk_head_dims``, else the one ``head_dim`` (d/h where the config has none)."""
    sizes = getattr(config, "layer_qk_head_dims", None)
    if sizes:
        return max(sizes)
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def check_ranks(ranks, largest: int | None = None, where: str = "the model") -> list[int]:
    """``ranks`` (the k a curve tries) as a list; ValueError naming the value unless every k is an int ≥ 1 (k = 0,
    uniform attention, is always scored), each once, and, given ``largest`` (the largest query/key head size),
    k ≤ it."""
    ranks = list(ranks)
    for k in ranks:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"ranks must be ints >= 1 (k = 0, uniform attention, is always scored), got {k!r}")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"ranks must be distinct, got {ranks}")
    if largest is not None and ranks and max(ranks) > largest:
        raise ValueError(
            f"ranks must be at most {largest}, the largest query/key head size of {where} (its logits have no "
            f"higher rank to cut), got {max(ranks)}"
        )
    return ranks


def rank_curve(
    model,
    score,
    input_ids: torch.Tensor,
    ranks: list[int] | None = None,
    progress: bool = True,
    per_layer: bool = True,
    method: str = "oracle",
    maps=None,
) -> dict:
    """Loss against the logit rank k, each layer alone and all layers together.

    Args:
        model: see :func:`truncated_logits`.
        score: a function ``model -> loss`` (nats, lower is better) on the held-out set, e.g.
            ``lambda m: evaluate_lm(m, ids, labels, objective="clm")["loss"]``.
        input_ids: a few sequences of the held-out set, [batch, n] (to find the layers and n).
        ranks: the k to try; None for :func:`default_ranks` of the largest head size.
        progress: a progress bar over the (setting, k) evaluations.
        per_layer: also cut each layer alone (False: all layers together only, a layer-count times cheaper).
        method, maps: how the logits are cut (:func:`truncated_logits`; the oracle's memo of fits is made here).

    Returns:
        ``{"full": the loss with no truncation, "uniform": the loss with every head's attention
        uniform over its visible keys (k = 0 in every layer), "uniform_layers": [the loss with one layer's
        attention uniform, per layer; empty unless ``per_layer``], "attention_gain": uniform − full (what
        the model gains from attention, nats), "head_dims": [d_p per layer: the size of queries and
        keys, which bounds the logits' rank], "seq_len": n, "ranks": [k], "method": method,
        "curves": {"all": {k: loss}, "layer 0": {k: loss}, ...}}``. From a layer's own d_p on nothing
        changes (the oracle's fit is exact and the realisable maps are invertible on the training text's
        span), and for the oracle and lookahead cuts from n − 1 on too (the row-centred n × n logits have no
        higher rank, whatever the mask hides): those k read ``full``, not the cut's float rounding of it,
        which a band of 0 would read as outside.
    """
    from tqdm.auto import tqdm

    modules = attention_modules(model, input_ids)
    head_dims = [_head_dim(m) for m in modules]
    n = int(input_ids.shape[1])
    ranks = check_ranks(ranks) if ranks else default_ranks(max(head_dims), n)  # k ≥ d_p: the full loss (a study's
    # arms of several head sizes share one list; `fixedhead rank-intervention` refuses k above a run's largest)
    with truncated_logits(model, None, modules=modules):
        full = float(score(model))
    with truncated_logits(model, 0, modules=modules):
        uniform = float(score(model))
    uniform_layers = []  # each layer alone at k = 0 too: a layer that needs no attention reads 0, not the least k
    for i in range(len(modules) if per_layer else 0):
        with truncated_logits(model, 0, [i], modules=modules):
            uniform_layers.append(float(score(model)))
    settings = [("all", None)] + [(f"layer {i}", [i]) for i in range(len(modules)) if per_layer]
    tops = {name: max(head_dims) if layers is None else head_dims[layers[0]] for name, layers in settings}
    # from this k on the cut leaves the setting's layers as they are (the realisable maps are fixed: only at d_p)
    exact = {name: top if method == "realisable" else min(top, n - 1) for name, top in tops.items()}
    jobs = [  # k by k: a layer cut alone after all layers at the same k reuses the oracle's fits of its logits
        (name, layers, k) for k in ranks for name, layers in settings if k < exact[name]
    ]
    if method == "oracle":
        maps = [{} for _ in modules]
    curves: dict[str, dict[int, float]] = {name: {} for name, _ in settings}
    for name, layers, k in tqdm(jobs, desc="rank intervention", disable=not progress):
        with truncated_logits(model, k, layers, modules=modules, method=method, maps=maps):
            curves[name][k] = float(score(model))
    for name, _ in settings:  # the layers unchanged: the loss is the full one
        curves[name] |= {k: full for k in ranks if k >= exact[name]}
    return {
        "full": full,
        "uniform": uniform,
        "uniform_layers": uniform_layers,
        "attention_gain": uniform - full,
        "head_dims": head_dims,
        "seq_len": n,
        "ranks": list(ranks),
        "method": method,
        "curves": curves,
    }


def _head_dim(module) -> int:
    """The size of a module's queries and keys, the bound on its logits' rank: ``qk_head_dim`` where it
    has one (fixedhead's layers; values may have another size), else its one head size."""
    for name in ("qk_head_dim", "head_dim", "attention_head_size"):
        value = getattr(module, name, None)
        if isinstance(value, int):
            return value
    config = getattr(module, "config", None)
    value = getattr(config, "head_dim", None)
    if isinstance(value, int):
        return value
    raise ValueError(f"cannot tell the head size of {type(module).__name__}")


# ----------------------------------------------------------------------------- trained runs
DEFAULT_BAND = 0.01  # nats: the tolerance when a model has one seed (and no --band)
RESULTS_FILE = "rank_intervention.json"
OWNED = (RESULTS_FILE, "rank_intervention.csv", "rank_intervention.png", "rank_intervention.md")


_HELDOUT: dict = {}  # the last held-out data prepared by run_rank_curve, by (data settings, tokenizer)


def run_rank_curve(
    run_dir,
    max_eval_tokens: int | None = 32_768,
    ranks=None,
    progress: bool = True,
    per_layer: bool = True,
    device: str | torch.device = "cpu",
    method: str = "oracle",
    fit_tokens: int = 32_768,
    corpus: str | None = None,
) -> dict:
    """:func:`rank_curve` of a pretraining run (fixedhead or Llama-style, masked or causal) on its own
    held-out documents, scored as ``fixedhead evaluate`` scores them (same split, same fixed masking),
    capped at ``max_eval_tokens`` tokens (None: all), with the model on ``device`` (e.g. ``"cuda"``);
    ``corpus``: where the run's training corpus is now (None: where the run records it).
    For ``method="realisable"`` the maps (:func:`fit_head_maps`) are fitted on the first
    ``fit_tokens`` tokens of the run's training split (masked as the held-out text for a masked model),
    so the cut is scored on text it was not fitted on.

    Returns:
        the curve with ``run`` (the folder), ``name`` (its folder name: the model), ``seed``,
        ``objective``, ``scored_tokens`` (and, realisable, ``fit_tokens``: the tokens the maps saw).

    Raises:
        FileNotFoundError / ValueError: as :func:`fixedhead.training.evaluate.evaluate_run`.
    """
    from ..data import prepare_data
    from ..data.lm import heldout_batches
    from ..model.architectures import objective_of
    from ..runs import open_run
    from ..training.evaluate import check_same_text, evaluate_lm, load_model, recorded_data_settings
    from ..training.settings import transformers_progress_bars

    run = open_run(run_dir)
    data_settings = recorded_data_settings(run_dir, run, corpus, max_eval_tokens)
    key = (json.dumps(data_settings.record(), sort_keys=True), run.tokenizer.backend_tokenizer.to_str())
    if key not in _HELDOUT:  # the runs of one study share their held-out text: tokenized once per process
        _HELDOUT.clear()
        _HELDOUT[key] = prepare_data(data_settings, tokenizer=run.tokenizer, heldout_only=True, progress=False)
    data = _HELDOUT[key]
    check_same_text(run_dir, run.settings, data)  # the corpus checked before the weights load
    with transformers_progress_bars(progress):
        model = load_model(run).eval().to(device)
    objective = objective_of(run.config)
    ids, labels = heldout_batches(
        data.heldout, run.tokenizer, objective, run.settings.get("train", {}).get("eval_seed", 1234)
    )

    def score(m):
        with torch.no_grad():
            return evaluate_lm(m, ids, labels, objective=objective)["loss"]

    extra, maps = {}, None
    if method == "realisable":
        train = prepare_data(data_settings, tokenizer=run.tokenizer, progress=False).train
        train = train[: max(1, math.ceil(positive_int("fit_tokens", fit_tokens) / train.shape[1]))]
        fit_ids, _ = heldout_batches(
            train, run.tokenizer, objective, run.settings.get("train", {}).get("eval_seed", 1234)
        )
        maps = fit_head_maps(model, fit_ids, attention_modules(model, ids))
        extra = {"fit_tokens": int(fit_ids.numel())}
    curve = rank_curve(model, score, ids, ranks, progress, per_layer, method=method, maps=maps)
    return (
        curve
        | extra
        | {
            "run": str(run_dir),
            "name": Path(run_dir).name,
            "seed": run.settings.get("train", {}).get("seed"),
            "objective": objective,
            "scored_tokens": int((labels != -100).sum()) - (ids.shape[0] if objective == "clm" else 0),
        }
    )


TOLERANCES = (0.01, 0.002)  # nats: the two bands the command reads every curve at


def summarise(curves: list[dict], band: float | None = None, tolerances=()) -> list[dict]:
    """Each curve with its ``band`` (``band`` if given; else the sample standard deviation of the
    full-rank loss over the runs of the same name and method, the seed-to-seed spread, when there are
    at least two; else :data:`DEFAULT_BAND`), ``band_source``, ``needed`` ({setting:
    :func:`needed_rank`} at the band) and ``needed_at`` ({tolerance: {setting: needed rank}} for each
    of ``tolerances``, nats). A curve without ``method`` was cut the lookahead way."""
    out = []
    for c in curves:
        method = c.get("method", "lookahead")
        fulls = [d["full"] for d in curves if d["name"] == c["name"] and d.get("method", "lookahead") == method]
        if band is not None:
            width, source = float(band), "given"
        elif len(fulls) >= 2:
            mean = sum(fulls) / len(fulls)
            width = math.sqrt(sum((f - mean) ** 2 for f in fulls) / (len(fulls) - 1))
            source = f"seed spread of the full-rank loss over {len(fulls)} runs"
        else:
            width, source = DEFAULT_BAND, "default (one run)"

        def needed(width, c=c):
            return {
                s: needed_rank({int(k): v for k, v in losses.items()}, c["full"], width, _uniform(c, s))
                for s, losses in c["curves"].items()
            }

        extra = {"needed_at": {f"{t:g}": needed(t) for t in tolerances}} if tolerances else {}
        out.append(c | {"band": width, "band_source": source, "needed": needed(width)} | extra)
    return out


def _uniform(curve: dict, setting: str) -> float | None:
    """The measured loss at k = 0 of a curve's setting: ``uniform`` for "all" (every layer's heads uniform),
    ``uniform_layers[i]`` for "layer i" alone (None in results scored before layers alone were scored at k = 0)."""
    if setting == "all":
        return curve.get("uniform")
    layers = curve.get("uniform_layers") or []
    i = int(setting.split()[-1])
    return layers[i] if i < len(layers) else None


def needed_band(results: list[dict]) -> list[dict]:
    """One row per run: the needed rank as the band from the oracle to the realisable cut.

    Returns:
        ``[{"run", "name", "seed", "head_dims", "seq_len", "full", "attention_gain", "band", "needed":
        {tolerance: {setting: [oracle, realisable]}}}]`` (tolerances from ``needed_at`` and "band",
        the run's band); the oracle's needed rank is the optimistic low end (the best fit of the visible
        logits that ALS reaches, per sequence and not causal: no proven bound on the loss), the realisable
        cut's is reached by a model with queries and keys of that size.
    """
    rows = {}
    for r in results:
        row = rows.setdefault(
            r["run"],
            {k: r[k] for k in ("run", "name", "seed", "head_dims", "seq_len", "full", "attention_gain", "band")}
            | {"needed": {}},
        )
        method = r.get("method", "lookahead")
        for tol, needed in list(r.get("needed_at", {}).items()) + [("band", r["needed"])]:
            for setting, k in needed.items():
                row["needed"].setdefault(tol, {}).setdefault(setting, {})[method] = k
    for row in rows.values():
        for tol in row["needed"].values():
            for setting, by in tol.items():
                tol[setting] = [by.get("oracle"), by.get("realisable")]
    return list(rows.values())


def report_markdown(results: list[dict], command: str) -> str:
    """The table of needed ranks: one row per run, each as oracle – realisable (:func:`needed_band`)."""
    rows = needed_band(results)
    tolerances = [t for t in rows[0]["needed"] if t != "band"] + ["band"]
    settings = sorted({s for r in rows for s in r["needed"]["band"]}, key=lambda s: (s != "all", s))
    if any(r.get("uniform_layers") for r in results):  # each layer alone scored at k = 0 too
        zero = [
            "full-rank loss where a model has several seeds); 0 where uniform attention (k = 0, in all layers or in",
            "the layer alone) is within it. *Attention gain*: uniform attention over the visible keys (k = 0) minus",
            "the full-rank loss.",
        ]
    else:  # results scored before: k = 0 with all layers cut only
        zero = [
            "full-rank loss where a model has several seeds); 0 with all layers cut where uniform attention is",
            "within it. *Attention gain*: uniform attention over the visible keys (k = 0) minus the full-rank loss.",
        ]
    lines = [
        "# Rank intervention: the logit rank each trained model needs",
        "",
        "Each head's logits cut to rank k (k = 1 .. d_p), in one layer or in all layers, and the held-out loss",
        "scored again, two ways. *Oracle*: per sequence, the best rank-k fit of each head's logits over the keys",
        "each query may see (a decoder's future keys cost no rank), up to a per-query shift the softmax ignores.",
        "It is not causal: the fit's factors are shared by all of a sequence's queries, so its logits at a",
        "position depend on later tokens too. It is an optimistic bound that no causal model (no fixed weights)",
        "realises: the low end (a least-squares fit of logits, not a proven bound on the loss).",
        "*Realisable*: each head's queries and keys mapped to size k by maps fitted on training text (the best",
        "rank-k form of q·k in expectation), scored on held-out text: a causal model with query/key heads of",
        "size k exists, so its needed rank is achievable.",
        "*Needed rank*: the smallest k from which the loss stays within a tolerance of the full-rank loss, shown",
        "as oracle – realisable, at fixed tolerances (nats) and at the run's band (the seed-to-seed spread of the",
        *zero,
        "`fixedhead.diagnostics.intervention`.",
        "",
        f"Command: `{command}`",
        "",
        "| run | seed | d_p per layer | n | full-rank loss | band (nats) | "
        + " | ".join(f"needed rank at {t}, {s}" for t in tolerances for s in settings)
        + " | attention gain (uniform − full) |",
        "|" + "---|" * (7 + len(settings) * len(tolerances)),
    ]

    def pair(v):
        return "–".join("none" if x is None else str(x) for x in v)

    for r in rows:
        lines.append(
            f"| {r['run']} | {r['seed']} | {r['head_dims']} | {r['seq_len']} | {r['full']:.4f} | {r['band']:.4f} | "
            + " | ".join(pair(r["needed"][t].get(s, [None, None])) for t in tolerances for s in settings)
            + f" | {r['attention_gain']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def plot_curves(results: list[dict], path) -> None:
    """Loss increase over the full-rank loss against k: one panel per model name; the oracle solid,
    the realisable cut dashed, one colour per setting (all layers, each layer), one line per seed."""
    from ..plotting import pyplot, save_figure

    plt = pyplot()
    names = list(dict.fromkeys(r["name"] for r in results))
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        runs = [r for r in results if r["name"] == name]
        seen = set()
        for r in runs:
            method = r.get("method", "lookahead")
            for setting, losses in r["curves"].items():
                ks = sorted(int(k) for k in losses)
                ys = [max(losses.get(k, losses.get(str(k))) - r["full"], 1e-5) for k in ks]
                style = {"oracle": "-", "realisable": "--"}.get(method, ":")
                label = f"{setting}, {method}" if (setting, method) not in seen else None
                seen.add((setting, method))
                color = f"C{list(r['curves']).index(setting)}"
                ax.plot(ks, ys, style, marker=".", color=color, label=label, alpha=0.8)
        for t in TOLERANCES:
            ax.axhline(t, color="grey", lw=0.8, alpha=0.6)
        ax.set_yscale("log")
        ax.set_xlabel("logit rank k")
        ax.set_ylabel("held-out loss − full-rank loss (nats)")
        ax.set_title(f"{name} (d_p = {runs[0]['head_dims'][0]}, n = {runs[0]['seq_len']})", fontsize=9)
    save_figure(fig, path, axes[0])


@dataclass(frozen=True)
class RankInterventionOptions:
    """How ``fixedhead rank-intervention`` scores each run (its command line)."""

    band: float | None = None
    """tolerance in nats of the needed rank at the run's band (None: the seed spread of the full-rank loss over
    runs of one name, or 0.01 for a single run)"""
    max_eval_tokens: int | None = 32_768
    """held-out tokens scored"""
    tolerances: tuple[float, ...] = TOLERANCES
    """fixed tolerances in nats at which the needed rank is also read"""
    fit_tokens: int = 32_768
    """training tokens the realisable cut's query and key maps are fitted on"""
    ranks: tuple[int, ...] = ()
    """the ranks k tried, each at most the largest query/key head size (empty: every k up to min(d_p, n - 1) where
    that is at most 64, else 1-16 and a geometric grid up to it)"""
    corpus: str | None = None
    """where the runs' training corpus is now, for runs that record none or whose corpus moved (its text must be
    the same)"""


def intervene_runs(
    run_dirs: list,
    output_dir,
    band: float | None = None,
    max_eval_tokens: int | None = RankInterventionOptions.max_eval_tokens,
    overwrite: bool = False,
    progress: bool = True,
    command: str = "",
    tolerances=RankInterventionOptions.tolerances,
    fit_tokens: int = RankInterventionOptions.fit_tokens,
    ranks=RankInterventionOptions.ranks,
    corpus: str | None = RankInterventionOptions.corpus,
) -> list[dict]:
    """:func:`run_rank_curve` of every run, oracle and realisable, then :func:`summarise`; writes
    ``rank_intervention.json`` (with the command and versions, every curve and :func:`needed_band`),
    ``.csv`` (run, seed, method, setting, k, loss), ``.png`` and ``.md`` into ``output_dir``.

    Raises:
        ValueError: no run or one given twice, a ``band`` or tolerance that is not a finite number >= 0, a rank
            that is not an int >= 1, given twice or above a run's largest query/key head size (before any run is
            scored).
        FileExistsError: ``output_dir`` holds something else (see :func:`fixedhead.runs.claim_output_dir`).
    """
    import csv
    import io

    from ..runs import claim_output_dir, environment_info, open_run, write_json_atomic, write_text_atomic

    if not run_dirs:
        raise ValueError("give at least one run directory")
    where = [Path(r).resolve() for r in run_dirs]
    twice = next((r for r, w in zip(run_dirs, where, strict=True) if where.count(w) > 1), None)
    if twice is not None:  # runs of one name are read as seeds of one model
        raise ValueError(f"the run {str(twice)!r} is given twice; it would count as two seeds of its model")
    if band is not None:
        _check_tolerance("band", band)
    for t in tolerances:
        _check_tolerance("tolerances", t)
    check_ranks(ranks)
    positive_int("fit_tokens", fit_tokens)
    for r in run_dirs:  # every run's head sizes before any is scored
        check_ranks(ranks, _largest_qk_head_dim(open_run(r).config), r)
    claim_output_dir(output_dir, (RESULTS_FILE,), OWNED, "rank-intervention", overwrite=overwrite, create=False)
    curves = [
        run_rank_curve(
            r, max_eval_tokens, list(ranks) or None, progress, method=method, fit_tokens=fit_tokens, corpus=corpus
        )
        for r in run_dirs
        for method in ("oracle", "realisable")
    ]
    results = summarise(curves, band, tuple(tolerances))
    out = claim_output_dir(output_dir, (RESULTS_FILE,), OWNED, "rank-intervention", overwrite=overwrite)
    record = {"command": command, "versions": environment_info(), "runs": results, "needed": needed_band(results)}
    write_json_atomic(out / RESULTS_FILE, record)
    table = io.StringIO()
    w = csv.writer(table)
    w.writerow(["run", "seed", "method", "setting", "k", "loss", "increase"])
    for r in results:
        for setting, losses in r["curves"].items():
            for k in sorted(losses, key=int):
                row = [r["run"], r["seed"], r["method"], setting, k, f"{losses[k]:.6f}", f"{losses[k] - r['full']:.6f}"]
                w.writerow(row)
    write_text_atomic(out / "rank_intervention.csv", table.getvalue())
    plot_curves(results, out / "rank_intervention.png")
    write_text_atomic(out / "rank_intervention.md", report_markdown(results, command))
    return results


def _register() -> None:
    """The implementation, and SDPA's mask for it (boolean, None where nothing is hidden but the future): without
    a mask function transformers makes no mask for an implementation, and padding keys would be attended to."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(RANK_IMPLEMENTATION, _truncated_attention)
    AttentionMaskInterface.register(RANK_IMPLEMENTATION, sdpa_mask)


_register()
