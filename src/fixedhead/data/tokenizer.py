"""WordPiece tokenizer: a vocabulary chosen deterministically here, tokenising by the tokenizers library,
BERT's special tokens; cached on disk.

Not ``WordPieceTrainer``: it breaks ties between equally frequent pairs by ids from a randomly seeded hash
map, so the same text trains another vocabulary on every call (huggingface/tokenizers#1794).
:func:`learn_wordpiece_vocab` runs the same algorithm with every order fixed: same text and settings, same
``tokenizer.json`` bytes on any machine and thread count.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import shutil
import tempfile
from collections import Counter, defaultdict
from itertools import pairwise
from pathlib import Path

from ..runs import follow_umask

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CONTINUING_SUBWORD_PREFIX = "##"
#: part of the cache key: a change to how vocabularies are chosen must never reuse a cached one
_ALGORITHM_VERSION = "v2-deterministic"


def default_cache_dir() -> Path:
    """``$FIXEDHEAD_CACHE``, else ``~/.cache/fixedhead``."""
    return Path(os.environ.get("FIXEDHEAD_CACHE", Path.home() / ".cache" / "fixedhead"))


#: characters normalised and pre-tokenised at a time when counting words (bounds the memory of one call)
_COUNT_CHUNK = 100_000


def texts_sha256(texts, prefix: str = "") -> str:
    """SHA-256 of ``prefix`` and then each text followed by a NUL byte, in order."""
    h = hashlib.sha256(prefix.encode())
    for t in texts:
        h.update(t.encode("utf-8", "surrogatepass") + b"\x00")
    return h.hexdigest()


def learn_wordpiece_vocab(
    word_counts: dict[str, int],
    vocab_size: int,
    special_tokens: list[str] = SPECIAL_TOKENS,
    prefix: str = CONTINUING_SUBWORD_PREFIX,
) -> list[str]:
    """Choose a WordPiece vocabulary by byte-pair merges, deterministically: ``vocab[i]`` has id ``i``.

    Start from ``special_tokens``, every character and every ``prefix``-ed character (sorted), then merge the
    most frequent adjacent pair (``"th" + "##e" → "the"``) until ``vocab_size`` pieces or no pair is left;
    ties go to the lower ids, so the result depends on ``word_counts`` alone.
    """
    words_sorted = sorted((w, n) for w, n in word_counts.items() if w and n > 0)
    vocab: list[str] = []
    ids: dict[str, int] = {}

    def add(token: str) -> int:
        if token not in ids:
            ids[token] = len(vocab)
            vocab.append(token)
        return ids[token]

    alphabet = sorted({c for w, _ in words_sorted for c in w})
    inner = sorted({c for w, _ in words_sorted for c in w[1:]})  # characters inside a word: "##" + c
    for token in [*special_tokens, *alphabet, *(prefix + c for c in inner)]:
        add(token)
    words = [[ids[w[0]]] + [ids[prefix + c] for c in w[1:]] for w, _ in words_sorted]
    counts = [n for _, n in words_sorted]
    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)  # word indices that hold (or held) a pair
    for i, w in enumerate(words):
        for pair in pairwise(w):
            pair_counts[pair] += counts[i]
            where[pair].add(i)
    heap = [(-n, pair) for pair, n in pair_counts.items()]  # most frequent first, then lowest ids
    heapq.heapify(heap)
    while len(vocab) < vocab_size and heap:
        neg_count, pair = heapq.heappop(heap)
        count = pair_counts.get(pair, 0)
        if count != -neg_count:  # a stale entry: queue the pair again at its current count
            if count > 0:
                heapq.heappush(heap, (-count, pair))
            continue
        a, b = pair
        piece_b = vocab[b]
        new = add(vocab[a] + (piece_b[len(prefix) :] if piece_b.startswith(prefix) else piece_b))
        changed = set()
        for i in sorted(where.pop(pair)):
            w = words[i]
            merged, j = [], 0
            while j < len(w):  # left to right, as the tokenizers library merges
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    merged.append(new)
                    j += 2
                else:
                    merged.append(w[j])
                    j += 1
            if len(merged) == len(w):
                continue
            for p in pairwise(w):
                pair_counts[p] -= counts[i]
                changed.add(p)
            for p in pairwise(merged):
                pair_counts[p] += counts[i]
                where[p].add(i)
                changed.add(p)
            words[i] = merged
        for p in sorted(changed):
            if pair_counts.get(p, 0) > 0:
                heapq.heappush(heap, (-pair_counts[p], p))
            else:
                pair_counts.pop(p, None)
    return vocab


def count_words(texts, lowercase: bool = True) -> Counter:
    """Occurrences of each word after BERT's normaliser and pre-tokeniser, read in 100,000-character chunks."""
    from tokenizers import pre_tokenizers

    normalizer = _normalizer(lowercase)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    counts: Counter = Counter()
    for chunk in (t[i : i + _COUNT_CHUNK] for t in texts for i in range(0, len(t), _COUNT_CHUNK)):
        counts.update(w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(chunk)))
    return counts


def _normalizer(lowercase: bool):
    from tokenizers import normalizers

    return normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase, clean_text=True)


def tokenizer_sha256(tokenizer) -> str:
    """SHA-256 of what turns text into ids (normaliser, pre-tokeniser, vocabulary): two runs with the same hash
    saw the same ids. The post-processor is left out, so a causal run's copy has its source's hash."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    spec = json.loads(backend.to_str())
    model = dict(spec["model"])
    model["vocab"] = sorted(model.get("vocab", {}).items(), key=lambda kv: kv[1])
    canonical = {"normalizer": spec.get("normalizer"), "pre_tokenizer": spec.get("pre_tokenizer"), "model": model}
    return hashlib.sha256(json.dumps(canonical, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def train_tokenizer(
    texts: list[str],
    vocab_size: int = 8192,
    lowercase: bool = True,
    cache_dir: str | os.PathLike | None = None,
    max_chars: int | None = 20_000_000,
    model_max_length: int = 512,
):
    """Train (or load from cache) a BERT WordPiece tokenizer on ``texts``: a ``BertTokenizerFast``.

    Deterministic (:func:`learn_wordpiece_vocab`; about 16 s for 18M characters on one core); the cache key
    hashes the text and settings. [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4. ``max_chars``: learn from the
    first ``max_chars // len(texts)`` characters of each document, so no long book dominates.

    Raises:
        ValueError: vocab_size below 100, or no text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import BertTokenizerFast

    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 100:
        raise ValueError(f"vocab_size must be an int >= 100, got {vocab_size!r}")
    if max_chars is not None:
        per_doc = max(1, max_chars // max(1, len(texts)))
        texts = [t[:per_doc] for t in texts]
    if not any(t.strip() for t in texts):
        raise ValueError("cannot train a tokenizer on empty text")
    key = texts_sha256(texts, f"{_ALGORITHM_VERSION}|{vocab_size}|{lowercase}|{model_max_length}|")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "tokenizers"
    path = cache / key[:16]
    if (path / "tokenizer.json").is_file():
        return BertTokenizerFast.from_pretrained(str(path))

    vocab = learn_wordpiece_vocab(count_words(texts, lowercase), vocab_size)
    tok = Tokenizer(
        models.WordPiece(
            {token: i for i, token in enumerate(vocab)},
            unk_token="[UNK]",
            continuing_subword_prefix=CONTINUING_SUBWORD_PREFIX,
        )
    )
    tok.normalizer = _normalizer(lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(t, tok.token_to_id(t)) for t in ("[CLS]", "[SEP]")],
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
