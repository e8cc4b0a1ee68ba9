"""Host-side controllers for the two clocks: DRBS, PURM and wall-clock learning-rate schedules.

Plain Python (+ NumPy).  This module does **not** import JAX: the controllers run in the thin
host loop between jitted calls, and they can be unit-tested on their own.  The one exception is
:func:`make_schedule`, which imports ``optax`` lazily (inside the function) because its job is to
return an optax schedule; importing ``tclock.control`` never pulls in JAX.

What lives here (section 4 of the write-up):

* :func:`batch_ladder` -- the fixed, finite set of rollout batch sizes (``num_envs``) a run may
  use.  Shapes are static in tclock, so a dynamic batch size must pick from a ladder; the loop
  compiles (and caches) one rollout/update program per rung, so the compile count is bounded
  by ``len(ladder)``.
* :class:`DRBSController` -- dynamic rollout batch size (write-up 4.1): shrink the batch when
  the mean ``rt_ut_ratio`` is high, grow it when low, one ladder rung at a time.
* :class:`UpdateRhythm`, :class:`RhythmGate` -- policy-update rhythm remapping, PURM (4.4):
  the number of updates allowed by wall time ``t`` is ``R(t)``; the gate waits until the
  rhythm allows the next update or the wall budget is spent.
* :func:`lr_clock_value`, :func:`make_schedule`, :class:`LRClock` -- evaluate a learning-rate
  schedule on the step clock, the wall clock, or a hybrid of the two (write-up checklist:
  "learning rate schedule aligned with wall-clock time").  The learner receives the learning
  rate as a plain float argument of each update, so changing it never recompiles anything.
"""
from __future__ import annotations

import builtins
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Protocol, Sequence, runtime_checkable

import numpy as np

__all__ = [
    "WallClock",
    "batch_ladder",
    "Decision",
    "DRBSController",
    "UpdateRhythm",
    "RhythmGate",
    "LR_CLOCK_MODES",
    "SCHEDULE_KINDS",
    "lr_clock_value",
    "make_schedule",
    "LRClock",
]


# --------------------------------------------------------------------------- clocks
@runtime_checkable
class WallClock(Protocol):
    """Any zero-argument callable returning seconds (e.g. ``time.monotonic``).

    Only differences between two readings are used, so the origin does not matter.  Tests
    inject a fake clock whose value they control.
    """

    def __call__(self) -> float: ...


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _finite_number(x: Any) -> bool:
    if x is None or isinstance(x, bool):
        return False
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


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
    if not _is_int(multiple) or multiple < 1:
        raise ValueError(f"multiple={multiple!r} must be an integer >= 1 (the lcm of what "
                         "num_envs must divide into, e.g. num_minibatches x device count)")
    if not _is_int(min_size) or min_size < 1:
        raise ValueError(f"min_size={min_size!r} must be an integer >= 1; pass a positive "
                         "number of envs")
    if not _is_int(max_size) or max_size < 1:
        raise ValueError(f"max_size={max_size!r} must be an integer >= 1; pass a positive "
                         "number of envs")
    if min_size > max_size:
        raise ValueError(f"min_size={min_size} is larger than max_size={max_size}; "
                         "swap them or raise max_size")
    if not _finite_number(step) or step <= 0:
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
    if anchor is None:
        anchor = lo
    if not _is_int(anchor) or not lo <= anchor <= hi or anchor % multiple:
        raise ValueError(f"anchor={anchor!r} must be a multiple of {multiple} in "
                         f"[{lo}, {hi}]; pick one such size")

    def snap(x: float) -> int:
        v = math.floor(x / multiple + 0.5) * multiple  # round half up
        return builtins.min(hi, builtins.max(lo, v))

    factor = 1.0 + float(step)
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
    # A rung less than half a step (in log space) from min or max would make a near-useless
    # move (e.g. 64 -> 67); such rungs are merged into the endpoint.  The anchor always stays.
    half = math.sqrt(factor)
    keep = {s for s in sizes
            if s in (lo, hi, anchor) or (s / lo >= half and hi / s >= half)}
    return tuple(sorted(keep))


