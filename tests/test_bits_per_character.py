"""Bits per character: the per-token character counts (tokenising and packing), the score on hand-made
logits, its independence from how the text is cut into tokens, and ``fixedhead evaluate --text``."""

import hashlib
import json
import math
from types import SimpleNamespace

import pytest
import torch

from fixedhead.cli import main
from fixedhead.data import pack_sequences, tokenize_documents, train_tokenizer
from fixedhead.training import evaluate_lm, evaluate_run, evaluate_text

WORDS = "the quick brown fox jumps over the lazy dog . "


# --------------------------------------------------------------------------- character counts
def test_each_token_covers_the_whitespace_before_it(tmp_path):
    tok = train_tokenizer([WORDS * 40], vocab_size=200, cache_dir=tmp_path)
    text = "  The quick\tbrown  fox.\n"
    ids, chars = tokenize_documents(tok, [text], with_chars=True)
    assert tok.convert_ids_to_tokens(ids[0]) == ["the", "quick", "brown", "fox", "."]  # whole words here
    # by hand: "  The" (2 spaces + 3), " quick", "\tbrown", "  fox", "." ; the final newline is covered by none
    assert chars[0] == [5, 6, 6, 5, 1]
    assert tokenize_documents(tok, [text]) == ids  # the ids are the same with or without counts


def test_counts_refer_to_the_original_text_and_ignore_chunking(tmp_path):
    """Lower-casing and accent stripping change the text the tokenizer sees, not the characters
    counted; cutting a long document into pieces changes neither ids nor counts."""
    text = "Héllo WÖRLD, ça va? Naïve café 日本語 and the quick brown fox. " * 5 + "  \n"
    tok = train_tokenizer([WORDS * 40, text], vocab_size=150, cache_dir=tmp_path)
    ids, chars = tokenize_documents(tok, [text, "fox"], with_chars=True)
    assert [len(c) for c in chars] == [len(i) for i in ids]
    assert sum(chars[0]) == len(text.rstrip()) and sum(chars[1]) == 3  # every character up to the last token's end
    assert all(c >= 1 for c in chars[0])
    ids17, chars17 = tokenize_documents(tok, [text, "fox"], with_chars=True, chunk_chars=17)
    assert ids17 == ids and chars17 == chars
    capped_ids, capped_chars = tokenize_documents(tok, [text], max_tokens=7, with_chars=True)
    assert capped_ids[0] == ids[0][:7] and capped_chars[0] == chars[0][:7]


def test_packing_carries_counts_with_zero_at_special_tokens():
    ids, chars = [[10, 11, 12], [13, 14, 15, 16, 17, 18, 19]], [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10]]
    packed, packed_chars = pack_sequences(ids, 6, cls_id=2, sep_id=3, chars=chars)
    # stream: 10 11 12 [SEP] 13 ... 19 [SEP], bodies of 4 between [CLS] and [SEP]
    assert packed.tolist() == [[2, 10, 11, 12, 3, 3], [2, 13, 14, 15, 16, 3], [2, 17, 18, 19, 3, 3]]
    assert packed_chars.tolist() == [[0, 1, 2, 3, 0, 0], [0, 4, 5, 6, 7, 0], [0, 8, 9, 10, 0, 0]]
    with pytest.raises(ValueError, match="one count per token"):
        pack_sequences(ids, 6, 2, 3, chars=[[1, 2], [4]])


# ------------------------------------------------------------------- the score, by hand
class FixedLogits(torch.nn.Module):
    """Every position predicts token 0, 1, 2, 3 with probability 1/2, 1/4, 1/8, 1/8."""

    def __init__(self):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, labels=None):
        probs = torch.tensor([0.5, 0.25, 0.125, 0.125])
        return SimpleNamespace(logits=probs.log().expand(*input_ids.shape, 4).clone())


def test_causal_bits_per_character_counts_the_target_tokens():
    # position t predicts token t + 1; the closing [SEP] (label -100) is not a target
    ids = torch.tensor([[3, 0, 1, 2, 3]])
    labels = torch.tensor([[3, 0, 1, 2, -100]])
    chars = torch.tensor([[0, 2, 5, 1, 0]])
    m = evaluate_lm(FixedLogits(), ids, labels, objective="clm", chars=chars)
    # targets 0, 1, 2 cost 1 + 2 + 3 = 6 bits and cover 2 + 5 + 1 = 8 characters
    assert m["masked_tokens"] == 3 and m["scored_characters"] == 8
    assert m["bits_per_character"] == pytest.approx(6 / 8, rel=1e-6)
    assert m["loss"] == pytest.approx(6 * math.log(2) / 3, rel=1e-6)
    assert "bits_per_character" not in evaluate_lm(FixedLogits(), ids, labels, objective="clm")


