"""fixedhead: fixed head size multi-head attention (Bhojanapalli et al., ICML 2020). See README.md.

Importing the package registers the models with transformers' Auto classes; its public names are imported
on first use. The ``fixedhead`` command registers after parsing its options instead, so ``--help`` answers
without importing torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ._lazy import lazy_names

__version__ = "0.1.0"

#: public name -> the module that defines it, imported on first use (PEP 562)
_PUBLIC = {
    "MultiHeadAttention": ".model.attention",
    "FixedHeadConfig": ".model.configuration",
    "from_bert": ".model.from_bert",
    "FixedHeadModel": ".model.modeling",
    "FixedHeadForMaskedLM": ".model.modeling",
    "FixedHeadForCausalLM": ".model.modeling",
    "FixedHeadForSequenceClassification": ".model.modeling",
    "register_auto_classes": ".model.modeling",
    "count_parameters": ".model.sizes",
    "widen_heads": ".model.surgery",
}

__all__ = [name for name in _PUBLIC if name != "register_auto_classes"]


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)


def _started_as_the_command() -> bool:
    """Whether this import is the ``fixedhead`` script's or ``python -m fixedhead[.cli]``'s (which then
    register the Auto classes themselves once the options are parsed)."""
    argv = getattr(sys, "orig_argv", [])
    by_module = "-m" in argv[:-1] and argv[argv.index("-m") + 1] in ("fixedhead", "fixedhead.cli")
    return by_module or Path(sys.argv[0] if sys.argv else "").name == "fixedhead"


if not _started_as_the_command():
    __getattr__("register_auto_classes")()
