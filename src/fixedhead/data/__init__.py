"""Data: corpus readers, WordPiece tokenizer training, packing, and language-model batches (masked and causal)."""

from .corpus import DEFAULT_CORPUS, DEFAULT_DATA_DIR, Document, read_corpus, read_text, split_documents
from .lm import DataSettings, PreparedData, fixed_masking, mlm_collator, prepare_data
from .packing import pack_sequences, text_windows, tokenize_documents
from .tokenizer import train_tokenizer

__all__ = [
    "DEFAULT_CORPUS",
    "DataSettings",
    "PreparedData",
    "fixed_masking",
    "mlm_collator",
    "prepare_data",
    "DEFAULT_DATA_DIR",
    "Document",
    "read_corpus",
    "read_text",
    "text_windows",
    "split_documents",
    "pack_sequences",
    "tokenize_documents",
    "train_tokenizer",
]
