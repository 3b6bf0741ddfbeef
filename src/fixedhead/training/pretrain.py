"""Masked-LM pretraining and held-out evaluation on top of transformers' ``Trainer``.

The Trainer brings AdamW, warm-up + linear decay, seeding, checkpoints and resume, progress bars,
TensorBoard logs (``RUN_DIR/runs``) and torchrun/accelerate support; this module only prepares
the data, builds the model and scores it.
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..configuration import FixedHeadConfig
from ..data import pack_sequences, read_corpus, split_documents, tokenize_documents, train_tokenizer
from ..modeling import FixedHeadForMaskedLM, count_parameters
from .card import write_model_card
from .checkpoints import (
    atomic_checkpoint_trainer,
    check_model_dir,
    find_resume_checkpoint,
    list_checkpoints,
    load_json_file,
    remove_staging,
    write_json_atomic,
)

METRICS_FILE = "metrics.json"
PRETRAIN_FILE = "pretrain_settings.json"


# ------------------------------------------------------------------------------------ data
@dataclass
class DataSettings:
    """Where the text comes from and how it becomes sequences.

    ``heldout_fraction`` of the *documents* (whole books) are held out, chosen by ``seed``;
    ``max_eval_tokens`` caps the held-out set used for scoring (its first sequences, in order).
    """

    corpus: str = ""
    text_field: str = "text"
    heldout_fraction: float = 0.05
    split_seed: int = 0
    vocab_size: int = 8192
    lowercase: bool = True
    tokenizer_max_chars: int | None = 20_000_000
    max_seq_length: int = 64
    max_train_tokens: int | None = None
    max_eval_tokens: int | None = 200_000


@dataclass
class PreparedData:
    tokenizer: object
    train: torch.Tensor  # [num_train_sequences, max_seq_length]
    heldout: torch.Tensor  # [num_heldout_sequences, max_seq_length]
    info: dict = field(default_factory=dict)
    settings: DataSettings | None = None


def prepare_data(
    settings: DataSettings, cache_dir=None, progress: bool = True, tokenizer=None, heldout_only: bool = False
) -> PreparedData:
    """Read the corpus, split by document, train/load the tokenizer, tokenise and pack.

    ``tokenizer`` reuses a trained one (e.g. a run directory's); ``heldout_only`` skips
    tokenising the training documents (``train`` is then empty), for evaluation.

    Raises:
        FileNotFoundError / ValueError: from :func:`fixedhead.data.read_corpus` and friends.
    """
    t0 = time.time()
    docs = read_corpus(settings.corpus, settings.text_field)
    train_docs, held_docs = split_documents(docs, settings.heldout_fraction, settings.split_seed)
    if progress:
        print(f"corpus: {len(docs)} documents, {sum(len(d.text) for d in docs):,} characters; "
              f"held out {len(held_docs)}: {', '.join((d.title or d.source)[:40] for d in held_docs[:6])}"
              f"{' …' if len(held_docs) > 6 else ''}", flush=True)
    tokenizer = tokenizer or train_tokenizer(
        [d.text for d in train_docs],
        vocab_size=settings.vocab_size,
        lowercase=settings.lowercase,
        cache_dir=cache_dir,
        max_chars=settings.tokenizer_max_chars,
        model_max_length=settings.max_seq_length,
    )
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    if heldout_only:
        train = torch.empty(0, settings.max_seq_length, dtype=torch.long)
    else:
        train_ids = tokenize_documents(tokenizer, [d.text for d in train_docs], settings.max_train_tokens)
        train = pack_sequences(train_ids, settings.max_seq_length, cls_id, sep_id)
    held_ids = tokenize_documents(tokenizer, [d.text for d in held_docs], settings.max_eval_tokens)
    heldout = pack_sequences(held_ids, settings.max_seq_length, cls_id, sep_id)
    info = {
        "corpus": str(settings.corpus),
        "documents": len(docs),
        "train_documents": len(train_docs),
        "heldout_documents": [d.title or d.source for d in held_docs],
        "train_sequences": int(train.shape[0]),
        "heldout_sequences": int(heldout.shape[0]),
        "vocab_size": len(tokenizer),
        "prepare_seconds": round(time.time() - t0, 1),
    }
    if progress:
        print(f"data: {train.numel():,} training tokens in {train.shape[0]:,} sequences of {settings.max_seq_length}; "
              f"{heldout.numel():,} held-out tokens; vocabulary {len(tokenizer):,} ({info['prepare_seconds']} s)", flush=True)
    return PreparedData(tokenizer, train, heldout, info, settings)


class SequenceDataset(Dataset):
    """Rows of a packed [N, n] tensor as ``{"input_ids": row}`` for the MLM data collator."""

    def __init__(self, sequences: torch.Tensor):
        self.sequences = sequences

    def __len__(self):
        return self.sequences.shape[0]

    def __getitem__(self, i):
        return {"input_ids": self.sequences[i]}


class MaskedDataset(Dataset):
    """Pre-masked rows: ``{"input_ids", "labels"}`` (fixed positions, see :func:`fixed_masking`)."""

    def __init__(self, input_ids: torch.Tensor, labels: torch.Tensor):
        self.input_ids, self.labels = input_ids, labels

    def __len__(self):
        return self.input_ids.shape[0]

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "labels": self.labels[i]}


def mlm_collator(tokenizer, mlm_probability: float = 0.15, seed: int | None = None):
    """transformers' ``DataCollatorForLanguageModeling``: 15% of tokens, 80% [MASK] / 10% random / 10% kept."""
    from transformers import DataCollatorForLanguageModeling

    return DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=True, mlm_probability=mlm_probability, seed=seed)


