"""What text a language model is trained on and how it becomes sequences (:class:`DataSettings`), and the
objectives: a module of its own, without torch, so that the command line builds its options in milliseconds."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from ..checks import in_range, non_negative_int, optional_positive_int, positive_int
from ..runs import resolve_local_path

#: training objectives: masked LM (BERT, 15% of tokens predicted) and causal LM (left to right,
#: every token predicted from the ones before it)
OBJECTIVES = ("mlm", "clm")


def check_objective(objective: str) -> str:
    """Raises ValueError naming the value unless ``objective`` is one of :data:`OBJECTIVES`."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)} (masked or causal LM), got {objective!r}")
    return objective


@dataclass
class DataSettings:
    """Where the text comes from and how it becomes sequences: whole documents (books) are held
    out, then the rest is tokenised and packed into rows of ``max_seq_length`` tokens."""

    corpus: str = ""
    """a .txt/.jsonl(.gz) file, a directory of them, or a Hugging Face dataset name (the command's
    default: the Gutenberg books, $FIXEDHEAD_DATA_DIR/pretrain/gutenberg_en_books.jsonl.gz, where
    $FIXEDHEAD_DATA_DIR is ../shared/data beside the source folder unless set)"""
    text_field: str = "text"
    """the field of a .jsonl record that holds the text"""
    heldout_fraction: float = 0.05
    """fraction of documents held out"""
    split_seed: int = 0
    """seed of the choice of held-out documents"""
    vocab_size: int = 8192
    """WordPiece vocabulary trained on the training documents"""
    lowercase: bool = True
    """lowercase the text before tokenising"""
    tokenizer_max_chars: int | None = 20_000_000
    """characters of training text the tokenizer is trained on"""
    max_seq_length: int = 64
    """n, tokens per packed sequence"""
    max_train_tokens: int | None = None
    """cap on training tokens (default: all)"""
    max_eval_tokens: int | None = 200_000
    """cap on held-out tokens scored (the first sequences, in order)"""
    validation_fraction: float = 0.0
    """fraction of the training documents held back as a validation split, on which settings such
    as the learning rate are chosen (0: none); the tokenizer still learns from them, so it is the
    same whatever the fraction"""

    #: fields added after runs were first saved, with the value those runs used
    ADDED_LATER = {"validation_fraction": 0.0}

    def __post_init__(self):
        if not isinstance(self.corpus, (str, os.PathLike)) or not str(self.corpus).strip():
            raise ValueError(
                "DataSettings needs a corpus: a .txt/.jsonl(.gz) file, a directory of them, "
                "or a Hugging Face dataset name (e.g. fixedhead.data.DEFAULT_CORPUS)"
            )
        # recorded as an absolute path: the run must mean the same file from any working folder
        self.corpus = resolve_local_path(self.corpus)
        positive_int("vocab_size", self.vocab_size)
        positive_int("max_seq_length", self.max_seq_length, minimum=3)  # [CLS] token [SEP]
        in_range("heldout_fraction", self.heldout_fraction, 0.0, 1.0, low_open=True)
        non_negative_int("split_seed", self.split_seed)
        optional_positive_int("tokenizer_max_chars", self.tokenizer_max_chars)
        optional_positive_int("max_train_tokens", self.max_train_tokens, minimum=self.max_seq_length)
        optional_positive_int("max_eval_tokens", self.max_eval_tokens, minimum=self.max_seq_length)
        in_range("validation_fraction", self.validation_fraction, 0.0, 1.0)

    def record(self) -> dict:
        """The settings for a settings record; fields in :attr:`ADDED_LATER` at the value older records imply are
        left out, so those records still match."""
        return {k: v for k, v in asdict(self).items() if not (k in self.ADDED_LATER and self.ADDED_LATER[k] == v)}
