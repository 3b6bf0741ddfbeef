import gzip
import json

import pytest
import torch

from fixedhead.data import pack_sequences, read_corpus, split_documents, tokenize_documents, train_tokenizer
from fixedhead.data.mlm import fixed_masking, mlm_collator

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