# --------------------------------------------------------------------------- DRBS
class Decision(NamedTuple):
    """One DRBS batch-size change: the mean ratio that triggered it and the new size."""

    ratio_mean: float
    size: int


class DRBSController:
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
        if not _is_int(window) or window < 1:
            raise ValueError(f"window={window!r} must be an integer >= 1 (number of recent "
                             "rt_ut_ratio values averaged; the write-up uses 20)")
        if not _is_int(min_samples) or not 1 <= min_samples <= window:
            raise ValueError(f"min_samples={min_samples!r} must be an integer in "
                             f"[1, window={window}]")
        if not _finite_number(high) or not _finite_number(low):
            raise ValueError(f"high={high!r} and low={low!r} must be finite numbers")
        if not 0 <= low < high:
            raise ValueError(f"thresholds must satisfy 0 <= low < high, got low={low}, "
                             f"high={high}; e.g. low=0.35, high=0.75")
        if not _finite_number(step) or step <= 0:
            raise ValueError(f"step={step!r} must be a finite number > 0 (0.25 = +-25% per "
                             "decision, 1.0 = x2 / /2)")
        if not _is_int(multiple) or multiple < 1:
            raise ValueError(f"multiple={multiple!r} must be an integer >= 1")
        for name, v in (("min", min_b), ("max", max_b), ("base", base)):
            if not _is_int(v) or v < 1:
                raise ValueError(f"{name}={v!r} must be a positive integer number of envs")
        if min_b > max_b:
            raise ValueError(f"min={min_b} is larger than max={max_b}; swap them")
        if not min_b <= base <= max_b:
            raise ValueError(f"base={base} is outside [min={min_b}, max={max_b}]; pick a base "
                             "inside the range or widen it")
        if base % multiple:
            raise ValueError(f"base={base} is not a multiple of multiple={multiple}; use "
                             f"{builtins.max(multiple, round(base / multiple) * multiple)}")
        if ladder is None:
            lad = batch_ladder(min_b, max_b, multiple, step, anchor=base)
        else:
            if any(not _is_int(s) for s in ladder):
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
        self._ladder = lad
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
    def batch_size(self) -> int:
        """The current rollout batch size (``num_envs``)."""
        return self._size

    @property
    def ladder(self) -> tuple[int, ...]:
        return self._ladder

    @property
    def history(self) -> tuple[Decision, ...]:
        """Every change so far, as ``(ratio_mean, new_size)``, oldest first."""
        return tuple(self._history)

    @property
    def ratios(self) -> tuple[float, ...]:
        """The ratios currently held (at most ``window``)."""
        return tuple(self._ratios)

    def ratio_mean(self) -> float | None:
        """Mean of the held ratios, or None if there are none."""
        return float(np.mean(self._ratios)) if self._ratios else None

    # ------------------------------------------------------------------ the rule
    def _nearest(self, target: float, candidates: Sequence[int]) -> int:
        # ties -> the candidate closest to the current size (the smaller move)
        return builtins.min(candidates, key=lambda s: (abs(s - target), abs(s - self._size)))

    def update(self, rt_ut_ratio: float | None) -> int:
        """Record one ``rt_ut_ratio`` and return the batch size for the next rollout."""
        self._calls += 1
        if not _finite_number(rt_ut_ratio):
            return self._size
        self._ratios.append(float(rt_ut_ratio))
        if len(self._ratios) > self._window:
            del self._ratios[: len(self._ratios) - self._window]
        if len(self._ratios) < self._min_samples:
            return self._size
        mean = float(np.mean(self._ratios))
        new = self._size
        if mean > self._high:
            below = [s for s in self._ladder if s < self._size]
            if below:
                new = self._nearest(self._size / (1.0 + self._step), below)
        elif mean < self._low:
            above = [s for s in self._ladder if s > self._size]
            if above:
                new = self._nearest(self._size * (1.0 + self._step), above)
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
        if size not in self._ladder:
            raise ValueError(f"saved batch_size={size} is not on this controller's ladder "
                             f"{list(self._ladder)}; resume with the same min/max/step/"
                             "multiple/ladder as the original run")
        self._size = size
        self._ratios = ratios[-self._window:]
        self._history = history
        self._calls = calls


