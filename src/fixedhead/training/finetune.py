"""GLUE fine-tuning of a pretrained run on transformers' ``Trainer`` (the paper fine-tunes on SQuAD and MNLI,
Tables 1–3; here the GLUE tasks the project ships).

GLUE's test labels are not public, so GLUE dev is the test set (scored once, with the chosen checkpoint)
and a seeded validation split of GLUE train drives early stopping and the best checkpoint. The pooler and
classifier are new (pretraining has no next-sentence task).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from torch.utils.data import Dataset

from ..checks import in_range, non_negative_int, optional_positive_int, positive_float, positive_int
from ..data.glue import MAIN_METRIC, get_glue_task, glue_metrics, glue_path, read_glue_tsv
from ..model.modeling import remote_code_files
from ..runs import (
    claim_output_dir,
    file_digest,
    follow_umask,
    load_json_file,
    model_fingerprint,
    open_run,
    write_json_atomic,
)
from .checkpoints import parametrized_trainer
from .evaluate import DivergedError
from .settings import quiet_unless, shared_training_arguments, transformers_progress_bars, transformers_verbosity

FINETUNE_FILE = "finetune_metrics.json"
#: written first: marks a folder as a fine-tuning output and records what it is computed from
FINETUNE_SETTINGS_FILE = "finetune_settings.json"
#: every entry fine-tuning writes (Trainer's checkpoints and saved model, the tokenizer); --overwrite
#: removes only these
FINETUNE_OWNED = (
    FINETUNE_FILE,
    FINETUNE_SETTINGS_FILE,
    "checkpoint-*",
    ".staging-checkpoint-*",
    "model.safetensors",
    "config.json",
    *remote_code_files(),  # the modeling code save_pretrained writes beside config.json
    "training_args.bin",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "README.md",
    "runs",
)
MIN_SEQ_LENGTH = 8
DEFAULT_VALIDATION_SIZE = 1000


@dataclass
class FinetuneSettings:
    """Fine-tuning budget and optimisation (AdamW, linear warm-up then decay, as BERT): validation every
    ``eval_steps``, early stopping after ``patience`` evaluations without improvement of the headline metric."""

    max_seq_length: int = 128
    """tokens per example (a pair is truncated to fit)"""
    batch_size: int = 32
    """examples per step"""
    learning_rate: float = 1e-4
    """peak learning rate"""
    max_steps: int = 1000
    """optimizer steps"""
    warmup_ratio: float = 0.1
    """fraction of the steps spent warming up linearly from 0"""
    weight_decay: float = 0.01
    """AdamW weight decay"""
    eval_steps: int = 100
    """validate (and checkpoint) every N steps"""
    patience: int = 3
    """early stopping: evaluations without improvement"""
    validation_size: int | None = None
    """examples carved out of GLUE train for early stopping (default: 1000 or a fifth of GLUE
    train, whichever is smaller; must leave at least one training example)"""
    max_train_examples: int | None = None
    """subsample the rest of GLUE train (seeded; default: all)"""
    max_dev_examples: int | None = None
    """cap on the GLUE dev examples scored (default: all, the honest choice)"""
    seed: int = 0
    """seed of the split, subsample, classifier initialisation and data order"""
    dropout: float = 0.1
    """hidden and attention dropout while fine-tuning"""
    progress: bool = True
    """progress bars and messages"""
    save_model: bool = True
    """save the chosen model into the output folder"""
    gradient_checkpointing: bool = False
    """recompute each encoder block in the backward pass: less activation memory, same result"""

    def __post_init__(self):
        # a pair needs [CLS] a [SEP] b [SEP]: below 8 the tokenizer cannot truncate both texts
        positive_int("max_seq_length", self.max_seq_length, minimum=MIN_SEQ_LENGTH)
        for name in ("batch_size", "max_steps", "eval_steps", "patience"):
            positive_int(name, getattr(self, name))
        for name in ("validation_size", "max_train_examples", "max_dev_examples"):
            optional_positive_int(name, getattr(self, name))
        non_negative_int("seed", self.seed)
        positive_float("learning_rate", self.learning_rate)
        in_range("warmup_ratio", self.warmup_ratio, 0.0, 1.0)
        in_range("weight_decay", self.weight_decay, 0.0, 1.0, high_open=False)
        in_range("dropout", self.dropout, 0.0, 1.0)


def finetune_settings_record(run_dir, task: str, settings: FinetuneSettings, data_dir=None) -> dict:
    """A fine-tuning result's settings record: the pretrained model's content hash
    (:func:`fixedhead.runs.model_fingerprint`), the GLUE files' content, the task and the settings. A result is
    reused only when all match, wherever the run lives; retraining a run in place changes it."""
    files = [glue_path(task, split, data_dir) for split in ("train", "dev")]
    how_it_runs = ("progress", "save_model", "gradient_checkpointing")  # not what it computes
    record = {
        "task": task,
        "model": model_fingerprint(run_dir),
        "glue_data": file_digest(files) if all(f.is_file() for f in files) else None,
        "settings": {k: v for k, v in asdict(settings).items() if k not in how_it_runs},
    }
    return json.loads(json.dumps(record))


class GlueDataset(Dataset):
    """Tokenised GLUE examples (unpadded; :class:`transformers.DataCollatorWithPadding` pads)."""

    def __init__(self, examples: list[dict], tokenizer, max_seq_length: int, regression: bool):
        a = [e["text_a"] for e in examples]
        b = [e["text_b"] for e in examples] if examples and examples[0]["text_b"] is not None else None
        enc = tokenizer(a, b, truncation=True, max_length=max_seq_length)
        self.features = [
            {
                **{k: enc[k][i] for k in ("input_ids", "token_type_ids", "attention_mask")},
                "labels": float(e["label"]) if regression else int(e["label"]),
            }
            for i, e in enumerate(examples)
        ]

    def __len__(self):
        return len(self.features)

    def __getitem__(self, i):
        return self.features[i]


def split_train_validation(examples: list[dict], validation_size: int, seed: int = 0):
    """Seeded shuffle of GLUE train, then ``(train, validation)`` with ``validation_size`` held out."""
    if validation_size < 1 or validation_size >= len(examples):
        raise ValueError(
            f"validation_size must be in [1, {len(examples) - 1}] for {len(examples)} training examples, "
            f"got {validation_size}"
        )
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    return [examples[i] for i in order[validation_size:]], [examples[i] for i in order[:validation_size]]


def finetune(
    run_dir: str | os.PathLike,
    task: str,
    output_dir: str | os.PathLike,
    settings: FinetuneSettings | None = None,
    data_dir: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> dict:
    """Fine-tune the pretrained model in ``run_dir`` on GLUE ``task`` and score it on GLUE dev.

    ``output_dir`` gets checkpoints, the model and ``finetune_metrics.json``; a finished result of the same
    model content, data and settings is returned as it is unless ``overwrite``. Returns ``{"task", "metric",
    "dev", "validation", "score" (the dev headline metric), "best_step", "steps", the example counts,
    "train_seconds", "settings", "run_dir"}``.

    Raises:
        FileExistsError: ``output_dir`` is the run itself, holds files fine-tuning did not write, or another
            result (without ``overwrite``, which removes only what fine-tuning wrote).
        DivergedError: a non-finite training loss.
    """
    from transformers import DataCollatorWithPadding, EarlyStoppingCallback, set_seed

    from ..model.architectures import objective_of
    from ..model.modeling import FixedHeadForSequenceClassification

    settings = settings or FinetuneSettings()
    spec = get_glue_task(task)
    run_dir, out = Path(run_dir), Path(output_dir)
    run = open_run(run_dir)  # the one way to open a run: refuses damaged, pickle or non-fixedhead models
    if objective_of(run.config) == "clm":
        raise ValueError(
            f"{run_dir} is a causal LM (left-to-right); GLUE fine-tuning here classifies from the first "
            f"token's state, which in a causal model has seen nothing else. Fine-tune a masked-LM run"
        )
    if out.resolve() == run_dir.resolve():
        raise FileExistsError(
            f"--output-dir {str(out)!r} is the pretraining run itself; fine-tuning would "
            f"replace its model (the default is {run_dir / ('finetune-' + task)})"
        )
    claim_output_dir(out, (FINETUNE_SETTINGS_FILE, FINETUNE_FILE), FINETUNE_OWNED, "finetune", create=False)
    train_path, dev_path = glue_path(task, "train", data_dir), glue_path(task, "dev", data_dir)
    for p in (train_path, dev_path):
        if not p.is_file():
            raise FileNotFoundError(f"GLUE {task} file not found: {p} (pass --data-dir, the folder holding glue/)")
    record = finetune_settings_record(run_dir, task, settings, data_dir)
    done = out / FINETUNE_FILE
    if done.is_file() and not overwrite:
        previous = load_json_file(done)
        if previous.get("fingerprint") == record:
            if settings.progress:
                print(f"{done} already holds this fine-tuning (same model, data and settings); reused", flush=True)
            return previous
        raise FileExistsError(
            f"{out} holds a fine-tuning result of another model, data or settings; "
            f"pass --overwrite to replace it, or choose another --output-dir"
        )
    started = out / FINETUNE_SETTINGS_FILE  # (without overwrite, a finished result returned or was refused above)
    if started.is_file() and not overwrite and load_json_file(started).get("fingerprint") != record:
        raise FileExistsError(
            f"{out} holds an unfinished fine-tuning run of another model, data or settings; "
            f"pass --overwrite to replace it, or choose another --output-dir"
        )

    train_all = read_glue_tsv(train_path, task)
    dev = read_glue_tsv(dev_path, task)
    validation_size = settings.validation_size
    if validation_size is None:
        validation_size = max(1, min(DEFAULT_VALIDATION_SIZE, len(train_all) // 5))
    train, val = split_train_validation(train_all, validation_size, settings.seed)
    train = train[: settings.max_train_examples]  # a limit of None keeps all
    dev = dev[: settings.max_dev_examples]

    # only now, with every input checked: take the folder (refusing one that holds anything
    # fine-tuning did not write; --overwrite removes only what fine-tuning wrote)
    claim_output_dir(out, (FINETUNE_SETTINGS_FILE, FINETUNE_FILE), FINETUNE_OWNED, "finetune", overwrite)
    for old in out.glob("checkpoint-*"):  # an interrupted earlier attempt: fine-tuning restarts from the run
        shutil.rmtree(old)
    write_json_atomic(started, {"fingerprint": record, "run_dir": str(run_dir.resolve())})

    # without progress, transformers' bars (loading, writing shards) and its expected load report (a new
    # classifier, the unused MLM head) stay hidden, for this fine-tuning only
    quiet = None if settings.progress else logging.ERROR
    with transformers_progress_bars(settings.progress), transformers_verbosity(quiet):
        tokenizer = run.tokenizer
        regression = spec.labels is None
        set_seed(settings.seed)
        model = run.load_model(
            FixedHeadForSequenceClassification,
            num_labels=spec.num_labels,
            problem_type="regression" if regression else "single_label_classification",
            hidden_dropout_prob=settings.dropout,
            attention_probs_dropout_prob=settings.dropout,
        )
        max_len = min(settings.max_seq_length, model.config.max_position_embeddings)
        if max_len < settings.max_seq_length and settings.progress:  # the default 128 meets models of fewer positions
            print(
                f"max_seq_length {settings.max_seq_length} > the model's {max_len} positions: "
                f"examples are cut to {max_len}",
                flush=True,
            )
        datasets = {
            name: GlueDataset(ex, tokenizer, max_len, regression)
            for name, ex in (("train", train), ("validation", val), ("dev", dev))
        }
        metric = MAIN_METRIC[task]

        def compute_metrics(p):
            preds = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
            return glue_metrics(task, preds, p.label_ids)

        args = shared_training_arguments(
            out,
            settings,
            eval_batch_size=max(64, settings.batch_size),
            logging_steps=max(1, settings.eval_steps // 2),
            save_steps=settings.eval_steps,
            save_total_limit=1,
            load_best_model_at_end=True,
            metric_for_best_model=metric,
            greater_is_better=True,
            report_to=[],
            save_only_model=True,
        )
        trainer = parametrized_trainer()(  # a μP checkpoint keeps its output projections' rates
            model=model,
            args=args,
            train_dataset=datasets["train"],
            eval_dataset=datasets["validation"],
            data_collator=DataCollatorWithPadding(tokenizer),
            compute_metrics=compute_metrics,
            callbacks=[EarlyStoppingCallback(early_stopping_patience=settings.patience)],
        )
        quiet_unless(settings.progress, trainer)
        t0 = time.time()
        trainer.train()
        wall = time.time() - t0
        if any(not math.isfinite(h["loss"]) for h in trainer.state.log_history if "loss" in h):
            raise DivergedError(f"fine-tuning loss became non-finite in {out}; lower the learning rate")
        # the "eval" prefix keeps the early-stopping callback quiet; these runs happen after training
        best_val = trainer.evaluate(datasets["validation"])
        dev_metrics = trainer.evaluate(datasets["dev"])

        def strip(m):  # the metrics without the "eval_" prefix
            return {k[5:]: v for k, v in m.items() if k.startswith("eval_") and k[5:] in _METRIC_NAMES}

        best_ckpt = trainer.state.best_model_checkpoint
        result = {
            "task": task,
            "metric": metric,
            "score": strip(dev_metrics)[metric],
            "dev": strip(dev_metrics),
            "validation": strip(best_val),
            "best_step": int(best_ckpt.rsplit("-", 1)[1]) if best_ckpt else trainer.state.global_step,
            "steps": trainer.state.global_step,
            "train_examples": len(train),
            "validation_examples": len(val),
            "dev_examples": len(dev),
            "train_seconds": round(wall, 1),
            "validation_size": validation_size,
            "run_dir": str(run_dir.resolve()),
            "fingerprint": record,
        }
        for ckpt in out.glob("checkpoint-*"):
            shutil.rmtree(ckpt, ignore_errors=True)
        if settings.save_model:
            trainer.save_model(str(out))
            follow_umask(out / "model.safetensors")  # safetensors writes 0600 whatever the umask
            tokenizer.save_pretrained(str(out))
        write_json_atomic(done, result)  # last: its presence marks a finished fine-tuning run
        return result


_METRIC_NAMES = {"accuracy", "f1", "matthews", "pearson", "spearman", "loss"}
