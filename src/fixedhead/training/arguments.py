"""The ``TrainingArguments`` fields that pretraining and fine-tuning share, built in one place.

Both :class:`~fixedhead.training.pretrain.TrainSettings` and
:class:`~fixedhead.training.finetune.FinetuneSettings` carry the same optimisation fields
(batch size, steps, peak learning rate, warm-up ratio, weight decay, seed, activation
checkpointing); each module adds only what is its own (evaluation, saving, metrics).
"""

from __future__ import annotations

import os

import torch

#: learning-rate schedules after the warm-up (transformers' ``SchedulerType`` names that need no
#: extra arguments): linear decay to 0 (BERT), cosine decay to 0, constant
LR_SCHEDULERS = ("linear", "cosine", "constant_with_warmup")


def shared_training_arguments(output_dir: str | os.PathLike, settings, eval_batch_size: int, **own):
    """``transformers.TrainingArguments`` for ``settings`` (AdamW, linear warm-up then linear decay
    as BERT unless ``own`` sets another ``lr_scheduler_type``), with ``own`` fields of the calling
    module added or overriding.

    ``warmup_steps`` receives the warm-up *ratio*: transformers 5 reads a value below 1 as a
    fraction of ``max_steps`` (its ``warmup_ratio`` argument is deprecated).
    """
    from transformers import TrainingArguments

    fields = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=settings.batch_size,
        per_device_eval_batch_size=eval_batch_size,
        max_steps=settings.max_steps,
        learning_rate=settings.learning_rate,
        warmup_steps=settings.warmup_ratio,  # < 1: a fraction of max_steps (see the docstring)
        lr_scheduler_type="linear",
        weight_decay=settings.weight_decay,
        seed=settings.seed,
        eval_strategy="steps",
        eval_steps=settings.eval_steps,
        save_strategy="steps",
        disable_tqdm=not settings.progress,
        dataloader_num_workers=0,
        activation_checkpointing=settings.gradient_checkpointing,
        use_cpu=not torch.cuda.is_available(),
    )
    return TrainingArguments(**{**fields, **own})
