"""``fixedhead widen``: a pretraining run's language model with wider heads (:func:`fixedhead.widen_heads`),
saved as a new run folder."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..checks import non_negative_int
from ..model.modeling import remote_code_files
from ..model.surgery import check_widening, widen_heads
from ..runs import claim_output_dir, follow_umask, open_run, resolve_local_path, write_json_atomic
from .evaluate import load_model

WIDEN_FILE = "widen.json"


def derived_run_files(marker: str) -> tuple[str, ...]:
    """Every entry a command that writes a run derived from another (``widen``, ``shrink``) puts in its output
    folder: its own record ``marker``, the saved model with its remote code and tokenizer, and temporary files."""
    return (
        marker,
        "config.json",
        "generation_config.json",
        "model.safetensors",
        *remote_code_files(),  # the modeling code save_pretrained writes beside config.json
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "vocab.txt",
        ".*.tmp*",
    )


WIDEN_OWNED = derived_run_files(WIDEN_FILE)


@dataclass(frozen=True)
class WidenOptions:
    """How ``fixedhead widen`` fills the new rows (its command line)."""

    init_std: float | None = None
    """std of the new random rows (default: the run's initialisation std, its config's initializer_range)"""
    seed: int = 0
    """seed of the new random rows"""


def widen_run(
    run_dir: str | os.PathLike,
    head_dim,
    output_dir: str | os.PathLike,
    *,
    init_std: float | None = None,
    seed: int = WidenOptions.seed,
    overwrite: bool = False,
    allow_pickle: bool = False,
) -> dict:
    """Widen the heads of a run's language model and save the model, tokenizer and ``widen.json`` (source, old and
    new head sizes, seed, init_std) to ``output_dir``; returns the record.

    Raises:
        FileExistsError: ``output_dir`` holds files ``fixedhead widen`` did not write.
    """
    non_negative_int("seed", seed)
    if Path(output_dir).resolve() == Path(run_dir).resolve():
        raise FileExistsError(f"--output-dir {str(output_dir)!r} is the run being widened; choose another folder")
    claim_output_dir(output_dir, (WIDEN_FILE,), WIDEN_OWNED, "widen", create=False)  # refuse before the work
    if (Path(output_dir) / WIDEN_FILE).is_file() and not overwrite:
        raise FileExistsError(f"{output_dir} holds an earlier `fixedhead widen` output; pass --overwrite to replace it")
    run = open_run(run_dir, allow_pickle=allow_pickle)
    if run.config.model_type != "fixedhead":
        raise ValueError(
            f"{run_dir} holds a {run.config.model_type} model; `fixedhead widen` grows fixedhead's attention layers "
            f"only (for a Llama model, choose its head_dim when pretraining)"
        )
    kinds = set(run.config.architectures or []) - {"FixedHeadForMaskedLM", "FixedHeadForCausalLM"}
    if kinds:
        raise ValueError(
            f"{run_dir} holds a {', '.join(sorted(kinds))}; `fixedhead widen` takes pretraining runs (masked or "
            f"causal LM). Widen other models in Python with fixedhead.widen_heads(model, head_dim)"
        )
    check_widening(run.config, head_dim, init_std)  # sizes and init_std refused before the weights load
    model = load_model(run)
    old = run.config.layer_head_dims
    wide = widen_heads(model, head_dim, init_std=init_std, seed=seed)
    record = {
        "source_run": resolve_local_path(run_dir),
        "objective": "clm" if run.config.is_decoder else "mlm",
        "old_head_dims": old,
        "new_head_dims": wide.config.layer_head_dims,
        "old_head_dim": run.config.head_dim,
        "new_head_dim": wide.config.head_dim,
        "seed": seed,
        "init_std": init_std if init_std is not None else run.config.initializer_range,
        # the source's data and masking settings: `evaluate` scores the widened model on the same held-out set
        "source_settings": run.settings,
    }
    out = claim_output_dir(output_dir, (WIDEN_FILE,), WIDEN_OWNED, "widen", overwrite=overwrite)
    write_json_atomic(out / WIDEN_FILE, record)  # the marker first: a failed save can be overwritten
    wide.save_pretrained(str(out), safe_serialization=True)
    follow_umask(out / "model.safetensors")  # safetensors writes 0600
    run.tokenizer.save_pretrained(str(out))
    return record
