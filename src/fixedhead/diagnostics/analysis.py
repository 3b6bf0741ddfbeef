"""Rank and entropy diagnostics of the attention heads of a fixedhead or transformers model (paper Section 3).

Per layer and head, on windows of ``n`` tokens of real text, averaged over windows:

* ``logit_rank``: the numerical rank of S = Q Kᵀ / √d_p (float64, from the model's own q and k), singular
  values above ``rtol · σ_max`` (:data:`DEFAULT_RTOL` = 1e-5, about 100× float32 resolution); rank(S) ≤ d_p.
* ``min_head_dim``: :func:`fixedhead.theory.min_head_dim` of P = softmax(S) at the same ``rtol``, so
  logit_rank − 1 ≤ min_head_dim ≤ logit_rank in exact arithmetic.
* ``entropy``: the mean over queries of −Σ_k P[q, k] ln P[q, k], nats (0: one key; ln n: uniform).

Any model whose attention goes through transformers' attention interface (BERT, GPT-2, Llama, ...; grouped
key heads repeated, rotary models read after the rotation); a decoder's heads are analysed as causal.
"""

from __future__ import annotations

import json
import logging
import math
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..checks import in_range, optional_positive_int, positive_int
from ..data import read_text, text_windows
from ..model.attention import SEPARATE_VALUE_SIZE_IMPLEMENTATIONS
from ..theory import min_head_dim

DEFAULT_RTOL = 1e-5
ANALYSIS_FILE = "analysis.json"
HEATMAP_FILE = "attention_heatmap.png"


# ------------------------------------------------------------------------------ capture q, k
_CAPTURE = "fixedhead_capture"  # the attention implementation that records q and k
SEPARATE_VALUE_SIZE_IMPLEMENTATIONS.add(_CAPTURE)  # it runs SDPA on the values it gets, of any size


