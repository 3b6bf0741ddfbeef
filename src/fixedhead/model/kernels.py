"""Kernel policy for attention: which fused kernel runs, and a faster CPU kernel for training.

Nothing here changes what attention computes beyond rounding; it decides how the product runs: on CUDA,
which SDPA backends a head size allows (a free d_p can leave FlashAttention), and on CPU in training with
attention dropout, where SDPA has only its math kernel, :class:`DropoutAttention`.
:func:`sdpa_attention_forward` is what ``attn_implementation="sdpa"`` runs in fixedhead's layers.
"""

from __future__ import annotations

import warnings

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.integrations.sdpa_attention import sdpa_attention_forward as transformers_sdpa

from .tensor_checks import tracing

# PyTorch's FlashAttention-2 kernel (CUDA) takes head sizes up to 256; its fused kernels want the
# head size a multiple of 8 (16 bytes in half precision) and otherwise pad or refuse it.
FLASH_MAX_HEAD_DIM = 256
FUSED_HEAD_DIM_MULTIPLE = 8
_warned_sdpa: set = set()


def sdpa_backends(
    head_dim: int, device_type: str, v_head_dim: int | None = None
) -> tuple[list[SDPBackend] | None, str | None]:
    """(backends, reason): the SDPA kernels allowed for a head size on a device, and why FlashAttention is out.

    FlashAttention takes d_p ≤ 256 and q, k, v of one size (PyTorch's ``check_head_dim_size_flash``); the fused
    kernels want d_p % 8 == 0; the math kernel builds the [batch, heads, n, n] matrix. On CUDA the backends in
    preference order, ending with ``SDPBackend.MATH`` (reason None when FlashAttention stays in); elsewhere
    ``(None, None)``: PyTorch's own choice.
    """
    if device_type != "cuda":
        return None, None
    v_head_dim = head_dim if v_head_dim is None else v_head_dim
    reasons = []
    if v_head_dim != head_dim:
        reasons.append(f"v_head_dim={v_head_dim} != qk_head_dim={head_dim}; FlashAttention needs one head size")
    sizes = {"head_dim": head_dim} if v_head_dim == head_dim else {"qk_head_dim": head_dim, "v_head_dim": v_head_dim}
    for name, size in sizes.items():
        if size > FLASH_MAX_HEAD_DIM:
            reasons.append(f"{name}={size} > {FLASH_MAX_HEAD_DIM}, the FlashAttention limit")
        if size % FUSED_HEAD_DIM_MULTIPLE != 0:
            reasons.append(
                f"{name}={size} is not a multiple of {FUSED_HEAD_DIM_MULTIPLE}, which the fused kernels "
                f"need (they pad it, with extra copies, or refuse it)"
            )
    if not reasons:
        return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH], None
    return [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH], "; ".join(reasons)


def warn_if_unfused(head_dim: int, device_type: str, v_head_dim: int | None = None) -> list[SDPBackend] | None:
    """:func:`sdpa_backends`, plus one ``UserWarning`` per (head sizes, device) per process, in eager mode only
    (a compiled or exported graph cannot hold a warning)."""
    backends, reason = sdpa_backends(head_dim, device_type, v_head_dim)
    key = (head_dim, device_type) if v_head_dim in (None, head_dim) else (head_dim, v_head_dim, device_type)
    if reason is not None and key not in _warned_sdpa and not tracing():
        _warned_sdpa.add(key)
        warnings.warn(
            f"fixedhead attention on {device_type}: {reason}. FlashAttention is skipped; SDPA uses the "
            f"memory-efficient kernel where it accepts these shapes and dtypes, otherwise the math kernel, "
            f"which materialises the [batch, heads, seq, seq] attention matrix (memory grows as seq²). "
            f"Head sizes that are multiples of 8 and at most {FLASH_MAX_HEAD_DIM} keep the fused kernels.",
            UserWarning,
            stacklevel=3,
        )
    return backends


# ---------------------------------------------------------------------------------------------
# CPU training fast path: attention with dropout
# ---------------------------------------------------------------------------------------------
#
# Attention dropout sends CPU SDPA to its math kernel (the fused CPU kernel has no dropout),
# which scales q and k separately, copies them, runs a "safe" softmax (isneginf, all, where) and
# draws the mask with ``bernoulli_`` (serial, a double per element). At the benchmark size
# (hidden 256, batch 32 × 128 tokens) that costs 32 ms per layer, forward and backward, against
# 24 ms for the kernel below with the same products (same FLOPs). Its mask keeps an element when
# a float32 uniform u in [0, 1) is >= p (probability 1 - p, to 2^-24) and scales kept ones by
# 1 / (1 - p), as ``nn.Dropout`` does; the masks come from PyTorch's default generator
# (reproducible under ``torch.manual_seed``), not the same stream as SDPA's. Used only where it
# pays: CPU, training, p > 0, no autocast.


def _dropout_scale_mask(like: torch.Tensor, p: float) -> torch.Tensor:
    """A tensor like ``like`` of 0 (probability p) and 1 / (1 - p) (probability 1 - p)."""
    return torch.rand_like(like).ge_(p).mul_(1.0 / (1.0 - p))


def use_cpu_fast_path(x: torch.Tensor, p: float, training: bool) -> bool:
    """Whether the CPU dropout-attention kernel applies: CPU, training, 0 < p, plain float, no autocast."""
    return (
        training
        and p > 0.0
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and not torch.is_autocast_enabled("cpu")
    )