# --------------------------------------------------------------------------- PURM
_EPS = 1e-9  # absorbs float error when t is an exact multiple of t_base (e.g. 0.3 / 0.1)


@dataclass(frozen=True)
class UpdateRhythm:
    """The update rhythm of the write-up's PURM (4.4)::

        R(t) = floor(t / t_base) * (1 + alpha * sin(2 pi t / t_cycle))

    ``t`` is wall seconds since training started.  :meth:`target_updates` returns ``R(t)``
    exactly as written (a float: only ``t / t_base`` is floored).  The number of updates the
    rhythm *allows* by time ``t`` is :meth:`allowed_updates` = ``floor(R(t))`` -- we floor the
    product, so an update is owed only once a whole one has come due; with ``alpha = 0`` this
    is exactly the write-up's loop ``step < int(elapsed / T_base)``.  Since ``updates_done`` is
    an integer, ``updates_done < floor(R)`` is the same test as ``updates_done + 1 <= R``.

    With ``alpha > 0``, ``R`` is not monotone: while the sine falls, ``R`` can drop below the
    updates already done, and the gate simply waits.  ``0 <= alpha <= 1`` keeps ``R >= 0``.
    """

    t_base: float = 3.0
    alpha: float = 0.2
    t_cycle: float = 60.0

    def __post_init__(self) -> None:
        if not _finite_number(self.t_base) or self.t_base <= 0:
            raise ValueError(f"t_base={self.t_base!r} must be > 0 seconds (base update period, "
                             "e.g. 3.0)")
        if not _finite_number(self.alpha) or not 0 <= self.alpha <= 1:
            raise ValueError(f"alpha={self.alpha!r} must be in [0, 1] (rhythm amplitude, "
                             "e.g. 0.2)")
        if not _finite_number(self.t_cycle) or self.t_cycle <= 0:
            raise ValueError(f"t_cycle={self.t_cycle!r} must be > 0 seconds (rhythm period, "
                             "e.g. 60)")

    def target_updates(self, t: float) -> float:
        """``R(t)`` as in the write-up (0 for ``t <= 0``)."""
        if t <= 0:
            return 0.0
        n = math.floor(t / self.t_base + _EPS)
        return n * (1.0 + self.alpha * math.sin(2.0 * math.pi * t / self.t_cycle))

    def allowed_updates(self, t: float) -> int:
        """``floor(R(t))``: how many updates the rhythm allows by time ``t``."""
        return builtins.max(0, math.floor(self.target_updates(t) + _EPS))

    def should_update(self, t: float, updates_done: int) -> bool:
        """True when another update is owed at time ``t``: ``updates_done < floor(R(t))``."""
        return updates_done < self.allowed_updates(t)


