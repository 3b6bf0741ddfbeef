"""Tokenise documents and pack the token stream into fixed-length sequences (no padding)."""

from __future__ import annotations

import numpy as np
import torch


def tokenize_documents(tokenizer, texts: list[str], max_tokens: int | None = None, chunk_chars: int = 50_000):
    """Token ids (no special tokens) of each document, in order.

    Long documents are encoded in ``chunk_chars`` pieces cut at whitespace (the fast tokenizer
    then runs them in parallel). Stops early once ``max_tokens`` ids have been produced.

    Returns:
        a list with one ``list[int]`` per document (the last possibly cut short).
    """
    backend = tokenizer.backend_tokenizer
    out, total = [], 0
    for text in texts:
        pieces, start = [], 0
        while start < len(text):
            end = min(len(text), start + chunk_chars)
            if end < len(text):
                cut = text.rfind(" ", start, end)
                end = cut if cut > start else end
            pieces.append(text[start:end])
            start = end
        ids: list[int] = []
        for i in range(0, len(pieces), 64):
            for enc in backend.encode_batch(pieces[i : i + 64], add_special_tokens=False):
                ids.extend(enc.ids)
            if max_tokens is not None and total + len(ids) >= max_tokens:
                break
        if max_tokens is not None and total + len(ids) >= max_tokens:
            out.append(ids[: max_tokens - total])
            return out
        out.append(ids)
        total += len(ids)
    return out


def pack_sequences(token_ids: list[list[int]], max_seq_length: int, cls_id: int, sep_id: int) -> torch.Tensor:
    """Concatenate documents (each followed by [SEP]) and cut into ``[CLS] … [SEP]`` sequences.

    Every row has exactly ``max_seq_length`` tokens, so no padding and no attention mask is
    needed; the incomplete tail is dropped.

    Returns:
        int64 tensor [num_sequences, max_seq_length].

    Raises:
        ValueError: max_seq_length < 3, or too little text for one sequence.
    """
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be >= 3, got {max_seq_length}")
    body = max_seq_length - 2
    stream = []
    for ids in token_ids:
        stream.extend(ids)
        stream.append(sep_id)
    n = len(stream) // body
    if n == 0:
        raise ValueError(f"corpus too small: {len(stream)} tokens, fewer than one sequence of {max_seq_length}")
    body_t = torch.tensor(stream[: n * body], dtype=torch.long).view(n, body)
    cls = torch.full((n, 1), cls_id, dtype=torch.long)
    sep = torch.full((n, 1), sep_id, dtype=torch.long)
    return torch.cat([cls, body_t, sep], dim=1)


def text_windows(tokenizer, text: str, seq_len: int, max_sequences: int = 8) -> torch.Tensor:
    """Windows of the text as [CLS] + (seq_len − 2) tokens + [SEP], evenly spread over the text.

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
    body = seq_len - 2
    windows = max(1, len(ids) // body)
    starts = np.linspace(0, (windows - 1) * body, num=min(windows, max_sequences)).astype(int)
    starts = [int(s) // body * body for s in starts]  # whole, non-overlapping windows
    rows = [[tokenizer.cls_token_id] + ids[s : s + body] + [tokenizer.sep_token_id] for s in starts]
    return torch.tensor(rows, dtype=torch.long)
