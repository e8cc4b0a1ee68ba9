"""Argument checks shared by the controllers in :mod:`tclock.control` (plain Python + NumPy).

Each ``check_*`` raises ``ValueError`` naming the field; the predicates return a bool.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

__all__ = ["is_int", "finite_number", "check_choice", "check_finite_nonneg"]


def is_int(x: Any) -> bool:
    """True for a Python or NumPy integer (``bool`` excluded)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def finite_number(x: Any) -> bool:
    """True when ``x`` converts to a finite float (``None`` and ``bool`` excluded)."""
    if x is None or isinstance(x, bool):
        return False
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {choices}")


def check_finite_nonneg(name: str, value: Any) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number >= 0."""
    if not finite_number(value) or value < 0:
        raise ValueError(f"{name}={value!r} must be a finite number >= 0")
