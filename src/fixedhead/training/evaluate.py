"""Scoring a language model on held-out text (masked or causal), and opening a finished run to score it.
:func:`evaluate_lm` is the one score of every model: pretraining's metrics, ``fixedhead evaluate`` and the
benchmarks."""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from ..checks import non_negative_int, optional_positive_int
from ..data.corpus import read_corpus
from ..data.lm import (
    DataSettings,
    PreparedData,
    bits_per_character,
    documents_sha256,
    heldout_batches,
    prepare_data,
    scored_characters,
)
from ..data.packing import pack_sequences, tokenize_documents
from ..model.architectures import objective_of
from ..model.modeling import FixedHeadForCausalLM, FixedHeadForMaskedLM
from ..runs import open_run


class DivergedError(ValueError):
    """A non-finite loss, or a held-out loss far above chance (:func:`check_not_diverged`): the learning rate is
    too high for this model (a study choosing a rate counts the run as the worst)."""


def check_not_diverged(loss: float, vocab_size: int, what: str = "held-out loss") -> None:
    """Refuse a loss that is not a result: not finite, or above ``2 · ln(vocab_size)`` nats.

    Uniform guessing scores ln V; only a confidently wrong model, one whose training blew up, ends a further
    ln V above it (a masked tiny run at learning rate 10 ends at 284 nats, ln V = 5.99). The margin scales with
    the vocabulary and keeps every perplexity far below ``math.exp``'s overflow.

    Raises:
        DivergedError: saying which.
    """
    bound = 2 * math.log(vocab_size)
    if not math.isfinite(loss) or loss > bound:
        raise DivergedError(
            f"{what} {loss:.4g} nats is {'not finite' if not math.isfinite(loss) else 'above 2·ln V'} "
            f"(ln V = {math.log(vocab_size):.2f} for a vocabulary of {vocab_size}): the run diverged; "
            f"lower the learning rate"
        )


