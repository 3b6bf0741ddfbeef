"""A package's public names imported on first use (PEP 562), so that the command line can read its
options without importing torch and transformers."""

from __future__ import annotations

import importlib
import sys


def lazy_names(package: str, public: dict[str, str]):
    """The ``__getattr__`` and ``__dir__`` of ``package``: each name of ``public`` (name -> module relative to
    ``package``) is imported on first use and kept; another name raises AttributeError."""

    def __getattr__(name: str):
        if name not in public:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(public[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__():
        return sorted([*vars(sys.modules[package]), *public])

    return __getattr__, __dir__