class _TrainOrFixedCollator:
    """Random masking for training batches; pre-masked (held-out) batches are only stacked.

    Training batch k of the run (k = 1, 2, ...) is masked with its own generator seeded from
    ``(seed, k)``, never the global RNG. Trainer restores the global RNG on resume only *after*
    fetching the first batch, so masking from the global RNG would differ after a resume; with
    this, a run resumed from step s (``batches_seen = s``) masks exactly as an uninterrupted one.
    Assumes one process collating (``dataloader_num_workers=0``) and no gradient accumulation.
    """

    def __init__(self, tokenizer, mlm_probability=0.15, seed: int = 0):
        self.tokenizer, self.mlm_probability, self.seed = tokenizer, mlm_probability, seed
        self.batches_seen = 0

    def __call__(self, features):
        if "labels" in features[0]:
            return {k: torch.stack([f[k] for f in features]) for k in features[0]}
        self.batches_seen += 1
        seed = (self.seed % 2**31) * 2**32 + self.batches_seen
        return mlm_collator(self.tokenizer, self.mlm_probability, seed=seed)(features)


def fixed_masking(sequences: torch.Tensor, tokenizer, seed: int = 1234, mlm_probability: float = 0.15):
    """One seeded masking of ``sequences`` so every model is scored on identical positions.

    Returns:
        (input_ids, labels), both [N, n]; labels are -100 except at the masked positions.
    """
    collator = mlm_collator(tokenizer, mlm_probability, seed=seed)
    batch = collator([{"input_ids": s} for s in sequences])
    return batch["input_ids"], batch["labels"]


