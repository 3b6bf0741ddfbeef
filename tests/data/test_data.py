import gzip
import json

import pytest
import torch

from fixedhead.data import pack_sequences, read_corpus, split_documents, tokenize_documents, train_tokenizer
from fixedhead.data.lm import fixed_masking, mlm_collator

TEXT = "The quick brown fox jumps over the lazy dog. " * 40


def test_read_txt_jsonl_gz_and_directory(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT)
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "first doc", "title": "t1"}) + "\n\n")
        f.write(json.dumps({"text": "second doc"}) + "\n")
    (tmp_path / "sub").mkdir()
    with gzip.open(tmp_path / "sub" / "c.txt.gz", "wt") as f:
        f.write("gz text")
    (tmp_path / "ignored.csv").write_text("x")
    assert [d.text for d in read_corpus(tmp_path / "a.txt")] == [TEXT]
    assert [d.title for d in read_corpus(tmp_path / "b.jsonl.gz")] == ["t1", ""]
    docs = read_corpus(tmp_path)
    assert [d.text for d in docs] == [TEXT, "first doc", "second doc", "gz text"]


def test_split_is_by_document_and_deterministic():
    from fixedhead.data import Document

    docs = [Document(f"doc {i}", str(i)) for i in range(40)]
    tr1, he1 = split_documents(docs, 0.1, seed=3)
    tr2, he2 = split_documents(docs, 0.1, seed=3)
    _, he3 = split_documents(docs, 0.1, seed=4)
    assert he1 == he2 and he1 != he3
    assert len(he1) == 4 and len(tr1) == 36
    assert not {d.source for d in tr1} & {d.source for d in he1}
    with pytest.raises(ValueError, match="at least 2"):
        split_documents(docs[:1])


def test_tokenizer_is_bert_style_and_cached(tmp_path):
    texts = [TEXT, "Another document about cats and dogs. " * 30]
    tok = train_tokenizer(texts, vocab_size=120, cache_dir=tmp_path)
    assert [tok.convert_tokens_to_ids(t) for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]] == [0, 1, 2, 3, 4]
    assert tok("the fox")["input_ids"][0] == tok.cls_token_id
    assert len(list(tmp_path.iterdir())) == 1
    again = train_tokenizer(texts, vocab_size=120, cache_dir=tmp_path)
    assert again.get_vocab() == tok.get_vocab()
    assert len(list(tmp_path.iterdir())) == 1  # loaded, not retrained
    train_tokenizer(texts, vocab_size=130, cache_dir=tmp_path)
    assert len(list(tmp_path.iterdir())) == 2  # settings are part of the key
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(texts, vocab_size=5, cache_dir=tmp_path)


def test_tokenizer_learns_an_even_share_of_every_document(tmp_path):
    """max_chars=200 over two documents: the first 100 characters of each, nothing after them."""
    a, b = "the quick brown fox. " * 10, "a lazy dog sleeps. " * 10  # 210 and 190 characters
    train_tokenizer([a, b], vocab_size=120, cache_dir=tmp_path, max_chars=200)
    assert len(list(tmp_path.iterdir())) == 1
    # past each document's share: the same text was learnt from, the cached tokenizer is reused
    train_tokenizer([a[:100] + "zebra" * 20, b[:100] + "yak" * 30], vocab_size=120, cache_dir=tmp_path, max_chars=200)
    assert len(list(tmp_path.iterdir())) == 1
    # inside the second document's share (not "200 characters of the first document, in order")
    train_tokenizer([a, "zebra" + b[5:]], vocab_size=120, cache_dir=tmp_path, max_chars=200)
    assert len(list(tmp_path.iterdir())) == 2


def test_packing():
    packed = pack_sequences([[10, 11, 12], [13, 14, 15, 16, 17, 18, 19]], 6, cls_id=2, sep_id=3)
    # stream: 10 11 12 3 13 14 15 16 17 18 19 3 -> bodies of 4
    assert packed.tolist() == [[2, 10, 11, 12, 3, 3], [2, 13, 14, 15, 16, 3], [2, 17, 18, 19, 3, 3]]
    with pytest.raises(ValueError, match="too small"):
        pack_sequences([[1]], 64, 2, 3)


