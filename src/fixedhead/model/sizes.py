"""Sizes of a model with standard or fixed head size, every formula in one place: parameter counts, FLOPs
(BERT-style encoder or Llama-style decoder) and the ``fixedhead count`` table. The benchmarks read them for
GFLOP/s and MFU, and the paper presets for GPU-hour estimates."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from .checks import in_range, positive_float, positive_int

if TYPE_CHECKING:  # imported where used: `fixedhead count --help` reads CountSizes without transformers
    from .configuration import FixedHeadConfig


def estimate_flops(
    config,
    batch_size: int,
    seq_len: int,
    masked_fraction: float = 0.15,
    training: bool = True,
) -> int:
    """Matrix-multiply FLOPs of one masked-LM step (forward, or forward + backward with ``training``).

    2 FLOPs per multiply-accumulate. With d = hidden_size, i = h·d_p, f = intermediate_size, v = vocab_size,
    l = num_hidden_layers, n = seq_len (padding counts), T = batch_size·n tokens and
    M = round(masked_fraction·T) positions where the MLM output layer runs:

      per layer, per token     2·d·3i       fused q, k, v projection          d → 3i
                               2·i·d        output projection W_o             i → d
                               2·n·i        logits  Q Kᵀ
                               2·n·i        context P V
                               2·2·d·f      feed-forward                      d → f → d
      MLM head, per position   2·d·d        transform dense
                               2·d·v        decoder

      forward = T·l·(8·d·i + 4·n·i + 4·d·f) + M·(2·d² + 2·d·v)

    Per-layer head sizes sum per layer; with ``qk_head_dim`` and ``v_head_dim`` the projection is
    2·d·(2·i_qk + i_v), W_o 2·i_v·d, the logits 2·n·i_qk, the context 2·n·i_v. A ``LlamaConfig`` counts
    separate q, k, v with fewer key/value heads, a SwiGLU feed-forward (2·3·d·f) and no transform. Training is
    3× forward. O(d)-per-token work (LayerNorm, softmax, the optimizer) is not counted: MFU is meant to expose it.
    ``masked_fraction``: 1.0 for full logits or a causal LM.
    """
    positive_int("batch_size", batch_size)
    positive_int("seq_len", seq_len)
    in_range("masked_fraction", masked_fraction, 0.0, 1.0, high_open=False)
    d, f, v, n = config.hidden_size, config.intermediate_size, config.vocab_size, seq_len
    tokens = batch_size * seq_len
    masked = round(masked_fraction * tokens)
    llama = config.model_type == "llama"
    per_token = 0
    head_dims = [config.head_dim] * config.num_hidden_layers if llama else config.layer_head_dims
    qk_dims = head_dims if llama else config.layer_qk_head_dims
    v_dims = head_dims if llama else config.layer_v_head_dims
    for qk, dv in zip(qk_dims, v_dims, strict=True):  # per-layer head sizes: each layer its own i
        h = config.num_attention_heads
        kv_heads = config.num_key_value_heads if llama else h  # keys and values: fewer heads under GQA
        i_qk, i_v = h * qk, h * dv  # queries' and the context's width
        projections = 2 * d * (i_qk + kv_heads * qk + kv_heads * dv)  # q, k, v
        ffn = 3 if llama else 2  # SwiGLU: gate, up and down; GELU: in and out
        per_token += projections + 2 * i_v * d + 2 * n * i_qk + 2 * n * i_v + ffn * 2 * d * f
    forward = tokens * per_token + masked * ((0 if llama else 2 * d * d) + 2 * d * v)
    return 3 * forward if training else forward


def training_flops(config: FixedHeadConfig, tokens: int, seq_len: int) -> float:
    """Training FLOPs for ``tokens`` tokens in sequences of ``seq_len``, with the output layer at every
    position (an upper bound for the masked LM). Within 1% of 6·N·T plus the attention products for the
    paper's presets; an estimate for planning."""
    positive_int("tokens", tokens)
    per_sequence = estimate_flops(config, 1, seq_len, masked_fraction=1.0, training=True)
    return float(per_sequence) * tokens / seq_len


def gpu_hours(flops: float, sustained_tflops: float = 125.0) -> float:
    """FLOPs / sustained throughput, in hours; the default, 125 TFLOP/s, is ~40% of an A100's dense BF16 peak."""
    return flops / (positive_float("sustained_tflops", sustained_tflops) * 1e12) / 3600


