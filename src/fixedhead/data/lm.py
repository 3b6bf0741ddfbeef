"""From a corpus to language-model batches: preparation, datasets, masking and labels.

:func:`prepare_data` reads, splits by document, trains or loads the tokenizer and packs [num_sequences, n]
tensors. Masking is transformers' ``DataCollatorForLanguageModeling`` (15%; 80/10/10), seeded per training
batch, with one fixed masking of the held-out set so every model is scored on the same positions. The causal
objective predicts every token from those before it on the same sequences.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch.utils.data import StackDataset

from .corpus import read_corpus, split_documents
from .packing import pack_sequences, tokenize_documents
from .settings import DataSettings, check_objective
from .tokenizer import texts_sha256, tokenizer_sha256, train_tokenizer


def documents_sha256(docs) -> str:
    """SHA-256 of the documents' text (each followed by NUL), in order: a run's ``corpus_sha256``, whatever the
    files are called."""
    return texts_sha256(d.text for d in docs)


@dataclass
class PreparedData:
    tokenizer: object
    train: torch.Tensor  # [num_train_sequences, max_seq_length]
    heldout: torch.Tensor  # [num_heldout_sequences, max_seq_length]
    info: dict = field(default_factory=dict)
    settings: DataSettings | None = None
    #: [num_heldout_sequences, max_seq_length]: characters of original text each held-out token
    #: covers (0 at [CLS]/[SEP]; see :func:`fixedhead.data.tokenize_documents`), for bits per character
    heldout_chars: torch.Tensor | None = None
    #: [num_validation_sequences, max_seq_length] and its characters: the validation split
    #: (``DataSettings.validation_fraction``), None without one
    validation: torch.Tensor | None = None
    validation_chars: torch.Tensor | None = None


def prepare_data(
    settings: DataSettings, cache_dir=None, progress: bool = True, tokenizer=None, heldout_only: bool = False
) -> PreparedData:
    """Read the corpus, split by document, train or load the tokenizer, tokenise and pack.

    ``tokenizer`` reuses a trained one; ``heldout_only`` skips the training documents (``train`` is empty).
    """
    t0 = time.time()
    docs = read_corpus(settings.corpus, settings.text_field)
    train_docs, held_docs = split_documents(docs, settings.heldout_fraction, settings.split_seed)
    duplicates = len(docs) - len(train_docs) - len(held_docs)
    if progress:
        if duplicates:
            print(
                f"corpus: dropped {duplicates} exact duplicate document{'s' * (duplicates > 1)} "
                f"(held-out text must never be trained on)",
                flush=True,
            )
        print(
            f"corpus: {len(docs)} documents, {sum(len(d.text) for d in docs):,} characters; "
            f"held out {len(held_docs)}: {', '.join((d.title or d.source)[:40] for d in held_docs[:6])}"
            f"{' …' if len(held_docs) > 6 else ''}",
            flush=True,
        )
    tokenizer = tokenizer or train_tokenizer(
        [d.text for d in train_docs],
        vocab_size=settings.vocab_size,
        lowercase=settings.lowercase,
        cache_dir=cache_dir,
        max_chars=settings.tokenizer_max_chars,
        model_max_length=settings.max_seq_length,
    )

    def packed(docs, max_tokens, with_chars=True):  # ids [N, n] (and, with_chars, their characters)
        ids = tokenize_documents(tokenizer, [d.text for d in docs], max_tokens, with_chars=with_chars)
        ids, chars = ids if with_chars else (ids, None)
        return pack_sequences(ids, settings.max_seq_length, tokenizer.cls_token_id, tokenizer.sep_token_id, chars=chars)

    validation = validation_chars = None
    if settings.validation_fraction > 0:
        train_docs, val_docs = split_documents(train_docs, settings.validation_fraction, settings.split_seed)
        validation, validation_chars = packed(val_docs, settings.max_eval_tokens)
    if heldout_only:
        train = torch.empty(0, settings.max_seq_length, dtype=torch.long)
    else:
        train = packed(train_docs, settings.max_train_tokens, with_chars=False)
    heldout, heldout_chars = packed(held_docs, settings.max_eval_tokens)
    info = {
        "corpus": str(settings.corpus),
        "documents": len(docs),
        "duplicate_documents_dropped": duplicates,
        "corpus_sha256": documents_sha256(docs),
        "train_documents": len(train_docs),
        "heldout_documents": [d.title or d.source for d in held_docs],
        "train_sequences": int(train.shape[0]),
        "heldout_sequences": int(heldout.shape[0]),
        **(
            {"validation_documents": len(val_docs), "validation_sequences": int(validation.shape[0])}
            if validation is not None
            else {}
        ),
        "vocab_size": len(tokenizer),
        # which id each piece of text gets: per-token results of two runs compare only when it is equal
        "tokenizer_sha256": tokenizer_sha256(tokenizer),
        "prepare_seconds": round(time.time() - t0, 1),
    }
    if progress:
        print(
            f"data: {train.numel():,} training tokens in {train.shape[0]:,} sequences of {settings.max_seq_length}; "
            f"{heldout.numel():,} held-out tokens; vocabulary {len(tokenizer):,} ({info['prepare_seconds']} s)",
            flush=True,
        )
    return PreparedData(tokenizer, train, heldout, info, settings, heldout_chars, validation, validation_chars)


class SequenceDataset(StackDataset):
    """Rows of a packed [N, n] tensor as ``{"input_ids": row}``; the data collator makes the labels."""

    def __init__(self, sequences: torch.Tensor):
        super().__init__(input_ids=sequences)


class LabelledDataset(StackDataset):
    """Rows with fixed labels, ``{"input_ids", "labels"}``: the held-out batches of either objective."""

    def __init__(self, input_ids: torch.Tensor, labels: torch.Tensor):
        super().__init__(input_ids=input_ids, labels=labels)


def mlm_collator(tokenizer, mlm_probability: float = 0.15, seed: int | None = None):
    """transformers' ``DataCollatorForLanguageModeling``: 15% of tokens, 80% [MASK] / 10% random / 10% kept."""
    from transformers import DataCollatorForLanguageModeling

    return DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=True, mlm_probability=mlm_probability, seed=seed)


