"""Helpers for the reliability tests: a seconds-long pretraining run on a slice of real text.

Plain functions to import; the shared fixtures (``tiny_prepared``, built on :func:`tiny_data`, and
``one_thread``) are in ``conftest.py``."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from fixedhead.model.configuration import FixedHeadConfig
from fixedhead.studies.kit.recipes import get_recipe
from fixedhead.training import TrainSettings, prepare_data

#: the test suite's runs are the ``tiny`` recipe's (fixedhead.studies.kit.recipes), on a slice of real text
TINY = get_recipe("tiny")


def tiny_data(corpus: Path, cache_dir: Path, **data):
    """The ``tiny`` recipe's data settings on ``corpus`` (``data``: fields to change), prepared."""
    settings = replace(TINY.data, corpus=str(corpus), **data)
    return prepare_data(settings, cache_dir=cache_dir, progress=False)


def tiny_config(**kw) -> FixedHeadConfig:
    """The tiny model: the recipe's shared fields, d = 32 with 4 heads of size 16 (``kw``: changes)."""
    return FixedHeadConfig(**TINY.model_fields(**{**dict(hidden_size=32, num_attention_heads=4, head_dim=16), **kw}))


def tiny_settings(**kw) -> TrainSettings:
    """The ``tiny`` recipe's training settings without progress bars (``kw``: changes)."""
    return replace(TINY.train, progress=False, **kw)


def snapshot(root: Path) -> dict:
    """{relative path: sha256} of every file under ``root`` (to show nothing was changed or added)."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def require_data(*paths) -> None:
    """Skip the calling test where a file of the project's shared data that it reads is absent (a checkout
    without ``../shared/data`` and no ``$FIXEDHEAD_DATA_DIR``), naming what is missing."""
    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        pytest.skip(f"shared data not found: {', '.join(missing)}")
