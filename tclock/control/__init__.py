"""Host-side controllers for the two clocks: DRBS, PURM and wall-clock learning-rate schedules.

Plain Python (+ NumPy).  This package does **not** import JAX: the controllers run in the thin
host loop between jitted calls, and they can be unit-tested on their own.  The one exception is
:func:`make_schedule`, which imports ``optax`` lazily (inside the function) because its job is to
return an optax schedule; importing ``tclock.control`` never pulls in JAX.

Three independent controllers (section 4 of the write-up), one module each:

* :mod:`tclock.control.drbs` -- dynamic rollout batch size on a ladder of valid sizes
  (:func:`batch_ladder`, :class:`Decision`, :class:`DRBSController`, steered by RT/UT);
* :mod:`tclock.control.drbs_critical` -- DRBS steered by the online critical batch or B*
  (:class:`CriticalBatchController`, the default signal);
* :mod:`tclock.control.coscale` -- the lr that follows B (:func:`lr_multiplier`);
* :mod:`tclock.control.rhythm` -- the policy-update rhythm PURM and its wall-clock gate
  (:class:`UpdateRhythm`, :class:`RhythmGate`, :class:`WallClock`);
* :mod:`tclock.control.schedules` -- learning-rate schedules on the step, wall or hybrid clock
  (:func:`lr_clock_value`, :func:`make_schedule`, :class:`LRClock`).

:mod:`tclock.control.checks` holds the argument checks they share.  Every public name is
re-exported here, so ``from tclock.control import X`` works for all of them.
"""
from __future__ import annotations

from tclock.control.coscale import SCALING_KINDS, lr_multiplier
from tclock.control.drbs import Decision, DRBSController, batch_ladder
from tclock.control.drbs_critical import CriticalBatchController, Move
from tclock.control.rhythm import RhythmGate, UpdateRhythm, WallClock
from tclock.control.schedules import (
    LR_CLOCK_MODES,
    SCHEDULE_KINDS,
    LRClock,
    lr_clock_value,
    make_schedule,
)

__all__ = [
    "WallClock",
    "batch_ladder",
    "Decision",
    "DRBSController",
    "CriticalBatchController",
    "Move",
    "SCALING_KINDS",
    "lr_multiplier",
    "UpdateRhythm",
    "RhythmGate",
    "LR_CLOCK_MODES",
    "SCHEDULE_KINDS",
    "lr_clock_value",
    "make_schedule",
    "LRClock",
]
