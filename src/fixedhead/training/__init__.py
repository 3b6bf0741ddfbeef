"""Masked-LM pretraining and evaluation on top of transformers' Trainer."""

from .pretrain import (
    DataSettings,
    PreparedData,
    TrainSettings,
    evaluate_mlm,
    evaluate_run,
    evaluate_text,
    fixed_masking,
    load_run,
    prepare_data,
    pretrain,
    source_data,
    train_or_reuse,
)

__all__ = [
    "DataSettings",
    "PreparedData",
    "TrainSettings",
    "evaluate_mlm",
    "evaluate_run",
    "evaluate_text",
    "fixed_masking",
    "load_run",
    "prepare_data",
    "pretrain",
    "source_data",
    "train_or_reuse",
]
