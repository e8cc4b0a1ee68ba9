"""The learning rate that follows the batch size: one rule for ``lr_scaling`` and for DRBS moves.

``lr_multiplier(kind, batch, start, base, b_noise)`` is the factor applied on top of the
configured ``lr`` at batch size ``batch`` (envs):

* ``none``: 1.
* ``sqrt`` / ``linear``: ``(batch / base) ** p`` with p = 1/2 or 1 (``base`` = ``lr_base_envs``),
  the usual square-root and linear scaling rules.
* ``noise``: McCandlish et al.'s (2018) optimal step ``eps_opt(B) = eps_max / (1 + B_noise/B)``
  relative to the same rule at ``base``: ``[batch/(batch + b)] / [base/(base + b)]``, with ``b``
  the run's online noise scale in envs (``b_crit_online_envs``, median over seeds); 1 until the
  first estimate.  Small batches (B << b) get a lr proportional to B, large ones (B >> b) a
  constant one.

A DRBS run moves B during training; the loop calls this with the current size, so every rule
follows B (``start`` is not used by the rules themselves: the factor depends on ``batch`` only, so
a run that starts at B0 and one fixed at B0 get the same lr).  Plain Python.
"""
from __future__ import annotations

import math

__all__ = ["SCALING_KINDS", "lr_multiplier"]

SCALING_KINDS = ("none", "sqrt", "linear", "noise")


def lr_multiplier(kind: str, batch: int, base: int, b_noise: float | None = None) -> float:
    """The lr factor at ``batch`` envs (see the module docstring)."""
    if kind not in SCALING_KINDS:
        raise ValueError(f"lr_scaling={kind!r} is not one of {', '.join(SCALING_KINDS)}")
    if not (batch > 0 and base > 0):
        raise ValueError(f"batch={batch} and lr_base_envs={base} must be positive")
    if kind == "none":
        return 1.0
    if kind in ("sqrt", "linear"):
        return (batch / base) ** (0.5 if kind == "sqrt" else 1.0)
    if b_noise is None or not math.isfinite(b_noise) or b_noise <= 0:
        return 1.0
    return (batch / (batch + b_noise)) / (base / (base + b_noise))
