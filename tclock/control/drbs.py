"""Dynamic rollout batch size, DRBS (write-up 4.1), on a fixed ladder of valid sizes.

Plain Python (+ NumPy), no JAX: the controller runs in the host loop between jitted calls.

* :func:`batch_ladder` -- the fixed, finite set of rollout batch sizes (``num_envs``) a run may
  use.  Shapes are static in tclock, so a dynamic batch size must pick from a ladder; the loop
  compiles (and caches) one rollout/update program per rung, so the compile count is bounded
  by ``len(ladder)``.
* :class:`DRBSController` -- dynamic rollout batch size (write-up 4.1): shrink the batch when
  the mean ``rt_ut_ratio`` is high, grow it when low, one ladder rung at a time.
"""
from __future__ import annotations

import builtins
import math
from typing import NamedTuple, Sequence

import numpy as np

from tclock.control.checks import finite_number, is_int

__all__ = ["batch_ladder", "Decision", "DRBSController", "LadderController"]


# --------------------------------------------------------------------------- ladder
def batch_ladder(
    min_size: int,
    max_size: int,
    multiple: int = 1,
    step: float = 0.25,
    anchor: int | None = None,
) -> tuple[int, ...]:
    """The valid rollout batch sizes (``num_envs``) between ``min_size`` and ``max_size``.

    Every size is a positive multiple of ``multiple`` (pass the lcm of everything ``num_envs``
    must divide into: minibatch constraints x device count).  Sizes are spaced geometrically by
    the factor ``1 + step``: rung ``k`` is ``anchor * (1 + step) ** k`` rounded to the nearest
    multiple (computed from the anchor each time, so rounding never drifts).  The result is
    sorted, deduplicated, and always contains the smallest and largest valid sizes in range
    (``min_size`` rounded *up* and ``max_size`` rounded *down* to a multiple).  An interior rung
    within a factor ``sqrt(1 + step)`` of either end (less than half a step away) is dropped in
    favour of that end, so the first and last moves are not uselessly small.

    ``anchor`` (default: the rounded ``min_size``) is a size the geometric progression passes
    through exactly; :class:`DRBSController` anchors the ladder at its ``base`` size so that,
    e.g., ``base=256, step=1.0`` gives the write-up's ladder 64, 128, 256, 512, 1024.

    Raises ``ValueError`` naming the field and the fix when no valid size exists, when
    ``min_size > max_size``, or when an argument is out of range.
    """
    lo, hi = _ladder_bounds(min_size, max_size, multiple, step)
    if anchor is None:
        anchor = lo
    if not is_int(anchor) or not lo <= anchor <= hi or anchor % multiple:
        raise ValueError(f"anchor={anchor!r} must be a multiple of {multiple} in "
                         f"[{lo}, {hi}]; pick one such size")
    factor = 1.0 + float(step)
    sizes = _geometric_rungs(anchor, factor, lo, hi, multiple)
    # A rung less than half a step (in log space) from min or max would make a near-useless
    # move (e.g. 64 -> 67); such rungs are merged into the endpoint.  The anchor always stays.
    half = math.sqrt(factor)
    keep = {s for s in sizes
            if s in (lo, hi, anchor) or (s / lo >= half and hi / s >= half)}
    return tuple(sorted(keep))


