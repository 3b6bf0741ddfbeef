"""Tokenise documents and pack the token stream into fixed-length sequences (no padding)."""

from __future__ import annotations

from itertools import chain

import numpy as np
import torch


def tokenize_documents(
    tokenizer,
    texts: list[str],
    max_tokens: int | None = None,
    chunk_chars: int = 50_000,
    with_chars: bool = False,
):
    """Token ids (no special tokens) of each document, in order, stopping once ``max_tokens`` are produced.

    Long documents are encoded in ``chunk_chars`` pieces cut at whitespace (run in parallel). ``with_chars``
    also returns, aligned with the ids, the characters of original text each token covers: from the end of the
    previous token to its own end (from the fast tokenizer's offsets), so a word's leading space is its first
    token's; the denominator of bits per character.
    """
    backend = tokenizer.backend_tokenizer
    out, out_chars, total = [], [], 0
    for text in texts:
        keep = None if max_tokens is None else max_tokens - total  # ids this document may still add
        pieces, starts, start = [], [], 0
        while start < len(text):
            end = min(len(text), start + chunk_chars)
            if end < len(text) and (cut := text.rfind(" ", start, end)) > start:
                end = cut
            pieces.append(text[start:end])
            starts.append(start)
            start = end
        ids: list[int] = []
        chars: list[int] = []
        covered = 0  # end (in the document) of the text covered so far
        for i in range(0, len(pieces), 64):
            encodings = backend.encode_batch(pieces[i : i + 64], add_special_tokens=False)
            for offset, enc in zip(starts[i : i + 64], encodings, strict=True):
                ids.extend(enc.ids)
                if with_chars:
                    for _, token_end in enc.offsets:
                        token_end += offset
                        chars.append(max(0, token_end - covered))
                        covered = max(covered, token_end)
            if keep is not None and len(ids) >= keep:
                break
        out.append(ids[:keep])
        out_chars.append(chars[:keep])
        total += len(ids)
        if keep is not None and len(ids) >= keep:
            break
    return (out, out_chars) if with_chars else out


def pack_sequences(
    token_ids: list[list[int]],
    max_seq_length: int,
    cls_id: int,
    sep_id: int,
    chars: list[list[int]] | None = None,
):
    """Concatenate documents (each followed by [SEP]) and cut into ``[CLS] … [SEP]`` rows: int64
    [num_sequences, max_seq_length], no padding, the tail dropped. ``chars`` is packed alike, 0 at [CLS] and [SEP].

    Raises:
        ValueError: too little text for one sequence.
    """
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be >= 3, got {max_seq_length}")
    if chars is not None and [len(c) for c in chars] != [len(t) for t in token_ids]:
        raise ValueError("chars must have one count per token of token_ids")
    body = max_seq_length - 2
    stream = list(chain.from_iterable([*ids, sep_id] for ids in token_ids))
    char_stream = list(chain.from_iterable([*counts, 0] for counts in chars or []))
    n = len(stream) // body
    if n == 0:
        raise ValueError(f"corpus too small: {len(stream)} tokens, fewer than one sequence of {max_seq_length}")

    def rows(values, first, last):
        body_t = torch.tensor(values[: n * body], dtype=torch.long).view(n, body)
        return torch.cat([torch.full((n, 1), first), body_t, torch.full((n, 1), last)], dim=1)

    packed = rows(stream, cls_id, sep_id)
    return (packed, rows(char_stream, 0, 0)) if chars is not None else packed


def text_windows(tokenizer, text: str, seq_len: int, max_sequences: int = 8) -> torch.Tensor:
    """Up to ``max_sequences`` windows of ``seq_len`` tokens spread evenly over ``text``, [num_sequences, seq_len],
    framed as the model expects: [CLS] … [SEP] (BERT-style), [BOS] … (GPT-2, Llama) or bare. A shorter text
    gives one shorter sequence."""
    if seq_len < 3:
        raise ValueError(f"seq_len must be >= 3 ([CLS] token [SEP]), got {seq_len}")
    if max_sequences < 1:
        raise ValueError(f"max_sequences must be >= 1, got {max_sequences}")
    ids: list[int] = []
    for chunk in (text[i : i + 100_000] for i in range(0, min(len(text), 20_000_000), 100_000)):
        ids.extend(tokenizer(chunk, add_special_tokens=False, verbose=False)["input_ids"])
    if not ids:
        raise ValueError("the text has no tokens")
    if tokenizer.cls_token_id is not None:
        head, tail = [tokenizer.cls_token_id], [tokenizer.sep_token_id] if tokenizer.sep_token_id is not None else []
    else:
        head, tail = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else [], []
    body = seq_len - len(head) - len(tail)
    windows = max(1, len(ids) // body)
    starts = np.linspace(0, (windows - 1) * body, num=min(windows, max_sequences)).astype(int)
    starts = [int(s) // body * body for s in starts]  # whole, non-overlapping windows
    rows = [head + ids[s : s + body] + tail for s in starts]
    return torch.tensor(rows, dtype=torch.long)