@contextmanager
def capture_queries_keys(model):
    """Record every self-attention layer's queries and keys during a forward pass.

    Yields a list each forward fills, in layer order, with ``(q, k, scale, causal)``: q and k [batch, heads, seq,
    qk_head_dim], head i's logits ``q[:, i] @ k[:, i].T · scale``. For the duration the model runs an attention
    implementation that records q and k and then runs SDPA. Raises ValueError for a model with nothing to capture.
    """
    if not (getattr(model, "_supports_attention_backend", False) and hasattr(model, "set_attn_implementation")):
        raise ValueError(
            f"{type(model).__name__} has no attention this analysis can capture (a fixedhead model, or a "
            "transformers model whose attention uses transformers' attention interface)"
        )
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    captured: list = []

    def capture(module, query, key, value, attention_mask, **kwargs):
        heads, kv_heads = query.shape[1], key.shape[1]
        keys = key if kv_heads == heads else key.repeat_interleave(heads // kv_heads, dim=1)
        scale = kwargs.get("scaling")
        scale = float(scale) if scale is not None else query.shape[-1] ** -0.5
        causal = bool(getattr(module, "is_causal", False))
        captured.append((query.detach(), keys.detach(), scale, causal))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(_CAPTURE, capture)
    AttentionMaskInterface.register(_CAPTURE, sdpa_mask)  # SDPA's mask: without one padding keys get attention
    previous = model.config._attn_implementation
    model.set_attn_implementation(_CAPTURE)
    try:
        yield captured
    finally:
        model.set_attn_implementation(previous)


@torch.no_grad()
def attention_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Each layer's pre-softmax logits S = Q Kᵀ · scale for input_ids [batch, seq]: one [batch, heads, query, key]
    float64 tensor per layer. Padding is not applied (the raw bilinear form)."""
    model.eval()
    with capture_queries_keys(model) as captured:
        model(input_ids=input_ids, attention_mask=attention_mask)
    return [torch.matmul(q.double(), k.double().transpose(-1, -2)) * scale for q, k, scale, _ in captured]


# ---------------------------------------------------------------------------- per-head stats
def numerical_rank(matrix: torch.Tensor, rtol: float = DEFAULT_RTOL) -> int:
    """Number of singular values of a 2-D ``matrix`` above ``rtol · σ_max`` (0 for a zero matrix)."""
    in_range("rtol", rtol, 0.0, 1.0, low_open=True)
    from ..theory import numerical_rank as rank  # one definition of numerical rank; refuses a matrix not 2-D

    return rank(matrix.detach().double().cpu().numpy(), rtol)


def head_statistics(logits: torch.Tensor, rtol: float = DEFAULT_RTOL, causal: bool = False) -> dict:
    """``{"logit_rank", "min_head_dim", "entropy" (nats, mean over queries)}`` of one head's [n, n] logits.

    ``causal``: P is the softmax of the lower triangle and ``min_head_dim`` the causal threshold (⌈(n − 1)/2⌉ for
    generic P); ``logit_rank`` stays the raw form's. ``min_head_dim`` is None where P underflows to 0.
    """
    logits = logits.double()
    masked = logits
    if causal:  # keys after the query are not attended to
        future = torch.ones_like(logits, dtype=torch.bool).triu(diagonal=1)
        masked = logits.masked_fill(future, float("-inf"))
    log_p = torch.log_softmax(masked, dim=-1)
    p = log_p.exp()
    entropy = float(-(p * log_p.nan_to_num(neginf=0.0)).sum(-1).mean())
    try:
        # the same relative tolerance as logit_rank: log P carries float64 rounding (≈ eps·ln n) that a
        # float64-level tolerance would count as rank on near-uniform heads
        mhd = int(min_head_dim(p.cpu().numpy(), rtol=rtol, causal=causal))
    except ValueError:  # an attention entry below float64's smallest positive number
        mhd = None
    return {"logit_rank": numerical_rank(logits, rtol), "min_head_dim": mhd, "entropy": entropy}


@dataclass
class AttentionAnalysis:
    """Per-layer, per-head diagnostics averaged over sequences (all lists are [layer][head])."""

    model: str
    model_type: str
    num_layers: int
    num_heads: int
    head_dims: list[int]  # per layer
    seq_len: int  # n
    num_sequences: int
    rtol: float
    logit_rank: list[list[float]]
    logit_rank_max: list[list[int]]
    min_head_dim: list[list[float | None]]
    min_head_dim_max: list[list[int | None]]
    entropy: list[list[float]]
    text: str = ""
    causal: bool = False  # a decoder: min_head_dim is the causal threshold (lower-triangular P)

    def rows(self) -> list[dict]:
        """One dict per (layer, head), as in the printed table."""
        stats = ("logit_rank", "logit_rank_max", "min_head_dim", "min_head_dim_max", "entropy")
        return [
            {"layer": layer, "head": head, "head_dim": d, "rank_cap": min(d, self.seq_len)}
            | {key: getattr(self, key)[layer][head] for key in stats}
            for layer, d in enumerate(self.head_dims[: self.num_layers])
            for head in range(self.num_heads)
        ]

    def summary(self) -> dict:
        """Over all heads: does the low-rank bottleneck bind?

        ``logit_rank``: the mean over heads of each head's mean, ``logit_rank_max`` the largest; ``at_ceiling``: the
        fraction of heads whose mean is within 0.5 of min(d_p, n); ``pattern_rank`` / ``pattern_rank_max``: the same
        for ``min_head_dim`` (None when no head has one).
        """
        rows = self.rows()
        ranks = [r["logit_rank"] for r in rows]
        patterns = [r["min_head_dim"] for r in rows if r["min_head_dim"] is not None]
        return {
            "heads": len(rows),
            "windows": self.num_sequences,
            "rtol": self.rtol,
            "logit_rank": sum(ranks) / len(ranks),
            "logit_rank_max": max(ranks),
            "at_ceiling": sum(r["logit_rank"] >= r["rank_cap"] - 0.5 for r in rows) / len(rows),
            "pattern_rank": sum(patterns) / len(patterns) if patterns else None,
            "pattern_rank_max": max(patterns) if patterns else None,
        }


@torch.no_grad()
def analyze_model(
    model, input_ids: torch.Tensor, rtol: float = DEFAULT_RTOL, batch_size: int = 8, name: str = ""
) -> AttentionAnalysis:
    """Diagnostics of every head of ``model`` on unpadded sequences ``input_ids`` [num_sequences, n], n >= 2."""
    if input_ids.dim() != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] < 2:
        raise ValueError(f"input_ids must be [num_sequences >= 1, n >= 2], got shape {tuple(input_ids.shape)}")
    in_range("rtol", rtol, 0.0, 1.0, low_open=True)
    model.eval()
    device = next(model.parameters()).device
    per_seq = None  # [layer][head] -> list of per-sequence dicts
    head_dims, causal = None, False
    for i in range(0, input_ids.shape[0], batch_size):
        batch = input_ids[i : i + batch_size].to(device)
        with capture_queries_keys(model) as captured:
            model(input_ids=batch, attention_mask=torch.ones_like(batch))
        if per_seq is None:
            per_seq = [[[] for _ in range(q.shape[1])] for q, *_ in captured]
            head_dims = [int(q.shape[-1]) for q, *_ in captured]
            causal = any(c for *_, c in captured)
        for layer, (q, k, scale, layer_causal) in enumerate(captured):
            s = torch.matmul(q.double(), k.double().transpose(-1, -2)) * scale  # [batch, h, n, n]
            for b in range(s.shape[0]):
                for head in range(s.shape[1]):
                    per_seq[layer][head].append(head_statistics(s[b, head], rtol, layer_causal))
    num_heads = {len(h) for h in per_seq}
    if len(num_heads) != 1:
        raise ValueError(f"layers have different head counts {sorted(num_heads)}; not supported")

    def stat(key, fn):  # fn of the per-sequence values that are not None (None where none is)
        values = [[[d[key] for d in head if d[key] is not None] for head in layer] for layer in per_seq]
        return [[fn(v) if v else None for v in layer] for layer in values]

    mean = lambda v: float(np.mean(v))  # noqa: E731
    return AttentionAnalysis(
        model=name or type(model).__name__,
        model_type=getattr(getattr(model, "config", None), "model_type", type(model).__name__),
        num_layers=len(per_seq),
        num_heads=num_heads.pop(),
        head_dims=head_dims,
        seq_len=int(input_ids.shape[1]),
        num_sequences=int(input_ids.shape[0]),
        rtol=rtol,
        logit_rank=stat("logit_rank", mean),
        logit_rank_max=stat("logit_rank", max),
        min_head_dim=stat("min_head_dim", mean),
        min_head_dim_max=stat("min_head_dim", max),
        entropy=stat("entropy", mean),
        causal=causal,
    )


# ----------------------------------------------------------------------- models, text, files
def load_encoder(
    model_path: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None, allow_pickle: bool = False
):
    """``(model, tokenizer)`` from a local fixedhead run (:func:`fixedhead.runs.open_run`) or transformers
    checkpoint (:func:`fixedhead.runs.check_model_dir`), the base model via ``AutoModel`` (heads dropped).

    Raises:
        FileNotFoundError: no tokenizer (the message says to pass ``tokenizer_path``), config or weights.
        ValueError: a checkpoint that lacks encoder weights.
    """
    _, tokenizer, weights = encoder_files(model_path, tokenizer_path, allow_pickle)
    return _encoder_weights(Path(model_path), weights), tokenizer


def encoder_files(
    model_path: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None, allow_pickle: bool = False
):
    """``(config, tokenizer, weights format)`` of what :func:`load_encoder` loads, read without its weights, so a
    command checks its options against the model before the weights load. Raises as :func:`load_encoder`."""
    from transformers import AutoConfig, AutoTokenizer

    from ..runs import check_model_dir, load_json_file, open_run

    path = Path(model_path)
    weights = check_model_dir(path, allow_pickle=allow_pickle)
    if load_json_file(path / "config.json").get("model_type") == "fixedhead" and tokenizer_path is None:
        run = open_run(path, allow_pickle=allow_pickle)
        return run.config, run.tokenizer, run.weights
    tok_path = Path(tokenizer_path) if tokenizer_path is not None else path
    if not any((tok_path / f).is_file() for f in ("tokenizer.json", "vocab.txt", "tokenizer_config.json")):
        raise FileNotFoundError(
            f"{str(tok_path)!r} holds no tokenizer (tokenizer.json or vocab.txt); pass the tokenizer directory"
            " (--tokenizer)"
        )
    return AutoConfig.from_pretrained(str(path)), AutoTokenizer.from_pretrained(str(tok_path)), weights


def _encoder_weights(path: Path, weights: str):
    """The base model of the checkpoint ``path`` in float32 eval mode; ValueError where encoder weights are missing."""
    from transformers import AutoModel

    from ..training.settings import transformers_verbosity

    with transformers_verbosity(logging.ERROR):  # the load report lists the dropped MLM head; missing keys below
        model, info = AutoModel.from_pretrained(
            str(path), output_loading_info=True, dtype=torch.float32, use_safetensors=weights == "safetensors"
        )
    missing = [k for k in info.get("missing_keys", []) if "pooler" not in k]
    if missing:
        raise ValueError(f"{path} lacks encoder weights, e.g. {missing[:3]}; is it a trained checkpoint?")
    return model.eval()


def analyze(
    model_path,
    text_path,
    tokenizer_path=None,
    max_sequences: int = 8,
    max_seq_length: int | None = None,
    rtol: float = DEFAULT_RTOL,
    allow_pickle: bool = False,
) -> AttentionAnalysis:
    """Analyse a local model's heads on a text file (``fixedhead analyze``); n defaults to the model's
    ``max_position_embeddings``, capped at 512. The numbers, the text and its windows are checked before the
    weights load (ValueError, FileNotFoundError)."""
    in_range("rtol", rtol, 0.0, 1.0, low_open=True)
    config, tokenizer, weights = encoder_files(model_path, tokenizer_path, allow_pickle=allow_pickle)
    max_pos = int(config.max_position_embeddings)
    n = max_seq_length if max_seq_length is not None else min(max_pos, 512)
    if n > max_pos:
        raise ValueError(f"max_seq_length={n} exceeds the model's max_position_embeddings={max_pos}")
    ids = text_windows(tokenizer, read_text(text_path), n, max_sequences)
    model = _encoder_weights(Path(model_path), weights)
    result = analyze_model(model, ids, rtol=rtol, name=Path(model_path).name)
    result.text = str(Path(text_path).resolve())  # means the same file from any folder
    return result


def format_table(result: AttentionAnalysis) -> str:
    """The per-head table: layer, head, d_p, rank(S) (mean, max), min_head_dim (mean, max), entropy."""
    n = result.seq_len
    causal = "; causal (decoder) heads: min_d_p is the causal threshold, at most ⌈(n − 1)/2⌉ generically"
    lines = [
        f"{result.model} ({result.model_type}): {result.num_layers} layers × {result.num_heads} heads, "
        f"n = {n} tokens × {result.num_sequences} sequences, rank tolerance {result.rtol:g}·σ_max"
        + (causal if result.causal else ""),
        f"{'layer':>5} {'head':>4} {'d_p':>4} {'cap':>4} {'rank(S)':>8} {'max':>4} {'min_d_p':>8} {'max':>4} "
        f"{'entropy':>8} {'/ln n':>6}",
    ]
    fmt = lambda v, w, p=1: f"{v:>{w}.{p}f}" if v is not None else f"{'-':>{w}}"  # noqa: E731
    for r in result.rows():
        lines.append(
            f"{r['layer']:>5} {r['head']:>4} {r['head_dim']:>4} {r['rank_cap']:>4} {fmt(r['logit_rank'], 8)} "
            f"{r['logit_rank_max']:>4} {fmt(r['min_head_dim'], 8)} "
            f"{(r['min_head_dim_max'] if r['min_head_dim_max'] is not None else '-'):>4} "
            f"{r['entropy']:>8.3f} {r['entropy'] / math.log(n):>6.2f}"
        )
    at_cap = sum(r["logit_rank_max"] >= r["rank_cap"] for r in result.rows())
    s = result.summary()
    lines.append(
        f"heads whose logits reach the rank cap min(d_p, n) on some sequence: {at_cap}/{len(result.rows())}, "
        f"on at least half the sequences: {round(s['at_ceiling'] * s['heads'])}/{s['heads']}; mean rank(S) over "
        f"heads {s['logit_rank']:.1f}; cap = d_p < n means the head is rank-limited (paper Section 3); "
        f"ln n = {math.log(n):.3f} nats"
    )
    return "\n".join(lines)


def plot_heatmap(result: AttentionAnalysis, path: str | os.PathLike) -> Path:
    """Three layer × head heatmaps (rank of logits, min_head_dim, entropy) as a PNG; returns the path."""
    from ..plotting import pyplot, save_figure

    plt = pyplot()
    panels = [
        ("rank of logits S (mean)", result.logit_rank, "viridis"),
        ("min_head_dim of softmax(S) (mean)", result.min_head_dim, "viridis"),
        ("attention entropy (nats)", result.entropy, "magma"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(4 + 1.2 * result.num_heads, 1.5 + 0.7 * result.num_layers), squeeze=False)
    rank_max = max(min(d, result.seq_len) for d in result.head_dims)
    for ax, (title, values, cmap) in zip(axes[0], panels, strict=True):
        grid = np.array([[np.nan if v is None else v for v in row] for row in values], dtype=float)
        vmax = math.log(result.seq_len) if "entropy" in title else rank_max
        im = ax.imshow(grid, cmap=cmap, vmin=0, vmax=vmax, aspect="auto")
        ax.set_title(title, fontsize=9)
        ax.set(xlabel="head", ylabel="layer", xticks=range(result.num_heads), yticks=range(result.num_layers))
        if result.num_heads * result.num_layers <= 400:
            for (i, j), v in np.ndenumerate(grid):
                if not np.isnan(v):
                    label = f"{v:.1f}" if "entropy" in title else f"{v:.0f}"
                    ax.text(
                        j, i, label, ha="center", va="center", fontsize=6, color="white" if v < 0.6 * vmax else "black"
                    )
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(
        f"{result.model}: d_p = {sorted(set(result.head_dims))}, n = {result.seq_len} "
        f"(rank cap min(d_p, n); entropy max ln n = {math.log(result.seq_len):.2f})",
        fontsize=10,
    )
    return save_figure(fig, path)


ANALYSIS_OWNED = (ANALYSIS_FILE, HEATMAP_FILE, f".{ANALYSIS_FILE}.*", f".{HEATMAP_FILE}.*")


def write_analysis(result: AttentionAnalysis, output_dir: str | os.PathLike) -> dict:
    """Write ``analysis.json`` and the heatmap PNG together or not at all; returns ``{"json", "heatmap"}`` paths.

    Raises:
        FileExistsError: ``output_dir`` holds files ``analyze`` did not write.
    """
    from ..runs import claim_output_dir, staged_outputs

    out = claim_output_dir(output_dir, (ANALYSIS_FILE, HEATMAP_FILE), ANALYSIS_OWNED, "analyze")
    with staged_outputs(out) as stage:
        stage(ANALYSIS_FILE).write_text(
            json.dumps({**asdict(result), "table": result.rows(), "summary": result.summary()}, indent=2)
        )
        plot_heatmap(result, stage(HEATMAP_FILE))
    return {"json": out / ANALYSIS_FILE, "heatmap": out / HEATMAP_FILE}


@dataclass(frozen=True)
class AnalyzeOptions:
    """What ``fixedhead analyze`` reads of a text (its command line)."""

    tokenizer: str | None = None
    """tokenizer directory (None: the model's)"""
    max_sequences: int = 8
    """windows of the text to analyse"""
    max_seq_length: int | None = None
    """n (None: the model's max_position_embeddings, at most 512)"""
    rtol: float = DEFAULT_RTOL
    """relative singular-value tolerance of the logit rank"""


def analyze_to_folder(
    model_path,
    text_path,
    output_dir=None,
    max_sequences: int = AnalyzeOptions.max_sequences,
    max_seq_length=None,
    **kw,
):
    """``fixedhead analyze``: check the numbers and refuse an occupied ``output_dir`` (default
    ``runs/analysis/<model folder name>``) before the work, then :func:`analyze` and :func:`write_analysis`."""
    from ..runs import claim_output_dir

    positive_int("max_sequences", max_sequences)
    optional_positive_int("max_seq_length", max_seq_length, minimum=3)
    out = output_dir or Path("runs") / "analysis" / Path(model_path).resolve().name
    claim_output_dir(out, (ANALYSIS_FILE, HEATMAP_FILE), ANALYSIS_OWNED, "analyze", create=False)
    result = analyze(model_path, text_path, max_sequences=max_sequences, max_seq_length=max_seq_length, **kw)
    return result, write_analysis(result, out)
