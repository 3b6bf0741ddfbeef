"""Language-model pretraining (masked or causal) on top of transformers' ``Trainer``.

The Trainer brings AdamW, warm-up + linear decay, seeding, checkpoints and resume, progress bars,
TensorBoard logs (``RUN_DIR/runs``) and torchrun/accelerate support; this module builds the model,
trains it on data prepared by :mod:`fixedhead.data.lm` and scores it.
"""

from __future__ import annotations

import copy
import json
import math
import os
import resource
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from ..data.lm import (
    CausalCollator,
    DataSettings,
    LabelledDataset,
    PreparedData,
    SequenceDataset,
    TrainOrFixedCollator,
    check_objective,
    heldout_batches,
    prepare_data,
)
from ..data.tokenizer import tokenizer_sha256
from ..model.architectures import (
    check_objective_for,
    head_size_label,
    is_fixed_head,
    new_model,
    objective_of,
)
from ..model.configuration import FixedHeadConfig
from ..model.sizes import parameter_count
from ..runs import (
    METRICS_FILE,
    PRETRAIN_FILE,
    environment_info,
    follow_umask,
    load_json_file,
    model_fingerprint,
    open_run,
    resolve_local_path,
    tensors_sha256,
    write_json_atomic,
)
from .card import write_model_card
from .checkpoints import (
    STAGING_PREFIX,
    atomic_checkpoint_trainer,
    find_resume_checkpoint,
    list_checkpoints,
    remove_staging,
)
from .evaluate import DivergedError, check_same_text, evaluate_lm, load_model, recorded_data_settings, same_corpus_text
from .settings import TrainSettings, transformers_progress_bars

#: TrainSettings fields that change how a run is watched or how much memory it takes, not what it computes
_NOT_MATCHED = ("progress", "report_to", "save_total_limit", "logging_steps", "gradient_checkpointing")
#: TrainSettings fields added after runs were first saved, with the default those runs used
_ADDED_LATER = {"bf16": False, "objective": "mlm", "mlm_probability": 0.15, "lr_scheduler_type": "linear"}


def with_later_defaults(train: dict) -> dict:
    """Recorded training settings with every field added after runs were first saved filled in at
    the default those runs used (``_ADDED_LATER``): the one way saved and current settings are
    compared, so an omitted field and its default are the same setting."""
    return {**_ADDED_LATER, **train}


def run_settings_record(
    config: FixedHeadConfig,
    settings: TrainSettings,
    data_settings: DataSettings | None,
    init_from: dict | None = None,
) -> dict:
    """A run's settings record: what must match for a run directory to be resumed or reused:
    model config, data settings, the training settings that affect the result (not logging or progress options), and the
    weights training started from: ``init_from`` is ``{"model_sha256": ...}`` (see
    :func:`init_from_record`) for a run continued from another run, None for one trained from
    scratch (runs saved before this was recorded count as from scratch)."""
    # fields added later are omitted at their default: older run directories still resume
    train = {k: v for k, v in asdict(settings).items() if k not in _NOT_MATCHED and (k, v) not in _ADDED_LATER.items()}
    record = {
        "config": config.to_diff_dict(),
        "train": train,
        "data": data_settings.record() if data_settings else {},
        # keyed on the starting weights' content, not on their folder: a moved source still matches
        "init_from": {"model_sha256": init_from["model_sha256"]} if init_from else None,
    }
    return json.loads(json.dumps(record, default=str))


def init_from_record(run_dir: str | os.PathLike) -> dict:
    """Where a continued run starts: ``{"path": absolute path, "model_sha256": hash of the
    config, weights and tokenizer (:func:`fixedhead.runs.model_fingerprint`)}``.

    Raises:
        FileNotFoundError: ``run_dir`` does not exist.
    """
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"run directory {str(run_dir)!r} does not exist")
    return {"path": resolve_local_path(run_dir), "model_sha256": model_fingerprint(run_dir)}