class DropoutAttention(torch.autograd.Function):
    """softmax(scale·q kᵀ + bias) with dropout, times v; q, k [batch, heads, seq, d_qk], v [batch, heads, seq, d_v].

    SDPA's math kernel with dropout and the same FLOPs, with a hand-written backward that reads and writes each
    [batch·heads, n, n] matrix as few times as possible. The bias is finite (no all -inf row) and gets no
    gradient; a second backward is refused.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, p, scale):
        b, h, n, dp = q.shape
        m = k.shape[2]
        q3, k3, v3 = q.reshape(b * h, n, dp), k.reshape(b * h, m, dp), v.reshape(b * h, m, v.shape[-1])
        if bias is None:
            scores = torch.bmm(q3, k3.transpose(1, 2)).mul_(scale)
        else:
            scores = torch.baddbmm(bias.expand(b, h, n, m).reshape(b * h, n, m), q3, k3.transpose(1, 2), alpha=scale)
        probs = torch.softmax(scores, dim=-1)
        del scores
        mask = _dropout_scale_mask(probs, p)
        dropped = probs * mask
        ctx.save_for_backward(q3, k3, v3, probs, mask, dropped)
        ctx.scale = scale
        return torch.bmm(dropped, v3).view(b, h, n, v.shape[-1])

    @staticmethod
    @torch.autograd.function.once_differentiable  # the saved probs/mask carry no graph: no double backward
    def backward(ctx, grad):
        q3, k3, v3, probs, mask, dropped = ctx.saved_tensors
        b, h, n, dv = grad.shape
        g3 = grad.reshape(b * h, n, dv)
        grad_v = torch.bmm(dropped.transpose(1, 2), g3)
        grad_dropped = torch.bmm(g3, v3.transpose(1, 2)).mul_(mask)
        grad_scores = torch._softmax_backward_data(grad_dropped, probs, -1, probs.dtype)
        grad_q = torch.bmm(grad_scores, k3).mul_(ctx.scale)
        grad_k = torch.bmm(grad_scores.transpose(1, 2), q3).mul_(ctx.scale)
        return (
            grad_q.view(b, h, n, -1),
            grad_k.view(b, h, -1, q3.shape[-1]),
            grad_v.view(b, h, -1, dv),
            None,
            None,
            None,
        )


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A mask as an additive bias in ``dtype``: bool (True = attend) becomes 0 / ``finfo(dtype).min``; a float
    bias is clamped to ``finfo(dtype).min`` (a float32 minimum overflows to -inf in fp16/bf16 and gives NaN rows)."""
    if mask.dtype == torch.bool:
        return torch.where(mask, torch.zeros((), dtype=dtype, device=mask.device), torch.finfo(dtype).min)
    if mask.dtype != dtype:
        mask = mask.clamp(min=torch.finfo(dtype).min).to(dtype)
    return mask


def causal_bias(query_len: int, key_len: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """The additive causal bias [1, 1, query_len, key_len]: the queries are the last ``query_len`` tokens (after
    a cache of ``key_len - query_len``), each seeing keys up to its own position; masked entries are
    ``finfo(dtype).min``, finite, so a fully masked row is uniform, never NaN."""
    if not 1 <= query_len <= key_len:
        raise ValueError(f"causal attention needs 1 <= query_len <= key_len, got {query_len} and {key_len}")
    # query i sees key j when j <= offset + i: the lower triangle, shifted by the cache
    seen = torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril(diagonal=key_len - query_len)
    return additive_mask(seen, dtype)[None, None]


def causal_mask_when_skipped(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, is_causal: bool):
    """(key, value, bias or None): what transformers' SDPA integration does with ``attention_mask=None`` and
    ``is_causal``, as explicit tensors for kernels without a causal flag.

    transformers skips the causal mask only where SDPA's top-left aligned flag is exact: one query, as many
    queries as keys, or a prefill into an empty pre-allocated cache (whose unused slots are then cut off).
    """
    q_len = query.shape[2]
    if not is_causal or q_len == 1:
        return key, value, None
    return key[:, :, :q_len], value[:, :, :q_len], causal_bias(q_len, q_len, query.dtype, query.device)


def sdpa_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """fixedhead's ``attn_implementation="sdpa"``: transformers' ``sdpa_attention_forward`` (same arguments
    and result, ([batch, q, heads, d_v], None)) with this module's policy around it.

    CPU training with attention dropout (:func:`use_cpu_fast_path`): :class:`DropoutAttention` (a learnable
    float mask keeps SDPA, which gives it a gradient). CUDA: SDPA restricted to :func:`sdpa_backends`, warning
    once when FlashAttention drops out. Otherwise transformers' function as is.
    """
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", False)
    learnable = attention_mask is not None and attention_mask.is_floating_point() and attention_mask.requires_grad
    if use_cpu_fast_path(query, dropout, module.training) and not learnable:
        if attention_mask is None:
            key, value, bias = causal_mask_when_skipped(query, key, value, is_causal)
        else:
            bias = additive_mask(attention_mask, query.dtype)
        out = DropoutAttention.apply(query, key, value, bias, dropout, scaling)
        return out.transpose(1, 2).contiguous(), None
    call = dict(dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs)
    if query.is_cuda:
        with sdpa_kernel(warn_if_unfused(query.shape[-1], "cuda", value.shape[-1]), set_priority=True):
            return transformers_sdpa(module, query, key, value, attention_mask, **call)
    return transformers_sdpa(module, query, key, value, attention_mask, **call)
