"""Checks of the numbers a user passes (settings dataclasses, the command line), with one wording:
:mod:`fixedhead.model.checks`, under the name every layer below the model imports.

The functions are defined in the model folder because ``FixedHeadConfig`` uses them and a saved run
carries that folder's modules as its modeling code (see :mod:`fixedhead.model.checks`).
"""

from __future__ import annotations

from .model.checks import in_range, non_negative_int, optional_positive_int, positive_float, positive_int

__all__ = ["in_range", "non_negative_int", "optional_positive_int", "positive_float", "positive_int"]