def test_tokenize_documents_stops_at_budget(tmp_path):
    tok = train_tokenizer([TEXT], vocab_size=120, cache_dir=tmp_path)
    ids = tokenize_documents(tok, [TEXT, TEXT], max_tokens=50)
    assert sum(map(len, ids)) == 50
    full = tokenize_documents(tok, [TEXT], chunk_chars=97)  # chunking at spaces does not change the tokens
    assert full[0] == tok(TEXT, add_special_tokens=False)["input_ids"]


def test_masking_is_80_10_10_and_fixed_masking_is_reproducible(tmp_path):
    tok = train_tokenizer([TEXT], vocab_size=120, cache_dir=tmp_path)
    seqs = torch.randint(5, len(tok), (400, 50))
    batch = mlm_collator(tok, seed=0)([{"input_ids": s} for s in seqs])
    masked = batch["labels"] != -100
    assert 0.13 < masked.float().mean() < 0.17
    as_mask = (batch["input_ids"] == tok.mask_token_id) & masked
    kept = (batch["input_ids"] == seqs) & masked
    assert 0.77 < as_mask.sum() / masked.sum() < 0.83
    assert 0.07 < kept.sum() / masked.sum() < 0.13
    a = fixed_masking(seqs, tok, seed=5)
    b = fixed_masking(seqs, tok, seed=5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_directory_follows_symlinked_subfolders(tmp_path):
    # documents kept elsewhere and linked into the corpus folder (Path.rglob skips such links on
    # Python < 3.13, which read this corpus as empty)
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    (shelf / "b.txt").write_text("book b")
    (shelf / "a.txt").write_text("book a")
    (shelf / ".draft.txt").write_text("a hidden draft")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "books").symlink_to(shelf, target_is_directory=True)
    assert [(d.text, d.source) for d in read_corpus(corpus)] == [
        ("book a", str(corpus / "books" / "a.txt")),
        ("book b", str(corpus / "books" / "b.txt")),
    ]
    # next to a real file and a real folder: still sorted by path, hidden names still skipped
    (corpus / "c.txt").write_text("file c")
    (corpus / "0").mkdir()
    (corpus / "0" / "z.txt").write_text("file z")
    (corpus / ".hidden").symlink_to(shelf, target_is_directory=True)
    assert [d.text for d in read_corpus(corpus)] == ["file z", "book a", "book b", "file c"]


def test_directory_symlink_loops_end_and_a_folder_is_read_once(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "sub" / "a.txt").write_text("doc a")
    (corpus / "top.txt").write_text("doc top")
    (corpus / "sub" / "up").symlink_to(corpus, target_is_directory=True)  # corpus/sub/up/sub/up/...
    (corpus / "sub" / "self").symlink_to(corpus / "sub", target_is_directory=True)
    (corpus / "twin").symlink_to(corpus / "sub", target_is_directory=True)  # the same folder again
    docs = read_corpus(corpus)  # would recurse forever (or to the path-length limit) without a guard
    assert sorted(d.text for d in docs) == ["doc a", "doc top"]
    assert [d.source for d in docs] == [str(corpus / "sub" / "a.txt"), str(corpus / "top.txt")]


def test_directory_with_only_a_broken_or_looping_link_is_refused(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "gone").symlink_to(tmp_path / "nowhere", target_is_directory=True)
    (corpus / "loop").symlink_to(corpus, target_is_directory=True)
    with pytest.raises(ValueError, match="directory holds no .txt/.jsonl/.txt.gz/.jsonl.gz files"):
        read_corpus(corpus)


def test_wordpiece_vocab_merges_by_hand():
    """Counts {"ab": 3, "abc": 1}: specials, alphabet a b c, inside-word ##b ##c; pair (a, ##b)
    occurs 4 times and is merged first, then (ab, ##c) once."""
    from fixedhead.data.tokenizer import SPECIAL_TOKENS, learn_wordpiece_vocab

    base = [*SPECIAL_TOKENS, "a", "b", "c", "##b", "##c"]
    assert learn_wordpiece_vocab({"ab": 3, "abc": 1}, 12) == [*base, "ab", "abc"]
    assert learn_wordpiece_vocab({"ab": 3, "abc": 1}, 11) == [*base, "ab"]  # stops at the size
    # a tie (both pairs once) goes to the pair of lower ids: a < c, whatever order the counts come in
    tie = [*SPECIAL_TOKENS, "a", "b", "c", "d", "##b", "##d", "ab", "cd"]
    assert learn_wordpiece_vocab({"cd": 1, "ab": 1}, 20) == tie
    assert learn_wordpiece_vocab(dict(reversed(list({"cd": 1, "ab": 1}.items()))), 20) == tie
    # {"ing": 2, "xing": 5}: "##n" + "##g" (7) -> "##ng", the second prefix dropped; then (x, ##i) and
    # (##i, ##ng) tie at 5 and x has the lower id -> "xi", then "xing" (5), last "ing" (2)
    assert learn_wordpiece_vocab({"ing": 2, "xing": 5}, 20)[-4:] == ["##ng", "xi", "xing", "ing"]
    # a repeated pair merges left to right: "aaa" is a ##a ##a, (a, ##a) -> "aa"
    assert learn_wordpiece_vocab({"aaa": 1}, 8)[-1] == "aa"