def test_masked_bits_per_character_counts_the_masked_tokens():
    ids = torch.tensor([[3, 4, 4, 4, 3], [3, 4, 0, 4, 3]])
    labels = torch.tensor([[-100, 1, -100, 0, -100], [-100, -100, -100, 3, -100]])
    chars = torch.tensor([[0, 4, 5, 2, 0], [0, 7, 1, 3, 0]])
    m = evaluate_lm(FixedLogits(), ids, labels, batch_size=1, objective="mlm", chars=chars)
    # masked targets 1, 0, 3: 2 + 1 + 3 = 6 bits over 4 + 2 + 3 = 9 characters
    assert m["scored_characters"] == 9 and m["bits_per_character"] == pytest.approx(6 / 9, rel=1e-6)
    with pytest.raises(ValueError, match="aligned"):
        evaluate_lm(FixedLogits(), ids, labels, objective="mlm", chars=chars[:, :4])


class PerCharacterModel(torch.nn.Module):
    """A causal 'model' that spends exactly log2(27) bits on every character of a target token and
    nothing on a token that covers none: probability 27^-c for a target covering c characters.
    Called on one row at a time, in order (``chars`` are the rows' counts)."""

    def __init__(self, chars: torch.Tensor, vocab: int):
        super().__init__()
        self.chars, self.vocab, self.calls = chars, vocab, 0
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, labels):
        c = self.chars[self.calls : self.calls + len(labels), 1:].double()  # what position t predicts: t + 1
        self.calls += len(labels)
        target = labels[:, 1:].clamp(min=0).unsqueeze(-1)
        logits = torch.full((len(labels), labels.shape[1], self.vocab), -1e9, dtype=torch.float64)
        # logit 0 on the target and log(27^c - 1) on one other token: softmax gives the target 27^-c
        other = torch.where(c > 0, torch.log(27.0**c - 1), torch.full_like(c, -1e9)).unsqueeze(-1)
        logits[:, :-1].scatter_(-1, (target + 1) % self.vocab, other)
        logits[:, :-1].scatter_(-1, target, torch.zeros_like(other))
        return SimpleNamespace(logits=logits)


def test_a_per_character_cost_gives_the_same_bits_per_character_under_any_tokenizer(tmp_path):
    """Two tokenizers cut the same text into different numbers of tokens: per-token perplexity
    differs, bits per character (of a model that pays per character) is the same: log2(27)."""
    text = (
        "Jumping foxes, lazier dogs; the browner quickness! A miller watched his river every morning "
        "while shepherds counted sheep upon distant hills, and children gathered wheat near stony walls. "
    ) * 8
    results = []
    for vocab in (100, 1000):
        tok = train_tokenizer([text], vocab_size=vocab, cache_dir=tmp_path / str(vocab))
        ids, chars = tokenize_documents(tok, [text, text.upper()], with_chars=True)
        packed, packed_chars = pack_sequences(ids, 16, tok.cls_token_id, tok.sep_token_id, chars=chars)
        labels = packed.clone()
        labels[:, -1] = -100  # the closing [SEP] of a row is not predicted
        model = PerCharacterModel(packed_chars, len(tok))
        results.append(evaluate_lm(model, packed, labels, batch_size=1, objective="clm", chars=packed_chars))
    coarse, fine = results
    assert fine["masked_tokens"] < 0.8 * coarse["masked_tokens"]  # the bigger vocabulary needs fewer tokens
    assert fine["perplexity"] > 1.5 * coarse["perplexity"]
    for r in results:
        assert r["bits_per_character"] == pytest.approx(math.log2(27), rel=1e-6)


# ------------------------------------------------------------------ held-out and evaluate --text
def _heldout_files(data, corpus, folder):
    """The run's held-out documents, one .txt file each, in corpus order (a folder reads sorted)."""
    from fixedhead.data import read_corpus

    titles = set(data.info["heldout_documents"])
    docs = [d.text for d in read_corpus(str(corpus)) if (d.title or d.source) in titles]
    folder.mkdir()
    for i, doc in enumerate(docs):
        (folder / f"{i:03d}.txt").write_text(doc)
    return docs


@pytest.mark.parametrize("kind", ["mlm", "clm"])
def test_text_that_is_the_heldout_set_scores_as_the_heldout_set(
    kind, tiny_pretrained_run, tiny_causal_run, small_real_corpus, tmp_path
):
    run, data, result = tiny_pretrained_run if kind == "mlm" else tiny_causal_run
    assert 0.3 < result["heldout_bits_per_character"] < 8
    again = evaluate_run(run)
    assert again["bits_per_character"] == pytest.approx(result["heldout_bits_per_character"], rel=1e-5)
    docs = _heldout_files(data, small_real_corpus, tmp_path / "held")
    cap = data.settings.max_eval_tokens
    scored = evaluate_text(run, tmp_path / "held", max_eval_tokens=cap)
    every_token = sum(len(data.tokenizer(d, add_special_tokens=False)["input_ids"]) for d in docs)
    assert scored["objective"] == kind and scored["masked_tokens"] == result["heldout_masked_tokens"]
    assert scored["loss"] == pytest.approx(result["heldout_loss"], rel=1e-5)
    assert scored["bits_per_character"] == pytest.approx(result["heldout_bits_per_character"], rel=1e-5)
    assert scored["text_tokens"] == min(cap, every_token) and scored["documents"] == len(docs)
    # bits per character is the same total cross-entropy as the loss, over characters instead of tokens
    total_bits = scored["loss"] * scored["masked_tokens"] / math.log(2)
    assert scored["bits_per_character"] == pytest.approx(total_bits / scored["scored_characters"], rel=1e-9)
    # masked: the scored tokens' text only (about 15% of it); causal: nearly all of it
    covered = sum(data.heldout_chars.reshape(-1).tolist())
    assert data.heldout_chars.shape == data.heldout.shape
    ratio = scored["scored_characters"] / covered
    assert (0.08 < ratio < 0.25) if kind == "mlm" else (ratio > 0.95)