def settings_differences(previous: dict, record: dict) -> list[str]:
    """The settings in which a saved ``pretrain_settings.json`` differs from a :func:`run_settings_record`,
    as ``"section.field: saved → now"`` strings (fields outside the record, such as logging
    options, may differ freely). Training fields added later (``_ADDED_LATER``) count at their
    default where either side omits them, so a run at a non-default value never matches one at
    the default."""
    diffs = []
    for key, value in record.items():
        old = previous.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            if key == "train":
                old, value = with_later_defaults(old), with_later_defaults(value)
            if key == "data" and old:  # a data section at all: fields added later count at their default
                old, value = {**DataSettings.ADDED_LATER, **old}, {**DataSettings.ADDED_LATER, **value}
            diffs += [
                f"{key}.{k}: {old.get(k)!r} → {v!r}"
                for k, v in value.items()
                if old.get(k) != v and not (key == "data" and k == "corpus" and same_corpus_path(old.get(k), v))
            ]
        elif old != value:
            diffs.append(f"{key}: {old!r} → {value!r}")
    return diffs


#: the first training batch's hash, written when a run takes it (a resumed run never sees it again)
DATA_ORDER_FILE = "data_order.json"


def run_tokenizer_sha256(run_dir: str | os.PathLike, saved: dict) -> str | None:
    """The :func:`~fixedhead.data.tokenizer.tokenizer_sha256` of the tokenizer a run trains with:
    recorded in its ``pretrain_settings.json`` (``saved``), else hashed from the tokenizer saved in
    ``run_dir``; None when the run has neither (started before tokenizers were kept with the run)."""
    recorded = (saved.get("data_info") or {}).get("tokenizer_sha256")
    path = Path(run_dir) / "tokenizer.json"
    if recorded or not path.is_file():
        return recorded or None
    from tokenizers import Tokenizer

    try:
        return tokenizer_sha256(Tokenizer.from_file(str(path)))
    except Exception:  # a damaged file: the tokenizer is unknown, never assumed equal
        return None


def data_differences(run_dir: str | os.PathLike, saved: dict, data_info: dict) -> list[str]:
    """How the data a saved run trained on differs from prepared data (``data_info``,
    :attr:`PreparedData.info`): another corpus text, or another tokenizer (which id each piece of
    text gets; a run whose tokenizer is unknown counts as different). Empty when they agree."""
    diffs = []
    if not same_corpus_text(saved, data_info.get("corpus_sha256")):
        diffs.append("data: the corpus text changed since the run started")
    now = data_info.get("tokenizer_sha256")
    if now is not None:
        then = run_tokenizer_sha256(run_dir, saved)
        if then is None:
            diffs.append("data: the run keeps no tokenizer (started before tokenizers were saved with runs)")
        elif then != now:
            diffs.append(f"data: another tokenizer (the run's {then[:12]}, now {now[:12]})")
    return diffs


def lm_config(config, tokenizer, objective: str = "mlm"):
    """Fill in what a run's config (a ``FixedHeadConfig`` or ``LlamaConfig``) takes from its
    tokenizer and objective (in place; returned): vocabulary size and padding id; for a causal LM
    ``is_decoder`` (fixedhead's; a Llama model is always one) and, since generation starts from
    [CLS] and a document ends with [SEP] as in the packed data, ``bos``/``eos`` token ids.
    :func:`pretrain` and the reuse check of ``compare``/``sweep`` both call it, so a finished run's
    settings record is compared with the config it was trained with.

    Raises:
        ValueError: an unknown objective, or one the architecture cannot train (a masked Llama).
    """
    check_objective_for(config, check_objective(objective))
    config.vocab_size = len(tokenizer)
    config.pad_token_id = tokenizer.pad_token_id
    if objective == "clm":
        if isinstance(config, FixedHeadConfig):
            config.is_decoder = True
        config.bos_token_id, config.eos_token_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    return config


def same_corpus_path(a, b) -> bool:
    """Two recorded corpus paths that name the same file or folder, or files of the same name in
    other folders (a checkout moved, another machine). Only the path is compared here: whenever
    a run is reused or resumed its corpus *text* is compared by digest (:func:`data_differences`),
    so a moved corpus matches and an edited one does not."""
    if not (isinstance(a, str) and isinstance(b, str)):
        return False
    try:
        if os.path.samefile(a, b):
            return True
    except OSError:
        pass
    return Path(a).name == Path(b).name