@torch.no_grad()
def evaluate_lm(
    model,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    batch_size: int = 128,
    objective: str = "mlm",
    chars: torch.Tensor | None = None,
) -> dict:
    """Held-out metrics over fixed batches, at the masked positions (``"mlm"``) or every next token (``"clm"``):
    ``{"loss": nats per scored token, "perplexity", "accuracy": top-1, "masked_tokens"}``.

    ``chars`` (aligned with ``labels``, 0 at special tokens) adds ``"scored_characters"`` and
    ``"bits_per_character"``. A non-finite loss raises :class:`DivergedError`; no scored token, ValueError.
    """
    characters = None if chars is None else scored_characters(labels, chars, objective)
    was_training = model.training
    model.eval()
    total_loss, total_correct, total = 0.0, 0, 0
    device = next(model.parameters()).device
    for i in range(0, input_ids.shape[0], batch_size):
        ids, lab = input_ids[i : i + batch_size].to(device), labels[i : i + batch_size].to(device)
        out = model(input_ids=ids, labels=lab)
        logits = out.logits  # [batch, seq, vocab], as BERT's
        if objective == "clm":  # position t predicts token t + 1
            logits, lab = logits[:, :-1], lab[:, 1:]
        scored = lab != -100  # a batch with none adds 0 to each sum
        targets, logits = lab[scored], logits[scored]
        total_loss += float(torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum"))
        total_correct += int((logits.argmax(-1) == targets).sum())
        total += len(targets)
    model.train(was_training)
    if total == 0:
        raise ValueError("held-out set has no masked tokens to score")
    loss = total_loss / total
    if not math.isfinite(loss):
        raise DivergedError(f"held-out loss is {loss}: the model's outputs are not finite")
    # a model may lose more than 709 nats a token (exp overflows): its perplexity is then inf, never a traceback
    perplexity = math.exp(loss) if loss < 709 else math.inf
    result = {"loss": loss, "perplexity": perplexity, "accuracy": total_correct / total, "masked_tokens": total}
    if characters is not None:
        result["scored_characters"] = characters
        result["bits_per_character"] = bits_per_character(total_loss, characters)
    return result


def same_corpus_text(saved: dict, corpus_sha256: str | None) -> bool:
    """Whether a saved ``pretrain_settings.json`` was computed on the text with digest ``corpus_sha256`` (a record
    without a digest matches)."""
    old = (saved.get("data_info") or {}).get("corpus_sha256")
    return old is None or corpus_sha256 is None or old == corpus_sha256


def recorded_data_settings(run_dir, run, corpus: str | None = None, max_eval_tokens: int | None = None):
    """The run's recorded DataSettings, with ``corpus`` / ``max_eval_tokens`` replaced when given."""
    data_kwargs = dict(run.settings.get("data", {}))
    data_kwargs["corpus"] = corpus if corpus is not None else recorded_corpus(run_dir, run.settings)
    if max_eval_tokens is not None:
        data_kwargs["max_eval_tokens"] = max_eval_tokens
    data_kwargs["max_seq_length"] = data_kwargs.get("max_seq_length", run.config.max_position_embeddings)
    return DataSettings(**data_kwargs)


def check_same_text(run_dir, saved: dict, data: PreparedData) -> None:
    if not same_corpus_text(saved, data.info["corpus_sha256"]):
        raise ValueError(
            f"corpus {data.settings.corpus!r} does not hold the text {run_dir} was trained on "
            f"(its content changed); pass --corpus with the original"
        )


def load_run(run_dir: str | os.PathLike, allow_pickle: bool = False):
    """``(model, tokenizer, settings)`` from a pretraining run folder, validated by :func:`fixedhead.runs.open_run`
    first; nothing in it is executed. ``allow_pickle``: accept pickle weights."""
    run = open_run(run_dir, allow_pickle=allow_pickle)
    return load_model(run), run.tokenizer, run.settings


def load_model(run):
    """The run's language model: ``FixedHeadForCausalLM`` for a decoder, else ``FixedHeadForMaskedLM``;
    transformers' ``LlamaForCausalLM`` for a Llama run."""
    if run.config.model_type == "llama":
        from transformers import LlamaForCausalLM

        cls = LlamaForCausalLM
    else:
        cls = FixedHeadForCausalLM if run.config.is_decoder else FixedHeadForMaskedLM
    return run.load_model(cls, config=run.config)


def recorded_corpus(run_dir: str | os.PathLike, saved: dict) -> str:
    """The corpus a run was trained on, as its ``pretrain_settings.json`` records it.

    Raises:
        ValueError: nothing recorded, or a relative path (which file it meant depends on where the run
            started): the user must give ``--corpus``.
    """
    corpus = (saved.get("data") or {}).get("corpus")
    if not corpus:
        raise ValueError(f"{run_dir} records no corpus; pass --corpus")
    looks_local = os.sep in corpus or corpus.endswith((".txt", ".jsonl", ".gz")) or corpus.startswith(".")
    if looks_local and not os.path.isabs(os.path.expanduser(corpus)):
        raise ValueError(
            f"{run_dir} records its corpus as the relative path {corpus!r}, which means a different file from "
            f"each folder; pass --corpus with the file it was trained on"
        )
    return corpus


def evaluate_run(
    run_dir: str | os.PathLike,
    corpus: str | None = None,
    eval_seed: int | None = None,
    max_eval_tokens: int | None = None,
    batch_size: int = 128,
    allow_pickle: bool = False,
) -> dict:
    """Score a run's model on its held-out documents (same split, same fixed masking): :func:`evaluate_lm`'s
    metrics with bits per character and the objective. ``corpus`` overrides the recorded corpus."""
    if eval_seed is not None:
        eval_seed = non_negative_int("eval_seed", eval_seed)
    run = open_run(run_dir, allow_pickle=allow_pickle)  # every input is checked before the weights load
    saved, tokenizer = run.settings, run.tokenizer
    data_settings = recorded_data_settings(run_dir, run, corpus, max_eval_tokens)
    data = prepare_data(data_settings, tokenizer=tokenizer, heldout_only=True, progress=False)
    check_same_text(run_dir, saved, data)
    model = load_model(run)
    seed = eval_seed if eval_seed is not None else saved.get("train", {}).get("eval_seed", 1234)
    objective = objective_of(run.config)
    ids, labels = heldout_batches(data.heldout, tokenizer, objective, seed)
    metrics = evaluate_lm(model, ids, labels, batch_size, objective=objective, chars=data.heldout_chars)
    return {**metrics, "objective": objective}


def evaluate_text(
    run_dir: str | os.PathLike,
    text: str | os.PathLike,
    eval_seed: int | None = None,
    max_eval_tokens: int | None = None,
    batch_size: int = 128,
    allow_pickle: bool = False,
    text_field: str = "text",
) -> dict:
    """Score a run's model on new text (a file or folder :func:`fixedhead.data.read_corpus` reads).

    Every document is tokenised with the run's tokenizer (up to ``max_eval_tokens``), packed into the run's
    sequence length and scored as its held-out set (every next token, or one fixed masking with ``eval_seed``).
    Returns :func:`evaluate_lm`'s metrics with ``objective``, ``text``, ``text_sha256``, ``documents``,
    ``text_tokens``, ``sequences`` and ``eval_seed``.

    Raises:
        ValueError: text with too few tokens for one sequence.
    """
    if eval_seed is not None:
        non_negative_int("eval_seed", eval_seed)
    path = Path(text).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"text {str(text)!r} does not exist; pass a .txt/.jsonl(.gz) file or a folder of them")
    run = open_run(run_dir, allow_pickle=allow_pickle)  # every input is checked before the weights load
    saved, tokenizer = run.settings, run.tokenizer
    n = int((saved.get("data") or {}).get("max_seq_length") or run.config.max_position_embeddings)
    optional_positive_int("max_eval_tokens", max_eval_tokens, minimum=n)
    docs = read_corpus(path, text_field)
    ids, chars = tokenize_documents(tokenizer, [d.text for d in docs], max_eval_tokens, with_chars=True)
    text_tokens = sum(map(len, ids))
    try:
        sequences, seq_chars = pack_sequences(ids, n, tokenizer.cls_token_id, tokenizer.sep_token_id, chars=chars)
    except ValueError:
        raise ValueError(
            f"{path}: {text_tokens} tokens in {len(docs)} document{'s' * (len(docs) != 1)}, too few for one "
            f"sequence of the run's n = {n} (n − 2 = {n - 2}, counting a [SEP] after each document); give more text"
        ) from None
    objective = objective_of(run.config)
    seed = eval_seed if eval_seed is not None else saved.get("train", {}).get("eval_seed", 1234)
    input_ids, labels = heldout_batches(sequences, tokenizer, objective, seed)
    model = load_model(run)
    metrics = evaluate_lm(model, input_ids, labels, batch_size, objective=objective, chars=seq_chars)
    return {
        **metrics,
        "objective": objective,
        "text": str(path),
        "text_sha256": documents_sha256(docs),
        "documents": len(docs),
        "text_tokens": text_tokens,
        "sequences": int(sequences.shape[0]),
        "eval_seed": seed if objective == "mlm" else None,
    }
