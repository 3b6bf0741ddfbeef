import math

import numpy as np
import pytest

from fixedhead.data.glue import (
    GLUE_TASKS,
    MAIN_METRIC,
    glue_metrics,
    glue_path,
    majority_class_accuracy,
    read_glue_tsv,
)

# (task, split) -> examples, from ../shared/data/README.md
COUNTS = {
    ("sst2", "train"): 67_349,
    ("sst2", "dev"): 872,
    ("cola", "train"): 8_551,
    ("cola", "dev"): 1_043,
    ("mrpc", "train"): 3_668,
    ("mrpc", "dev"): 408,
    ("rte", "train"): 2_490,
    ("rte", "dev"): 277,
    ("stsb", "train"): 5_749,
    ("stsb", "dev"): 1_500,
}


def _need(task, split):
    path = glue_path(task, split)
    if not path.is_file():
        pytest.skip(f"shared GLUE data not found at {path}")
    return path


@pytest.mark.parametrize("task,split", sorted(COUNTS))
def test_row_counts_match_the_data_readme(task, split):
    examples = read_glue_tsv(_need(task, split), task)
    assert len(examples) == COUNTS[(task, split)]
    spec = GLUE_TASKS[task]
    assert all((e["text_b"] is None) == (spec.text_b is None) for e in examples)
    if spec.labels is None:
        assert all(0.0 <= e["label"] <= 5.0 for e in examples)
    else:
        assert {e["label"] for e in examples} == set(range(len(spec.labels)))


def test_header_quirks_first_rows():
    # SST-2: header consumed, trailing space of the sentence kept as in the file
    sst = read_glue_tsv(_need("sst2", "train"), "sst2")[0]
    assert sst == {"text_a": "hide new secretions from the parental units ", "text_b": None, "label": 0}
    # CoLA has no header: the first line is an example, sentence in column 4, label in column 2
    cola = read_glue_tsv(_need("cola", "train"), "cola")[0]
    assert cola["text_a"] == "Our friends won't buy this analysis, let alone the next one we propose."
    assert cola["label"] == 1
    # MRPC: the header starts with a byte-order mark; still found, "Quality" is the label
    mrpc = read_glue_tsv(_need("mrpc", "train"), "mrpc")[0]
    assert mrpc["label"] == 1 and mrpc["text_a"].startswith("Amrozi accused his brother")
    assert mrpc["text_b"].startswith("Referring to him as only")
    # RTE: string labels mapped to class ids in the order (entailment, not_entailment)
    rte = read_glue_tsv(_need("rte", "train"), "rte")[0]
    assert rte["label"] == 1 and rte["text_b"] == "Weapons of Mass Destruction Found in Iraq."
    # STS-B: 10 columns, the float score is the last one
    sts = read_glue_tsv(_need("stsb", "train"), "stsb")[0]
    assert sts == {"text_a": "A plane is taking off.", "text_b": "An air plane is taking off.", "label": 5.0}


def test_quotes_are_kept_verbatim():
    # quoting is off: a sentence that contains a double quote is read as is, not merged with the next line
    examples = read_glue_tsv(_need("mrpc", "train"), "mrpc")
    assert '" the witness "' in examples[0]["text_a"]


def test_errors_name_task_and_column(tmp_path):
    with pytest.raises(ValueError, match="'qnli'"):
        read_glue_tsv(tmp_path / "x.tsv", "qnli")
    bad = tmp_path / "train.tsv"
    bad.write_text("text\tlabel\nnice film\t1\n")
    with pytest.raises(ValueError, match=r"train\.tsv.*'sentence'"):
        read_glue_tsv(bad, "sst2")
    with pytest.raises(ValueError, match="'test'"):
        glue_path("sst2", "test")


def test_majority_class_accuracy(tmp_path):
    folder = tmp_path / "glue" / "SST-2"
    folder.mkdir(parents=True)
    (folder / "dev.tsv").write_text("sentence\tlabel\ngood\t1\nbad\t0\nfine\t1\n")
    assert majority_class_accuracy("sst2", tmp_path) == pytest.approx(2 / 3)
    assert majority_class_accuracy("sst2", tmp_path, max_examples=2) == pytest.approx(1 / 2)  # good, bad
    assert majority_class_accuracy("stsb", tmp_path) is None  # a regression has no majority class
    with pytest.raises(FileNotFoundError, match="CoLA"):
        majority_class_accuracy("cola", tmp_path)
    # the published dev label counts: SST-2 444 positive of 872, CoLA 721 acceptable of 1,043
    _need("sst2", "dev"), _need("cola", "dev")
    assert majority_class_accuracy("sst2") == pytest.approx(444 / 872)
    assert majority_class_accuracy("cola") == pytest.approx(721 / 1043)


def test_classification_metrics_against_hand_computed_values():
    preds, gold = [1, 0, 1, 1], [1, 0, 0, 1]
    # accuracy 3/4; TP=2, FP=1, FN=0, TN=1
    assert glue_metrics("sst2", preds, gold) == {"accuracy": 0.75}
    mrpc = glue_metrics("mrpc", preds, gold)
    assert mrpc["f1"] == pytest.approx(0.8)  # P = 2/3, R = 1
    cola = glue_metrics("cola", preds, gold)
    assert cola["matthews"] == pytest.approx((2 * 1 - 1 * 0) / math.sqrt(3 * 2 * 2 * 1))
    # logits are arg-maxed
    logits = np.array([[0.1, 0.9], [2.0, -1.0], [0.0, 0.5], [-3.0, 3.0]])
    assert glue_metrics("rte", logits, gold) == {"accuracy": 0.75}
    assert MAIN_METRIC["mrpc"] == "f1" and MAIN_METRIC["cola"] == "matthews"


def test_regression_metrics_against_hand_computed_values():
    # deviations (-1, 0, 1) and (-1, 1, 0): covariance 1, variances 2 and 2 -> r = 0.5; same ranks
    m = glue_metrics("stsb", [1.0, 2.0, 3.0], [1.0, 3.0, 2.0])
    assert m["pearson"] == pytest.approx(0.5) and m["spearman"] == pytest.approx(0.5)
    m = glue_metrics("stsb", np.array([[1.0], [2.0], [3.0], [10.0]]), [1.0, 2.0, 3.0, 4.0])
    assert m["spearman"] == pytest.approx(1.0) and m["pearson"] < 0.99
    # a constant prediction has no correlation: reported as 0, never NaN
    assert glue_metrics("stsb", [2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == {"pearson": 0.0, "spearman": 0.0}
    with pytest.raises(ValueError, match="3 predictions for 2 labels"):
        glue_metrics("stsb", [1.0, 2.0, 3.0], [1.0, 2.0])
