"""Checks of the numbers a user passes, with one wording: ``max_steps must be a positive int, got 0``.

Imported by the rest of the package as :mod:`fixedhead.checks`; it lives here because ``FixedHeadConfig``
uses it and a saved model carries only the modules of this folder its modeling code imports
(transformers' ``custom_object_save``). Standard library only.
"""

from __future__ import annotations

import math
import numbers


def positive_int(name: str, value, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``; bools and floats are refused (True steps is a bug)."""
    what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        # bool is an int subclass: True heads is a bug, not 1 head
        raise ValueError(f"{name} must be {what}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return int(value)


def optional_positive_int(name: str, value, minimum: int = 1) -> int | None:
    """None (no limit) or :func:`positive_int`."""
    return None if value is None else positive_int(name, value, minimum)


def non_negative_int(name: str, value) -> int:
    """An int >= 0 (a seed, a count that may be zero)."""
    return positive_int(name, value, minimum=0)


def positive_float(name: str, value) -> float:
    """A finite number > 0 (a learning rate, a tolerance)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def in_range(name: str, value, low: float, high: float, low_open: bool = False, high_open: bool = True) -> float:
    """A finite number between ``low`` and ``high`` (open or closed at each end), e.g. ``warmup_ratio must be in
    [0, 1), got 1.5``."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return float(value)
