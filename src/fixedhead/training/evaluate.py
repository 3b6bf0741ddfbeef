"""Scoring a language model on held-out text (masked or causal), and opening a finished run to score it.

:func:`evaluate_lm` is the one score of every model: the metrics ``pretrain`` records, what
``fixedhead evaluate`` prints (:func:`evaluate_run` on the run's own held-out set,
:func:`evaluate_text` on new text) and the tokens-to-quality benchmark.
"""

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
    """Training or held-out loss became non-finite, or the held-out loss lies far above chance
    (:func:`check_not_diverged`): the learning rate is too high for this model (a study choosing a
    learning rate counts the run as the worst)."""


def check_not_diverged(loss: float, vocab_size: int, what: str = "held-out loss") -> None:
    """Refuse a loss that is not a result: not finite, or above ``2 · ln(vocab_size)`` nats.

    Uniform guessing over the vocabulary scores ln V nats per token, and a freshly initialised
    model scores about that; any training that learns something scores below it. The margin of
    a further ln V above chance (perplexity above V², each token given on average less than
    1/V² of probability) is only reached by a model that is confidently wrong, i.e. one whose
    training blew up (a masked tiny run at learning rate 10 ends at 284 nats where ln V is 5.99),
    never by one that is merely slow; it scales with the vocabulary, and it keeps every reported
    perplexity far below ``math.exp``'s overflow at 709 nats.

    Raises:
        DivergedError: the loss is not finite or above the margin; the message says which.
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
    """Held-out language-model metrics over fixed batches (:func:`fixedhead.data.lm.heldout_batches`): at the masked
    positions (``objective="mlm"``) or every next token (``"clm"``, logits at t score the label at t + 1).

    ``chars``: the characters of text each token covers, aligned with ``labels`` (0 at special tokens); with it,
    bits per character = the scored tokens' cross-entropy in bits / the characters they cover
    (:func:`~fixedhead.data.lm.scored_characters`).

    Returns:
        ``{"loss": nats per scored token, "perplexity": exp(loss), "accuracy": top-1, "masked_tokens": scored
        tokens}``, with ``chars`` also ``"scored_characters"`` and ``"bits_per_character"``.

    Raises:
        DivergedError: a non-finite loss (the 2 ln V rule is pretraining's, :func:`check_not_diverged`).
        ValueError: no scored token, or ``chars`` not aligned with ``labels``.
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
    """Whether a saved ``pretrain_settings.json`` was computed on the corpus text whose digest is
    ``corpus_sha256`` (``data_info.corpus_sha256``); runs saved before digests were recorded match."""
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
    """Load ``(model, tokenizer, settings)`` from a pretraining run directory (a masked or causal LM).

    The directory is validated by :func:`fixedhead.runs.open_run` (the one way every command
    opens a run) before anything is loaded; nothing in it is executed.

    Raises:
        FileNotFoundError: no such directory, or it holds no finished model.
        ValueError: a config or tokenizer file that is not valid JSON or not a fixedhead model,
            truncated weights, pickle weights without ``allow_pickle``.
    """
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
    """The corpus a run was trained on, as recorded in its ``pretrain_settings.json``.

    Raises:
        ValueError: nothing recorded, or a relative path (runs saved before paths were recorded
            resolved): which file it meant depends on the folder it was started from, so the user
            must say it with ``--corpus``.
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
    """Score a run directory's model on its held-out documents (same split, same fixed masking).

    ``corpus`` overrides the corpus recorded in the run (the split seed and fraction still
    apply); ``eval_seed`` the masking seed; ``allow_pickle`` see :func:`load_run`. Returns the
    :func:`evaluate_lm` metrics, bits per character of the held-out set included, and the objective.
    """
    if eval_seed is not None:
        eval_seed = non_negative_int("eval_seed", eval_seed)
    run = open_run(run_dir, allow_pickle=allow_pickle)  # every input is checked before the weights load
    saved, tokenizer = run.settings, run.tokenizer
    data_settings = recorded_data_settings(run_dir, run, corpus, max_eval_tokens)
    model = load_model(run)
    data = prepare_data(data_settings, tokenizer=tokenizer, heldout_only=True, progress=False)
    check_same_text(run_dir, saved, data)
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
    """Score a run directory's model on new text: a ``.txt``/``.jsonl(.gz)`` file or a folder of
    them (anything :func:`fixedhead.data.read_corpus` reads from a path).

    Every document is new text (no train/held-out split): all are tokenised with the run's own
    tokenizer (the first ``max_eval_tokens`` tokens, when given), packed into rows of the run's
    sequence length as the held-out set is (the incomplete last row is dropped), and scored as
    the run's held-out set: every next token for a causal run, one fixed seeded masking
    (``eval_seed``, default the run's) for a masked one. Bits per character are over the text of
    the scored tokens: all of it for a causal run, the masked tokens' for a masked one.

    Returns:
        the :func:`evaluate_lm` metrics (loss, perplexity, accuracy, bits per character, scored
        tokens and characters) with ``objective``, ``text`` (the path), ``text_sha256`` (of the
        documents' text, as a run's ``corpus_sha256``), ``documents``, ``text_tokens`` (all tokens
        read), ``sequences`` and ``eval_seed`` (None for a causal run).

    Raises:
        FileNotFoundError: no such text path, or ``run_dir`` holds no finished model.
        ValueError: text with no words, or too few tokens for one sequence; a bad run directory
            or option (see :func:`evaluate_run`).
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
