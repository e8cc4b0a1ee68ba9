"""Policy-update rhythm remapping, PURM (write-up 4.4), paced against a wall clock.

Plain Python, no JAX: the gate runs in the host loop between jitted calls.

* :class:`UpdateRhythm`, :class:`RhythmGate` -- the number of updates allowed by wall time
  ``t`` is ``R(t)``; the gate waits until the rhythm allows the next update or the wall budget
  is spent.
* :class:`WallClock` -- the protocol of the injectable clock (``time.monotonic`` by default).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

from tclock.control.checks import finite_number

__all__ = ["WallClock", "UpdateRhythm", "RhythmGate"]


# --------------------------------------------------------------------------- clocks
@runtime_checkable
class WallClock(Protocol):
    """Any zero-argument callable returning seconds (e.g. ``time.monotonic``).

    Only differences between two readings are used, so the origin does not matter.  Tests
    inject a fake clock whose value they control.
    """

    def __call__(self) -> float: ...


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
        if not finite_number(self.t_base) or self.t_base <= 0:
            raise ValueError(f"t_base={self.t_base!r} must be > 0 seconds (base update period, "
                             "e.g. 3.0)")
        if not finite_number(self.alpha) or not 0 <= self.alpha <= 1:
            raise ValueError(f"alpha={self.alpha!r} must be in [0, 1] (rhythm amplitude, "
                             "e.g. 0.2)")
        if not finite_number(self.t_cycle) or self.t_cycle <= 0:
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
        return max(0, math.floor(self.target_updates(t) + _EPS))

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
        if not finite_number(poll_s) or poll_s <= 0:
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
