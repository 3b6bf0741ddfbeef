"""Helpers for the reliability tests: a seconds-long pretraining run on a slice of real text.

Plain functions to import; the shared fixtures (``tiny_prepared``, built on :func:`tiny_data`, and
``one_thread``) are in ``conftest.py``."""

from __future__ import annotations

import hashlib
from pathlib import Path

from fixedhead.model.configuration import FixedHeadConfig
from fixedhead.training import DataSettings, TrainSettings, prepare_data


def tiny_data(corpus: Path, cache_dir: Path):
    return prepare_data(
        DataSettings(
            corpus=str(corpus),
            vocab_size=400,
            max_seq_length=32,
            heldout_fraction=0.1,
            tokenizer_max_chars=None,
            max_eval_tokens=4000,
        ),
        cache_dir=cache_dir,
        progress=False,
    )


def tiny_config(**kw) -> FixedHeadConfig:
    base = dict(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        head_dim=16,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return FixedHeadConfig(**{**base, **kw})


def tiny_settings(**kw) -> TrainSettings:
    base = dict(
        batch_size=16,
        max_steps=20,
        learning_rate=3e-3,
        logging_steps=5,
        eval_steps=10,
        save_steps=5,
        save_total_limit=2,
        report_to=[],
        progress=False,
    )
    return TrainSettings(**{**base, **kw})


def snapshot(root: Path) -> dict:
    """{relative path: sha256} of every file under ``root`` (to show nothing was changed or added)."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
