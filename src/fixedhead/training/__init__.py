"""Language-model pretraining, evaluation and fine-tuning on top of transformers' Trainer."""

from ..data.lm import DataSettings, PreparedData, fixed_masking, prepare_data
from .evaluate import evaluate_lm, evaluate_run, evaluate_text, load_run
from .pretrain import pretrain, source_data, train_or_reuse
from .settings import ModelSettings, TrainSettings

__all__ = [
    "DataSettings",
    "ModelSettings",
    "PreparedData",
    "TrainSettings",
    "evaluate_lm",
    "evaluate_run",
    "evaluate_text",
    "fixed_masking",
    "load_run",
    "prepare_data",
    "pretrain",
    "source_data",
    "train_or_reuse",
]