@torch.no_grad()
def evaluate_mlm(model, input_ids: torch.Tensor, labels: torch.Tensor, batch_size: int = 128) -> dict:
    """Held-out masked-LM metrics over pre-masked sequences.

    Returns:
        ``{"loss": mean cross-entropy over masked tokens (nats), "perplexity": exp(loss),
        "accuracy": fraction of masked tokens predicted exactly, "masked_tokens": count}``.

    Raises:
        ValueError: no masked token, or a non-finite loss (a diverged model is reported, not hidden).
    """
    was_training = model.training
    model.eval()
    total_loss, total_correct, total = 0.0, 0, 0
    device = next(model.parameters()).device
    for i in range(0, input_ids.shape[0], batch_size):
        ids, lab = input_ids[i : i + batch_size].to(device), labels[i : i + batch_size].to(device)
        out = model(input_ids=ids, labels=lab)
        n = int((lab != -100).sum())
        if n == 0:
            continue
        scored = lab != -100
        targets, logits = lab[scored], out.logits[scored]  # logits are [batch, seq, vocab], as BERT's
        total_loss += float(torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum"))
        total_correct += int((logits.argmax(-1) == targets).sum())
        total += n
    model.train(was_training)
    if total == 0:
        raise ValueError("held-out set has no masked tokens to score")
    loss = total_loss / total
    if not math.isfinite(loss):
        raise ValueError(f"held-out loss is not finite ({loss}); the model has diverged")
    return {"loss": loss, "perplexity": math.exp(loss), "accuracy": total_correct / total, "masked_tokens": total}


# -------------------------------------------------------------------------------- training
@dataclass
class TrainSettings:
    """Optimisation settings (AdamW; linear warm-up then linear decay, as BERT)."""

    batch_size: int = 64
    max_steps: int = 600
    learning_rate: float = 1e-3
    warmup_ratio: float = 0.06
    weight_decay: float = 0.01
    adam_beta2: float = 0.98
    max_grad_norm: float = 1.0
    seed: int = 0
    logging_steps: int = 25
    eval_steps: int = 100
    save_steps: int = 200
    save_total_limit: int = 2
    eval_seed: int = 1234
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    progress: bool = True
    torch_compile: bool = False
    bf16: bool = False  # bf16 autocast (Trainer's bf16=True): CUDA with bf16 support, or a CPU with it
    # activation checkpointing: recompute each encoder block in the backward pass (less memory,
    # about one more forward of time; same gradients, dropout masks are replayed)
    gradient_checkpointing: bool = False

    def __post_init__(self):
        for name in ("batch_size", "max_steps", "logging_steps", "eval_steps", "save_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not (isinstance(self.learning_rate, (int, float)) and math.isfinite(self.learning_rate)
                and self.learning_rate > 0):
            raise ValueError(f"learning_rate must be a positive finite number, got {self.learning_rate!r}")
        if not (isinstance(self.warmup_ratio, (int, float)) and 0.0 <= self.warmup_ratio < 1.0):
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio!r}")


#: TrainSettings fields that change how a run is watched or how much memory it takes, not what it computes
_NOT_FINGERPRINTED = ("progress", "report_to", "save_total_limit", "logging_steps", "gradient_checkpointing")
#: TrainSettings fields added after runs were first saved, with the default those runs used
_ADDED_LATER = {"bf16": False}


def run_fingerprint(config: FixedHeadConfig, settings: TrainSettings, data_settings: DataSettings | None) -> dict:
    """What must match for a run directory to be resumed or reused: model config, data settings,
    and the training settings that affect the result (not logging or progress options)."""
    train = {k: v for k, v in asdict(settings).items() if k not in _NOT_FINGERPRINTED}
    for name, default in _ADDED_LATER.items():  # omitted at their default: older run directories still resume
        if train.get(name) == default:
            del train[name]
    fingerprint = {
        "config": config.to_diff_dict(),
        "train": train,
        "data": asdict(data_settings) if data_settings else {},
    }
    return json.loads(json.dumps(fingerprint, default=str))


def settings_differences(previous: dict, fingerprint: dict) -> list[str]:
    """The settings in which a saved ``pretrain_settings.json`` differs from a :func:`run_fingerprint`,
    as ``"section.field: saved → now"`` strings (fields outside the fingerprint, such as logging
    options, may differ freely)."""
    diffs = []
    for key, value in fingerprint.items():
        old = previous.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            diffs += [f"{key}.{k}: {old.get(k)!r} → {v!r}" for k, v in value.items() if old.get(k) != v]
        elif old != value:
            diffs.append(f"{key}: {old!r} → {value!r}")
    return diffs


def same_run_settings(previous: dict, fingerprint: dict) -> bool:
    """Whether a saved settings file matches a :func:`run_fingerprint` (see :func:`settings_differences`)."""
    return not settings_differences(previous, fingerprint)


