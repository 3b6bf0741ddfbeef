#!/usr/bin/env python
"""Fill-mask on sentences from a run's held-out books, through ``transformers.pipeline``.

Usage: python examples/fill_mask.py RUN_DIR [--sentences 300] [--show 12] [--seed 0] [--corpus PATH]
       [--write] [--save-heldout-text FILE]

The held-out books are the ones the run never trained on (the run's own document split, read
from its ``pretrain_settings.json``; a ``--corpus`` whose split gives other held-out books is
refused). Sentences of 8-30 words are drawn at random; in each, one whole word (letters only,
not a piece after an apostrophe) that is a single token of the run's vocabulary is replaced by
``[MASK]``. The script prints some sentences with the model's top-5 and the share of masks whose
word is the top-1 / in the top-5, next to the same shares for always guessing the most frequent
training words (the "frequency-ranked" answer an undertrained model gives). ``--write`` also
writes everything to ``RUN_DIR/fill_mask.json``; ``--save-heldout-text`` writes the held-out
books as one text file (for ``fixedhead analyze --text``).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from pathlib import Path

from transformers import pipeline

import fixedhead  # noqa: F401  (registers the Auto classes: no trust_remote_code)
from fixedhead.data import read_corpus, split_documents
from fixedhead.runs import open_run
from fixedhead.training.evaluate import recorded_corpus

WORD = re.compile(r"(?<![A-Za-z'’])[A-Za-z]+(?![A-Za-z'’])")  # whole words, not pieces around apostrophes
ABBREVIATION = re.compile(r"\b(?:Mr|Mrs|Ms|Dr|St|Mme|Mlle|Messrs|Capt|Col|Gen|Rev|Prof)\.$")


def split_sentences(text: str) -> list[str]:
    """Sentences of a text: split after . ! ? before a capital or an opening quote, but not after
    common abbreviations (Mr., Mrs., Dr., St., ...)."""
    pieces = re.split(r"(?<=[.!?])\s+(?=[A-Z\"'“‘])", re.sub(r"\s+", " ", text))
    sentences = []
    for piece in pieces:
        if sentences and ABBREVIATION.search(sentences[-1]):
            sentences[-1] += " " + piece
        else:
            sentences.append(piece)
    return sentences


def heldout_documents(run_dir: Path, corpus: str | None):
    """(held-out documents, training documents) of the run, checked against what the run recorded."""
    try:
        recorded = open_run(run_dir).settings  # the one way every command opens a run
        if not recorded:
            sys.exit(f"{run_dir} is not a fixedhead pretraining run (no pretrain_settings.json)")
        corpus = corpus or recorded_corpus(run_dir, recorded)
    except (ValueError, OSError) as e:
        sys.exit(str(e))
    saved = recorded["data"]
    docs = read_corpus(corpus, saved.get("text_field", "text"))
    train_docs, held_docs = split_documents(docs, saved["heldout_fraction"], saved["split_seed"])
    expected = recorded.get("data_info", {}).get("heldout_documents")
    got = [d.title or d.source for d in held_docs]
    if expected is not None and got != expected:
        sys.exit(
            f"corpus {corpus!r} is not the one {run_dir} was trained on "
            f"(its held-out documents would be {got[:3]}, the run held out {expected[:3]})"
        )
    return held_docs, train_docs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("run_dir")
    p.add_argument("--sentences", type=int, default=300, help="masked sentences to score (default 300)")
    p.add_argument("--show", type=int, default=12, help="sentences to print with their top-5")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus", default=None, help="the run's corpus, if it moved since training")
    p.add_argument("--write", action="store_true", help="also write RUN_DIR/fill_mask.json")
    p.add_argument("--save-heldout-text", default=None, metavar="FILE", help="write the held-out books to FILE")
    args = p.parse_args(argv)
    if args.sentences < 1:
        p.error(f"--sentences must be >= 1, got {args.sentences}")
    if args.show < 0:
        p.error(f"--show must be >= 0, got {args.show}")
    run_dir = Path(args.run_dir)
    if args.save_heldout_text and Path(args.save_heldout_text).exists():
        sys.exit(
            f"--save-heldout-text {args.save_heldout_text}: the file exists; choose a new name (nothing was written)"
        )
    held_docs, train_docs = heldout_documents(run_dir, args.corpus)
    if args.save_heldout_text:
        Path(args.save_heldout_text).write_text("\n\n".join(d.text for d in held_docs))
    fill = pipeline("fill-mask", model=str(run_dir), top_k=5)
    tok = fill.tokenizer
    vocab = tok.get_vocab()
    norm = str.lower if getattr(tok, "do_lower_case", True) else str
    sentences = [
        (d.title or d.source, s)
        for d in held_docs
        for s in split_sentences(d.text)
        if 8 <= len(s.split()) <= 30 and not re.search(r"[_\[\]*#<>|]", s)
    ]
    rng = random.Random(args.seed)
    rng.shuffle(sentences)

    # the frequency baseline: the 5 most frequent whole-word tokens of the training books
    counts = Counter()
    for doc in train_docs[:20]:
        counts.update(norm(w) for w in WORD.findall(doc.text[:500_000]))
    frequent = [w for w, _ in counts.most_common(50) if w in vocab][:5]

    items = []
    for title, s in sentences:
        words = [m for m in WORD.finditer(s) if norm(m.group()) in vocab]
        if not words:
            continue
        m = rng.choice(words)
        masked = s[: m.start()] + tok.mask_token + s[m.end() :]
        if len(tok(masked)["input_ids"]) > tok.model_max_length:
            continue
        items.append({"book": title, "text": masked, "answer": norm(m.group())})
        if len(items) == args.sentences:
            break
    if not items:
        sys.exit(f"no usable held-out sentences in {run_dir}'s corpus")

    outputs = fill([it["text"] for it in items], batch_size=64)
    if len(items) == 1:  # the pipeline unwraps a one-element list
        outputs = [outputs]
    top1 = top5 = base1 = base5 = 0
    for it, out in zip(items, outputs, strict=True):
        it["predictions"] = [(o["token_str"].strip(), round(float(o["score"]), 4)) for o in out]
        guesses = [g for g, _ in it["predictions"]]
        top1 += guesses[0] == it["answer"]
        top5 += it["answer"] in guesses
        base1 += frequent[0] == it["answer"]
        base5 += it["answer"] in frequent

    for it in items[: args.show]:
        preds = ", ".join(f"{g} {p:.2f}" for g, p in it["predictions"])
        print(f"- {it['text']}\n    answer: {it['answer']:<14} model: {preds}")
    n = len(items)
    summary = {
        "run_dir": str(run_dir),
        "sentences": n,
        "seed": args.seed,
        "top1": top1 / n,
        "top5": top5 / n,
        "frequency_baseline": {"guesses": frequent, "top1": base1 / n, "top5": base5 / n},
    }
    print(
        f"\n{n} held-out sentences, one masked word each: top-1 {top1 / n:.1%}, top-5 {top5 / n:.1%}; "
        f"always guessing the most frequent words {frequent}: top-1 {base1 / n:.1%}, top-5 {base5 / n:.1%}"
    )
    if args.write:
        (run_dir / "fill_mask.json").write_text(json.dumps({"summary": summary, "items": items}, indent=1))
    return summary


if __name__ == "__main__":
    main()