class TrainOrFixedCollator:
    """Random masking for training batches; pre-masked (held-out) batches are only stacked.

    Training batch k is masked with a generator seeded from ``(seed, k)``, not the global RNG, which the Trainer
    restores only after fetching the first batch on resume; so a resumed run masks as an uninterrupted one.
    Assumes one collating process and no gradient accumulation.
    """

    def __init__(self, tokenizer, mlm_probability=0.15, seed: int = 0):
        self.tokenizer, self.mlm_probability, self.seed = tokenizer, mlm_probability, seed
        self.batches_seen = 0

    def __call__(self, features):
        if "labels" in features[0]:
            return {k: torch.stack([f[k] for f in features]) for k in features[0]}
        self.batches_seen += 1
        seed = (self.seed % 2**31) * 2**32 + self.batches_seen
        return mlm_collator(self.tokenizer, self.mlm_probability, seed=seed)(features)


def fixed_masking(sequences: torch.Tensor, tokenizer, seed: int = 1234, mlm_probability: float = 0.15):
    """One seeded masking of ``sequences`` [N, n]: (input_ids, labels), labels -100 except where masked."""
    collator = mlm_collator(tokenizer, mlm_probability, seed=seed)
    batch = collator([{"input_ids": s} for s in sequences])
    return batch["input_ids"], batch["labels"]


def causal_labels(sequences: torch.Tensor) -> torch.Tensor:
    """Causal-LM labels of packed ``[CLS] … [SEP]`` rows [N, n]: the tokens themselves (the model shifts them),
    except each row's closing [SEP], which marks only where packing cut (-100); n − 2 tokens per row are scored."""
    labels = sequences.clone()
    labels[:, -1] = -100
    return labels


class CausalCollator:
    """Stacks rows into ``{"input_ids", "labels"}`` (labels from :func:`causal_labels` unless given)."""

    def __call__(self, features):
        ids = torch.stack([f["input_ids"] for f in features])
        labels = torch.stack([f["labels"] for f in features]) if "labels" in features[0] else causal_labels(ids)
        return {"input_ids": ids, "labels": labels}


def heldout_batches(sequences: torch.Tensor, tokenizer, objective: str = "mlm", eval_seed: int = 1234):
    """The held-out ``(input_ids, labels)`` every model of an objective is scored on: one fixed
    seeded masking (``"mlm"``, :func:`fixed_masking`) or the causal labels (``"clm"``)."""
    if check_objective(objective) == "mlm":
        return fixed_masking(sequences, tokenizer, eval_seed)
    return sequences, causal_labels(sequences)


def scored_characters(labels: torch.Tensor, chars: torch.Tensor, objective: str = "mlm") -> int:
    """Characters of original text covered by the scored tokens: the denominator of :func:`bits_per_character`.

    ``chars`` is aligned with ``labels``; for ``"clm"`` the targets are ``labels[:, 1:]``, so ``chars[:, 1:]``
    counts. Raises ValueError when the shapes differ.
    """
    if tuple(chars.shape) != tuple(labels.shape):
        raise ValueError(f"chars {tuple(chars.shape)} must be aligned with labels {tuple(labels.shape)}")
    if check_objective(objective) == "clm":
        labels, chars = labels[:, 1:], chars[:, 1:]
    return int(chars[labels != -100].sum())


def bits_per_character(total_nats: float, characters: int) -> float | None:
    """Cross-entropy in bits per character of the text covered: ``total_nats / ln 2 / characters`` (None for
    none). Unlike per-token perplexity it does not depend on the tokenizer."""
    return total_nats / math.log(2) / characters if characters > 0 else None


def unigram_perplexity(data: PreparedData, eval_seed: int = 1234, objective: str = "mlm") -> float:
    """Perplexity of the training-set unigram frequencies (add-one, special tokens excluded) on the held-out
    positions the models are scored on: a model near it has learnt word frequencies but little from context."""
    vocab = len(data.tokenizer)
    counts = torch.bincount(data.train.reshape(-1), minlength=vocab).double()
    special = [i for i in data.tokenizer.all_special_ids if i is not None and i < vocab]
    counts[special] = 0.0
    probs = (counts + 1.0) / (counts.sum() + vocab)
    _, labels = heldout_batches(data.heldout, data.tokenizer, objective, eval_seed)
    if objective == "clm":
        labels = labels[:, 1:]  # position 0 ([CLS]) is never a target
    targets = labels[labels != -100]
    return math.exp(float(-probs[targets].log().mean()))