class RhythmGate:
    """Paces a training loop by an :class:`UpdateRhythm` against a wall clock.

    ::

        gate = RhythmGate(UpdateRhythm(3.0, 0.2, 60.0))
        gate.start()
        done = 0
        while gate.wait_for_slot(done, deadline_s=total_train_time_s):
            ...  # rollout + update
            done += 1

    ``clock`` and ``sleep`` are injectable: a test passes a fake clock whose ``sleep`` advances
    it, so nothing really sleeps and the result is deterministic.  Between checks the gate
    calls ``sleep(poll_s)`` (the write-up's ``time.sleep(0.01)``, which yields the CPU).
    """

    def __init__(
        self,
        rhythm: UpdateRhythm,
        clock: WallClock = time.monotonic,
        sleep: Callable[[float], Any] = time.sleep,
        poll_s: float = 0.01,
    ) -> None:
        if not isinstance(rhythm, UpdateRhythm):
            raise TypeError(f"rhythm must be an UpdateRhythm, got {type(rhythm).__name__}")
        if not _finite_number(poll_s) or poll_s <= 0:
            raise ValueError(f"poll_s={poll_s!r} must be > 0 seconds (e.g. 0.01)")
        self.rhythm = rhythm
        self._clock = clock
        self._sleep = sleep
        self.poll_s = float(poll_s)
        self._t0: float | None = None
        self.waited_s = 0.0  # total time spent waiting for slots

    def start(self) -> None:
        """Mark ``t = 0`` of the rhythm (call once, when training starts)."""
        self._t0 = float(self._clock())
        self.waited_s = 0.0

    def elapsed(self) -> float:
        if self._t0 is None:
            raise RuntimeError("RhythmGate.start() must be called before elapsed() / "
                               "wait_for_slot()")
        return float(self._clock()) - self._t0

    def wait_for_slot(self, updates_done: int, deadline_s: float | None = None) -> bool:
        """Wait until the rhythm allows update number ``updates_done + 1``.

        Returns True when it does, False once ``elapsed() >= deadline_s`` (the wall budget is
        spent; checked first, like the write-up's ``while elapsed < total``).  ``deadline_s=None``
        waits without a budget.
        """
        t_enter = self.elapsed()
        while True:
            t = self.elapsed()
            if deadline_s is not None and t >= deadline_s:
                self.waited_s += t - t_enter
                return False
            if self.rhythm.should_update(t, updates_done):
                self.waited_s += t - t_enter
                return True
            self._sleep(self.poll_s)


# --------------------------------------------------------------------------- LR clocks
LR_CLOCK_MODES = ("steps", "wall", "hybrid")
SCHEDULE_KINDS = ("constant", "linear", "cosine")


def lr_clock_value(
    mode: str,
    step: float,
    elapsed_s: float,
    steps_per_second_hint: float | None = None,
    total_steps: float | None = None,
    total_seconds: float | None = None,
) -> float:
    """The "time" at which a learning-rate schedule is evaluated.

    * ``"steps"``: ``step`` (the update count); the schedule's horizon is in updates.
    * ``"wall"``: ``elapsed_s`` (wall seconds since training started); horizon in seconds.
    * ``"hybrid"``: in step units, ``max(step, elapsed_s * rate)`` where ``rate`` converts
      seconds to steps: ``total_steps / total_seconds`` when both budgets are given -- then the
      value is ``total_steps * max(step / total_steps, elapsed_s / total_seconds)``, i.e. the
      larger of the two progress fractions, so the LR decays as soon as *either* budget runs
      out -- otherwise ``steps_per_second_hint``.  The horizon is ``total_steps``.

    The value is not clamped; optax schedules hold their end value past the horizon.
    """
    if mode not in LR_CLOCK_MODES:
        raise ValueError(f"mode={mode!r} is not one of {LR_CLOCK_MODES}")
    if not _finite_number(step) or step < 0:
        raise ValueError(f"step={step!r} must be a finite number >= 0")
    if not _finite_number(elapsed_s) or elapsed_s < 0:
        raise ValueError(f"elapsed_s={elapsed_s!r} must be a finite number >= 0")
    if mode == "steps":
        return float(step)
    if mode == "wall":
        return float(elapsed_s)
    if total_steps is not None and total_seconds is not None:
        if not _finite_number(total_steps) or total_steps <= 0:
            raise ValueError(f"total_steps={total_steps!r} must be > 0 for mode='hybrid'")
        if not _finite_number(total_seconds) or total_seconds <= 0:
            raise ValueError(f"total_seconds={total_seconds!r} must be > 0 for mode='hybrid'")
        return float(total_steps) * builtins.max(step / total_steps, elapsed_s / total_seconds)
    if steps_per_second_hint is not None:
        if not _finite_number(steps_per_second_hint) or steps_per_second_hint <= 0:
            raise ValueError(f"steps_per_second_hint={steps_per_second_hint!r} must be > 0")
        return float(builtins.max(step, elapsed_s * steps_per_second_hint))
    raise ValueError("mode='hybrid' needs total_steps and total_seconds (the two budgets), "
                     "or steps_per_second_hint to convert seconds to steps")


