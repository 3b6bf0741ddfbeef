import gzip
import json
from pathlib import Path

import pytest
import torch

from fixedhead.data import DEFAULT_DATA_DIR

WIKI = DEFAULT_DATA_DIR / "pretrain" / "wikipedia_vital_articles_summaries_en.jsonl.gz"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


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