def _check_run_dir(run_dir: Path, fingerprint: dict, resume: bool, overwrite: bool):
    settings_file = run_dir / PRETRAIN_FILE
    if run_dir.exists() and not run_dir.is_dir():
        raise FileExistsError(f"output directory {str(run_dir)!r} is an existing file, not a directory")
    if resume and overwrite:
        raise ValueError("--resume and --overwrite contradict each other; pass one of them")
    if not run_dir.exists() or not any(run_dir.iterdir()):
        if resume:
            raise FileNotFoundError(f"nothing to resume: {str(run_dir)!r} holds no run (drop --resume to start one)")
        return
    if settings_file.is_file():
        if overwrite:
            return  # a fixedhead run: replacing it is what was asked
        previous = load_json_file(settings_file)
        if resume:
            diffs = settings_differences(previous, fingerprint)
            if diffs:
                raise FileExistsError(
                    f"{run_dir} holds a run with different settings ({'; '.join(diffs[:6])}"
                    f"{' …' if len(diffs) > 6 else ''}); resume it with its own settings, or choose another "
                    f"--output-dir or --overwrite"
                )
            return
        raise FileExistsError(
            f"{run_dir} already holds a run; pass --resume to continue it or --overwrite to replace it"
        )
    raise FileExistsError(
        f"{run_dir} exists and is not a fixedhead run directory; choose another --output-dir "
        f"(--overwrite only replaces fixedhead runs, never other files)"
    )


