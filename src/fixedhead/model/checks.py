"""Checks of the numbers a user passes (settings dataclasses, the command line), with one wording.

Every message names the setting and the value: ``max_steps must be a positive int, got 0``. The
settings dataclasses of pretraining, fine-tuning, data preparation and the experiments call these
in ``__post_init__``, so the library and every command refuse the same values the same way.

They live in the model folder, and the rest of the package imports them as :mod:`fixedhead.checks`,
because ``FixedHeadConfig`` uses them and a saved model carries the modules of this folder that its
modeling code imports: transformers' ``save_pretrained`` copies a custom model's module and its
relative imports *within one folder* next to ``config.json`` (``custom_object_save``), so that
``from_pretrained(..., trust_remote_code=True)`` runs without fixedhead installed. This module
imports nothing but the standard library.
"""

from __future__ import annotations

import math
import numbers


def positive_int(name: str, value, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``; bools and floats are refused (True steps is a bug).

    Raises:
        ValueError: naming ``name`` and the value.
    """
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
    """A finite number in the interval from ``low`` to ``high`` (open or closed at each end).

    Raises:
        ValueError: e.g. ``warmup_ratio must be in [0, 1), got 1.5``.
    """
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return float(value)
