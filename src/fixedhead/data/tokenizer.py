"""WordPiece tokenizer training (the tokenizers library) with BERT's special tokens, cached on disk."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from ..runs import follow_umask

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def default_cache_dir() -> Path:
    """``$FIXEDHEAD_CACHE``, else ``~/.cache/fixedhead``."""
    return Path(os.environ.get("FIXEDHEAD_CACHE", Path.home() / ".cache" / "fixedhead"))


def _iter_chunks(texts, chunk_chars=100_000):
    for t in texts:
        for i in range(0, len(t), chunk_chars):
            yield t[i : i + chunk_chars]


def train_tokenizer(
    texts: list[str],
    vocab_size: int = 8192,
    lowercase: bool = True,
    cache_dir: str | os.PathLike | None = None,
    max_chars: int | None = 20_000_000,
    model_max_length: int = 512,
):
    """Train (or load from cache) a BERT WordPiece tokenizer on ``texts``.

    The cache key is a SHA-256 of the text actually learnt from (after the ``max_chars`` cut) and
    of the settings: a changed corpus or setting trains a new tokenizer, a change beyond the cut
    reuses the cached one. Special tokens are BERT's, with ids [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3,
    [MASK]=4.

    Args:
        texts: documents to learn the vocabulary from.
        vocab_size: target vocabulary size (including special tokens).
        lowercase: BERT-uncased normalisation (lowercase, strip accents).
        cache_dir: where tokenizers are kept (default :func:`default_cache_dir`/tokenizers).
        max_chars: for speed, learn from an even share of every document, the first
            ``max(1, max_chars // len(texts))`` characters of each, so that no single long book
            dominates the vocabulary: at most ``max_chars`` characters in all, except that every
            document gives at least one. A document shorter than its share leaves the rest
            unused (it does not go to the others). None: every character.
        model_max_length: recorded in the tokenizer (the model's max_position_embeddings).

    Returns:
        a ``transformers.BertTokenizerFast``.

    Raises:
        ValueError: vocab_size below 100 or no text.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 100:
        raise ValueError(f"vocab_size must be an int >= 100, got {vocab_size!r}")
    if max_chars is not None:
        per_doc = max(1, max_chars // max(1, len(texts)))
        texts = [t[:per_doc] for t in texts]
    if not any(t.strip() for t in texts):
        raise ValueError("cannot train a tokenizer on empty text")
    h = hashlib.sha256(f"v1|{vocab_size}|{lowercase}|{model_max_length}|".encode())
    for t in texts:
        h.update(t.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "tokenizers"
    path = cache / h.hexdigest()[:16]
    if (path / "tokenizer.json").is_file():
        return BertTokenizerFast.from_pretrained(str(path))

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase, clean_text=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    tok.train_from_iterator(_iter_chunks(texts), trainer=trainer)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    fast = BertTokenizerFast(tokenizer_object=tok, do_lower_case=lowercase, model_max_length=model_max_length)
    # write to a temporary directory, then rename: a killed run never leaves a half-written cache
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".tmp-"))
    follow_umask(tmp)  # mkdtemp makes it 0700; a shared FIXEDHEAD_CACHE must stay readable to others
    fast.save_pretrained(str(tmp))
    try:
        os.replace(tmp, path)
    except OSError:  # another process won the race; use its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return BertTokenizerFast.from_pretrained(str(path))
