"""Widen the heads of a trained model, exactly: d_p → d_p' ≥ d_p with the same function (paper Section 4).

Per head, fused ``qkv`` rows [q | k | v] and ``out_proj`` columns:

* queries: old rows and bias × √(d_p'/d_p), so (c·q)·k / √d_p' = q·k / √d_p; new rows small random, bias 0;
* keys: new rows and bias **zero**, so the new logit terms are 0;
* values: new rows small random, bias 0;
* output projection: new columns **zero**, so the new value dimensions add nothing.

One side of each new product is random, so the zero side gets a gradient at once (zeros on both sides
would stay zero); the key bias never does, since softmax ignores a per-query shift.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

from .attention import MultiHeadAttention
from .checks import positive_float, positive_int


def new_head_dims(old: list[int], head_dim) -> list[int]:
    """The per-layer target sizes; None (as a whole or in a list) keeps a layer's size."""
    if head_dim is None:
        return list(old)
    if isinstance(head_dim, (list, tuple)):
        if len(head_dim) != len(old):
            raise ValueError(
                f"head_dim as a list needs one entry per layer ({len(old)} layers), got {len(head_dim)} "
                f"(head_dim={list(head_dim)!r})"
            )
        targets = list(head_dim)
    else:
        targets = [head_dim] * len(old)
    sizes = []
    for layer, (was, new) in enumerate(zip(old, targets, strict=True)):
        if new is None:
            new = was
        if isinstance(new, bool) or not isinstance(new, int) or new < 1:
            raise ValueError(f"head_dim for layer {layer} must be a positive int (none keeps its size), got {new!r}")
        if new < was:
            raise ValueError(
                f"head_dim={new} for layer {layer} is smaller than its current head size {was}: "
                "widening only grows heads (d_p' >= d_p)"
            )
        sizes.append(new)
    return sizes


@torch.no_grad()
def widen_attention(
    attention: MultiHeadAttention, head_dim: int, init_std: float, generator: torch.Generator | None = None
) -> MultiHeadAttention:
    """A :class:`MultiHeadAttention` with head size ``head_dim`` ≥ ``attention.head_dim`` computing what
    ``attention`` does (the module docstring's construction); new random entries are N(0, init_std²)."""
    h, old, d = attention.num_attention_heads, attention.head_dim, attention.hidden_size
    if head_dim < old:
        raise ValueError(f"head_dim={head_dim} is smaller than the current head size {old}")
    wide = MultiHeadAttention(
        d,
        h,
        head_dim=head_dim,
        dropout=attention.dropout,
        bias=attention.qkv.bias is not None,
        layer_idx=attention.layer_idx,
        config=attention.config,  # the model's attention implementation and causality
    )
    w = attention.qkv.weight
    wide = wide.to(device=w.device, dtype=w.dtype)
    extra = head_dim - old
    c = math.sqrt(head_dim / old)  # (c·q)·k / √d_p' = q·k / √d_p

    def noise(*shape):
        return (torch.randn(*shape, generator=generator, dtype=torch.float32) * init_std).to(w.device, w.dtype)

    # qkv weight [3·h·d_p, d] -> [3, h, d_p, d]: rows of q, k, v per head
    new_w = F.pad(w.view(3, h, old, d), (0, 0, 0, extra))
    new_w[0, :, :old] *= c
    new_w[0, :, old:] = noise(h, extra, d)  # new query rows: random
    # new_w[1, :, old:] stays 0                 new key rows: zero, so the new logit terms are 0
    new_w[2, :, old:] = noise(h, extra, d)  # new value rows: random (out_proj's new columns are 0)
    wide.qkv.weight.copy_(new_w.view(3 * h * head_dim, d))
    if attention.qkv.bias is not None:
        new_b = F.pad(attention.qkv.bias.view(3, h, old), (0, extra))  # new entries of every bias: 0
        new_b[0, :, :old] *= c
        wide.qkv.bias.copy_(new_b.view(-1))
    # out_proj weight [d, h·d_p] -> [d, h, d_p]: new columns zero
    wide.out_proj.weight.copy_(F.pad(attention.out_proj.weight.view(d, h, old), (0, extra)).view(d, h * head_dim))
    if attention.out_proj.bias is not None:
        wide.out_proj.bias.copy_(attention.out_proj.bias)
    wide.train(attention.training)
    return wide


