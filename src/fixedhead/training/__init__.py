"""Language-model pretraining, evaluation and fine-tuning on top of transformers' Trainer.

The names below are imported on first use (PEP 562): ``fixedhead.training.settings`` holds the options the
command line reads, and importing it must not import torch through this package.
"""

import sys
import types

from .._lazy import lazy_names

#: public name -> the module that defines it
_PUBLIC = {
    "DataSettings": "..data.settings",
    "PreparedData": "..data.lm",
    "fixed_masking": "..data.lm",
    "prepare_data": "..data.lm",
    "evaluate_lm": ".evaluate",
    "evaluate_run": ".evaluate",
    "evaluate_text": ".evaluate",
    "load_run": ".evaluate",
    "pretrain": ".pretrain",
    "source_data": ".pretrain",
    "train_or_reuse": ".pretrain",
    "ModelSettings": ".settings",
    "TrainSettings": ".settings",
}

__all__ = list(_PUBLIC)


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)


class _Package(types.ModuleType):
    """This package, where the name ``pretrain`` stays the function: importing the submodule of that name would
    otherwise bind the module in its place."""

    def __setattr__(self, name, value):
        if not (name == "pretrain" and isinstance(value, types.ModuleType)):
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
