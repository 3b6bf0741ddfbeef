"""Checks of the numbers a user passes, with one wording: :mod:`fixedhead.model.checks` under the name every
layer imports, and :func:`check_fields`, the checks an Options field's metadata names."""

from __future__ import annotations

import dataclasses

from .model.checks import in_range, non_negative_int, optional_positive_int, positive_float, positive_int

__all__ = [
    "FIELD_CHECKS",
    "check_fields",
    "in_range",
    "non_negative_int",
    "optional_positive_int",
    "positive_float",
    "positive_int",
]

#: ``field(metadata={"check": NAME})``: the check of the value (of each value of a tuple; None passes) and how
#: ``--help`` says it
FIELD_CHECKS = {
    "positive": (positive_int, "a positive int"),
    "non_negative": (non_negative_int, "an int >= 0"),
    "positive_float": (positive_float, "a positive number"),
}


def check_fields(options) -> None:
    """Check each field of the dataclass ``options`` as its metadata says: ``check`` (:data:`FIELD_CHECKS`),
    ``nonempty``, ``distinct``; ValueError naming the field and the value."""
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        values = list(value) if isinstance(value, (tuple, list)) else [value]
        if f.metadata.get("nonempty") and not values:
            raise ValueError(f"{f.name} must hold at least one value, got none")
        if "check" in f.metadata:
            check = FIELD_CHECKS[f.metadata["check"]][0]
            for v in values:
                if v is not None:
                    check(f.name, v)
        if f.metadata.get("distinct") and len(set(values)) != len(values):
            raise ValueError(f"{f.name} must be distinct, got {values}")