def pretrain(
    config: FixedHeadConfig,
    data: PreparedData,
    run_dir: str | os.PathLike,
    settings: TrainSettings | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> dict:
    """Pretrain a ``FixedHeadForMaskedLM`` with masked-LM on ``data`` and score it on the held-out set.

    Writes to ``run_dir``: the model (safetensors) and tokenizer (loadable with
    ``from_pretrained`` and ``transformers.pipeline("fill-mask", model=run_dir)``),
    ``metrics.json``, ``pretrain_settings.json``, a model card ``README.md``, Trainer checkpoints
    (``checkpoint-STEP``) and TensorBoard logs (``runs/``). Runs unchanged under
    ``torchrun``/``accelerate launch`` (``settings.batch_size`` is then per process; only the
    main process writes files).

    Returns:
        the metrics dict: parameters, training tokens, wall time, held-out loss/perplexity/
        accuracy, and the learning curves (train loss and held-out loss by step).

    ``resume`` continues from the newest *complete* checkpoint (damaged newer ones are skipped
    with a :class:`~fixedhead.training.checkpoints.CheckpointWarning`) and ends where an
    uninterrupted run would; checkpoints are written atomically. ``overwrite`` replaces the run,
    deleting its checkpoints.

    Raises:
        FileExistsError: ``run_dir`` holds another run (without ``overwrite``) or different
            settings (with ``resume``), or is a file.
        ValueError: non-finite training loss.
    """
    from transformers import set_seed

    settings = settings or TrainSettings()
    run_dir = Path(run_dir)
    config.vocab_size = len(data.tokenizer)
    config.pad_token_id = data.tokenizer.pad_token_id
    if config.max_position_embeddings < data.train.shape[1]:
        raise ValueError(
            f"max_position_embeddings={config.max_position_embeddings} < max_seq_length={data.train.shape[1]}"
        )
    fingerprint = run_fingerprint(config, settings, data.settings)
    recorded = {
        **fingerprint,
        "train": json.loads(json.dumps(asdict(settings), default=str)),
        "data_info": {k: v for k, v in data.info.items() if k != "prepare_seconds"},
    }
    args = _training_args(run_dir, settings)  # under torchrun/accelerate this joins the process group
    # one process checks and claims the run directory; the others wait for it (no-op when single-process)
    with args.main_process_first(local=False, desc="run directory check"):
        if args.process_index == 0:
            _check_run_dir(run_dir, fingerprint, resume, overwrite)
            run_dir.mkdir(parents=True, exist_ok=True)
            remove_staging(run_dir)  # left by a run killed while saving a checkpoint
            if overwrite:  # the replaced run's checkpoints must not be resumed into this one later
                for old in list_checkpoints(run_dir):
                    shutil.rmtree(old)
                (run_dir / METRICS_FILE).unlink(missing_ok=True)
            write_json_atomic(run_dir / PRETRAIN_FILE, recorded)

    set_seed(settings.seed)
    model = FixedHeadForMaskedLM(config)
    eval_ids, eval_labels = fixed_masking(data.heldout, data.tokenizer, settings.eval_seed)
    checkpoint = find_resume_checkpoint(run_dir) if resume else None  # skips incomplete ones, with a warning
    collator = _TrainOrFixedCollator(data.tokenizer, seed=settings.seed)
    if checkpoint is not None:
        collator.batches_seen = int(load_json_file(Path(checkpoint) / "trainer_state.json")["global_step"])
        if settings.progress:
            print(f"resuming from {checkpoint}", flush=True)
    trainer = atomic_checkpoint_trainer()(
        model=model,
        args=args,
        train_dataset=SequenceDataset(data.train),
        eval_dataset=MaskedDataset(eval_ids, eval_labels),
        data_collator=collator,
    )
    t0 = time.time()
    trainer.train(resume_from_checkpoint=checkpoint)
    wall = time.time() - t0
    history = trainer.state.log_history
    train_curve = [(h["step"], h["loss"]) for h in history if "loss" in h]
    if any(not math.isfinite(loss) for _, loss in train_curve):
        raise ValueError(f"training loss became non-finite in {run_dir}; lower the learning rate")
    trainer.save_model(str(run_dir))  # the Trainer writes from the main process only
    if args.should_save:
        data.tokenizer.save_pretrained(str(run_dir))
    metrics = evaluate_mlm(model, eval_ids, eval_labels)
    result = {
        "name": run_dir.name,
        "parameters": count_parameters(config, pooler=False),
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "head_dim": config.attention_head_size,
        "fixed_head": config.is_fixed_head,
        "num_hidden_layers": config.num_hidden_layers,
        "world_size": args.world_size,  # processes (torchrun / accelerate); batch_size is per process
        "training_tokens": settings.max_steps * settings.batch_size * args.world_size * data.train.shape[1],
        "tokens_per_step": settings.batch_size * args.world_size * data.train.shape[1],
        "train_seconds": round(wall, 1),
        "heldout_loss": metrics["loss"],
        "heldout_perplexity": metrics["perplexity"],
        "heldout_accuracy": metrics["accuracy"],
        "heldout_masked_tokens": metrics["masked_tokens"],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "train_curve": train_curve,
        "eval_curve": [(h["step"], h["eval_loss"]) for h in history if "eval_loss" in h],
    }
    if args.should_save:
        write_model_card(run_dir, result, recorded)
        write_json_atomic(run_dir / METRICS_FILE, result)  # last: its presence marks a finished run
    return result


def _training_args(run_dir: Path, settings: TrainSettings):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(run_dir),
        per_device_train_batch_size=settings.batch_size,
        per_device_eval_batch_size=max(settings.batch_size, 128),
        max_steps=settings.max_steps,
        learning_rate=settings.learning_rate,
        warmup_steps=settings.warmup_ratio,
        lr_scheduler_type="linear",
        weight_decay=settings.weight_decay,
        adam_beta2=settings.adam_beta2,
        max_grad_norm=settings.max_grad_norm,
        seed=settings.seed,
        logging_steps=settings.logging_steps,
        eval_strategy="steps",
        eval_steps=settings.eval_steps,
        save_strategy="steps",
        save_steps=settings.save_steps,
        save_total_limit=settings.save_total_limit,
        prediction_loss_only=True,
        report_to=settings.report_to,
        disable_tqdm=not settings.progress,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        ddp_find_unused_parameters=False,  # every parameter of the MLM model gets a gradient
        torch_compile=settings.torch_compile,
        bf16=settings.bf16,
        activation_checkpointing=settings.gradient_checkpointing,
        use_cpu=not torch.cuda.is_available(),
    )