def same_run_settings(previous: dict, record: dict) -> bool:
    """Whether a saved settings file matches a :func:`run_settings_record` (see :func:`settings_differences`)."""
    return not settings_differences(previous, record)


def finished_metrics(run_dir: str | os.PathLike, record: dict, data_info: dict) -> dict | None:
    """The metrics of a run in ``run_dir`` that finished with these settings (``record``) on
    the same corpus text and tokenizer (``data_info``, see :func:`data_differences`); None for an
    unfinished run, a missing or unreadable record, or other settings. The one answer to "is this
    run done?": :func:`pretrain` with ``resume`` and every study that reuses runs ask it."""
    run_dir = Path(run_dir)
    if not (run_dir / METRICS_FILE).is_file() or not (run_dir / PRETRAIN_FILE).is_file():
        return None
    try:
        saved = load_json_file(run_dir / PRETRAIN_FILE)
    except ValueError:
        return None  # unreadable: retrain rather than trust it
    if settings_differences(saved, record) or data_differences(run_dir, saved, data_info):
        return None
    return load_json_file(run_dir / METRICS_FILE)


def train_or_reuse(
    config: FixedHeadConfig, data: PreparedData, run_dir: str | os.PathLike, settings: TrainSettings, overwrite=False
) -> dict:
    """:func:`pretrain` into ``run_dir``: the metrics of a run that finished there with these
    settings (:func:`finished_metrics`), an unfinished one continued from its newest checkpoint,
    or a new run (``overwrite``: always a new run). What makes a study resumable.

    Raises:
        FileExistsError: ``run_dir`` holds a run with other settings (without ``overwrite``).
    """
    resume = not overwrite and (Path(run_dir) / PRETRAIN_FILE).is_file()
    return pretrain(config, data, run_dir, settings, resume=resume, overwrite=overwrite)


