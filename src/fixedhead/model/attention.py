"""Multi-head attention with the head size decoupled from the embedding size.

This is the paper's core object (Bhojanapalli et al., ICML 2020, Sections 2 and 4). In standard
multi-head attention the head size is tied to the embedding size, d_p = d/h; with
``head_dim=None`` this module is exactly that layer (and, inside :mod:`fixedhead.model.modeling`,
numerically identical to transformers' BERT self-attention). With an integer ``head_dim`` it is
the paper's *fixed head size* layer ("FixedMultiHead", Section 4): per head
W_q^i, W_k^i, W_v^i ∈ R^{d_p×d}, logits scaled by 1/√d_p and an output projection
W_o ∈ R^{d×(h·d_p)}, for any number of heads h.

Read :func:`multi_head_attention` first: the equation in 20 lines, a shape at every reshape.
:class:`MultiHeadAttention` is the same computation with biases, dropout, masks (padding and
causal), a key/value cache and fast kernels (chosen in :mod:`fixedhead.model.kernels`); a test checks
that the two agree.

Conventions (batch-first, as in PyTorch): hidden states are [batch, seq, hidden_size]; inside
the layer [batch, heads, seq, head_dim]; attention probabilities are [batch, heads, query, key]
and each *row* sums to 1 — the transpose of the paper's column-stochastic P.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from transformers.cache_utils import Cache

from ..validation import positive_int
from .checks import host_reads_allowed, require_tensor
from .kernels import needs_explicit_bias, scaled_dot_product


def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads: int, padding_mask=None):
    """The paper's multi-head attention as plain tensor code (Eq. 1–2; Section 4 for a fixed d_p).

    head_i(X) = W_v^i X · Softmax[(W_k^i X)ᵀ (W_q^i X) / √d_p],  MultiHead(X) = W_o · Concat_i head_i(X).
    x [batch, n, d]; w_q, w_k, w_v [h·d_p, d] (rows of head i are W^i); w_o [d, h·d_p];
    padding_mask [batch, n] with 1 = token or None. Returns [batch, n, d]. No biases, no dropout:
    :class:`MultiHeadAttention` is this equation plus those, and faster kernels.
    """
    batch, n, d = x.shape  # x: [batch, n, d]
    head_dim = w_q.shape[0] // num_heads  # d_p: free, not tied to d / h

    def per_head(t):  # [batch, n, h·d_p] -> [batch, h, n, d_p]
        return t.view(batch, n, num_heads, head_dim).transpose(1, 2)

    q, k, v = per_head(x @ w_q.T), per_head(x @ w_k.T), per_head(x @ w_v.T)
    logits = q @ k.transpose(-1, -2) / math.sqrt(head_dim)  # [batch, h, n, n]: rank <= d_p (Section 3)
    if padding_mask is not None:  # padding keys get no attention
        logits = logits.masked_fill(padding_mask[:, None, None, :] == 0, float("-inf"))
    probs = logits.softmax(dim=-1)  # [batch, h, query, key]; rows sum to 1
    heads = probs @ v  # [batch, h, n, d_p]
    concat = heads.transpose(1, 2).reshape(batch, n, num_heads * head_dim)  # [batch, n, h·d_p]
    return concat @ w_o.T  # [batch, n, d]


def resolve_head_dim(hidden_size: int, num_attention_heads: int, head_dim: int | None) -> int:
    """Return the per-head size d_p.

    ``head_dim=None`` means the standard tied head size d_p = d/h (paper Section 2), which
    requires ``hidden_size % num_attention_heads == 0``; an int is a fixed head size (Section 4)
    with no divisibility requirement.

    Raises:
        ValueError: a size that is not a positive int (bools and floats included), or standard
            mode with ``hidden_size`` not divisible by ``num_attention_heads``.
    """
    hidden_size = positive_int("hidden_size", hidden_size)
    num_attention_heads = positive_int("num_attention_heads", num_attention_heads)
    if head_dim is None:
        if hidden_size % num_attention_heads != 0:
            raise ValueError(
                f"standard attention (head_dim=None) needs hidden_size divisible by num_attention_heads, "
                f"got hidden_size={hidden_size} and num_attention_heads={num_attention_heads}; "
                f"pass an explicit head_dim for a fixed head size"
            )
        return hidden_size // num_attention_heads
    return positive_int("head_dim", head_dim)


def padding_mask_to_bias(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Turn a transformers padding mask into an additive attention bias.

    Args:
        attention_mask: [batch, seq] with 1 = real token, 0 = padding (any int, bool or float
            dtype holding only 0/1), or None.
        dtype: dtype of the returned bias (the attention logits' dtype).

    Returns:
        None when there is no mask, or when nothing is masked and reading the mask on the host is
        free (eager mode, CPU: see :mod:`fixedhead.model.checks`), so SDPA can take its fastest path;
        otherwise a [batch, 1, 1, seq] tensor, 0 at real keys and ``finfo(dtype).min`` at padding
        (:class:`MultiHeadAttention` clamps it to the min of q's dtype under autocast, so the
        cast cannot make it -inf). Under ``torch.compile``/``torch.export`` and on GPUs a mask is
        always turned into a bias (same results), since asking whether it is all ones would be a
        graph break or a device-to-host synchronisation.
        A query whose keys are all padding then gets a uniform (finite) distribution, never NaN,
        in float32, bfloat16 and under bf16 autocast.

    Raises:
        ValueError: a mask that is not 2-D, is complex, or holds values other than 0 and 1
            (an additive 0/-inf mask, say); the message names the first bad value (the value
            check runs where host reads are free, see :mod:`fixedhead.model.checks`).
        TypeError: a mask that is not a tensor.
    """
    if attention_mask is None:
        return None
    require_tensor("attention_mask", attention_mask)
    if attention_mask.dim() != 2:
        raise ValueError(
            "attention_mask must be [batch, seq] with 1 = token and 0 = padding, "
            f"got shape {tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype.is_complex:
        raise ValueError(
            f"attention_mask must be an int, bool or float tensor of 0/1, got dtype {attention_mask.dtype}"
        )
    host = host_reads_allowed(attention_mask)
    if attention_mask.dtype == torch.bool:
        keep = attention_mask
    else:
        if host:
            bad = ~((attention_mask == 0) | (attention_mask == 1))
            if bool(bad.any()):
                # e.g. an additive mask (0 / -inf or -10000) passed where a padding mask belongs
                raise ValueError(
                    f"attention_mask must hold only 0 (padding) and 1 (token), got {attention_mask[bad][0].item()!r} "
                    f"(dtype {attention_mask.dtype})"
                )
        keep = attention_mask != 0
    if host and bool(keep.all()):
        return None
    bias = torch.zeros(keep.shape, dtype=dtype, device=keep.device)
    bias.masked_fill_(~keep, torch.finfo(dtype).min)
    return bias[:, None, None, :]


def _check_attention_bias(bias, batch: int, heads: int, seq: int, keys: int | None = None) -> None:
    """An additive bias must be a float tensor broadcastable to [batch, heads, seq, keys] (metadata only)."""
    require_tensor("attention_bias", bias)
    keys = seq if keys is None else keys
    shape = tuple(bias.shape)
    ok = len(shape) == 4 and shape[3] == keys
    ok = ok and all(s in (1, full) for s, full in zip(shape[:3], (batch, heads, seq), strict=True))
    if not ok:
        raise ValueError(
            f"attention_bias must broadcast to [batch, heads, query, key] = {(batch, heads, seq, keys)} "
            f"(e.g. [batch, 1, 1, keys]), got {shape}"
        )
    if not bias.is_floating_point():
        raise ValueError(f"attention_bias must be an additive float tensor, got dtype {bias.dtype}")


def causal_bias(query_len: int, key_len: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """The additive bias of causal (left-to-right) attention, [1, 1, query_len, key_len].

    Query i is the token at position ``key_len - query_len + i`` (the queries are the last
    ``query_len`` tokens, e.g. new tokens after a key/value cache of ``key_len - query_len``): it
    sees keys at positions up to its own (0) and not after it (``finfo(dtype).min``, finite, so a
    fully masked row gives a uniform distribution, never NaN).

    Raises:
        ValueError: query_len > key_len or a length below 1.
    """
    if not 1 <= query_len <= key_len:
        raise ValueError(f"causal attention needs 1 <= query_len <= key_len, got {query_len} and {key_len}")
    offset = key_len - query_len
    # key j is hidden from query i when j > offset + i: the strict upper triangle, shifted by the cache
    hidden = torch.ones(query_len, key_len, dtype=torch.bool, device=device).triu(diagonal=offset + 1)
    return torch.zeros(query_len, key_len, dtype=dtype, device=device).masked_fill(hidden, torch.finfo(dtype).min)[
        None, None
    ]


class MultiHeadAttention(nn.Module):
    """Self-attention with h heads of size d_p, standard (d_p = d/h) or fixed (any d_p).

    Implements head_i(X) = W_v^i X · Softmax[(W_k^i X)^T (W_q^i X) / √d_p] and
    MultiHead(X) = W_o · Concat_i head_i(X) (paper Eq. 1–2 for d_p = d/h; Section 4 for a fixed
    d_p). q, k and v come from one fused projection hidden_size → 3·h·d_p.

    Args:
        hidden_size: embedding size d.
        num_attention_heads: number of heads h.
        head_dim: head size d_p; None for the standard d/h (then d must be divisible by h).
        dropout: dropout on the attention probabilities (training only).
        bias: whether the projections have biases (BERT: yes).
        layer_idx: this layer's index in a key/value cache (decoders that generate).
        scale: the logit scale; None for 1/√d_p (:mod:`fixedhead.model.parametrization` gives others).

    Raises:
        ValueError: see :func:`resolve_head_dim`; dropout outside [0, 1).
    """

    def __init__(
        self,
        hidden_size: int,
        num_attention_heads: int,
        head_dim: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        layer_idx: int | None = None,
        scale: float | None = None,
    ):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = resolve_head_dim(hidden_size, num_attention_heads, head_dim)
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be a float in [0, 1), got {dropout!r}")
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.inner_size = num_attention_heads * self.head_dim  # h·d_p, not necessarily d
        self.dropout = float(dropout)
        self.scale = 1.0 / math.sqrt(self.head_dim) if scale is None else float(scale)
        self.qkv = nn.Linear(hidden_size, 3 * self.inner_size, bias=bias)
        self.out_proj = nn.Linear(self.inner_size, hidden_size, bias=bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        use_sdpa: bool = True,
        attention_bias: torch.Tensor | None = None,
        is_causal: bool = False,
        cache: Cache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend.

        Args:
            hidden_states: [batch, seq, hidden_size].
            attention_mask: [batch, seq], 1 = token, 0 = padding; or None.
            output_attentions: also return the probabilities (forces the eager path).
            use_sdpa: use ``torch.nn.functional.scaled_dot_product_attention`` (on CPU in
                training with dropout, where SDPA has only its math kernel,
                :class:`~fixedhead.model.kernels.DropoutAttention`, the same computation); False for the
                eager reference path. They agree to float rounding (with dropout: in distribution).
            attention_bias: a precomputed additive bias [batch, 1, 1, seq] from
                :func:`padding_mask_to_bias` (models compute it once for all layers), or any
                float bias broadcastable to [batch, heads, query, key]; overrides ``attention_mask``.
            is_causal: left-to-right attention: a query sees only keys at or before its position
                (:func:`causal_bias`; with no other bias and no cache, SDPA's own causal kernel).
            cache: a transformers key/value ``Cache`` (e.g. ``DynamicCache``): this call's keys and
                values are appended to it under ``layer_idx`` and the queries attend to all of them
                (the queries are then the last tokens; masks and biases cover past + new keys).

        Returns:
            (output [batch, seq, hidden_size], probabilities [batch, heads, query, key] with rows
            summing to 1, or None unless ``output_attentions``).

        Raises:
            ValueError: hidden_states not a float tensor [batch, seq, hidden_size]; an
                attention_mask that is not [batch, seq] (see :func:`padding_mask_to_bias`); an
                attention_bias that is not a float tensor broadcastable to [batch, heads, seq, seq].
        """
        require_tensor("hidden_states", hidden_states)
        if hidden_states.dim() != 3 or hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(
                f"hidden_states must be [batch, seq, {self.hidden_size}], got {tuple(hidden_states.shape)}"
            )
        if not hidden_states.is_floating_point():
            raise ValueError(f"hidden_states must be a floating-point tensor, got dtype {hidden_states.dtype}")
        batch, seq, _ = hidden_states.shape
        past = cache.get_seq_length(self.layer_idx or 0) if cache is not None else 0
        if (
            attention_bias is None
            and attention_mask is not None
            and (tuple(require_tensor("attention_mask", attention_mask).shape) != (batch, past + seq))
        ):
            what = "[batch, seq]" if cache is None else "[batch, cached + new tokens]"
            raise ValueError(
                f"attention_mask must have shape {what} = {(batch, past + seq)}, got {tuple(attention_mask.shape)}"
            )
        # [batch, seq, 3·h·d_p] -> 3 × [batch, h, seq, d_p]
        qkv = self.qkv(hidden_states).view(batch, seq, 3, self.num_attention_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        if cache is not None:
            if self.layer_idx is None:
                raise ValueError("a key/value cache needs the layer's index: build MultiHeadAttention(layer_idx=...)")
            k, v = cache.update(k, v, self.layer_idx)  # [batch, h, past + seq, d_p]
        keys = k.shape[2]
        if attention_bias is None:
            attention_bias = padding_mask_to_bias(attention_mask, hidden_states.dtype)
        else:
            _check_attention_bias(attention_bias, batch, self.num_attention_heads, seq, keys)
        # SDPA's causal kernel applies when nothing else is masked and queries and keys coincide
        sdpa_causal = is_causal and attention_bias is None and keys == seq
        if is_causal and not sdpa_causal:
            causal = causal_bias(seq, keys, hidden_states.dtype, hidden_states.device)
            # either mask hides a key: the minimum of two 0 / finfo.min biases (a sum could overflow)
            attention_bias = causal if attention_bias is None else torch.minimum(attention_bias, causal)
        if attention_bias is not None and attention_bias.dtype != q.dtype:
            # under autocast q is bf16/fp16 while the bias was built in the hidden states' fp32:
            # SDPA wants one dtype, and the fp32 minimum would overflow to -inf in fp16 (NaN rows)
            attention_bias = attention_bias.clamp(min=torch.finfo(q.dtype).min).to(q.dtype)
        dropout_p = self.dropout if self.training else 0.0
        probs = None
        if use_sdpa and not output_attentions:
            if sdpa_causal and needs_explicit_bias(q, dropout_p, self.training, attention_bias):
                attention_bias, sdpa_causal = causal_bias(seq, keys, q.dtype, q.device), False
            context = scaled_dot_product(
                q, k, v, attention_bias, dropout_p, self.scale, sdpa_causal, self.training, self.head_dim
            )
        else:
            if sdpa_causal:  # the eager path applies the causal bias itself
                attention_bias = causal_bias(seq, keys, q.dtype, q.device)
            scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale  # [batch, h, query, key]
            if attention_bias is not None:
                scores = scores + attention_bias
            probs = torch.softmax(scores, dim=-1)
            context = torch.matmul(F.dropout(probs, p=dropout_p, training=self.training), v)
        # [batch, h, seq, d_p] -> [batch, seq, h·d_p]
        context = context.transpose(1, 2).reshape(batch, seq, self.inner_size)
        return self.out_proj(context), (probs if output_attentions else None)

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, num_attention_heads={self.num_attention_heads}, "
            f"head_dim={self.head_dim}, dropout={self.dropout}"
        )
