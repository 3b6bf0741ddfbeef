"""GLUE TSV reader that fails clearly (SST-2, CoLA, MRPC, RTE, STS-B): every error names the file, line and value.

UTF-8 with any byte-order mark stripped (MRPC's header has one), quoting off (``csv.QUOTE_NONE``) as GLUE's
own readers, since sentences contain bare quotes; ``.tsv`` or ``.tsv.gz``.
"""

from __future__ import annotations

import csv
import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .corpus import DEFAULT_DATA_DIR, open_text


@dataclass(frozen=True)
class GlueTask:
    """How one task's TSV is laid out: ``text_a``/``text_b``/``label`` are header names or column indices
    (headerless CoLA); ``labels`` in class-id order, None for regression (a float in ``score_range``)."""

    name: str
    directory: str
    header: bool
    num_columns: int
    text_a: str | int
    text_b: str | int | None
    label: str | int
    labels: tuple[str, ...] | None
    score_range: tuple[float, float] = (0.0, 5.0)  # regression only: STS-B's similarity scale

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)


GLUE_TASKS: dict[str, GlueTask] = {
    "sst2": GlueTask("sst2", "SST-2", True, 2, "sentence", None, "label", ("0", "1")),
    # no header: source, label, original label (empty), sentence
    "cola": GlueTask("cola", "CoLA", False, 4, 3, None, 1, ("0", "1")),
    "mrpc": GlueTask("mrpc", "MRPC", True, 5, "#1 String", "#2 String", "Quality", ("0", "1")),
    "rte": GlueTask("rte", "RTE", True, 4, "sentence1", "sentence2", "label", ("entailment", "not_entailment")),
    "stsb": GlueTask("stsb", "STS-B", True, 10, "sentence1", "sentence2", "score", None),
}


def get_glue_task(task: str) -> GlueTask:
    """The :class:`GlueTask` for ``task``. Raises ValueError naming it and listing the known ones."""
    if task not in GLUE_TASKS:
        raise ValueError(f"unknown GLUE task {task!r}; known: {', '.join(sorted(GLUE_TASKS))}")
    return GLUE_TASKS[task]


def read_glue_tsv(path: str | os.PathLike, task: str) -> list[dict]:
    """One GLUE split file as ``{"text_a": str, "text_b": str | None, "label": int | float}`` per example.

    Raises:
        ValueError: a missing column, a row with the wrong number of fields, a label outside the task's set
            (STS-B: not a finite number in [0, 5]) or not UTF-8, naming the file and line.
    """
    spec = get_glue_task(task)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GLUE {task} file not found: {path}")
    examples = []
    try:
        with open_text(path, newline="") as f:
            rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            columns = {}
            if spec.header:
                header = next(rows, None)
                if header is None:
                    raise ValueError(f"{path}: empty file (expected a header for GLUE {task})")
                columns = {name: i for i, name in enumerate(header)}
                for needed in (spec.text_a, spec.text_b, spec.label):
                    if needed is not None and needed not in columns:
                        raise ValueError(
                            f"{path}: header lacks column {needed!r} needed by GLUE {task} (has: {header})"
                        )
            index = lambda c: c if isinstance(c, int) else columns[c]  # noqa: E731
            ia, ib, il = index(spec.text_a), None if spec.text_b is None else index(spec.text_b), index(spec.label)
            for row in rows:
                lineno = rows.line_num
                if not row:
                    continue
                if len(row) != spec.num_columns:
                    raise ValueError(
                        f"{path}:{lineno}: expected {spec.num_columns} tab-separated fields for GLUE {task}, "
                        f"got {len(row)}"
                    )
                raw = row[il]
                if spec.labels is None:
                    try:
                        label = float(raw)
                    except ValueError:
                        raise ValueError(f"{path}:{lineno}: score {raw!r} is not a number") from None
                    # float() also takes "nan" and "inf": one such label makes the loss and
                    # every correlation NaN, so it is refused here, where file and line are known
                    if not math.isfinite(label):
                        raise ValueError(f"{path}:{lineno}: score {raw!r} is not a finite number")
                    low, high = spec.score_range
                    if not low <= label <= high:
                        raise ValueError(f"{path}:{lineno}: score {raw!r} is outside GLUE {task}'s [{low:g}, {high:g}]")
                elif raw in spec.labels:
                    label = spec.labels.index(raw)
                else:
                    raise ValueError(f"{path}:{lineno}: label {raw!r} is not one of {list(spec.labels)}")
                examples.append({"text_a": row[ia], "text_b": None if ib is None else row[ib], "label": label})
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except (OSError, EOFError) as e:
        raise ValueError(f"{path}: cannot read ({e})") from None
    if not examples:
        raise ValueError(f"{path}: no examples for GLUE {task}")
    return examples


