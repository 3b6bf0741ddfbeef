"""Multi-head attention with the head size decoupled from the embedding size (paper Sections 2 and 4).

``head_dim=None`` is the standard layer, d_p = d/h (numerically BERT's self-attention); an integer
``head_dim`` is the paper's fixed head size layer for any number of heads h. Read
:func:`multi_head_attention` first (the equation, a shape at every reshape); :class:`MultiHeadAttention`
adds biases, dropout, masks, a key/value cache and fast kernels, and a test checks the two agree.
Probabilities are [batch, heads, query, key] with rows summing to 1, the transpose of the paper's P.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

if TYPE_CHECKING:
    from transformers.cache_utils import Cache
    from transformers.configuration_utils import PreTrainedConfig

from transformers.masking_utils import (
    ALL_MASK_ATTENTION_FUNCTIONS,
    bidirectional_mask_function,
    causal_mask_function,
)
from transformers.modeling_utils import AttentionInterface

from .checks import positive_int
from .kernels import FLASH_MAX_HEAD_DIM, additive_mask, causal_bias, causal_mask_when_skipped, sdpa_attention_forward
from .tensor_checks import host_reads_allowed, require_tensor


def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads: int, padding_mask=None):
    """The paper's multi-head attention as plain tensor code (Eq. 1–2; Section 4 for a fixed d_p).

    head_i(X) = W_v^i X · Softmax[(W_k^i X)ᵀ (W_q^i X) / √d_p],  MultiHead(X) = W_o · Concat_i head_i(X).
    x [batch, n, d]; w_q, w_k [h·d_qk, d], w_v [h·d_v, d], w_o [d, h·d_v]; padding_mask [batch, n] with
    1 = token, or None. Returns [batch, n, d].
    """
    batch, n, d = x.shape  # x: [batch, n, d]
    qk_head_dim = w_q.shape[0] // num_heads  # d_p of queries and keys: free, not tied to d / h
    v_head_dim = w_v.shape[0] // num_heads  # d_p of values

    def per_head(t, size):  # [batch, n, h·size] -> [batch, h, n, size]
        return t.view(batch, n, num_heads, size).transpose(1, 2)

    q, k = per_head(x @ w_q.T, qk_head_dim), per_head(x @ w_k.T, qk_head_dim)
    v = per_head(x @ w_v.T, v_head_dim)
    logits = q @ k.transpose(-1, -2) / math.sqrt(qk_head_dim)  # [batch, h, n, n]: rank <= d_qk (Section 3)
    if padding_mask is not None:  # padding keys get no attention
        logits = logits.masked_fill(padding_mask[:, None, None, :] == 0, float("-inf"))
    probs = logits.softmax(dim=-1)  # [batch, h, query, key]; rows sum to 1
    heads = probs @ v  # [batch, h, n, d_v]
    concat = heads.transpose(1, 2).reshape(batch, n, num_heads * v_head_dim)  # [batch, n, h·d_v]
    return concat @ w_o.T  # [batch, n, d]


def resolve_head_dim(hidden_size: int, num_attention_heads: int, head_dim: int | None) -> int:
    """The per-head size d_p: ``head_dim=None`` is d/h (Section 2, d divisible by h), an int a fixed size
    (Section 4). Raises ValueError for a size that is not a positive int or d not divisible by h."""
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


def check_padding_mask(
    attention_mask, batch: int | None = None, keys: int | None = None, what: str = "[batch, seq]"
) -> torch.Tensor:
    """A transformers padding mask [batch, keys] (1 = token, 0 = padding, any real dtype) as bool.

    ``batch``, ``keys``: the expected shape (None: not checked), called ``what`` in the message. The 0/1 check
    runs only where host reads are free (:mod:`fixedhead.model.tensor_checks`).

    Raises:
        ValueError: another shape, or a value other than 0 and 1 (an additive 0/-inf mask, say).
        TypeError: not a tensor.
    """
    require_tensor("attention_mask", attention_mask)
    shape = tuple(attention_mask.shape)
    if batch is not None and keys is not None and shape != (batch, keys):
        raise ValueError(f"attention_mask must have shape {what} = {(batch, keys)}, got {shape}")
    if attention_mask.dim() != 2 or (batch is not None and shape[0] != batch):
        raise ValueError(f"attention_mask must be {what} with 1 = token and 0 = padding, got shape {shape}")
    if attention_mask.dtype.is_complex:
        raise ValueError(
            f"attention_mask must be an int, bool or float tensor of 0/1, got dtype {attention_mask.dtype}"
        )
    if attention_mask.dtype == torch.bool:
        return attention_mask
    if host_reads_allowed(attention_mask):
        bad = ~((attention_mask == 0) | (attention_mask == 1))
        if bool(bad.any()):
            # e.g. an additive mask (0 / -inf or -10000) passed where a padding mask belongs
            raise ValueError(
                f"attention_mask must hold only 0 (padding) and 1 (token), got {attention_mask[bad][0].item()!r} "
                f"(dtype {attention_mask.dtype})"
            )
    return attention_mask != 0


def padding_mask_to_bias(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A padding mask [batch, seq] (or None) as an additive bias [batch, 1, 1, seq] of ``dtype``: 0 at tokens,
    ``finfo(dtype).min`` at padding. None when nothing is masked and reading the mask is free, so SDPA takes
    its fastest path. A query whose keys are all padding gets a uniform distribution, never NaN."""
    if attention_mask is None:
        return None
    keep = check_padding_mask(attention_mask)
    if host_reads_allowed(attention_mask) and bool(keep.all()):
        return None
    return additive_mask(keep, dtype)[:, None, None, :]


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


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scaling·q kᵀ + mask) with dropout, times v, step by step (BERT's ``"eager"``).

    Returns (output [batch, q, heads, d_v], probabilities [batch, heads, q, kv]). The mask may be additive
    float, boolean (True = attend, the ``"sdpa"`` format) or None with ``is_causal``.
    """
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", False)
    if attention_mask is None:
        key, value, attention_mask = causal_mask_when_skipped(query, key, value, is_causal)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling  # [batch, h, query, key]
    if attention_mask is not None:
        scores = scores + additive_mask(attention_mask, scores.dtype)
    probs = torch.softmax(scores, dim=-1)
    context = torch.matmul(F.dropout(probs, p=dropout, training=module.training), value)
    return context.transpose(1, 2).contiguous(), probs


#: transformers' attention interface with ``"sdpa"`` replaced, for these layers only, by
#: :func:`fixedhead.model.kernels.sdpa_attention_forward`; a local instance, so the library-wide registry is
#: untouched. It keeps transformers' name because vLLM's Transformers backend finds attention layers by a
#: local variable assigned from ``ALL_ATTENTION_FUNCTIONS[...]`` in ``forward``.
ALL_ATTENTION_FUNCTIONS = AttentionInterface()
ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa_attention_forward

#: the implementations known to take queries and keys of one size and values of another; the analysis and
#: rank intervention add their own. FlashAttention: :func:`check_flash_head_dim`.
SEPARATE_VALUE_SIZE_KERNELS = ("eager", "sdpa", "flex_attention")  # the ones a user picks
SEPARATE_VALUE_SIZE_IMPLEMENTATIONS = set(SEPARATE_VALUE_SIZE_KERNELS)


def is_flash_attention(attn_implementation: str | None) -> bool:
    """Whether ``attn_implementation`` runs FlashAttention by any route transformers offers (the
    ``flash_attention_*`` names, hub kernels, ``paged|`` variants): transformers' own rule, "flash" in the name."""
    return attn_implementation is not None and "flash" in attn_implementation.lower()


def check_flash_head_dim(attn_implementation: str | None, head_dim: int, v_head_dim: int | None = None) -> None:
    """Refuse FlashAttention for head sizes it cannot take, rather than quietly run something else.

    FlashAttention 2 and 3 take d_p ≤ 256 (a fixed head size may be 512; "sdpa" and "flex_attention" take it,
    docs/head-sizes.md), and transformers pads values to the queries' size, so v_head_dim > head_dim would be
    cut. Reads only the name, before any kernel is loaded.

    Raises:
        ValueError: FlashAttention with ``head_dim`` > 256 or ``v_head_dim`` > ``head_dim``.
    """
    if not is_flash_attention(attn_implementation):
        return
    if head_dim > FLASH_MAX_HEAD_DIM:
        raise ValueError(
            f"attn_implementation={attn_implementation!r} takes head sizes up to {FLASH_MAX_HEAD_DIM} "
            f"(FlashAttention's limit), got head_dim={head_dim}; use attn_implementation='sdpa' (fused "
            f"memory-efficient kernel on CUDA) or 'flex_attention' for this head size"
        )
    if v_head_dim is not None and v_head_dim > head_dim:
        raise ValueError(
            f"attn_implementation={attn_implementation!r} pads values up to the query size, so it takes "
            f"v_head_dim <= qk_head_dim; got qk_head_dim={head_dim}, v_head_dim={v_head_dim}; use "
            f"attn_implementation='sdpa' or 'flex_attention' for these head sizes"
        )


def check_head_dims(attn_implementation: str | None, qk_head_dim: int, v_head_dim: int) -> None:
    """Refuse an implementation that cannot take these query/key and value sizes, by name.

    qk ≠ v runs on :data:`SEPARATE_VALUE_SIZE_IMPLEMENTATIONS` and FlashAttention; a serving engine's own
    attention (vLLM's ``"vllm"``) sizes its cache and kernel from one head size and would compute wrongly.
    None and unregistered names pass (transformers refuses the latter).

    Raises:
        ValueError: naming the implementation and both sizes.
    """
    check_flash_head_dim(attn_implementation, qk_head_dim, v_head_dim)
    if (
        qk_head_dim != v_head_dim
        and attn_implementation in ALL_ATTENTION_FUNCTIONS
        and attn_implementation not in SEPARATE_VALUE_SIZE_IMPLEMENTATIONS
        and not is_flash_attention(attn_implementation)
    ):
        raise ValueError(
            f"attn_implementation={attn_implementation!r} is not known to take queries and keys of one head size "
            f"and values of another (qk_head_dim={qk_head_dim}, v_head_dim={v_head_dim}); those run with "
            f"{', '.join(repr(i) for i in SEPARATE_VALUE_SIZE_KERNELS)} (docs/head-sizes.md)"
        )


class MultiHeadAttention(nn.Module):
    """Self-attention with h heads of size d_p, standard (d_p = d/h) or fixed (any d_p; Eq. 1–2, Section 4).

    Queries and keys may have their own size d_qk, values d_v (both d_p by default); the logits' rank is at most
    d_qk (Theorem 1). One fused ``qkv`` maps hidden_size → h·(2·d_qk + d_v), rows [q | k | v]; the product runs
    through :data:`ALL_ATTENTION_FUNCTIONS`, chosen by ``config._attn_implementation`` at every call (no config:
    "sdpa", bidirectional; ``config.is_decoder`` makes it causal). ``scale``: the logit scale, None for 1/√d_qk.
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
        config: PreTrainedConfig | None = None,
        qk_head_dim: int | None = None,
        v_head_dim: int | None = None,
    ):
        super().__init__()
        self.layer_idx = layer_idx
        self.config = config
        head_dim = resolve_head_dim(hidden_size, num_attention_heads, head_dim)
        self.qk_head_dim = head_dim if qk_head_dim is None else positive_int("qk_head_dim", qk_head_dim)
        self.v_head_dim = head_dim if v_head_dim is None else positive_int("v_head_dim", v_head_dim)
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be a float in [0, 1), got {dropout!r}")
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.qk_size = num_attention_heads * self.qk_head_dim  # h·d_qk: rows of W_q, and of W_k
        self.v_size = num_attention_heads * self.v_head_dim  # h·d_v: rows of W_v, columns of W_o
        self.dropout = float(dropout)
        self.scale = 1.0 / math.sqrt(self.qk_head_dim) if scale is None else float(scale)
        # read by transformers' attention functions (and serving engines) when a call does not say
        self.is_causal = bool(getattr(config, "is_decoder", False))
        self.qkv = nn.Linear(hidden_size, 2 * self.qk_size + self.v_size, bias=bias)
        self.out_proj = nn.Linear(self.v_size, hidden_size, bias=bias)

    @property
    def head_dim(self) -> int:
        """d_p, the one head size of queries, keys and values (ValueError when qk and v sizes differ)."""
        if self.qk_head_dim != self.v_head_dim:
            raise ValueError(
                f"this layer's queries/keys and values have different head sizes (qk_head_dim={self.qk_head_dim}, "
                f"v_head_dim={self.v_head_dim}): read qk_head_dim or v_head_dim"
            )
        return self.qk_head_dim

    @property
    def inner_size(self) -> int:
        """h·d_p, the width of queries, keys and values (ValueError as :attr:`head_dim`)."""
        return self.num_attention_heads * self.head_dim

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        use_sdpa: bool = True,
        attention_bias: torch.Tensor | None = None,
        is_causal: bool | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states [batch, seq, hidden_size] -> (output [batch, seq, hidden_size], probabilities
        [batch, heads, query, key] or None unless ``output_attentions``).

        ``attention_mask``: a padding mask [batch, seq] ([batch, cached + new] with a cache), or a mask already
        prepared by transformers' masking utilities (4-D, a flex ``BlockMask``), used as is. ``attention_bias``:
        additive float, broadcastable to [batch, heads, query, key], overrides the mask. ``use_sdpa=False`` runs
        "eager". ``is_causal`` None: ``config.is_decoder``. ``cache``: keys and values are appended under ``layer_idx``.
        """
        require_tensor("hidden_states", hidden_states)
        if hidden_states.dim() != 3 or hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(
                f"hidden_states must be [batch, seq, {self.hidden_size}], got {tuple(hidden_states.shape)}"
            )
        if not hidden_states.is_floating_point():
            raise ValueError(f"hidden_states must be a floating-point tensor, got dtype {hidden_states.dtype}")
        if cache is not None and self.layer_idx is None:
            raise ValueError("a key/value cache needs the layer's index: build MultiHeadAttention(layer_idx=...)")
        batch, seq, _ = hidden_states.shape
        is_causal = self.is_causal if is_causal is None else bool(is_causal)
        impl = getattr(self.config, "_attn_implementation", None) or "sdpa"
        if output_attentions or not use_sdpa:
            impl = "eager"
        check_head_dims(impl, self.qk_head_dim, self.v_head_dim)
        if (
            attention_bias is None
            and not _is_prepared_mask(attention_mask)
            # the kernel needs a mask made here: from a padding mask, sized by a cache, or flex's causal
            # one (flex has no causal flag); FlashAttention and engines' own kernels take none
            and (attention_mask is not None or cache is not None or (is_causal and impl == "flex_attention"))
            # the kernels transformers makes masks for (FlashAttention takes the padding mask as it is)
            and impl in ALL_MASK_ATTENTION_FUNCTIONS
            and not is_flash_attention(impl)
        ):
            attention_mask = self._mask_from_padding(attention_mask, hidden_states, is_causal, cache, impl)
        h = self.num_attention_heads
        # [batch, seq, h·(2·d_qk + d_v)] -> q, k [batch, h, seq, d_qk] and v [batch, h, seq, d_v]
        q, k, v = self.qkv(hidden_states).split((self.qk_size, self.qk_size, self.v_size), dim=-1)
        q = q.view(batch, seq, h, self.qk_head_dim).transpose(1, 2)
        k = k.view(batch, seq, h, self.qk_head_dim).transpose(1, 2)
        v = v.view(batch, seq, h, self.v_head_dim).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # [batch, h, cached + seq (or the cache size), d_qk / d_v]
        if attention_bias is not None:
            _check_attention_bias(attention_bias, batch, self.num_attention_heads, seq, k.shape[2])
            attention_mask = attention_bias
            if is_causal:
                # either mask hides a key: the minimum of two 0 / finfo.min biases (a sum could overflow)
                causal = causal_bias(seq, k.shape[2], attention_bias.dtype, attention_bias.device)
                attention_mask = torch.minimum(attention_bias, causal)
        if isinstance(attention_mask, torch.Tensor) and attention_mask.is_floating_point():
            attention_mask = additive_mask(attention_mask, q.dtype)  # SDPA wants q's dtype (autocast)
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(impl, eager_attention_forward)
        context, probs = attend(
            self,
            q,
            k,
            v,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scale,
            is_causal=is_causal,
            **kwargs,
        )
        # [batch, seq, h, d_v] -> [batch, seq, h·d_v]
        context = context.reshape(batch, seq, self.v_size)
        return self.out_proj(context), (probs if output_attentions else None)

    def _mask_from_padding(self, padding_mask, hidden_states, is_causal, cache, impl):
        """The kernel's mask from a padding mask (or None): without a cache or causality, the additive bias of
        :func:`padding_mask_to_bias`; otherwise transformers' mask for the kernel, sized by the cache as
        ``create_causal_mask`` sizes it (so a pre-allocated cache's empty slots are hidden)."""
        batch, seq = hidden_states.shape[:2]
        q_offset, kv_length, kv_offset = 0, seq, 0
        if cache is not None:
            past = cache.get_seq_length(self.layer_idx)
            q_offset = cache.get_query_offset(self.layer_idx)
            kv_length, kv_offset = cache.get_mask_sizes(seq, self.layer_idx)
            keys = past + seq if isinstance(past, int) else None  # a static cache counts in a tensor
        else:
            keys = seq
        if padding_mask is not None:
            what = "[batch, seq]" if cache is None else "[batch, cached + new tokens]"
            padding_mask = check_padding_mask(padding_mask, batch, keys, what)
            if cache is None and not is_causal and impl != "flex_attention":  # flex indexes a full mask
                return padding_mask_to_bias(padding_mask, hidden_states.dtype)
        make_mask = ALL_MASK_ATTENTION_FUNCTIONS[impl]
        # a compiled decoding step keeps its mask (transformers' rule: no data-dependent skip there)
        allow_skip = is_causal and not (getattr(cache, "is_compileable", False) and seq == 1)
        return make_mask(
            batch_size=batch,
            q_length=seq,
            kv_length=kv_length,
            q_offset=q_offset,
            kv_offset=kv_offset,
            mask_function=causal_mask_function if is_causal else bidirectional_mask_function,
            attention_mask=padding_mask,
            allow_is_causal_skip=allow_skip,
            allow_is_bidirectional_skip=not is_causal,
            dtype=hidden_states.dtype,
            device=hidden_states.device,
        )

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, num_attention_heads={self.num_attention_heads}, "
            f"qk_head_dim={self.qk_head_dim}, v_head_dim={self.v_head_dim}, dropout={self.dropout}"
        )


def _is_prepared_mask(mask) -> bool:
    """A mask already prepared for a kernel (4-D, or a flex ``BlockMask``), not a padding mask."""
    return isinstance(mask, BlockMask) or (isinstance(mask, torch.Tensor) and mask.dim() == 4)