def check_run_dir(run_dir: Path, record: dict, resume: bool, overwrite: bool, data_info: dict | None = None):
    """Refuse ``run_dir`` for a pretraining run unless it is new or empty, a fixedhead run being
    resumed with the same settings (``record``, a :func:`run_settings_record`, and the same corpus text and tokenizer as
    ``data_info``, see :func:`data_differences`), or one being replaced (``overwrite``). Nothing
    is changed.

    Raises:
        FileExistsError: a file; another run (without ``resume``/``overwrite``); different
            settings with ``resume``; a folder holding something that is not a fixedhead run.
        FileNotFoundError: ``resume`` with nothing to resume.
        ValueError: both ``resume`` and ``overwrite``.
    """
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
            diffs = settings_differences(previous, record) + data_differences(run_dir, previous, data_info or {})
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
    config,
    data: PreparedData,
    run_dir: str | os.PathLike,
    settings: TrainSettings | None = None,
    resume: bool = False,
    overwrite: bool = False,
    init_from: str | os.PathLike | None = None,
    callbacks: list | None = None,
) -> dict:
    """Pretrain a ``FixedHeadForMaskedLM`` with masked-LM on ``data`` and score it on the held-out set.

    ``settings.objective="clm"`` trains a ``FixedHeadForCausalLM`` instead, or, for a ``LlamaConfig``
    (:mod:`fixedhead.model.architectures`), transformers' ``LlamaForCausalLM`` (causal only). ``init_from``
    continues training from another run's weights instead of a fresh initialisation: a
    pretraining run or a ``fixedhead widen`` output, opened with :func:`fixedhead.runs.open_run`.
    Its config is the model's (pass ``config=None``), ``settings.objective`` must be its objective,
    and ``data`` must be tokenised with its tokenizer (:func:`source_data` prepares the data the
    run recorded). Where it started (path and content hash, :func:`init_from_record`) is recorded
    in ``pretrain_settings.json`` and ``metrics.json`` and is part of the run's settings record, so a
    run continued from other weights is never resumed or reused as this one.

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
    deleting its checkpoints. ``callbacks``: extra ``transformers.TrainerCallback`` objects
    (e.g. the held-out timer of ``benchmarks/bench_tokens_to_quality.py``).

    Raises:
        FileExistsError: ``run_dir`` holds another run (without ``overwrite``) or different
            settings (with ``resume``), or is a file, or is ``init_from`` itself.
        FileNotFoundError: ``init_from`` is not a finished run.
        ValueError: non-finite training loss; the masked objective for a Llama config; with
            ``init_from``: a ``config`` passed, another objective than the run's, or data tokenised
            with another vocabulary.
    """
    from transformers import set_seed

    settings = settings or TrainSettings()
    run_dir = Path(run_dir)
    source = None
    if init_from is not None:
        source, config = _open_source(init_from, config, data, settings, run_dir)
    elif config is None:
        raise ValueError("pretrain needs a config (or init_from: a run to continue, whose config is used)")
    else:
        lm_config(config, data.tokenizer, settings.objective)
    causal = settings.objective == "clm"
    run_tokenizer = causal_tokenizer(data.tokenizer) if causal else data.tokenizer  # what the run folder keeps
    if config.max_position_embeddings < data.train.shape[1]:
        raise ValueError(
            f"max_position_embeddings={config.max_position_embeddings} < max_seq_length={data.train.shape[1]}"
        )
    start = init_from_record(init_from) if source is not None else None
    record = run_settings_record(config, settings, data.settings, init_from=start)
    recorded = {
        **record,
        "train": json.loads(json.dumps(asdict(settings), default=str)),
        "data_info": {k: v for k, v in data.info.items() if k != "prepare_seconds"},
        "init_from": start,
    }
    done = finished_metrics(run_dir, record, data.info) if resume and not overwrite else None
    if done is not None:  # finished with these settings: nothing to train, nothing to rewrite
        if settings.progress:
            print(f"{run_dir} already finished with these settings; its metrics are returned", flush=True)
        return done
    args = settings.training_arguments(run_dir)  # under torchrun/accelerate this joins the process group
    # one process checks and claims the run directory; the others wait for it (no-op when single-process)
    with args.main_process_first(local=False, desc="run directory check"):
        if args.process_index == 0:
            check_run_dir(run_dir, record, resume, overwrite, data.info)
            run_dir.mkdir(parents=True, exist_ok=True)
            remove_staging(run_dir)  # left by a run killed while saving a checkpoint
            if overwrite:  # the replaced run's checkpoints must not be resumed into this one later
                for old in list_checkpoints(run_dir):
                    shutil.rmtree(old)
                (run_dir / METRICS_FILE).unlink(missing_ok=True)
            if not resume:  # the first batch of a run that starts now is taken again below
                (run_dir / DATA_ORDER_FILE).unlink(missing_ok=True)
            write_json_atomic(run_dir / PRETRAIN_FILE, recorded)
            # the tokenizer goes into the run before its first step: a resume never depends on a cache
            save_tokenizer_atomic(run_tokenizer, run_dir)
    set_seed(settings.seed)
    if source is not None:
        model = load_model(source)  # the source run's weights, exactly
    else:
        # a copy: the Trainer sets its model's config.use_cache, and the caller's config must not change
        model = new_model(copy.deepcopy(config), settings.objective)
    use_cache = model.config.use_cache
    init_weights_sha256 = tensors_sha256(model.state_dict())
    eval_ids, eval_labels = heldout_batches(data.heldout, data.tokenizer, settings.objective, settings.eval_seed)
    checkpoint = find_resume_checkpoint(run_dir) if resume else None  # skips incomplete ones, with a warning
    collator = (
        CausalCollator()
        if causal
        else TrainOrFixedCollator(data.tokenizer, settings.mlm_probability, seed=settings.seed)
    )
    if checkpoint is not None and settings.progress:
        print(f"resuming from {checkpoint}", flush=True)
    if checkpoint is not None and not causal:
        collator.batches_seen = int(load_json_file(Path(checkpoint) / "trainer_state.json")["global_step"])
    if checkpoint is None and args.process_index == 0:
        collator = FirstBatchRecorder(collator, run_dir / DATA_ORDER_FILE)
    trainer = atomic_checkpoint_trainer()(
        model=model,
        args=args,
        train_dataset=SequenceDataset(data.train),
        eval_dataset=LabelledDataset(eval_ids, eval_labels),
        data_collator=collator,
        processing_class=run_tokenizer,  # saved into every checkpoint
        callbacks=callbacks,
    )
    t0 = time.time()
    with transformers_progress_bars(settings.progress):  # the checkpoints' "Writing model shards" bars
        trainer.train(resume_from_checkpoint=checkpoint)
    wall = time.time() - t0
    history = trainer.state.log_history
    train_curve = [(h["step"], h["loss"]) for h in history if "loss" in h]
    if any(not math.isfinite(loss) for _, loss in train_curve):
        raise DivergedError(f"training loss became non-finite in {run_dir}; lower the learning rate")
    model.config.use_cache = use_cache  # the Trainer turned it off for training; generation wants it
    with transformers_progress_bars(settings.progress):
        trainer.save_model(str(run_dir))  # the Trainer writes from the main process only
    if args.should_save:
        follow_umask(run_dir / "model.safetensors")  # safetensors writes 0600 whatever the umask
        save_tokenizer_atomic(run_tokenizer, run_dir)
    metrics = evaluate_lm(model, eval_ids, eval_labels, objective=settings.objective, chars=data.heldout_chars)
    result = {
        "name": run_dir.name,
        "objective": settings.objective,
        "architecture": config.model_type,
        "parameters": parameter_count(config),
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "head_dim": head_size_label(config),  # a list for per-layer head sizes
        "fixed_head": is_fixed_head(config),
        "num_hidden_layers": config.num_hidden_layers,
        "world_size": args.world_size,  # processes (torchrun / accelerate); batch_size is per process
        "training_tokens": settings.max_steps * settings.batch_size * args.world_size * data.train.shape[1],
        "tokens_per_step": settings.batch_size * args.world_size * data.train.shape[1],
        "train_seconds": round(wall, 1),
        "heldout_loss": metrics["loss"],
        "heldout_perplexity": metrics["perplexity"],
        "heldout_accuracy": metrics["accuracy"],
        "heldout_masked_tokens": metrics["masked_tokens"],
        "heldout_bits_per_character": metrics.get("bits_per_character"),  # None without character counts
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "train_curve": train_curve,
        "eval_curve": [(h["step"], h["eval_loss"]) for h in history if "eval_loss" in h],
    }
    if data.validation is not None:  # the split that chooses settings (a learning rate), never reported as held-out
        val_ids, val_labels = heldout_batches(data.validation, data.tokenizer, settings.objective, settings.eval_seed)
        val = evaluate_lm(model, val_ids, val_labels, objective=settings.objective, chars=data.validation_chars)
        result["validation_loss"] = val["loss"]
        result["validation_bits_per_character"] = val.get("bits_per_character")
    if start is not None:
        result["init_from"] = start
    # what two runs of one command could differ in: the ids, the starting weights, the data order, the software
    data_order = load_json_file(run_dir / DATA_ORDER_FILE) if (run_dir / DATA_ORDER_FILE).is_file() else {}
    result["reproducibility"] = {
        "corpus_sha256": data.info.get("corpus_sha256"),
        "tokenizer_sha256": data.info.get("tokenizer_sha256"),
        "init_weights_sha256": init_weights_sha256,
        "first_batch_sha256": data_order.get("first_batch_sha256"),
        **{k: v for k, v in environment_info().items() if k not in ("platform", "cpu_count")},
    }
    if args.should_save:
        write_model_card(run_dir, result, recorded)
        write_json_atomic(run_dir / METRICS_FILE, result)  # last: its presence marks a finished run
    return result


