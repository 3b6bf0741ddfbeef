"""Language-model pretraining (masked or causal) on transformers' ``Trainer``, which brings AdamW, the
schedule, seeding, checkpoints and resume, logs and torchrun/accelerate; this module builds the model,
trains it on :mod:`fixedhead.data.lm`'s data and scores it."""

from __future__ import annotations

import copy
import json
import math
import os
import pickle
import resource
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from ..data.lm import (
    CausalCollator,
    LabelledDataset,
    PreparedData,
    SequenceDataset,
    TrainOrFixedCollator,
    check_objective,
    heldout_batches,
    prepare_data,
)
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
    create_json_exclusive,
    environment_info,
    follow_umask,
    load_json_file,
    open_run,
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
from .evaluate import (
    DivergedError,
    check_not_diverged,
    check_same_text,
    evaluate_lm,
    load_model,
    recorded_data_settings,
)
from .identity import (
    DATA_ORDER_FILE,
    DIVERGED_FILE,
    check_run_dir,
    finished_metrics,
    init_from_record,
    run_settings_record,
)
from .settings import TrainSettings, quiet_unless, transformers_progress_bars


def lm_config(config, tokenizer, objective: str = "mlm"):
    """Fill in (in place, and return) what a run's config takes from its tokenizer and objective: vocabulary
    size, padding id, and for a causal LM ``is_decoder`` and the bos/eos ids ([CLS] and [SEP], as in the packed
    data). :func:`pretrain` and the studies' reuse check both call it, so a settings record is compared with the
    config it was trained with."""
    check_objective_for(config, check_objective(objective))
    config.vocab_size = len(tokenizer)
    config.pad_token_id = tokenizer.pad_token_id
    if objective == "clm":
        if isinstance(config, FixedHeadConfig):
            config.is_decoder = True
        config.bos_token_id, config.eos_token_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    return config


