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
    """Token ids (no special tokens) of each document, in order.

    Long documents are encoded in ``chunk_chars`` pieces cut at whitespace (the fast tokenizer
    then runs them in parallel). Stops early once ``max_tokens`` ids have been produced.

    ``with_chars`` also counts the characters of the original text each token covers, from the
    fast tokenizer's offset mapping (which refers to the un-normalised text): a token covers the
    characters from the end of the previous token of the same document (its start, for the first
    token) to its own end, so the whitespace before a word belongs to the word's first token.
    The counts of a document's tokens sum to the end offset of its last token (trailing
    whitespace is covered by no token); they are the denominator of bits per character.

    Returns:
        a list with one ``list[int]`` per document (the last possibly cut short); with
        ``with_chars``, ``(ids, chars)``: two such lists, ``chars`` aligned with ``ids``.
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
    """Concatenate documents (each followed by [SEP]) and cut into ``[CLS] … [SEP]`` sequences.

    Every row has exactly ``max_seq_length`` tokens, so no padding and no attention mask is
    needed; the incomplete tail is dropped.

    ``chars``: per-token character counts aligned with ``token_ids`` (from
    :func:`tokenize_documents` with ``with_chars``); they are packed the same way, with 0 at
    every [CLS] and [SEP] (special tokens cover no text).

    Returns:
        int64 tensor [num_sequences, max_seq_length]; with ``chars``, ``(ids, chars)``: two such
        tensors, aligned.

    Raises:
        ValueError: max_seq_length < 3, too little text for one sequence, or ``chars`` not
            aligned with ``token_ids``.
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
    """Windows of ``seq_len`` tokens of the text, evenly spread over it, framed as the model expects:
    [CLS] + tokens + [SEP] for a tokenizer with a [CLS] token (BERT-style), [BOS] + tokens for one
    with a beginning-of-sequence token only (GPT-2, Llama), the tokens alone otherwise.

    Returns:
        [num_sequences, seq_len] token ids, num_sequences = min(max_sequences, windows available);
        a text shorter than one window gives one shorter sequence.

    Raises:
        ValueError: seq_len < 3, max_sequences < 1, or a text with no tokens.
    """
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