def check_widening(config, head_dim, init_std: float | None = None) -> None:
    """What :func:`widen_heads` would refuse that a fixedhead ``config`` already shows, for a command to refuse
    before it loads any weight: separate query/key and value sizes, a ``head_dim`` below a layer's or a list of
    the wrong length (:func:`new_head_dims`), an ``init_std`` (default ``initializer_range``) that is not a
    positive number. Raises ValueError as :func:`widen_heads` does."""
    if any(getattr(config, f, None) is not None for f in ("qk_head_dim", "v_head_dim")):
        _refuse_separate_sizes(config.layer_qk_head_dims, config.layer_v_head_dims)
    new_head_dims(config.layer_head_dims, head_dim)
    positive_float("init_std", init_std if init_std is not None else config.initializer_range)


def _refuse_separate_sizes(qk_head_dims: list[int], v_head_dims: list[int]):
    """ValueError naming the layers' query/key and value sizes: widening grows the one ``head_dim``."""
    sizes = {"qk_head_dim": sorted(set(qk_head_dims)), "v_head_dim": sorted(set(v_head_dims))}
    shown = ", ".join(f"{f}={s[0] if len(s) == 1 else s}" for f, s in sizes.items())
    raise ValueError(
        f"widening grows head_dim, the one size of queries, keys and values; this model's queries and keys "
        f"and its values have sizes of their own ({shown})"
    )


def widen_heads(model, head_dim, *, init_std: float | None = None, seed: int = 0):
    """A copy of ``model`` whose attention heads are wider and which computes the same function.

    ``head_dim``: the new d_p' for every layer, or a list with one entry per layer (None keeps a layer), each
    ≥ the layer's d_p. ``init_std``: of the new query and value rows (default ``initializer_range``); ``seed``
    seeds them. The copy keeps mode, dtype and device; in float32 eval mode its outputs equal the original's to
    rounding.

    Raises:
        ValueError: a size below a layer's current one (naming the layer), a list of the wrong length, or a
            config with ``qk_head_dim`` / ``v_head_dim`` set (widening grows the one ``head_dim``).
    """
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no fixedhead MultiHeadAttention layers to widen")
    if any(getattr(model.config, f, None) is not None for f in ("qk_head_dim", "v_head_dim")):
        _refuse_separate_sizes([m.qk_head_dim for m in layers], [m.v_head_dim for m in layers])
    old = [m.head_dim for m in layers]
    new = new_head_dims(old, head_dim)
    std = positive_float("init_std", init_std if init_std is not None else model.config.initializer_range)
    generator = torch.Generator().manual_seed(seed)
    wide = copy.deepcopy(model)
    # replace in layer order (module order, as old was read)
    found = [(name, m) for name, m in wide.named_modules() if isinstance(m, MultiHeadAttention)]
    for (name, child), size in zip(found, new, strict=True):
        if size != child.head_dim:
            wide.set_submodule(name, widen_attention(child, size, std, generator))
    if isinstance(head_dim, (list, tuple)):
        wide.config.head_dim = list(new)
    elif head_dim is not None and new != old:
        wide.config.head_dim = new[0]
    return wide


@torch.no_grad()
def widen_feed_forward(model, intermediate_size: int, *, init_std: float | None = None, seed: int = 0):
    """A copy of a fixedhead language model whose feed-forward layers are ``intermediate_size`` wide, computing
    the same function (the parameter-matched control of ``fixedhead widen-experiment``): new input rows
    N(0, init_std²), output columns zero, as in :func:`widen_heads`. Raises ValueError for a narrower size."""
    old = model.config.intermediate_size
    if positive_int("intermediate_size", intermediate_size) < old:
        raise ValueError(f"intermediate_size={intermediate_size} is smaller than the model's {old}")
    std = init_std if init_std is not None else model.config.initializer_range
    generator = torch.Generator().manual_seed(seed)
    config = copy.deepcopy(model.config)
    config.intermediate_size = intermediate_size
    wide = type(model)(config)
    source = model.state_dict()
    state = {}
    for name, target in wide.state_dict().items():
        w = source[name]
        if w.shape == target.shape:
            state[name] = w.clone()
        elif name.endswith("intermediate.weight"):  # [f, d]: new rows random
            new = torch.randn(target.shape[0] - w.shape[0], w.shape[1], generator=generator) * std
            state[name] = torch.cat([w, new.to(w.dtype)])
        elif name.endswith("intermediate.bias"):  # [f]: new entries 0
            state[name] = torch.cat([w, w.new_zeros(target.shape[0] - w.shape[0])])
        elif name.endswith("output.weight"):  # [d, f]: new columns 0
            state[name] = torch.cat([w, w.new_zeros(w.shape[0], target.shape[1] - w.shape[1])], 1)
        else:
            raise ValueError(f"unexpected parameter {name} of shape {tuple(w.shape)} → {tuple(target.shape)}")
    wide.load_state_dict(state)
    wide.train(model.training)
    return wide