# ------------------------------------------------------------------------------ files and metrics
#: the headline metric of each task (the one early stopping and the sweep report use)
MAIN_METRIC = {"sst2": "accuracy", "cola": "matthews", "mrpc": "f1", "rte": "accuracy", "stsb": "pearson"}
#: the examples in each task's GLUE dev split (the test set here), counted with :func:`read_glue_tsv`
GLUE_DEV_EXAMPLES = {"sst2": 872, "cola": 1043, "mrpc": 408, "rte": 277, "stsb": 1500}


def glue_path(task: str, split: str, data_dir: str | os.PathLike | None = None) -> Path:
    """``DATA_DIR/glue/<Task>/<split>.tsv.gz`` (or ``.tsv``); ``split`` is ``train`` or ``dev`` (GLUE's test
    labels are not public: dev is the test set here). ``data_dir``: ``$FIXEDHEAD_DATA_DIR`` or ``../shared/data``."""
    spec = get_glue_task(task)
    if split not in ("train", "dev"):
        raise ValueError(f"unknown GLUE split {split!r}; use 'train' or 'dev'")
    folder = Path(data_dir if data_dir is not None else DEFAULT_DATA_DIR) / "glue" / spec.directory
    gz = folder / f"{split}.tsv.gz"
    return gz if gz.is_file() or not (folder / f"{split}.tsv").is_file() else folder / f"{split}.tsv"


def majority_class_accuracy(
    task: str, data_dir: str | os.PathLike | None = None, max_examples: int | None = None
) -> float | None:
    """Dev accuracy in [0, 1] of always answering the most frequent dev label (None for STS-B); with
    ``max_examples``, on the first ``max_examples``, as fine-tuning with ``max_dev_examples`` scores."""
    if get_glue_task(task).labels is None:
        return None
    labels = [e["label"] for e in read_glue_tsv(glue_path(task, "dev", data_dir), task)][:max_examples]
    return Counter(labels).most_common(1)[0][1] / len(labels)


def glue_metrics(task: str, predictions, labels) -> dict:
    """GLUE's metrics for ``task`` (scikit-learn / SciPy): sst2 / rte ``accuracy``; cola ``matthews``,
    ``accuracy``; mrpc ``f1`` (class 1), ``accuracy``; stsb ``pearson``, ``spearman``.

    ``predictions``: class ids [N] or logits [N, num_labels]; scores [N] for STS-B. An undefined correlation
    (constant prediction) is 0.0, never NaN.

    Raises:
        ValueError: lengths that differ, or a NaN or ±inf (a diverged model), named with its index.
    """
    import numpy as np

    spec = get_glue_task(task)
    preds = np.asarray(predictions)
    gold = np.asarray(labels)
    for name, values in (("predictions", preds), ("labels", gold)):  # before arg-maxing logits
        if values.dtype.kind in "fc" and not np.isfinite(values).all():
            where = tuple(int(i) for i in np.argwhere(~np.isfinite(values))[0])
            raise ValueError(
                f"GLUE {task}: {name} hold {values[where]} at index {where}; metrics of non-finite values are undefined"
            )
    if spec.labels is not None and preds.ndim == 2:
        preds = preds.argmax(-1)
    preds = preds.reshape(-1)
    gold = gold.reshape(-1)
    if preds.shape[0] != gold.shape[0]:
        raise ValueError(f"GLUE {task}: {preds.shape[0]} predictions for {gold.shape[0]} labels")
    if spec.labels is None:
        from scipy.stats import pearsonr, spearmanr

        if np.ptp(preds) == 0 or np.ptp(gold) == 0:
            return {"pearson": 0.0, "spearman": 0.0}
        return {"pearson": float(pearsonr(preds, gold)[0]), "spearman": float(spearmanr(preds, gold)[0])}
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    out = {"accuracy": float(accuracy_score(gold, preds))}
    if task == "cola":
        out["matthews"] = float(matthews_corrcoef(gold, preds))
    if task == "mrpc":
        out["f1"] = float(f1_score(gold, preds, pos_label=1, zero_division=0.0))
    return out