def make_schedule(kind: str, lr: float, horizon: float, warmup: float = 0,
                  end_value: float = 0.0):
    """An optax schedule ``t -> learning rate`` with ``t`` in the clock's units.

    * ``"constant"``: ``lr`` (after the warmup, if any).
    * ``"linear"``: ``lr`` at the end of the warmup, decaying linearly to ``end_value`` at
      ``t = horizon``.
    * ``"cosine"``: ``lr`` at the end of the warmup, cosine decay to ``end_value`` at
      ``t = horizon`` (``end + (lr - end) * (1 + cos(pi * (t - warmup) / (horizon - warmup))) / 2``).

    ``horizon`` includes the warmup, which ramps linearly from 0 to ``lr`` over ``[0, warmup]``.
    Past the horizon the value stays at ``end_value`` (``lr`` for "constant").  ``t`` may be a
    float (seconds on the wall clock).  Evaluate it on the host (``float(schedule(t))``) and pass
    the float to the update function.  optax is imported here, lazily.
    """
    if kind not in SCHEDULE_KINDS:
        raise ValueError(f"kind={kind!r} is not one of {SCHEDULE_KINDS}")
    if not _finite_number(lr) or lr < 0:
        raise ValueError(f"lr={lr!r} must be a finite number >= 0")
    if not _finite_number(warmup) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be >= 0 (in the clock's units)")
    if not _finite_number(horizon) or horizon <= 0:
        raise ValueError(f"horizon={horizon!r} must be > 0 (in the clock's units: updates for "
                         "mode='steps'/'hybrid', seconds for mode='wall')")
    if kind != "constant" and warmup >= horizon:
        raise ValueError(f"warmup={warmup} must be smaller than horizon={horizon} for a "
                         f"{kind!r} schedule; shorten the warmup or lengthen the horizon")
    if not _finite_number(end_value) or end_value < 0:
        raise ValueError(f"end_value={end_value!r} must be a finite number >= 0")
    import optax  # lazy: keeps `import tclock.control` free of JAX

    lr = float(lr)
    if kind == "constant":
        main = optax.constant_schedule(lr)
    elif kind == "linear":
        main = optax.linear_schedule(lr, float(end_value), horizon - warmup)
    else:
        alpha = float(end_value) / lr if lr > 0 else 0.0
        main = optax.cosine_decay_schedule(lr, horizon - warmup, alpha=alpha)
    if warmup <= 0:
        return main
    ramp = optax.linear_schedule(0.0, lr, warmup)
    return optax.join_schedules([ramp, main], [warmup])


class LRClock:
    """A schedule bundled with its clock: ``lr(step, elapsed_s) -> float``.

    ``horizon`` defaults to ``total_steps`` for "steps"/"hybrid" and ``total_seconds`` for
    "wall".
    """

    def __init__(self, mode: str, kind: str, lr: float, *, total_steps: float | None = None,
                 total_seconds: float | None = None, warmup: float = 0,
                 steps_per_second_hint: float | None = None, end_value: float = 0.0,
                 horizon: float | None = None) -> None:
        if mode not in LR_CLOCK_MODES:
            raise ValueError(f"mode={mode!r} is not one of {LR_CLOCK_MODES}")
        if horizon is None:
            horizon = total_seconds if mode == "wall" else total_steps
        if horizon is None:
            need = "total_seconds" if mode == "wall" else "total_steps"
            raise ValueError(f"LRClock(mode={mode!r}) needs {need} (or horizon=)")
        self.mode = mode
        self.total_steps, self.total_seconds = total_steps, total_seconds
        self.steps_per_second_hint = steps_per_second_hint
        self.schedule = make_schedule(kind, lr, horizon, warmup, end_value)
        # fail early on an incomplete hybrid configuration
        lr_clock_value(mode, 0, 0.0, steps_per_second_hint, total_steps, total_seconds)

    def clock_value(self, step: float, elapsed_s: float) -> float:
        return lr_clock_value(self.mode, step, elapsed_s, self.steps_per_second_hint,
                              self.total_steps, self.total_seconds)

    def lr(self, step: float, elapsed_s: float) -> float:
        return float(self.schedule(self.clock_value(step, elapsed_s)))