def _ladder_bounds(min_size: int, max_size: int, multiple: int, step: float) -> tuple[int, int]:
    """Check :func:`batch_ladder`'s range arguments; return the smallest and largest multiple
    of ``multiple`` in ``[min_size, max_size]``."""
    if not is_int(multiple) or multiple < 1:
        raise ValueError(f"multiple={multiple!r} must be an integer >= 1 (the lcm of what "
                         "num_envs must divide into, e.g. num_minibatches x device count)")
    if not is_int(min_size) or min_size < 1:
        raise ValueError(f"min_size={min_size!r} must be an integer >= 1; pass a positive "
                         "number of envs")
    if not is_int(max_size) or max_size < 1:
        raise ValueError(f"max_size={max_size!r} must be an integer >= 1; pass a positive "
                         "number of envs")
    if min_size > max_size:
        raise ValueError(f"min_size={min_size} is larger than max_size={max_size}; "
                         "swap them or raise max_size")
    if not finite_number(step) or step <= 0:
        raise ValueError(f"step={step!r} must be a finite number > 0 (0.25 means +-25% "
                         "per rung, 1.0 means x2 / /2)")
    lo = -(-min_size // multiple) * multiple  # round up
    hi = (max_size // multiple) * multiple    # round down
    if lo > hi:
        fix = f"raise max_size to at least {lo}"
        if hi >= 1:
            fix = f"lower min_size to {hi} or " + fix
        raise ValueError(
            f"no multiple of multiple={multiple} lies in [min_size={min_size}, "
            f"max_size={max_size}]; {fix}")
    return lo, hi


def _geometric_rungs(anchor: int, factor: float, lo: int, hi: int, multiple: int) -> set[int]:
    """``lo``, ``hi``, ``anchor`` and every ``anchor * factor ** k`` (k positive or negative)
    inside ``[lo, hi]``, each rounded half up to a multiple of ``multiple``."""

    def snap(x: float) -> int:
        v = math.floor(x / multiple + 0.5) * multiple  # round half up
        return builtins.min(hi, builtins.max(lo, v))

    sizes = {lo, hi, anchor}
    k = 1
    while True:  # up from the anchor
        x = anchor * factor ** k
        if x > hi:
            break
        sizes.add(snap(x))
        k += 1
    k = 1
    while True:  # down from the anchor
        x = anchor / factor ** k
        if x < lo:
            break
        sizes.add(snap(x))
        k += 1
    return sizes


# --------------------------------------------------------------------------- DRBS checks
def _check_rule(window: int, min_samples: int, high: float, low: float, step: float) -> None:
    """The decision rule's arguments: averaging window, evidence, thresholds, step."""
    if not is_int(window) or window < 1:
        raise ValueError(f"window={window!r} must be an integer >= 1 (number of recent "
                         "rt_ut_ratio values averaged; the write-up uses 20)")
    if not is_int(min_samples) or not 1 <= min_samples <= window:
        raise ValueError(f"min_samples={min_samples!r} must be an integer in "
                         f"[1, window={window}]")
    if not finite_number(high) or not finite_number(low):
        raise ValueError(f"high={high!r} and low={low!r} must be finite numbers")
    if not 0 <= low < high:
        raise ValueError(f"thresholds must satisfy 0 <= low < high, got low={low}, "
                         f"high={high}; e.g. low=0.35, high=0.75")
    if not finite_number(step) or step <= 0:
        raise ValueError(f"step={step!r} must be a finite number > 0 (0.25 = +-25% per "
                         "decision, 1.0 = x2 / /2)")


def _check_range(base: int, min_b: int, max_b: int, multiple: int) -> None:
    """The size range: ``min <= base <= max``, all positive, ``base`` a multiple of ``multiple``."""
    if not is_int(multiple) or multiple < 1:
        raise ValueError(f"multiple={multiple!r} must be an integer >= 1")
    for name, v in (("min", min_b), ("max", max_b), ("base", base)):
        if not is_int(v) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive integer number of envs")
    if min_b > max_b:
        raise ValueError(f"min={min_b} is larger than max={max_b}; swap them")
    if not min_b <= base <= max_b:
        raise ValueError(f"base={base} is outside [min={min_b}, max={max_b}]; pick a base "
                         "inside the range or widen it")
    if base % multiple:
        raise ValueError(f"base={base} is not a multiple of multiple={multiple}; use "
                         f"{builtins.max(multiple, round(base / multiple) * multiple)}")


def _resolve_ladder(ladder: Sequence[int] | None, base: int, min_b: int, max_b: int,
                    multiple: int, step: float) -> tuple[int, ...]:
    """The controller's ladder: ``batch_ladder(..., anchor=base)`` by default, or the given one
    after checking it (sorted, unique, multiples of ``multiple`` in ``[min, max]``, holds base)."""
    if ladder is None:
        return batch_ladder(min_b, max_b, multiple, step, anchor=base)
    if any(not is_int(s) for s in ladder):
        raise ValueError(f"ladder={list(ladder)} must hold integers")
    lad = tuple(int(s) for s in ladder)
    if not lad:
        raise ValueError("ladder is empty; pass at least one size or ladder=None")
    if list(lad) != sorted(set(lad)):
        raise ValueError(f"ladder={list(lad)} must be sorted and without duplicates; "
                         f"use {sorted(set(lad))}")
    bad = [s for s in lad if s % multiple or not min_b <= s <= max_b]
    if bad:
        raise ValueError(f"ladder sizes {bad} are not multiples of multiple={multiple} "
                         f"inside [min={min_b}, max={max_b}]; remove them or widen "
                         "min/max")
    if base not in lad:
        raise ValueError(f"base={base} is not on the ladder {list(lad)}; add it or "
                         "pick base from the ladder")
    return lad


# --------------------------------------------------------------------------- the shared walker
class LadderController:
    """What every DRBS controller shares: a fixed ladder, the current size on it, the moves made.

    Subclasses set ``_ladder``, ``_size`` and ``_history`` in ``__init__`` and decide *when* to
    move; :meth:`_move_towards` says *where* (the ladder size nearest a goal, strictly on one side
    of the current one) and :meth:`_check_saved_size` guards a resume.
    """

    _ladder: tuple[int, ...]
    _size: int
    _history: list

    @property
    def batch_size(self) -> int:
        """The current rollout batch size (``num_envs``)."""
        return self._size

    @property
    def ladder(self) -> tuple[int, ...]:
        return self._ladder

    @property
    def wants_estimate(self) -> bool:
        """Whether the next iteration should measure the noise whatever ``gdc_every`` says (the
        controller is waiting for estimates before it may decide); False for a controller that
        does not read them."""
        return False

    @property
    def noise_scale(self) -> float | None:
        """The online noise scale (envs) the controller reads at the current size, which
        ``lr_scaling noise`` then follows; None for a controller that does not read it."""
        return None

    @property
    def history(self) -> tuple:
        """Every change so far, oldest first."""
        return tuple(self._history)

    def _move_towards(self, goal: float, down: bool, log: bool = False) -> int:
        """The ladder size nearest ``goal`` among those strictly below (``down``) or above the
        current size, linear or log distance; ties go to the size nearer the current one (the
        smaller move).  The current size when there is no room on that side."""
        side = [s for s in self._ladder if (s < self._size if down else s > self._size)]
        if not side:
            return self._size

        def dist(s: int) -> float:
            return abs(math.log(s / goal)) if log else abs(s - goal)

        return builtins.min(side, key=lambda s: (dist(s), abs(s - self._size)))

    def _check_saved_size(self, size: int, fix: str) -> None:
        if size not in self._ladder:
            raise ValueError(f"saved batch_size={size} is not on this controller's ladder "
                             f"{list(self._ladder)}; {fix}")


# --------------------------------------------------------------------------- DRBS
class Decision(NamedTuple):
    """One DRBS batch-size change: the mean ratio that triggered it and the new size."""

    ratio_mean: float
    size: int


class DRBSController(LadderController):
    """Dynamic rollout batch size (write-up 4.1), on a fixed ladder of valid sizes.

    Call :meth:`update` once per iteration with the measured ``rt_ut_ratio``; it returns the
    batch size for the next rollout.

    Rule.  The ratio is appended to a history (``None``, NaN and +-inf are ignored: such a call
    changes nothing and returns the current size).  Once at least ``min_samples`` ratios are
    held, the mean of the last ``window`` of them is compared with the thresholds:

    * mean > ``high``: shrink -- move to the ladder size nearest to ``current / (1 + step)``
      among the sizes strictly *below* the current one (so a shrink decision always moves while
      there is room);
    * mean < ``low``: grow -- the ladder size nearest to ``current * (1 + step)`` among the sizes
      strictly *above* the current one;
    * otherwise hold.

    Sizes never leave ``[min, max]`` (the ladder lies inside it).  Ties are broken towards the
    current size (the smaller move).  ``step=1.0`` with ``base=256`` reproduces the write-up's
    x2 / /2 controller (ladder 64..1024 by doubling); the write-up's recommended setting, +-25%
    per step with a 20-sample moving average, is the default.

    ``reset_on_change`` (default True): after a change the ratio history is cleared, because
    ratios measured at the old size do not describe the new one (RT grows with the batch).
    Without the reset, the stale high (or low) mean would keep pushing the size in the same
    direction for up to ``window`` iterations -- the "wild jumping between 64 and 1024" the
    write-up reports for aggressive settings.  With the reset, each size is judged on its own
    measurements; set ``min_samples`` (default 1, as in the write-up's sketch) up to ``window``
    to require that much evidence at a size before moving again.

    ``ladder`` may be given explicitly (sorted, unique, multiples of ``multiple``, inside
    ``[min, max]``); by default it is ``batch_ladder(min, max, multiple, step, anchor=base)``.
    """

    def __init__(
        self,
        base: int = 256,
        min: int = 64,  # noqa: A002 - the brief's field names
        max: int = 1024,  # noqa: A002
        window: int = 20,
        high: float = 0.75,
        low: float = 0.35,
        step: float = 0.25,
        ladder: Sequence[int] | None = None,
        multiple: int = 1,
        reset_on_change: bool = True,
        min_samples: int = 1,
    ) -> None:
        min_b, max_b = min, max
        _check_rule(window, min_samples, high, low, step)
        _check_range(base, min_b, max_b, multiple)
        self._ladder = _resolve_ladder(ladder, base, min_b, max_b, multiple, step)
        self._min, self._max = min_b, max_b
        self._window = int(window)
        self._min_samples = int(min_samples)
        self._high, self._low = float(high), float(low)
        self._step = float(step)
        self._reset = bool(reset_on_change)
        self._size = int(base)
        self._ratios: list[float] = []
        self._history: list[Decision] = []
        self._calls = 0

    # ------------------------------------------------------------------ properties
    @property
    def ratios(self) -> tuple[float, ...]:
        """The ratios currently held (at most ``window``)."""
        return tuple(self._ratios)

    def ratio_mean(self) -> float | None:
        """Mean of the held ratios, or None if there are none."""
        return float(np.mean(self._ratios)) if self._ratios else None

    # ------------------------------------------------------------------ the rule
    def observe(self, record: dict) -> int:
        """The loop's entry point (shared with :class:`tclock.control.drbs_critical.CriticalBatchController`):
        :meth:`update` with the record's ``rt_ut_ratio``."""
        return self.update(record.get("rt_ut_ratio"))

    def update(self, rt_ut_ratio: float | None) -> int:
        """Record one ``rt_ut_ratio`` and return the batch size for the next rollout."""
        self._calls += 1
        if not finite_number(rt_ut_ratio):
            return self._size
        self._ratios.append(float(rt_ut_ratio))
        if len(self._ratios) > self._window:
            del self._ratios[: len(self._ratios) - self._window]
        if len(self._ratios) < self._min_samples:
            return self._size
        mean = float(np.mean(self._ratios))
        new = self._size
        if mean > self._high:
            new = self._move_towards(self._size / (1.0 + self._step), down=True)
        elif mean < self._low:
            new = self._move_towards(self._size * (1.0 + self._step), down=False)
        if new != self._size:
            self._size = new
            self._history.append(Decision(mean, new))
            if self._reset:
                self._ratios.clear()
        return self._size

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict:
        """Plain-Python state (JSON/pickle friendly) so a resumed run continues the controller."""
        return {
            "batch_size": self._size,
            "ratios": list(self._ratios),
            "history": [[d.ratio_mean, d.size] for d in self._history],
            "calls": self._calls,
            "ladder": list(self._ladder),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output.  The saved size must be on this controller's ladder
        (a run resumed with a different ladder fails here with a clear message)."""
        try:
            size = int(state["batch_size"])
            ratios = [float(r) for r in state.get("ratios", [])]
            history = [Decision(float(m), int(s)) for m, s in state.get("history", [])]
            calls = int(state.get("calls", 0))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"DRBS state is malformed ({e!r}); pass the dict returned by "
                             "DRBSController.state_dict()") from e
        self._check_saved_size(size, "resume with the same min/max/step/multiple/ladder as the original run")
        self._size = size
        self._ratios = ratios[-self._window:]
        self._history = history
        self._calls = calls
