"""``fixedhead shrink``: a run whose queries and keys have size K, the realisable rank-K cut folded into its weights.

The rank intervention's realisable cut (:func:`fixedhead.diagnostics.intervention.fit_head_maps`) maps each head's
scaled queries q̃ = s·q and keys k by fixed maps A, B [d_qk, K] and scores (q̃ᵀA)(Bᵀk). With the new logit
scale s' (1/√K in the standard parametrization) they fold into the fused ``qkv`` rows:

    W_q' = (s/s') Aᵀ W_q,  b_q' = (s/s') Aᵀ b_q,  W_k' = Bᵀ W_k,  b_k' = Bᵀ b_k,

so s'·q'ᵀk' = (q̃ᵀA)(Bᵀk) exactly, with a key cache of h·K numbers per layer and token; values keep their
size. Theorem 1 (Section 3) bounds a head's logit rank by that size. fixedhead's own families only: Llama's
rotary positions act after the projection, so maps fitted on rotated q and k do not fold into its weights.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .checks import non_negative_int, positive_int
from .runs import claim_output_dir, follow_umask, open_run, resolve_local_path, write_json_atomic
from .training.evaluate import load_model
from .training.widen import derived_run_files

SHRINK_FILE = "shrink.json"
SHRINK_OWNED = derived_run_files(SHRINK_FILE)


@dataclass(frozen=True)
class ShrinkOptions:
    """How ``fixedhead shrink`` fits the cut and whether it trains on (its command line)."""

    fit_tokens: int = 32_768
    """training tokens the query and key maps are fitted on"""
    finetune_steps: int = 0
    """optimizer steps of further pretraining on the run's own data after the cut (0: none)"""
    learning_rate: float = 5e-4
    """peak learning rate of that fine-tuning"""
    corpus: str | None = None
    """where the run's training corpus is now, for a run that records none or whose corpus moved (its text must be
    the same)"""


def _attention_layers(model):
    from .model.attention import MultiHeadAttention

    return [m for m in model.modules() if isinstance(m, MultiHeadAttention)]


@torch.no_grad()
def shrink_model(model, maps: list, qk_head_dim: int):
    """A copy of a fixedhead model whose queries and keys have size ``qk_head_dim`` = K (the module docstring).

    ``maps``: one (A, B) per attention layer in module order, each [heads, d_qk, ≥ K], fitted on the scaled
    queries. The copy is in eval mode with the original's dtype and device and ``config.qk_head_dim = K``.

    Raises:
        ValueError: K above a layer's d_qk, ``maps`` not one pair per layer, or a map of another shape (naming
            the layer); the model is left as it was.
    """
    positive_int("qk_head_dim", qk_head_dim)
    old_layers = _attention_layers(model)
    if not old_layers:
        raise ValueError(f"{type(model).__name__} has no fixedhead MultiHeadAttention layers to shrink")
    if len(maps) != len(old_layers):
        raise ValueError(f"maps needs one (A, B) pair per attention layer ({len(old_layers)}), got {len(maps)}")
    sizes = [m.qk_head_dim for m in old_layers]
    if qk_head_dim > min(sizes):
        raise ValueError(
            f"--qk-head-dim {qk_head_dim} is larger than the queries' and keys' size of a layer ({sizes}): "
            "shrink only cuts them"
        )
    names = {id(m): n for n, m in model.named_modules()}
    for i, (old, pair) in enumerate(zip(old_layers, maps, strict=True)):
        h, d_qk = old.num_attention_heads, old.qk_head_dim
        shapes = [tuple(getattr(t, "shape", ())) for t in pair] if isinstance(pair, (tuple, list)) else []
        if len(shapes) != 2 or any(len(s) != 3 or s[:2] != (h, d_qk) or s[2] < qk_head_dim for s in shapes):
            raise ValueError(
                f"maps[{i}] (layer {names[id(old)]}): A and B must each be [{h}, {d_qk}, >= {qk_head_dim}] "
                "(heads, the layer's qk_head_dim, at least the new qk_head_dim), got "
                f"{' and '.join(map(str, shapes)) if shapes else type(pair).__name__}"
            )
    config = copy.deepcopy(model.config)
    config.qk_head_dim = qk_head_dim  # values keep each layer's size (v_head_dim, else the layer's head_dim)
    new = type(model)(config).to(device=model.device, dtype=model.dtype).eval()
    state = model.state_dict()
    new_layers = _attention_layers(new)
    for old, small, (a, b) in zip(old_layers, new_layers, maps, strict=True):
        h, d_qk, v = old.num_attention_heads, old.qk_head_dim, old.v_size
        ratio = old.scale / small.scale
        fold_q = (a[..., :qk_head_dim] * ratio).transpose(-1, -2)  # [h, K, d_qk]
        fold_k = b[..., :qk_head_dim].transpose(-1, -2)
        prefix = names[id(old)] + ".qkv."
        for kind in ("weight", "bias"):
            t = state.get(prefix + kind)
            if t is None:
                continue
            q, k, rest = t.double().split((h * d_qk, h * d_qk, v), dim=0)
            q = (fold_q @ q.reshape(h, d_qk, -1)).reshape(h * qk_head_dim, *t.shape[1:])
            k = (fold_k @ k.reshape(h, d_qk, -1)).reshape(h * qk_head_dim, *t.shape[1:])
            state[prefix + kind] = torch.cat([q, k, rest]).to(t.dtype)
    new.load_state_dict(state)
    return new


