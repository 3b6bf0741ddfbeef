"""Rank intervention: how much of its heads' logit rank does a trained model need?

Counting the numerical rank of attention logits (:mod:`fixedhead.analysis`) says what rank a head
*has*; this module measures what rank the model *needs*, by intervention. For every head and every
sequence, the logits S = Q Kᵀ · scale ([n queries, n keys]) are replaced before the mask and the
softmax by the best rank-k approximation (Eckart–Young: the k leading singular triplets, in float64)
of the row-centred logits S_c = S (I − 11ᵀ/n). Softmax ignores a per-query shift, so S_c gives the
head's attention exactly, and rank S_c ≤ rank S ≤ d_p (centring is a right multiplication): at
k ≥ d_p nothing changes, and at k < d_p the head keeps only its k strongest logit directions. This is
the shift the theory module removes too (:func:`fixedhead.theory.min_head_dim`, the paper's D_0 in
Theorem 1).

A decoder's logits are truncated over all keys and then masked, so the truncation also spends rank
on entries the query never sees: the rank found this way is an upper bound on the rank of the
visible (lower-triangular) part.

:func:`rank_curve` scores held-out text with the intervention for k = 1 .. d_p in each layer alone
and in all layers together: the loss against k. The rank a layer *needs* is the smallest k whose loss
is within a band of the full-rank loss (:func:`needed_rank`): a tolerance in nats, e.g. the
seed-to-seed spread of the full-rank loss.

Works on fixedhead models and on any transformers model whose attention goes through transformers'
attention interface (Llama-style runs included, grouped key heads repeated per query head, rotary
positions applied before the logits), and on modules built from
:class:`fixedhead.model.attention.MultiHeadAttention` (e.g. the farthest-point task's model).
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from .checks import non_negative_int
from .model.attention import SEPARATE_VALUE_SIZE_IMPLEMENTATIONS

RANK_IMPLEMENTATION = "fixedhead_truncated_logits"  # the attention implementation registered below
SEPARATE_VALUE_SIZE_IMPLEMENTATIONS.add(RANK_IMPLEMENTATION)  # it multiplies by the values it gets, of any size
_RANK_ATTR = "_fixedhead_logit_rank"  # set on the attention modules being truncated (int) for the duration


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


def _truncated_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """An attention implementation (transformers' interface): the module's own product, with the
    logits of a module marked by :func:`truncated_logits` cut to rank k (:func:`truncate_product`)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rank = getattr(module, _RANK_ATTR, None)
    if rank is None:  # a layer left as it is
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=0.0, **kwargs)
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads != heads:  # grouped keys and values: one per query head
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    logits = truncate_product(query.double() * scale, key, rank)  # scaled in float64
    q_len, k_len = logits.shape[-2:]
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        raise ValueError(
            f"the rank intervention takes a tensor mask or none, got {type(attention_mask).__name__} "
            "(use attn_implementation 'sdpa' or 'eager' for the model it is applied to)"
        )
    if attention_mask is not None:
        mask = attention_mask[..., :k_len]
        if mask.dtype == torch.bool:
            logits = logits.masked_fill(~mask, float("-inf"))
        else:
            logits = logits + mask.double().clamp(min=-1e30)
    else:
        causal = kwargs.get("is_causal")
        causal = getattr(module, "is_causal", False) if causal is None else causal
        if causal and q_len > 1:
            future = torch.ones(q_len, k_len, dtype=torch.bool, device=logits.device).triu(k_len - q_len + 1)
            logits = logits.masked_fill(future, float("-inf"))
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
    from .model.attention import MultiHeadAttention

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
def truncated_logits(model, rank: int | None, layers=None, *, modules: list):
    """Inside the block, the attention logits of ``layers`` are cut to rank ``rank`` (:func:`truncate_logits`).

    Args:
        model: a fixedhead model, a transformers model using the attention interface, or a module
            of :class:`~fixedhead.model.attention.MultiHeadAttention` layers.
        rank: k ≥ 1; 0 for uniform attention over the visible keys (what the model loses without
            attention); None for no truncation (the model as it is, through the same code path).
        layers: indices (in call order) of the layers to truncate; None for all.
        modules: the attention modules in call order (:func:`attention_modules`).

    Raises:
        ValueError: a rank that is not an int ≥ 0, a layer index out of range, or a model the
            intervention cannot reach.
    """
    if rank is not None:
        non_negative_int("rank", rank)
    chosen = range(len(modules)) if layers is None else list(layers)
    bad = [i for i in chosen if not (isinstance(i, int) and 0 <= i < len(modules))]
    if bad:
        raise ValueError(f"layers must be indices in [0, {len(modules)}), got {bad}")
    for i in chosen:
        setattr(modules[i], _RANK_ATTR, rank)
    try:
        with _switched(model):
            yield
    finally:
        for m in modules:
            if hasattr(m, _RANK_ATTR):
                delattr(m, _RANK_ATTR)


