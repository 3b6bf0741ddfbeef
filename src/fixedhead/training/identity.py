"""Run identity: is the run in a folder the one these settings would train? (``pretrain --resume`` and every
study that reuses runs ask here.)

A folder is reused or resumed only when its ``pretrain_settings.json`` matches :func:`run_settings_record`
and the corpus text and tokenizer are the same (:func:`data_differences`). It lives in the training layer
because it compares data and training settings, which sit below :mod:`fixedhead.runs`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from ..data.lm import DataSettings
from ..data.tokenizer import tokenizer_sha256
from ..model.configuration import FixedHeadConfig
from ..runs import METRICS_FILE, PRETRAIN_FILE, load_json_file, model_fingerprint, resolve_local_path
from .evaluate import same_corpus_text
from .settings import TrainSettings

#: TrainSettings fields that change how a run is watched or how much memory it takes, not what it computes
_NOT_MATCHED = ("progress", "report_to", "save_total_limit", "logging_steps", "gradient_checkpointing")
#: TrainSettings fields added after runs were first saved, with the default those runs used
_ADDED_LATER = {"bf16": False, "objective": "mlm", "mlm_probability": 0.15, "lr_scheduler_type": "linear"}


def with_later_defaults(train: dict) -> dict:
    """Recorded training settings with every field added later (``_ADDED_LATER``) at the default older runs used,
    so an omitted field and its default compare equal."""
    return {**_ADDED_LATER, **train}


def run_settings_record(
    config: FixedHeadConfig,
    settings: TrainSettings,
    data_settings: DataSettings | None,
    init_from: dict | None = None,
) -> dict:
    """What must match for a run folder to be resumed or reused: model config, data settings, the training
    settings that affect the result, and ``init_from`` (``{"model_sha256": ...}`` of the weights a continued
    run started from, None from scratch)."""
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
    """Where a continued run starts: ``{"path", "model_sha256"}`` (:func:`fixedhead.runs.model_fingerprint`)."""
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"run directory {str(run_dir)!r} does not exist")
    return {"path": resolve_local_path(run_dir), "model_sha256": model_fingerprint(run_dir)}


def settings_differences(previous: dict, record: dict) -> list[str]:
    """How a saved ``pretrain_settings.json`` differs from a :func:`run_settings_record`, as
    ``"section.field: saved → now"``; fields outside the record (logging) may differ freely."""
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
#: written instead of metrics.json by a run whose loss diverged (:func:`fixedhead.training.evaluate.check_not_diverged`)
DIVERGED_FILE = "diverged.json"


def run_tokenizer_sha256(run_dir: str | os.PathLike, saved: dict) -> str | None:
    """The tokenizer hash of a run: recorded in ``saved``, else hashed from the tokenizer in ``run_dir``; None
    when it has neither."""
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
    """How a saved run's data differs from ``data_info``: another corpus text, or another tokenizer (an unknown
    one counts as different). Empty when they agree."""
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


def same_corpus_path(a, b) -> bool:
    """Whether two recorded corpus paths name the same file or folder, or files of one name in other folders (a
    moved checkout): the text itself is compared by digest wherever a run is reused."""
    if not (isinstance(a, str) and isinstance(b, str)):
        return False
    try:
        if os.path.samefile(a, b):
            return True
    except OSError:
        pass
    return Path(a).name == Path(b).name


def finished_metrics(
    run_dir: str | os.PathLike, record: dict, data_info: dict, marker: str | os.PathLike = METRICS_FILE
) -> dict | None:
    """The metrics of a run in ``run_dir`` that finished with these settings on the same corpus text and
    tokenizer, else None: the one answer to "is this run done?"."""
    run_dir = Path(run_dir)
    if not (run_dir / marker).is_file() or not (run_dir / PRETRAIN_FILE).is_file():
        return None
    try:
        saved = load_json_file(run_dir / PRETRAIN_FILE)
    except ValueError:
        return None  # unreadable: retrain rather than trust it
    if settings_differences(saved, record) or data_differences(run_dir, saved, data_info):
        return None
    return load_json_file(run_dir / marker)


def check_run_dir(run_dir: Path, record: dict, resume: bool, overwrite: bool, data_info: dict | None = None):
    """Refuse ``run_dir`` for pretraining unless it is new or empty, a run resumed with the same settings and data,
    or one being replaced (``overwrite``). Changes nothing.

    Raises:
        FileExistsError: another run (without ``resume``/``overwrite``), other settings with ``resume``, or
            something that is not a fixedhead run.
        FileNotFoundError: ``resume`` with nothing to resume.
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
