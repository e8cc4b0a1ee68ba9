"""The one number formatter of every table and sentence tclock prints."""
from __future__ import annotations

import math


def fmt(value, digits: int = 3, missing: str = "—") -> str:
    """A number for a table cell or a sentence.

    ``None``, NaN, inf and non-numbers -> ``missing``; 0 -> ``"0"``; whole numbers print without
    a decimal point (``10,000`` and above with thousands separators); very small magnitudes
    (< 1e-3) in scientific notation; everything else with ``digits`` significant digits."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return missing
    if not math.isfinite(v):
        return missing
    if v == 0:
        return "0"
    if abs(v) < 1e-3:
        return f"{v:.{max(1, digits - 1)}e}"
    if abs(v) >= 10 ** digits or (v.is_integer() and abs(v) < 1e7):
        return f"{v:,.0f}" if abs(v) >= 10000 else f"{v:.0f}"
    return f"{v:.{digits}g}"