def train_or_reuse(
    config: FixedHeadConfig, data: PreparedData, run_dir: str | os.PathLike, settings: TrainSettings, overwrite=False
) -> dict:
    """:func:`pretrain` into ``run_dir``: the metrics of a run that finished there with these settings, an
    unfinished one continued, or a new run (``overwrite``: always new). What makes a study resumable.

    Raises:
        FileExistsError: ``run_dir`` holds a run with other settings (without ``overwrite``).
    """
    resume = not overwrite and (Path(run_dir) / PRETRAIN_FILE).is_file()
    return pretrain(config, data, run_dir, settings, resume=resume, overwrite=overwrite)


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
    """Pretrain a ``FixedHeadForMaskedLM`` (``objective="clm"``: ``FixedHeadForCausalLM``, or ``LlamaForCausalLM``
    for a ``LlamaConfig``) on ``data``, score it on the held-out set and return the metrics: parameters,
    training tokens, wall time, held-out loss (nats/token), perplexity, accuracy and the loss curves.

    ``init_from`` starts from another run's weights (``config=None``, its tokenizer's data); its path and hash
    join the settings record, so the run is never reused as one trained from scratch. Writes the model
    (safetensors), tokenizer, ``metrics.json``, ``pretrain_settings.json``, a model card, checkpoints and logs to
    ``run_dir``; under torchrun ``batch_size`` is per process and only the main process writes. ``resume``
    continues from the newest complete checkpoint and ends where an uninterrupted run would.

    Raises:
        FileExistsError: ``run_dir`` holds another run (without ``overwrite``), other settings (with
            ``resume``), or is ``init_from``.
        FileNotFoundError: ``init_from`` is not a finished run.
        ValueError: a non-finite training loss (:class:`DivergedError`), or an ``init_from`` of another
            objective or vocabulary.
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
    world_size = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun / accelerate: batch_size is per process
    if settings.batch_size * world_size > data.train.shape[0]:
        # the Trainer would take the whole set as each smaller step, and the record would count tokens never seen
        raise ValueError(
            f"--batch-size {settings.batch_size}"
            f"{f' x {world_size} processes' if world_size > 1 else ''} is larger than the training set "
            f"({data.train.shape[0]} sequences of {data.train.shape[1]} tokens); lower it or add text"
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
    diverged = run_dir / DIVERGED_FILE
    if resume and not overwrite and diverged.is_file() and finished_metrics(run_dir, record, data.info, DIVERGED_FILE):
        # diverged with these settings: the same command diverges again, so say so instead of retraining
        raise DivergedError(f"{run_dir}: {load_json_file(diverged).get('reason', 'the run diverged')}")
    args = settings.training_arguments(run_dir)  # under torchrun/accelerate this joins the process group
    # one process checks and claims the run directory; the others wait for it (no-op when single-process)
    with args.main_process_first(local=False, desc="run directory check"):
        if args.process_index == 0:
            check_run_dir(run_dir, record, resume, overwrite, data.info)
            run_dir.mkdir(parents=True, exist_ok=True)
            if not (resume or overwrite):
                # a new run claims the folder before touching anything in it: of two processes that
                # both found it empty, the one whose settings file appears second is refused here
                create_json_exclusive(run_dir / PRETRAIN_FILE, recorded, "--output-dir")
            remove_staging(run_dir)  # left by a run killed while saving a checkpoint
            if overwrite:  # the replaced run's checkpoints must not be resumed into this one later
                for old in list_checkpoints(run_dir):
                    shutil.rmtree(old)
                (run_dir / METRICS_FILE).unlink(missing_ok=True)
            diverged.unlink(missing_ok=True)  # a run that starts or continues now has not diverged yet
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
    quiet_unless(settings.progress, trainer)
    try:  # train, save the model, score it and write metrics.json
        t0 = time.time()
        state = load_json_file(Path(checkpoint) / "trainer_state.json") if checkpoint is not None else {}
        if state.get("global_step", 0) >= settings.max_steps:
            # training had finished (killed before metrics.json): the Trainer would take one step past
            # max_steps, log and rotate; instead take the last checkpoint's weights and write what is missing
            _load_checkpoint_weights(model, Path(checkpoint))
            history = state["log_history"]
        else:
            with transformers_progress_bars(settings.progress):  # the checkpoints' "Writing model shards" bars
                try:
                    trainer.train(resume_from_checkpoint=checkpoint)
                except (
                    pickle.UnpicklingError
                ) as e:  # the Trainer reads optimizer, scheduler and RNG states with weights_only
                    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                    raise ValueError(
                        f"{checkpoint}: a saved training state was refused by torch's safe loader ({first}); "
                        f"delete that checkpoint to resume from the one before"
                    ) from None
            history = trainer.state.log_history
        wall = time.time() - t0
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
        check_not_diverged(metrics["loss"], config.vocab_size)
        result = {
            "name": run_dir.name,
            "objective": settings.objective,
            "architecture": config.model_type,
            "parameters": parameter_count(config),
            "hidden_size": config.hidden_size,
            "num_attention_heads": config.num_attention_heads,
            "head_dim": head_size_label(config),  # a list for per-layer head sizes
            "fixed_head": is_fixed_head(config),
            # queries' and keys' size apart from the values' (fixedhead only; absent when not set)
            **{f: getattr(config, f) for f in ("qk_head_dim", "v_head_dim") if getattr(config, f, None) is not None},
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
            val_ids, val_labels = heldout_batches(
                data.validation, data.tokenizer, settings.objective, settings.eval_seed
            )
            val = evaluate_lm(model, val_ids, val_labels, objective=settings.objective, chars=data.validation_chars)
            check_not_diverged(val["loss"], config.vocab_size, "validation loss")
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
    except DivergedError as e:  # recorded, so that a rerun (a rate grid resumed) says so without training again
        if args.should_save:
            write_json_atomic(diverged, {"diverged": True, "reason": str(e)})
        raise


def _load_checkpoint_weights(model, checkpoint: Path) -> None:
    """Load a Trainer checkpoint's ``model.safetensors`` into ``model`` (tied weights are saved once)."""
    from safetensors.torch import load_file

    missing, unexpected = model.load_state_dict(load_file(checkpoint / "model.safetensors"), strict=False)
    tied = set(getattr(model, "all_tied_weights_keys", None) or getattr(model, "_tied_weights_keys", None) or ())
    if unexpected or set(missing) - tied:
        raise ValueError(
            f"{checkpoint}: weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    model.tie_weights()


class FirstBatchRecorder:
    """A data collator that writes the SHA-256 of the first training batch (``input_ids`` and ``labels`` after
    masking) to ``path``: two runs took the same first step only if these agree. Held-out batches are not recorded."""

    def __init__(self, collator, path: Path):
        self.collator, self.path, self.recorded = collator, Path(path), False

    def __call__(self, features):
        batch = self.collator(features)
        if not self.recorded and "labels" not in features[0]:
            self.recorded = True
            write_json_atomic(self.path, {"first_batch_sha256": tensors_sha256(dict(batch))})
        return batch


def save_tokenizer_atomic(tokenizer, run_dir: Path) -> None:
    """``tokenizer.save_pretrained(run_dir)`` with each file appearing whole (staged, then moved file by file)."""
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
    """The data a run was trained on, prepared again to continue it: its recorded data settings
    (``pretrain_settings.json``, or ``widen.json``'s source) and its own tokenizer. ``corpus`` replaces a moved
    corpus path; its text must be the same.

    Raises:
        ValueError: no corpus recorded and none given, or the corpus text changed.
    """
    run = open_run(init_from, allow_pickle=allow_pickle)
    data = prepare_data(
        recorded_data_settings(init_from, run, corpus), cache_dir=cache_dir, progress=progress, tokenizer=run.tokenizer
    )
    check_same_text(init_from, run.settings, data)
    return data


def causal_tokenizer(tokenizer):
    """A copy of a run's WordPiece tokenizer for a causal LM: only [CLS] in front, no [SEP] at the end, so a
    prompt is continued rather than closed; [CLS] and [SEP] become ``bos_token`` and ``eos_token``."""
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
