"""Learning-rate schedules on the step clock, the wall clock, or a hybrid of the two.

* :func:`lr_clock_value`, :func:`make_schedule`, :class:`LRClock` -- evaluate a learning-rate
  schedule on the step clock, the wall clock, or a hybrid of the two (write-up checklist:
  "learning rate schedule aligned with wall-clock time").  The learner receives the learning
  rate as a plain float argument of each update, so changing it never recompiles anything.

Plain Python: :func:`make_schedule` imports ``optax`` lazily (inside the function) because its
job is to return an optax schedule; importing this module never pulls in JAX.
"""
from __future__ import annotations

from tclock.control.checks import check_choice, check_finite_nonneg, finite_number

__all__ = ["LR_CLOCK_MODES", "SCHEDULE_KINDS", "lr_clock_value", "make_schedule", "LRClock"]


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
    check_choice("mode", mode, LR_CLOCK_MODES)
    check_finite_nonneg("step", step)
    check_finite_nonneg("elapsed_s", elapsed_s)
    if mode == "steps":
        return float(step)
    if mode == "wall":
        return float(elapsed_s)
    if total_steps is not None and total_seconds is not None:
        if not finite_number(total_steps) or total_steps <= 0:
            raise ValueError(f"total_steps={total_steps!r} must be > 0 for mode='hybrid'")
        if not finite_number(total_seconds) or total_seconds <= 0:
            raise ValueError(f"total_seconds={total_seconds!r} must be > 0 for mode='hybrid'")
        return float(total_steps) * max(step / total_steps, elapsed_s / total_seconds)
    if steps_per_second_hint is not None:
        if not finite_number(steps_per_second_hint) or steps_per_second_hint <= 0:
            raise ValueError(f"steps_per_second_hint={steps_per_second_hint!r} must be > 0")
        return float(max(step, elapsed_s * steps_per_second_hint))
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
    check_choice("kind", kind, SCHEDULE_KINDS)
    check_finite_nonneg("lr", lr)
    if not finite_number(warmup) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be >= 0 (in the clock's units)")
    if not finite_number(horizon) or horizon <= 0:
        raise ValueError(f"horizon={horizon!r} must be > 0 (in the clock's units: updates for "
                         "mode='steps'/'hybrid', seconds for mode='wall')")
    if kind != "constant" and warmup >= horizon:
        raise ValueError(f"warmup={warmup} must be smaller than horizon={horizon} for a "
                         f"{kind!r} schedule; shorten the warmup or lengthen the horizon")
    check_finite_nonneg("end_value", end_value)
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
        check_choice("mode", mode, LR_CLOCK_MODES)
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
