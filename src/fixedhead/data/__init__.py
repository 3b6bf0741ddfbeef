"""Data: corpus readers, WordPiece tokenizer training, packing, and language-model batches (masked and causal).

The names below are imported on first use (PEP 562): ``fixedhead.data.settings`` holds the options the
command line reads, and importing it must not import torch through this package.
"""

from .._lazy import lazy_names

#: public name -> the module of this package that defines it
_PUBLIC = {
    "DEFAULT_CORPUS": ".corpus",
    "DEFAULT_DATA_DIR": ".corpus",
    "Document": ".corpus",
    "read_corpus": ".corpus",
    "read_text": ".corpus",
    "split_documents": ".corpus",
    "DataSettings": ".settings",
    "PreparedData": ".lm",
    "fixed_masking": ".lm",
    "mlm_collator": ".lm",
    "prepare_data": ".lm",
    "pack_sequences": ".packing",
    "text_windows": ".packing",
    "tokenize_documents": ".packing",
    "train_tokenizer": ".tokenizer",
}

__all__ = list(_PUBLIC)


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