# ------------------------------------------------------------------------------ parameter counts
def count_parameters(
    config: FixedHeadConfig, *, pooler: bool = True, mlm_head: bool = True, nsp_head: bool = False
) -> int:
    """Number of trainable parameters of a model with ``config``, without building it.

    With d = hidden_size, i = h·d_p (attention inner size; per layer when ``head_dim`` is a list),
    f = intermediate_size, v = vocab:
      embeddings  v·d + max_positions·d + type_vocab·d + 2d (LayerNorm)
      per layer   3(d·i + i) + (i·d + d)      q, k, v and output projections (4·h·d_p·d + biases:
                                              the paper's stated cost of a fixed head size); with
                                              i_qk = h·d_qk and i_v = h·d_v of their own,
                                              2(d·i_qk + i_qk) + (d·i_v + i_v) + (i_v·d + d)
                  + (d·f + f) + (f·d + d)     feed-forward
                  + 4d                        two LayerNorms
      pooler      d² + d                      (BERT's; ``pooler=True``)
      MLM head    d² + d + 2d + v             transform, LayerNorm, output bias; decoder tied
      NSP head    2d + 2                      (``nsp_head=True``, as in the paper's pretraining)

    Defaults match ``FixedHeadModel`` + pooler + MLM head, BERT as counted in the paper's Tables 1–3 (within
    1% there; exactly ``sum(p.numel())`` in the tests).
    """
    d, v, f = config.hidden_size, config.vocab_size, config.intermediate_size
    total = v * d + config.max_position_embeddings * d + max(config.type_vocab_size, 1) * d + 2 * d
    for qk, dv in zip(config.layer_qk_head_dims, config.layer_v_head_dims, strict=True):
        i_qk, i_v = config.num_attention_heads * qk, config.num_attention_heads * dv
        total += 2 * (d * i_qk + i_qk) + (d * i_v + i_v) + (i_v * d + d) + (d * f + f) + (f * d + d) + 4 * d
    if pooler:
        total += d * d + d
    if mlm_head:
        total += d * d + d + 2 * d + v
    if nsp_head:
        total += 2 * d + 2
    return total


def parameter_count(config) -> int:
    """Trainable parameters of the language model a study trains with ``config`` (a tied matrix once); Llama
    models are built on the meta device and summed."""
    from .configuration import FixedHeadConfig

    if isinstance(config, FixedHeadConfig):
        return count_parameters(config, pooler=False)
    return sum(p.numel() for p in _meta_model(config).parameters())


