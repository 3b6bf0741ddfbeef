"""Model FLOPs of a BERT-style encoder (or a Llama-style decoder) with standard or fixed head size:
every formula in one place.

Used by the benchmarks for achieved GFLOP/s and model-FLOP utilisation (MFU), to predict the
compute cost of the paper's fixed head size (Section 4) relative to the standard d_p = d/h, and
for the GPU-hour estimates of the paper-size presets (:func:`training_flops`, :func:`gpu_hours`).
"""

from __future__ import annotations

from .checks import in_range, positive_float, positive_int
from .configuration import FixedHeadConfig


def estimate_flops(
    config,
    batch_size: int,
    seq_len: int,
    masked_fraction: float = 0.15,
    training: bool = True,
) -> int:
    """Matrix-multiply FLOPs of one masked-LM step (one forward, or forward + backward).

    Counts 2 FLOPs per multiply-accumulate of every matrix product, nothing else. With
    d = hidden_size, i = h·d_p (attention inner size; d for standard heads), f =
    intermediate_size, v = vocab_size, l = num_hidden_layers, n = seq_len, T = batch_size·n
    tokens, and M = round(masked_fraction·T) positions at which the MLM output layer runs:

      per layer, per token     2·d·3i       fused q, k, v projection          d → 3i
                               2·i·d        output projection W_o             i → d
                               2·n·i        logits  Q Kᵀ   (h heads: n keys × d_p each)
                               2·n·i        context P V
                               2·2·d·f      feed-forward, two layers          d → f → d
      MLM head, per position   2·d·d        transform dense
                               2·d·v        decoder (tied to the word embeddings)

      forward = T·l·(8·d·i + 4·n·i + 4·d·f) + M·(2·d² + 2·d·v)

    With per-layer head sizes (``head_dim`` a list) each layer counts its own i and the l·(…) is a sum.

    A Llama config (``LlamaConfig``, :mod:`fixedhead.model.architectures`) counts its own layer and
    head: separate q, k, v projections (the same 2·d·3i for plain multi-head attention, 2·d·(i +
    2·i_kv) with fewer key/value heads), a SwiGLU feed-forward of three matrices (2·3·d·f) and
    no transform before the output layer (2·d·v), which runs wherever the loss or the logits need
    it (``masked_fraction``: 1.0 for a causal LM).

    Training (``training=True``) is 3× forward: the backward of every product ``Y = X·W``
    costs two more of the same size (``dX = dY·Wᵀ`` and ``dW = Xᵀ·dY``); this includes the first
    layer, whose input gradient feeds the trained embeddings, and the two attention products
    (gradients for both operands). Not counted, because they are O(d) per token rather than
    O(d²): embedding lookups, LayerNorm, GELU, softmax, dropout, biases, the loss and the
    optimizer update. Those are real time on a memory-bound machine — which is exactly what
    model-FLOP utilisation is meant to expose.

    ``masked_fraction`` is the fraction of positions where the output layer runs: the masking
    rate for :class:`~fixedhead.model.modeling.FixedHeadForMaskedLM` with labels (it scores only the
    labelled positions), ``1.0`` for full logits (transformers' ``BertForMaskedLM``, or our
    model without labels, e.g. inference). The paper's fixed head size changes only the ``i``
    terms: 8·d·i + 4·n·i per token per layer, against 8·d² + 4·n·d for standard heads.

    Args:
        config: the model configuration.
        batch_size: sequences per step (B ≥ 1).
        seq_len: tokens per sequence (n ≥ 1; padding counts — it is computed).
        masked_fraction: in [0, 1].
        training: forward + backward (3×) if True, forward only if False.

    Returns:
        FLOPs per step, an int.

    Raises:
        ValueError: non-positive batch_size / seq_len, masked_fraction outside [0, 1].
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
    for dp in head_dims:  # per-layer head sizes: each layer its own i
        i = config.num_attention_heads * dp
        i_kv = config.num_key_value_heads * dp if llama else i  # keys and values: fewer heads under GQA
        ffn = 3 if llama else 2  # SwiGLU: gate, up and down; GELU: in and out
        per_token += 2 * d * (i + 2 * i_kv) + 2 * i * d + 2 * n * i + 2 * n * i + ffn * 2 * d * f
    forward = tokens * per_token + masked * ((0 if llama else 2 * d * d) + 2 * d * v)
    return 3 * forward if training else forward


def training_flops(config: FixedHeadConfig, tokens: int, seq_len: int) -> float:
    """Training cost of ``tokens`` tokens in sequences of ``seq_len``, in FLOPs: :func:`estimate_flops`
    of a forward + backward step with the output layer at every position (an upper bound for the
    masked LM, which needs it at ~15%), per token, times ``tokens``. Within 1% of the 6·N·T rule plus
    the attention products for the paper's presets. An estimate for planning, not a measurement.

    Raises:
        ValueError: non-positive ``tokens`` or ``seq_len``.
    """
    positive_int("tokens", tokens)
    per_sequence = estimate_flops(config, 1, seq_len, masked_fraction=1.0, training=True)
    return float(per_sequence) * tokens / seq_len


def gpu_hours(flops: float, sustained_tflops: float = 125.0) -> float:
    """FLOPs / sustained throughput, in hours; the default, 125 TFLOP/s, is ~40% of an A100's dense BF16 peak."""
    return flops / (positive_float("sustained_tflops", sustained_tflops) * 1e12) / 3600