def load_run(run_dir: str | os.PathLike, allow_pickle: bool = False):
    """Load ``(model, tokenizer, settings)`` from a pretraining run directory.

    Everything is validated before use and nothing in the directory is executed: the config and
    tokenizer JSON must parse and describe a ``fixedhead`` model whose vocabulary matches the
    tokenizer; weights must be a whole ``model.safetensors``. Pickle weights
    (``pytorch_model.bin``) are refused unless ``allow_pickle=True`` (then loaded by transformers
    with ``torch.load(weights_only=True)``). ``trust_remote_code`` is never used.

    Raises:
        FileNotFoundError: no such directory, or it holds no finished model.
        ValueError: a config or tokenizer file that is not valid JSON or not a fixedhead model,
            truncated weights, pickle weights without ``allow_pickle``.
    """
    from transformers import BertTokenizerFast

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {str(run_dir)!r} does not exist")
    if not (run_dir / "config.json").is_file():
        raise FileNotFoundError(f"{run_dir} holds no finished model (model.safetensors and config.json)")
    weights = check_model_dir(run_dir, allow_pickle=allow_pickle)
    config_dict = load_json_file(run_dir / "config.json")
    if config_dict.get("model_type") != FixedHeadConfig.model_type:
        raise ValueError(
            f"{run_dir / 'config.json'}: model_type is {config_dict.get('model_type')!r}, expected 'fixedhead'"
        )
    try:
        config = FixedHeadConfig.from_dict(config_dict)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{run_dir / 'config.json'}: {e}") from None
    tok_file = run_dir / "tokenizer.json"
    tok = load_json_file(tok_file)
    if not isinstance(tok.get("model"), dict) or not isinstance(tok["model"].get("vocab"), dict):
        raise ValueError(f"{tok_file}: not a tokenizers file (no model.vocab)")
    for extra in ("tokenizer_config.json", "special_tokens_map.json"):
        if (run_dir / extra).is_file():
            load_json_file(run_dir / extra)
    try:
        tokenizer = BertTokenizerFast.from_pretrained(str(run_dir))
    except Exception as e:  # the tokenizers library raises bare Exceptions on malformed files
        raise ValueError(f"{tok_file}: cannot be loaded as a WordPiece tokenizer ({type(e).__name__}: {e})") from None
    if len(tokenizer) > config.vocab_size:
        raise ValueError(
            f"{run_dir}: tokenizer has {len(tokenizer)} tokens but config.vocab_size={config.vocab_size}"
        )
    model = FixedHeadForMaskedLM.from_pretrained(str(run_dir), config=config, use_safetensors=weights == "safetensors")
    settings_file = run_dir / PRETRAIN_FILE
    settings = load_json_file(settings_file) if settings_file.is_file() else {}
    return model, tokenizer, settings


def evaluate_run(run_dir: str | os.PathLike, corpus: str | None = None, eval_seed: int | None = None,
                 max_eval_tokens: int | None = None, batch_size: int = 128, allow_pickle: bool = False) -> dict:
    """Score a run directory's model on its held-out documents (same split, same fixed masking).

    ``corpus`` overrides the corpus recorded in the run (the split seed and fraction still
    apply); ``eval_seed`` the masking seed; ``allow_pickle`` see :func:`load_run`. Returns the
    :func:`evaluate_mlm` metrics.
    """
    model, tokenizer, saved = load_run(run_dir, allow_pickle=allow_pickle)
    data_kwargs = dict(saved.get("data", {}))
    if corpus is not None:
        data_kwargs["corpus"] = corpus
    if max_eval_tokens is not None:
        data_kwargs["max_eval_tokens"] = max_eval_tokens
    if not data_kwargs.get("corpus"):
        raise ValueError(f"{run_dir} records no corpus; pass --corpus")
    data_kwargs["max_seq_length"] = data_kwargs.get("max_seq_length", model.config.max_position_embeddings)
    data = prepare_data(DataSettings(**data_kwargs), tokenizer=tokenizer, heldout_only=True, progress=False)
    seed = eval_seed if eval_seed is not None else saved.get("train", {}).get("eval_seed", 1234)
    ids, labels = fixed_masking(data.heldout, tokenizer, seed)
    return evaluate_mlm(model, ids, labels, batch_size)