_TRAIN_IN_SUBPROCESS = """
import sys
from fixedhead.data import read_corpus, train_tokenizer
train_tokenizer([d.text for d in read_corpus(sys.argv[1])], vocab_size=400, cache_dir=sys.argv[2])
"""


def test_tokenizer_is_byte_identical_across_processes_and_threads(small_real_corpus, tmp_path):
    """The same text trained in two fresh processes, one limited to one thread everywhere (rayon,
    the tokenizers library's parallelism, BLAS): the same bytes in every saved file."""
    import os
    import subprocess
    import sys

    outputs = []
    for i, env in enumerate(
        [
            {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"},
            {"RAYON_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "true"},
        ]
    ):
        cache = tmp_path / f"cache{i}"
        run_env = {k: v for k, v in os.environ.items() if k not in ("RAYON_NUM_THREADS", "OMP_NUM_THREADS")}
        subprocess.run(
            [sys.executable, "-c", _TRAIN_IN_SUBPROCESS, str(small_real_corpus), str(cache)],
            env={**run_env, **env},
            check=True,
        )
        (folder,) = cache.iterdir()
        outputs.append({f.name: f.read_bytes() for f in sorted(folder.iterdir())})
    assert "tokenizer.json" in outputs[0]
    assert outputs[0] == outputs[1]


def test_tokenizer_hash_names_what_maps_text_to_ids(tmp_path):
    from fixedhead.data.tokenizer import tokenizer_sha256
    from fixedhead.training.pretrain import causal_tokenizer

    tok = train_tokenizer([TEXT, "Another document about cats and dogs. " * 30], vocab_size=120, cache_dir=tmp_path)
    assert tokenizer_sha256(tok) == tokenizer_sha256(causal_tokenizer(tok))  # other framing, same ids
    other = train_tokenizer([TEXT, "Another document about mice and dogs. " * 30], vocab_size=120, cache_dir=tmp_path)
    assert tokenizer_sha256(other) != tokenizer_sha256(tok)


def test_a_validation_split_is_carved_from_training_documents_only(small_real_corpus, tiny_prepared, tmp_path):
    from fixedhead.data import DataSettings, prepare_data
    from fixedhead.data.tokenizer import tokenizer_sha256

    settings = {**vars(tiny_prepared.settings), "validation_fraction": 0.2}
    with_val = prepare_data(DataSettings(**settings), cache_dir=tmp_path, progress=False)
    assert tiny_prepared.validation is None and "validation_sequences" not in tiny_prepared.info
    # the tokenizer is learned from every training document: the same with or without the split
    assert tokenizer_sha256(with_val.tokenizer) == tokenizer_sha256(tiny_prepared.tokenizer)
    torch.testing.assert_close(with_val.heldout, tiny_prepared.heldout)  # the reported set is untouched
    docs = tiny_prepared.info["train_documents"]
    assert with_val.info["train_documents"] + with_val.info["validation_documents"] == docs
    assert with_val.info["validation_documents"] == round(0.2 * docs)
    assert with_val.info["validation_sequences"] == with_val.validation.shape[0] > 0
    assert with_val.validation_chars.shape == with_val.validation.shape
    # no validation row is trained on: the training rows shrink and share no row with it
    assert with_val.train.shape[0] < tiny_prepared.train.shape[0]
    train_rows = {tuple(r) for r in with_val.train.tolist()}
    assert not any(tuple(r) in train_rows for r in with_val.validation.tolist())
    with pytest.raises(ValueError, match=r"validation_fraction must be in \[0, 1\), got 1.0"):
        DataSettings(**{**settings, "validation_fraction": 1.0})
