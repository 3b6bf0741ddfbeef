"""Data: corpus readers, WordPiece tokenizer training, packing, and masked-LM batches."""

from .corpus import DEFAULT_CORPUS, DEFAULT_DATA_DIR, Document, read_corpus, split_documents
from .packing import pack_sequences, tokenize_documents
from .tokenizer import train_tokenizer

__all__ = [
    "DEFAULT_CORPUS",
    "DEFAULT_DATA_DIR",
    "Document",
    "read_corpus",
    "split_documents",
    "pack_sequences",
    "tokenize_documents",
    "train_tokenizer",
]