def _meta_model(config):
    """The config's language model (causal or masked, :func:`objective_of`) built on the meta
    device: parameter shapes without memory or initialisation."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    from .architectures import objective_of

    auto = AutoModelForCausalLM if objective_of(config) == "clm" else AutoModelForMaskedLM
    with torch.device("meta"):
        return auto.from_config(config)


def non_embedding_parameters(config) -> int:
    """N, the parameters outside embedding tables and a tied output layer (Kaplan et al.'s count)."""
    from torch import nn

    model = _meta_model(config)
    embedding = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    output = model.get_output_embeddings()
    untied = output is not None and id(output.weight) not in embedding
    out_params = output.weight.numel() if untied else 0
    return sum(p.numel() for p in model.parameters() if id(p) not in embedding) - out_params


# -------------------------------------------------------------------------------- fixedhead count
def option_names(fields) -> str:
    """``--a, --b``: command-line option names of settings fields, sorted (for messages)."""
    return ", ".join(sorted(f"--{f.replace('_', '-')}" for f in fields))


@dataclass(kw_only=True)
class CountSizes:
    """``fixedhead count``'s options: paper presets, or explicit sizes on BERT-large's depth, vocabulary and
    positions (each field one option; only those given change a preset)."""

    preset: list[str] = field(default_factory=list)
    """paper preset names (default: all of Tables 1-3)"""
    hidden_size: int | None = None
    """d (refused with --preset)"""
    num_attention_heads: int | None = None
    """h (refused with --preset)"""
    head_dim: int | list[int | None] | None = None
    """d_p, or one per layer (refused with --preset)"""
    qk_head_dim: int | None = None
    """queries' and keys' size (refused with --preset)"""
    v_head_dim: int | None = None
    """values' size (refused with --preset)"""
    num_hidden_layers: int = 24
    """layers, or the preset's"""
    intermediate_size: int | None = None
    """feed-forward width, or the preset's (default: 4 x hidden size)"""
    vocab_size: int = 30522
    """vocabulary, or the preset's"""
    max_position_embeddings: int = 512
    """positions, or the preset's"""
    objective: str | None = field(default=None, metadata={"choices": ("mlm", "clm")})
    """count the language model pretraining trains, masked or causal (no pooler; default: BERT with its pooler,
    as the paper counts)"""


#: the sizes of :class:`CountSizes` a preset has too, with their defaults for explicit sizes
COUNT_DEFAULTS = {
    f.name: f.default
    for f in fields(CountSizes)
    if f.name in ("num_hidden_layers", "intermediate_size", "vocab_size", "max_position_embeddings")
}


def count_table(presets: list[str] | None = None, sizes: dict | None = None, objective: str | None = None) -> str:
    """``fixedhead count``: one line for explicit ``sizes``, or a table of paper presets (default: Tables 1–3 and
    the LM1B-style ones) beside the paper's counts.

    ``sizes`` needs ``hidden_size`` and ``num_attention_heads`` (BERT-large's depth, vocabulary and positions
    unless given, f = 4d), or changes a preset's depth, feed-forward, vocabulary and positions (then the paper
    column is left out). ``objective``: None counts BERT as the paper does; ``"mlm"`` / ``"clm"`` the language
    model pretraining trains (no pooler). Raises ValueError naming a size or preset that does not fit.
    """
    from .paper_presets import PAPER_PRESETS, get_preset

    if objective not in (None, "mlm", "clm"):
        raise ValueError(f"objective must be mlm or clm, got {objective!r}")
    counted = {
        None: ("pooler and MLM head included, as the paper counts BERT", {}),
        "mlm": ("FixedHeadForMaskedLM: MLM head, no pooler", {}),
        "clm": ("FixedHeadForCausalLM: LM head, no pooler", {"is_decoder": True}),
    }
    what, causal = counted[objective]
    sizes = dict(sizes or {})
    fixed = [f for f in ("hidden_size", "num_attention_heads", "head_dim", "qk_head_dim", "v_head_dim") if f in sizes]
    overrides = {f: v for f, v in sizes.items() if f in COUNT_DEFAULTS}
    if fixed and presets is not None:
        raise ValueError(f"--preset fixes d, h and d_p; drop {option_names(fixed)} (or drop --preset)")
    if presets is None and sizes:
        for f in ("hidden_size", "num_attention_heads"):  # a bad value is named before what is missing
            if f in sizes:
                positive_int(f, sizes[f])
        missing = [f for f in ("hidden_size", "num_attention_heads") if f not in sizes]
        if missing:
            verb = "needs" if len(sizes) == 1 else "need"
            raise ValueError(f"{option_names(sizes)} also {verb} {option_names(missing)} (or --preset NAME)")
        from .configuration import FixedHeadConfig

        d = sizes["hidden_size"]
        cfg = FixedHeadConfig(**{**COUNT_DEFAULTS, "intermediate_size": 4 * d, **sizes, **causal})
        if "qk_head_dim" in sizes or "v_head_dim" in sizes:  # no head has d_p: name the two sizes each head has
            heads = f"qk_head_dim={_label(cfg.layer_qk_head_dims)}, v_head_dim={_label(cfg.layer_v_head_dims)}"
        else:
            heads = f"d_p={cfg.head_size_label}"
        return (
            f"{count_parameters(cfg, pooler=objective is None):,} parameters: d={cfg.hidden_size}, "
            f"h={cfg.num_attention_heads}, {heads}, {cfg.num_hidden_layers} layers, "
            f"feed-forward {cfg.intermediate_size}, vocabulary {cfg.vocab_size}, "
            f"{cfg.max_position_embeddings} positions ({what})"
        )
    rows = [(name, get_preset(name)) for name in presets or list(PAPER_PRESETS)]  # unknown names refused first
    wn, ws = max(len(n) for n, _ in rows), max(len(p.source) for _, p in rows)  # columns as wide as their names
    lines = [f"{'preset':<{wn}} {'source':<{ws}} {'d':>5} {'h':>3} {'d_p':>4} {'params':>13} {'paper':>6} {'diff':>7}"]
    for name, p in rows:
        cfg = p.build_config(**overrides, **causal)
        n = count_parameters(cfg, pooler=objective is None)
        paper_params = None if overrides or objective else p.paper_params  # the paper counted the preset as it is
        diff = f"{100 * (n / 1e6 - paper_params) / paper_params:+.2f}%" if paper_params else ""
        paper = f"{paper_params:.0f}M" if paper_params else ""
        lines.append(
            f"{name:<{wn}} {p.source:<{ws}} {cfg.hidden_size:>5} {cfg.num_attention_heads:>3} "
            f"{cfg.head_size_label!s:>4} {n:>13,} {paper:>6} {diff:>7}"
        )
    if overrides:
        changed = ", ".join(f"{k}={v}" for k, v in overrides.items())
        lines.append(
            f"({changed} in place of the preset's own; no paper column: the paper counted the presets as published)"
        )
    if objective:
        lines.append(f"({what}; no paper column: the paper counted BERT with its pooler)")
    return "\n".join(lines)


def _label(sizes: list[int]) -> int | list[int]:
    """A per-layer size for reports: the int when every layer has it, else the list."""
    return sizes[0] if len(set(sizes)) == 1 else sizes