class FirstBatchRecorder:
    """A data collator that passes every batch through and writes the SHA-256 of the first
    *training* batch it makes (``input_ids`` and ``labels`` after masking, so the data order and
    the masking) to ``path``: two runs of one command took the same first step only if these
    agree. Held-out batches (features that bring their own labels) are not recorded."""

    def __init__(self, collator, path: Path):
        self.collator, self.path, self.recorded = collator, Path(path), False

    def __call__(self, features):
        batch = self.collator(features)
        if not self.recorded and "labels" not in features[0]:
            self.recorded = True
            write_json_atomic(self.path, {"first_batch_sha256": tensors_sha256(dict(batch))})
        return batch


def save_tokenizer_atomic(tokenizer, run_dir: Path) -> None:
    """``tokenizer.save_pretrained(run_dir)`` with each file appearing whole: written into a
    staging folder (removed by :func:`~fixedhead.training.checkpoints.remove_staging` if a kill
    leaves it), then moved into place file by file."""
    staging = Path(tempfile.mkdtemp(dir=run_dir, prefix=STAGING_PREFIX))
    try:
        tokenizer.save_pretrained(str(staging))
        for f in staging.iterdir():
            follow_umask(f)
            os.replace(f, run_dir / f.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _open_source(init_from, config, data: PreparedData, settings: TrainSettings, run_dir: Path):
    """Check a run to continue from against what :func:`pretrain` was given; return it opened and its config."""
    if config is not None:
        raise ValueError(
            f"init_from={str(init_from)!r} brings its own model config; pass config=None (to change the model's "
            f"size, widen it first: fixedhead widen)"
        )
    if Path(init_from).exists() and Path(init_from).resolve() == run_dir.resolve():
        raise FileExistsError(f"--output-dir {str(run_dir)!r} is the run being continued; choose another folder")
    source = open_run(init_from)
    objective = objective_of(source.config)
    if settings.objective != objective:
        raise ValueError(
            f"{init_from} holds a {'causal' if objective == 'clm' else 'masked'} LM; continue it with "
            f"objective={objective!r}, not {settings.objective!r}"
        )
    if data.tokenizer.get_vocab() != source.tokenizer.get_vocab():
        raise ValueError(
            f"the data is tokenised with another vocabulary than {init_from}'s tokenizer; prepare it with "
            f"source_data({str(init_from)!r}) or prepare_data(..., tokenizer=<the run's tokenizer>)"
        )
    return source, source.config


def source_data(
    init_from: str | os.PathLike,
    corpus: str | None = None,
    cache_dir=None,
    progress: bool = True,
    allow_pickle: bool = False,
) -> PreparedData:
    """The data a run was trained on, prepared again to continue it (:func:`pretrain` with ``init_from``):
    its recorded data settings (``pretrain_settings.json``, or a widened run's source settings in
    ``widen.json``) and its own tokenizer, so the training and held-out sequences are the run's.

    ``corpus`` replaces the recorded corpus path (a moved file); its text must be the same.

    Raises:
        FileNotFoundError: no such run.
        ValueError: the run records no corpus and none is given, or the corpus text changed.
    """
    run = open_run(init_from, allow_pickle=allow_pickle)
    data = prepare_data(
        recorded_data_settings(init_from, run, corpus), cache_dir=cache_dir, progress=progress, tokenizer=run.tokenizer
    )
    check_same_text(init_from, run.settings, data)
    return data


def causal_tokenizer(tokenizer):
    """A copy of a run's WordPiece tokenizer for a causal LM: it adds only [CLS] in front (the
    beginning of a packed sequence), not [SEP] at the end, so a prompt from
    ``pipeline("text-generation")`` or ``generate`` is continued rather than closed; [CLS] and
    [SEP] become its ``bos_token`` and ``eos_token``."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    backend = copy.deepcopy(tokenizer.backend_tokenizer)
    cls, sep = tokenizer.cls_token, tokenizer.sep_token
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A",
        pair=f"{cls} $A {sep} $B:1",
        special_tokens=[(cls, tokenizer.cls_token_id), (sep, tokenizer.sep_token_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=cls,
        eos_token=sep,
        cls_token=cls,
        sep_token=sep,
        pad_token=tokenizer.pad_token,
        unk_token=tokenizer.unk_token,
        mask_token=tokenizer.mask_token,
        model_max_length=tokenizer.model_max_length,
    )