def shrink_run(
    run_dir: str | os.PathLike,
    qk_head_dim: int,
    output_dir: str | os.PathLike,
    *,
    fit_tokens: int = ShrinkOptions.fit_tokens,
    finetune_steps: int = ShrinkOptions.finetune_steps,
    learning_rate: float = ShrinkOptions.learning_rate,
    corpus: str | None = ShrinkOptions.corpus,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Cut a run's queries and keys to size K and save the result as a run folder (``fixedhead shrink``).

    Fits the maps on the first ``fit_tokens`` tokens of the training split, folds them in (:func:`shrink_model`)
    and writes the model, tokenizer and ``shrink.json`` (source, sizes, tokens fitted, the source's data
    settings so ``fixedhead evaluate`` scores the source's held-out text; ``corpus``, where given, in place of the
    recorded one); returns that record. With ``finetune_steps`` > 0 the cut model trains on into
    ``output_dir/finetuned``, a pretraining run of its own. ``progress`` False: no bar, transformers' own included.

    Raises:
        ValueError: a Llama or non-pretraining run.
        FileExistsError: ``output_dir`` holds files ``fixedhead shrink`` did not write, or is the run.
    """
    from .data import prepare_data
    from .data.lm import heldout_batches
    from .diagnostics.intervention import attention_modules, fit_head_maps
    from .training.evaluate import check_same_text, recorded_data_settings
    from .training.settings import transformers_progress_bars

    positive_int("qk_head_dim", qk_head_dim)
    positive_int("fit_tokens", fit_tokens)
    non_negative_int("finetune_steps", finetune_steps)
    if not (math.isfinite(learning_rate) and learning_rate > 0):
        raise ValueError(f"learning_rate must be a finite number > 0, got {learning_rate}")
    if Path(output_dir).resolve() == Path(run_dir).resolve():
        raise FileExistsError(f"--output-dir {str(output_dir)!r} is the run being shrunk; choose another folder")
    owned = (*SHRINK_OWNED, "finetuned")
    claim_output_dir(output_dir, (SHRINK_FILE,), owned, "shrink", create=False)  # refuse before the work
    if (Path(output_dir) / SHRINK_FILE).is_file() and not overwrite:
        raise FileExistsError(f"{output_dir} holds an earlier `fixedhead shrink` output; pass --overwrite")
    run = open_run(run_dir)
    if run.config.model_type != "fixedhead":
        raise ValueError(
            f"{run_dir} holds a {run.config.model_type} model; `fixedhead shrink` cuts fixedhead's attention layers "
            "only (transformers' Llama has one head size, and its rotary positions act after the projection the "
            "cut would fold into)"
        )
    kinds = set(run.config.architectures or []) - {"FixedHeadForMaskedLM", "FixedHeadForCausalLM"}
    if kinds:
        raise ValueError(f"{run_dir} holds a {', '.join(sorted(kinds))}; `fixedhead shrink` takes pretraining runs")
    sizes = run.config.layer_qk_head_dims
    if qk_head_dim > min(sizes):
        raise ValueError(f"--qk-head-dim {qk_head_dim} is larger than the run's query/key head sizes {sizes}")
    data_settings = recorded_data_settings(run_dir, run, corpus)  # a run that records no corpus: refused here
    objective = "clm" if run.config.is_decoder else "mlm"
    data = prepare_data(data_settings, tokenizer=run.tokenizer, progress=progress)
    check_same_text(run_dir, run.settings, data)  # the corpus checked before the weights load
    with transformers_progress_bars(progress):
        model = load_model(run).eval()
    seq = data.train.shape[1]
    train = data.train[: max(1, math.ceil(fit_tokens / seq))]
    eval_seed = run.settings.get("train", {}).get("eval_seed", 1234)
    fit_ids, _ = heldout_batches(train, run.tokenizer, objective, eval_seed)  # masked as scored, for an MLM
    maps = fit_head_maps(model, fit_ids, attention_modules(model, fit_ids[:1]))
    small = shrink_model(model, maps, qk_head_dim)
    values = small.config.layer_v_head_dims
    settings = run.settings
    if corpus is not None:  # where the text is now: the shrunk run's own evaluate needs no --corpus
        settings = settings | {"data": settings.get("data", {}) | {"corpus": resolve_local_path(corpus)}}
    record = {
        "source_run": resolve_local_path(run_dir),
        "objective": objective,
        "old_qk_head_dims": sizes,
        "qk_head_dim": qk_head_dim,
        "v_head_dim": values[0] if len(set(values)) == 1 else values,  # kept: one int, or one per layer
        "fit_tokens": int(fit_ids.numel()),
        "source_settings": settings,  # `evaluate` scores the shrunk model on the source's held-out set
    }
    out = claim_output_dir(output_dir, (SHRINK_FILE,), owned, "shrink", overwrite=overwrite)
    write_json_atomic(out / SHRINK_FILE, record)  # the marker first: a failed save can be overwritten
    with transformers_progress_bars(progress):
        small.save_pretrained(str(out), safe_serialization=True)
    follow_umask(out / "model.safetensors")  # safetensors writes 0600
    run.tokenizer.save_pretrained(str(out))
    if finetune_steps:
        tuned = out / "finetuned"
        metrics = train_on(out, data, tuned, finetune_steps, learning_rate, overwrite=overwrite, progress=progress)
        record["finetuned"] = {
            "run": resolve_local_path(out / "finetuned"),
            "steps": finetune_steps,
            "learning_rate": learning_rate,
            "heldout_loss": metrics.get("heldout_loss", metrics.get("eval_loss")),
        }
        write_json_atomic(out / SHRINK_FILE, record)
    return record


def train_on(
    run_dir: str | os.PathLike,
    data,
    output_dir: str | os.PathLike,
    steps: int,
    learning_rate: float,
    *,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Continue ``run_dir``'s model for ``steps`` steps at peak ``learning_rate`` on ``data`` (``pretrain`` with
    ``init_from``, other recorded settings kept) and return the new run's metrics; also the control of a shrunk
    run in ``benchmarks/bench_shrink.py``."""
    from .training.pretrain import pretrain
    from .training.settings import TrainSettings

    run = open_run(run_dir)
    recorded = {k: v for k, v in run.settings.get("train", {}).items() if k in TrainSettings.__dataclass_fields__}
    objective = "clm" if run.config.is_decoder else "mlm"
    steps_settings = {"max_steps": steps, "learning_rate": learning_rate, "objective": objective, "progress": progress}
    steps_settings |= {"eval_steps": max(1, steps // 4), "save_steps": steps}
    settings = TrainSettings(**(recorded | steps_settings))
    return pretrain(None, data, output_dir, settings, overwrite=overwrite, init_from=run_dir)
