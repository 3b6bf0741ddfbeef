"""The arms of ``fixedhead widen-experiment``: each continuation's starting model made from the trained
base (heads widened in some layers, or the feed-forward layers to the same parameter count), each computing
the base's function exactly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch

from ...checks import positive_int
from ...model.sizes import count_parameters
from ...model.surgery import widen_feed_forward
from ...runs import claim_output_dir, follow_umask, resolve_local_path, write_json_atomic
from ...training.evaluate import load_run
from ...training.widen import WIDEN_FILE, widen_run


@dataclass(frozen=True)
class Arm:
    """One way to continue the base: per-layer head sizes (None = keep the layer's) and/or a
    feed-forward width; both None continues the base as it is."""

    name: str
    description: str
    head_dim: tuple[int | None, ...] | None = None
    intermediate_size: int | None = None


def matched_intermediate_size(config, target_params: int) -> int:
    """The feed-forward width (same for every layer, ≥ the config's) whose parameter count is
    nearest to ``target_params`` (counted as :func:`~fixedhead.model.sizes.count_parameters` without
    pooler); ties go to the smaller width."""

    def params(f):
        return count_parameters(replace_config(config, intermediate_size=f), pooler=False)

    f = config.intermediate_size
    while params(f + 1) <= target_params:
        f += 1
    return f + 1 if abs(params(f + 1) - target_params) < abs(params(f) - target_params) else f


def replace_config(config, **fields):
    """A copy of a config with ``fields`` changed."""
    c = copy.deepcopy(config)
    for k, v in fields.items():
        setattr(c, k, v)
    return c


def make_arms(config, wide_head_dim: int, name: str = "wide_head_dim") -> list[Arm]:
    """The arms for a standard-head base ``config``; ValueError for a ``wide_head_dim`` not larger than the
    base's head size."""
    layers = config.num_hidden_layers
    old = config.layer_head_dims
    if positive_int(name, wide_head_dim) <= max(old):
        raise ValueError(
            f"{name}={wide_head_dim} must be larger than the base's head size {max(old)}: "
            "widening to the same size changes nothing"
        )
    w = wide_head_dim
    arms = [
        Arm("as-is", f"the base model as it is (d_p = {old[0]} in every layer)"),
        Arm("wide-all", f"every layer's heads widened to d_p = {w}", head_dim=(w,) * layers),
    ]
    if layers >= 2:
        k = layers // 2
        half = f"{k} layers" if k > 1 else "layer"
        for name, which, dims in (
            ("wide-early", "first", (w,) * k + (None,) * (layers - k)),
            ("wide-late", "last", (None,) * (layers - k) + (w,) * k),
        ):
            arms.append(Arm(name, f"the {which} {half}'s heads widened to d_p = {w}", head_dim=dims))
    wide_params = count_parameters(replace_config(config, head_dim=[w] * layers), pooler=False)
    f = matched_intermediate_size(config, wide_params)
    arms.append(
        Arm(
            "ffn-matched",
            f"heads kept (d_p = {old[0]}); every feed-forward layer widened {config.intermediate_size} → {f}, "
            f"the parameter count of wide-all",
            intermediate_size=f,
        )
    )
    return arms


# --------------------------------------------------------------------------- starting models
def write_start(base_dir: Path, arm: Arm, seed: int, out: Path) -> None:
    """The starting model of ``arm`` for ``seed`` in ``out``: a ``fixedhead widen`` output (heads), or
    the same kind of folder with the feed-forward layers widened; rewritten every time (it is
    deterministic, so a finished continuation's record of its content still matches)."""
    if arm.head_dim is not None:
        widen_run(base_dir, list(arm.head_dim), out, seed=seed, overwrite=True)
        return
    model, tokenizer, settings = load_run(base_dir)
    old, wide = model.config, widen_feed_forward(model, arm.intermediate_size, seed=seed)
    owned = (WIDEN_FILE, "*.json", "*.safetensors", "vocab.txt", ".*.tmp*")
    out = claim_output_dir(out, (WIDEN_FILE,), owned, "widen-experiment", overwrite=True)
    write_json_atomic(
        out / WIDEN_FILE,
        {
            "source_run": resolve_local_path(base_dir),
            "objective": "clm" if old.is_decoder else "mlm",
            "old_head_dims": old.layer_head_dims,
            "new_head_dims": wide.config.layer_head_dims,
            "old_intermediate_size": old.intermediate_size,
            "new_intermediate_size": wide.config.intermediate_size,
            "seed": seed,
            "init_std": old.initializer_range,
            "source_settings": settings,
        },
    )
    wide.save_pretrained(str(out), safe_serialization=True)
    follow_umask(out / "model.safetensors")
    tokenizer.save_pretrained(str(out))


@torch.no_grad()
def max_logit_change(base_model, start_dir: Path, ids: torch.Tensor) -> float:
    """max |Δ logits| between the base and a starting model on ``ids`` (eval mode, float32)."""
    start = load_run(start_dir)[0].eval()
    return float((start(input_ids=ids).logits - base_model(input_ids=ids).logits).abs().max())
