"""How the attention's logit scale, W_o's initialisation and its learning rate follow the head size d_p.

``"standard"`` is BERT's and the paper's: logits Q Kᵀ / √d_p, every weight from N(0, initializer_range), one
learning rate. ``"mup"`` is the maximal-update parametrization (Yang et al. 2022, "Tensor Programs V", Table 3,
Adam) along d_p only, the attention width being h·d_p at fixed d and h:

* q, k, v projections (fan-in d fixed): unchanged;
* W_o (fan-in h·d_p): initial std and Adam learning rate × base_width / width, width = h·d_p;
* logits × √base_d_p / d_p instead of 1/√d_p (q and k correlate in training, so q·k grows like d_p).

At the base (``mup_base_head_dim``, ``mup_base_num_attention_heads``) the two are the same model.
``attention_scale`` overrides either logit scale; ``query_init="zero"`` starts W_q at zero. ``fixedhead
coordcheck`` measures which keeps the updates flat in d_p.
"""

from __future__ import annotations

import math
import numbers

#: the values of ``FixedHeadConfig.parametrization``
PARAMETRIZATIONS = ("standard", "mup")
#: the values of ``FixedHeadConfig.query_init``
QUERY_INITS = ("normal", "zero")


def check_parametrization(config) -> None:
    """Validate a config's parametrization fields (called by ``FixedHeadConfig``); ValueError naming the field."""
    if config.parametrization not in PARAMETRIZATIONS:
        raise ValueError(f"parametrization must be one of {PARAMETRIZATIONS}, got {config.parametrization!r}")
    if config.query_init not in QUERY_INITS:
        raise ValueError(f"query_init must be one of {QUERY_INITS}, got {config.query_init!r}")
    for name in ("mup_base_head_dim", "mup_base_num_attention_heads"):
        value = getattr(config, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
            raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    if config.parametrization == "mup" and config.mup_base_head_dim is None:
        raise ValueError(
            "parametrization='mup' needs mup_base_head_dim: the head size d_p at which it equals the standard one"
        )
    scale = config.attention_scale
    if scale is not None and (
        isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale <= 0
    ):
        raise ValueError(f"attention_scale must be a positive number or None, got {scale!r}")


def attention_scale(config, head_dim: int) -> float:
    """The logit scale of a layer whose queries and keys have size ``head_dim`` (d_p, or d_qk when it
    differs from the values'): ``attention_scale`` if set, else √base_d_p / d_p under μP, else 1/√d_p."""
    if config.attention_scale is not None:
        return float(config.attention_scale)
    if config.parametrization == "mup":
        base = config.mup_base_head_dim
        return (1.0 / math.sqrt(base)) * (base / head_dim)  # = √base / d_p, exactly 1/√d_p at the base
    return 1.0 / math.sqrt(head_dim)


def output_projection_multiplier(config, head_dim: int) -> float:
    """base_width / width for W_o under μP (width = h·d_p, with ``head_dim`` the size of the values
    W_o reads), 1.0 otherwise: the factor on its initial standard deviation and on its learning rate."""
    if config.parametrization != "mup":
        return 1.0
    base_heads = config.mup_base_num_attention_heads or config.num_attention_heads
    return (base_heads * config.mup_base_head_dim) / (config.num_attention_heads * head_dim)


def learning_rate_multipliers(model) -> dict[str, float]:
    """``{parameter name: factor}`` for the parameters whose learning rate is not the base one (μP's output
    projections; biases keep the base rate, their fan-in is 1); empty under the standard parametrization."""
    from .attention import MultiHeadAttention

    config = getattr(model, "config", None)
    if config is None or getattr(config, "parametrization", "standard") == "standard":
        return {}
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention):
            factor = output_projection_multiplier(config, module.v_head_dim)  # W_o's fan-in is h·d_v
            if factor != 1.0:
                out[f"{name}.out_proj.weight" if name else "out_proj.weight"] = factor
    return out