def default_ranks(head_dim: int, seq_len: int) -> list[int]:
    """Every k from 1 to min(d_p, n − 1) when that is at most 64; beyond, 1–16 then a geometric grid."""
    top = max(1, min(head_dim, seq_len - 1))
    if top <= 64:
        return list(range(1, top + 1))
    grid = set(range(1, 17)) | {round(16 * 2 ** (i / 4)) for i in range(1, 4 * math.ceil(math.log2(top / 16)) + 1)}
    return sorted(k for k in grid | {top} if k <= top)


def needed_rank(losses: dict[int, float], full: float, band: float) -> int | None:
    """The smallest k whose loss is at most ``full + band``, and every larger k too (None when none is).

    Args:
        losses: {k: loss in nats}.
        full: the full-rank loss (nats).
        band: the tolerance (nats, ≥ 0), e.g. the seed-to-seed spread of ``full``.
    """
    if not math.isfinite(band) or band < 0:
        raise ValueError(f"band must be a finite number >= 0, got {band}")
    within = None
    for k in sorted(losses, reverse=True):
        if losses[k] <= full + band:
            within = k
        else:
            break
    return within


def rank_curve(
    model, score, input_ids: torch.Tensor, ranks: list[int] | None = None, progress: bool = True, per_layer: bool = True
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

    Returns:
        ``{"full": the loss with no truncation, "uniform": the loss with every head's attention
        uniform over its visible keys (k = 0 in every layer), "attention_gain": uniform − full (what
        the model gains from attention, nats), "head_dims": [d_p per layer: the size of queries and
        keys, which bounds the logits' rank], "seq_len": n,
        "ranks": [k], "curves": {"all": {k: loss}, "layer 0": {k: loss}, ...}}``; a layer's curve
        stops at its own d_p (beyond it nothing changes).
    """
    from tqdm.auto import tqdm

    modules = attention_modules(model, input_ids)
    head_dims = [_head_dim(m) for m in modules]
    n = int(input_ids.shape[1])
    ranks = ranks or default_ranks(max(head_dims), n)
    with truncated_logits(model, None, modules=modules):
        full = float(score(model))
    with truncated_logits(model, 0, modules=modules):
        uniform = float(score(model))
    settings = [("all", None)] + [(f"layer {i}", [i]) for i in range(len(modules)) if per_layer]
    jobs = [
        (name, layers, k)
        for name, layers in settings
        for k in ranks
        if k < (max(head_dims) if layers is None else head_dims[layers[0]])
    ]
    curves: dict[str, dict[int, float]] = {name: {} for name, _ in settings}
    for name, layers, k in tqdm(jobs, desc="rank intervention", disable=not progress):
        with truncated_logits(model, k, layers, modules=modules):
            curves[name][k] = float(score(model))
    for name, layers in settings:  # at k ≥ d_p the layer is unchanged: its loss is the full one
        top = max(head_dims) if layers is None else head_dims[layers[0]]
        for k in ranks:
            if k >= top:
                curves[name][k] = full
    return {
        "full": full,
        "uniform": uniform,
        "attention_gain": uniform - full,
        "head_dims": head_dims,
        "seq_len": n,
        "ranks": list(ranks),
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
) -> dict:
    """:func:`rank_curve` of a pretraining run (fixedhead or Llama-style, masked or causal) on its own
    held-out documents, scored as ``fixedhead evaluate`` scores them (same split, same fixed masking),
    capped at ``max_eval_tokens`` tokens (None: all), with the model on ``device`` (e.g. ``"cuda"``).

    Returns:
        the curve with ``run`` (the folder), ``name`` (its folder name: the model), ``seed``,
        ``objective`` and ``scored_tokens``.

    Raises:
        FileNotFoundError / ValueError: as :func:`fixedhead.training.evaluate.evaluate_run`.
    """
    from .data import prepare_data
    from .data.lm import heldout_batches
    from .model.architectures import objective_of
    from .runs import open_run
    from .training.evaluate import check_same_text, evaluate_lm, load_model, recorded_data_settings
    from .training.settings import transformers_progress_bars

    run = open_run(run_dir)
    data_settings = recorded_data_settings(run_dir, run, None, max_eval_tokens)
    with transformers_progress_bars(progress):
        model = load_model(run).eval().to(device)
    key = (json.dumps(data_settings.record(), sort_keys=True), run.tokenizer.backend_tokenizer.to_str())
    if key not in _HELDOUT:  # the runs of one study share their held-out text: tokenized once per process
        _HELDOUT.clear()
        _HELDOUT[key] = prepare_data(data_settings, tokenizer=run.tokenizer, heldout_only=True, progress=False)
    data = _HELDOUT[key]
    check_same_text(run_dir, run.settings, data)
    objective = objective_of(run.config)
    ids, labels = heldout_batches(
        data.heldout, run.tokenizer, objective, run.settings.get("train", {}).get("eval_seed", 1234)
    )

    def score(m):
        with torch.no_grad():
            return evaluate_lm(m, ids, labels, objective=objective)["loss"]

    curve = rank_curve(model, score, ids, ranks, progress, per_layer)
    return curve | {
        "run": str(run_dir),
        "name": Path(run_dir).name,
        "seed": run.settings.get("train", {}).get("seed"),
        "objective": objective,
        "scored_tokens": int((labels != -100).sum()) - (ids.shape[0] if objective == "clm" else 0),
    }


def summarise(curves: list[dict], band: float | None = None) -> list[dict]:
    """Each curve with its ``band`` (``band`` if given; else the sample standard deviation of the
    full-rank loss over the runs of the same name, the seed-to-seed spread, when there are at least
    two; else :data:`DEFAULT_BAND`), ``band_source`` and ``needed`` ({setting: :func:`needed_rank`})."""
    out = []
    for c in curves:
        fulls = [d["full"] for d in curves if d["name"] == c["name"]]
        if band is not None:
            width, source = float(band), "given"
        elif len(fulls) >= 2:
            mean = sum(fulls) / len(fulls)
            width = math.sqrt(sum((f - mean) ** 2 for f in fulls) / (len(fulls) - 1))
            source = f"seed spread of the full-rank loss over {len(fulls)} runs"
        else:
            width, source = DEFAULT_BAND, "default (one run)"
        needed = {
            s: needed_rank({int(k): v for k, v in losses.items()}, c["full"], width)
            for s, losses in c["curves"].items()
        }
        out.append(c | {"band": width, "band_source": source, "needed": needed})
    return out


def report_markdown(results: list[dict], command: str) -> str:
    """The table of needed ranks: one row per run."""
    settings = sorted({s for r in results for s in r["needed"]}, key=lambda s: (s != "all", s))
    lines = [
        "# Rank intervention: the logit rank each trained model needs",
        "",
        "Each head's row-centred attention logits cut to their best rank-k approximation (k = 1 .. d_p), in one",
        "layer or in all layers, and the held-out loss scored again. *Needed rank*: the smallest k from which the",
        "loss stays within the band of the full-rank loss (the band: the seed-to-seed spread of the full-rank",
        "loss where a model has several seeds). A decoder's logits are cut over all keys, then masked: an upper",
        "bound on the rank of the visible part. *Attention gain*: the loss with every head's attention made uniform",
        "over the keys it may see (k = 0), minus the full-rank loss: what the model gains from attention at all.",
        "`fixedhead.intervention`.",
        "",
        f"Command: `{command}`",
        "",
        "| run | seed | d_p per layer | n | full-rank loss | band (nats) | "
        + " | ".join(f"needed rank, {s}" for s in settings)
        + " | loss at k = 1, all layers | attention gain (uniform − full) |",
        "|" + "---|" * (8 + len(settings)),
    ]
    for r in results:
        k1 = r["curves"]["all"].get(1, r["curves"]["all"].get("1"))
        lines.append(
            f"| {r['run']} | {r['seed']} | {r['head_dims']} | {r['seq_len']} | {r['full']:.4f} | {r['band']:.4f} | "
            + " | ".join(str(r["needed"].get(s)) for s in settings)
            + f" | {k1:.4f} ({k1 - r['full']:+.3f}) | {r['attention_gain']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def plot_curves(results: list[dict], path) -> None:
    """Loss increase over the full-rank loss against k: one panel per model name; all layers (solid)
    and each layer alone (dashed), one line per seed; the band shaded."""
    from .plotting import pyplot, save_figure

    plt = pyplot()
    names = list(dict.fromkeys(r["name"] for r in results))
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        runs = [r for r in results if r["name"] == name]
        for i, r in enumerate(runs):
            for setting, losses in r["curves"].items():
                ks = sorted(int(k) for k in losses)
                ys = [max(losses.get(k, losses.get(str(k))) - r["full"], 1e-5) for k in ks]
                style = "-" if setting == "all" else "--"
                label = f"{setting}" if i == 0 else None
                ax.plot(ks, ys, style, marker=".", color=f"C{list(r['curves']).index(setting)}", label=label, alpha=0.8)
        ax.axhspan(1e-5, max(runs[0]["band"], 1e-5), color="grey", alpha=0.2, label="band")
        ax.set_yscale("log")
        ax.set_xlabel("logit rank k")
        ax.set_ylabel("held-out loss − full-rank loss (nats)")
        ax.set_title(
            f"{name} (d_p = {runs[0]['head_dims'][0]}, n = {runs[0]['seq_len']}, {len(runs)} seed(s))", fontsize=9
        )
    save_figure(fig, path, axes[0])


@dataclass(frozen=True)
class RankInterventionOptions:
    """How ``fixedhead rank-intervention`` scores each run (its command line)."""

    band: float | None = None
    """tolerance in nats of the needed rank (None: the seed spread of the full-rank loss over runs of one name,
    or 0.01 for a single run)"""
    max_eval_tokens: int | None = 32_768
    """held-out tokens scored"""


def intervene_runs(
    run_dirs: list,
    output_dir,
    band: float | None = None,
    max_eval_tokens: int | None = RankInterventionOptions.max_eval_tokens,
    overwrite: bool = False,
    progress: bool = True,
    command: str = "",
) -> list[dict]:
    """:func:`run_rank_curve` of every run, then :func:`summarise`; writes ``rank_intervention.json``
    (with the command and versions), ``.csv`` (run, setting, k, loss), ``.png`` and ``.md`` into
    ``output_dir``.

    Raises:
        ValueError: no run, a ``band`` that is not a finite number >= 0.
        FileExistsError: ``output_dir`` holds something else (see :func:`fixedhead.runs.claim_output_dir`).
    """
    import csv
    import io

    from .runs import claim_output_dir, environment_info, write_json_atomic, write_text_atomic

    if not run_dirs:
        raise ValueError("give at least one run directory")
    if band is not None and (not math.isfinite(band) or band < 0):
        raise ValueError(f"band must be a finite number >= 0, got {band}")
    claim_output_dir(output_dir, (RESULTS_FILE,), OWNED, "rank-intervention", overwrite=overwrite, create=False)
    curves = [run_rank_curve(r, max_eval_tokens, progress=progress) for r in run_dirs]
    results = summarise(curves, band)
    out = claim_output_dir(output_dir, (RESULTS_FILE,), OWNED, "rank-intervention", overwrite=overwrite)
    write_json_atomic(out / RESULTS_FILE, {"command": command, "versions": environment_info(), "runs": results})
    table = io.StringIO()
    w = csv.writer(table)
    w.writerow(["run", "seed", "setting", "k", "loss", "increase"])
    for r in results:
        for setting, losses in r["curves"].items():
            for k in sorted(losses, key=int):
                w.writerow([r["run"], r["seed"], setting, k, f"{losses[k]:.6f}", f"{losses[k] - r['full']:.6f}"])
    write_text_atomic(out / "rank_intervention.csv", table.getvalue())
    plot_curves(results, out / "rank_intervention.png")
    write_text_atomic(out / "rank_intervention.md", report_markdown(results, command))
    return results


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(RANK_IMPLEMENTATION, _truncated_attention)


_register()
