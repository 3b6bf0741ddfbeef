"""Fixtures shared by the test modules. Plain helpers (tiny configs, settings, snapshots) live in
``_tiny_run.py`` and are imported; fixtures are found by pytest here, by name."""

import gzip
import json
from pathlib import Path

import pytest
import torch

from _tiny_run import tiny_data
from fixedhead.data import DEFAULT_DATA_DIR

WIKI = DEFAULT_DATA_DIR / "pretrain" / "wikipedia_vital_articles_summaries_en.jsonl.gz"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models train several times faster on one thread when the CPUs are shared. A module
    opts in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def small_real_corpus(tmp_path_factory) -> Path:
    """A few tens of kilobytes of the real Wikipedia summaries, as a .jsonl.gz (one doc a line)."""
    if not WIKI.is_file():
        pytest.skip(f"shared data not found at {WIKI}")
    out = tmp_path_factory.mktemp("corpus") / "wiki_small.jsonl.gz"
    with gzip.open(WIKI, "rt", encoding="utf-8") as src, gzip.open(out, "wt", encoding="utf-8") as dst:
        for i, line in enumerate(src):
            if i >= 120:
                break
            rec = json.loads(line)
            dst.write(json.dumps({"title": rec["title"], "text": rec["text"]}) + "\n")
    return out


@pytest.fixture(scope="session")
def tiny_prepared(small_real_corpus, tmp_path_factory):
    """``small_real_corpus`` prepared for pretraining (:func:`_tiny_run.tiny_data`); read-only."""
    return tiny_data(small_real_corpus, tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="session")
def tiny_pretrained_run(small_real_corpus, tmp_path_factory):
    """A 30-step, 2-layer pretraining run on real text with the default tracking (TensorBoard):
    (run directory, its PreparedData, pretrain's result). Tests may add files to the run
    directory, never change or remove what is there."""
    from _tiny_run import tiny_config, tiny_settings
    from fixedhead.training import pretrain

    tmp = tmp_path_factory.mktemp("eco")
    data = tiny_data(small_real_corpus, tmp / "cache", max_eval_tokens=3000)
    config = tiny_config(num_hidden_layers=2)
    settings = tiny_settings(max_steps=30, logging_steps=10, eval_steps=15, save_steps=30, report_to=["tensorboard"])
    run = tmp / "run"
    result = pretrain(config, data, run, settings)
    return run, data, result


@pytest.fixture(scope="session")
def tiny_causal_run(small_real_corpus, tmp_path_factory):
    """A 6-step causal-LM run of the tiny config on ``small_real_corpus``, trained on one thread:
    (run directory, its PreparedData, pretrain's result). Read-only for tests."""
    from _tiny_run import tiny_config, tiny_settings
    from fixedhead.training import pretrain

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    data = tiny_data(small_real_corpus, tmp_path_factory.mktemp("tok"))
    run = tmp_path_factory.mktemp("clm") / "run"
    result = pretrain(tiny_config(), data, run, tiny_settings(max_steps=6, save_steps=6, eval_steps=3, objective="clm"))
    torch.set_num_threads(threads)
    return run, data, result


@pytest.fixture(scope="session")
def heldout_text(tiny_pretrained_run, small_real_corpus, tmp_path_factory):
    """The held-out documents of ``tiny_pretrained_run``, as a .txt file."""
    from fixedhead.data import read_corpus

    _, data, _ = tiny_pretrained_run
    titles = set(data.info["heldout_documents"])
    docs = [d.text for d in read_corpus(str(small_real_corpus)) if (d.title or d.source) in titles]
    assert docs, "no held-out documents found"
    path = tmp_path_factory.mktemp("text") / "heldout.txt"
    path.write_text("\n\n".join(docs))
    return path