@pytest.mark.parametrize("kind", ["mlm", "clm"])
def test_cli_evaluate_text_scores_a_folder_of_new_text(kind, tiny_pretrained_run, tiny_causal_run, tmp_path, capsys):
    run, data, _ = tiny_pretrained_run if kind == "mlm" else tiny_causal_run
    folder = tmp_path / "new"
    folder.mkdir()
    a = "The river ran past the old mill, and the miller watched it every morning. " * 12
    b = "A small town stood on the hill; its people grew wheat and kept sheep. " * 12
    (folder / "a.txt").write_text(a)
    (folder / "b.txt").write_text(b)
    assert main(["evaluate", str(run), "--text", str(folder)]) == 0
    out = json.loads(capsys.readouterr().out)
    tok = data.tokenizer
    n_tokens = len(tok(a, add_special_tokens=False)["input_ids"]) + len(tok(b, add_special_tokens=False)["input_ids"])
    assert out["documents"] == 2 and out["text_tokens"] == n_tokens
    assert out["text_sha256"] == hashlib.sha256(a.encode() + b"\x00" + b.encode() + b"\x00").hexdigest()
    n = data.heldout.shape[1]
    assert out["sequences"] == (n_tokens + 2) // (n - 2)  # a [SEP] after each document; the tail dropped
    if kind == "clm":
        assert out["masked_tokens"] == out["sequences"] * (n - 2) and out["eval_seed"] is None
    else:
        assert 0 < out["masked_tokens"] < out["sequences"] * (n - 2) and out["eval_seed"] == 1234
    for key in ("loss", "perplexity", "accuracy", "bits_per_character"):
        assert math.isfinite(out[key]) and out[key] > 0, key
    assert out["perplexity"] == pytest.approx(math.exp(out["loss"]))
    assert 0 < out["scored_characters"] <= len(a) + len(b)
    # --max-eval-tokens caps the text read
    assert main(["evaluate", str(run), "--text", str(folder), "--max-eval-tokens", "64"]) == 0
    capped = json.loads(capsys.readouterr().out)
    assert capped["text_tokens"] == 64 and capped["sequences"] == 64 // (n - 2)


def test_cli_evaluate_reports_heldout_bits_per_character(tiny_pretrained_run, capsys):
    run, _, result = tiny_pretrained_run
    assert main(["evaluate", str(run)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bits_per_character"] == pytest.approx(result["heldout_bits_per_character"], rel=1e-5)


def test_cli_evaluate_text_errors_are_one_line(tiny_pretrained_run, tmp_path, capsys):
    run, _, _ = tiny_pretrained_run
    (tmp_path / "blank.txt").write_text("  \n\n ")
    (tmp_path / "short.txt").write_text("the end")
    (tmp_path / "good.txt").write_text("the cat sat on the mat. " * 30)
    (tmp_path / "empty_dir").mkdir()
    cases = [
        (["evaluate", str(run), "--text", str(tmp_path / "missing.txt")], "does not exist"),
        (["evaluate", str(run), "--text", str(tmp_path / "blank.txt")], "is empty"),
        (["evaluate", str(run), "--text", str(tmp_path / "short.txt")], "too few for one sequence"),
        (["evaluate", str(tmp_path / "empty_dir"), "--text", str(tmp_path / "good.txt")], "empty_dir"),
        (["evaluate", str(run), "--text", str(tmp_path / "good.txt"), "--corpus", "x.txt"], "not both"),
        (["evaluate", str(run), "--text", str(tmp_path / "good.txt"), "--max-eval-tokens", "5"], "--max-eval-tokens"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    # --corpus still means "the training corpus moved": other text is refused
    (tmp_path / "other").mkdir()
    for name in ("a", "b", "c"):
        (tmp_path / "other" / f"{name}.txt").write_text(f"document {name}: the cat sat on the mat. " * 30)
    assert main(["evaluate", str(run), "--corpus", str(tmp_path / "other")]) == 2
    assert "content changed" in capsys.readouterr().err
