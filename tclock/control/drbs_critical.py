"""DRBS that steers by the critical batch (``drbs_signal="critical"``, the default of ``--drbs``).

Plain Python (+ NumPy), no JAX: the controller runs in the host loop between jitted calls, on
the same fixed ladder as :class:`tclock.control.drbs.DRBSController` (bounded compiles).

Why not RT/UT: in a synchronous loop ``rt_ut_ratio = RT / (RT + learn)`` is the rollout's share
of an iteration; it barely moves with B and carries no information about the critical batch
(docs/metrics.md), so a controller steered by it drifts to one end of the ladder whatever the
task needs.  This one steers by the quantity the S-E relation is about:

* the target is the online critical batch ``b`` (median over seeds of Σ trace / Σ signal,
  :mod:`tclock.online_critical`) **from the estimates made at the current size only**: the run's
  logged ``b_crit_online_envs`` averages its last ``noise_window`` estimates across sizes, and
  the estimate changes as the policy learns (pointmass_reach: several hundred envs near the initial
  policy, tens once it reaches the target; experiments/lr_batch.py), so a window that still held
  the old size's (older) estimates kept a
  run that had just moved down near its old size; or, once the run has timed iterations at two or more ladder
  sizes and ``t(B) = a + k B`` has a positive per-env term, the wall-clock optimum
  ``B* = sqrt(b a / k)`` (McCandlish et al. 2018; :func:`tclock.critical.wallclock_optimum`).
  ``t(B)`` is timed on the iterations that measured an estimate only (every size has them, since
  the controller asks for estimates after each move; a plain iteration costs about 0.6x of one on
  a CPU, so a mix of the two made a size's time depend on which kind it happened to run), and
  leaves out each size's first iteration (the first call of its programs: on a CPU 0.05-0.08 s
  more, 3x an iteration at B = 32, which read B* about 2-4x too large).  A fit whose intercept
  comes out <= 0 targets the smallest size (:meth:`CriticalBatchController.target`);
* every ``min_estimates`` new estimates at the current size it compares B with the target
  (until they are in, :attr:`CriticalBatchController.wants_estimate` asks the loop to measure on
  every iteration, whatever ``gdc_every`` says: at the default cadence of 8 a decision would
  otherwise wait 24 iterations, most of a short budget when they are at a large B; the extra
  measured iterations come only after a start or a move, so they are bounded by the ladder):
  B > ``band`` x target or B < target / ``band`` -> move, else hold (the hysteresis band keeps a
  noisy estimate from making the size oscillate);
* **the timing probe** (``timing_probe``, on by default): a run that starts above the ladder's
  smallest size moves there after its first timed iteration, before any estimate, and makes its
  first ``min_estimates`` estimates there.  B* needs ``t(B)`` at two sizes, and without it a run
  started at a large B can only compare B with the critical batch, which near the initial policy
  reads about as large as the start (pointmass_reach: ~1000 envs at B = 1024), so it held there:
  experiments/drbs_critical.py measured 1.9-2.4x the best fixed B's wall time spent at B = 1024 before
  the first move.  The smallest size is the cheapest iteration and, far from the start, gives a
  well-conditioned ``a`` and ``k`` (on a CPU ``a`` is a few percent of a large-B iteration, below
  the noise of two neighbouring sizes).  The first decision then steers to B* from both timings,
  back up when ``a`` dominates (an accelerator) and nowhere when the small size is already near B*;
* a move goes straight to the ladder size nearest the target on a log scale (below the current
  size when shrinking, above it when growing), not one rung at a time: a run started at 32x its
  critical batch would otherwise spend ``min_estimates`` iterations at every rung on the way
  down, which at a large B is most of a short budget (experiments/drbs_critical.py measured
  1.8-2.3x the best fixed B's wall time with one-rung moves).  Each size still compiles once, so
  compiles stay bounded by the ladder.

The online estimate's calibration against sweeps is in RESULTS.md (experiments/lr_batch.py).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from tclock.control.checks import finite_number, is_int
from tclock.control.drbs import LadderController, _check_range, _resolve_ladder
from tclock.online_critical import OnlineCriticalBatch
from tclock.runlog import seed_median

__all__ = ["Move", "CriticalBatchController"]


class Move(NamedTuple):
    """One change: the target it steered to (envs), what the target was, the new size."""

    target: float
    source: str  # "b_crit", "b_star" or "timing_probe" (target: the probed size)
    size: int




class CriticalBatchController(LadderController):
    """Steers the batch size towards the online critical batch or ``B*``; see the module docstring.

    Call :meth:`observe` once per iteration with the iteration's metrics record (it reads the
    per-seed noise estimates of :data:`tclock.online_critical.SOURCES`, ``num_envs``, ``rt_s``,
    ``learn_s``); :attr:`batch_size` is the size for the next rollout.  ``window``: at most this
    many estimates at the current size are averaged (``noise_window``).  ``timing_probe``: move to
    the smallest ladder size after the first timed iteration when starting above it (module
    docstring).
    """

    def __init__(self, base: int = 256, min: int = 64, max: int = 1024,  # noqa: A002
                 step: float = 0.25, band: float = 1.5, min_estimates: int = 3,
                 ladder: Sequence[int] | None = None, multiple: int = 1, window: int = 20,
                 timing_probe: bool = True) -> None:
        if not finite_number(band) or band < 1:
            raise ValueError(f"band={band!r} must be a finite number >= 1 (1.5: hold while B is within "
                             "1.5x of the target either way)")
        if not is_int(min_estimates) or min_estimates < 1:
            raise ValueError(f"min_estimates={min_estimates!r} must be an integer >= 1 (new critical-batch "
                             "estimates at a size before the controller may move again)")
        if not finite_number(step) or step <= 0:
            raise ValueError(f"step={step!r} must be a finite number > 0")
        if not is_int(window) or window < 1:
            raise ValueError(f"window={window!r} must be an integer >= 1 (estimates at a size averaged, noise_window)")
        _check_range(base, min, max, multiple)
        self._ladder = _resolve_ladder(ladder, base, min, max, multiple, step)
        self._band, self._min_estimates = float(band), int(min_estimates)
        self._size = int(base)
        self._seen = 0  # estimates at the current size since the last change
        self._window = int(window)
        self._estimates = OnlineCriticalBatch(self._window)  # at the current size only
        self._b: float | None = None
        self._times: dict[int, list[float]] = {}
        self._history: list[Move] = []
        self._timing_probe = bool(timing_probe)

    @property
    def wants_estimate(self) -> bool:
        """True until ``min_estimates`` estimates are in at the current size: the loop then
        measures on every iteration (the probe), so a decision at a new size waits
        ``min_estimates`` iterations, not ``min_estimates x gdc_every``."""
        return self._seen < self._min_estimates

    @property
    def noise_scale(self) -> float | None:
        """The online critical batch (envs, median over seeds) from the estimates at the current
        size only; None until the first one there.  The loop scales the lr by it under ``lr_scaling noise``
        (not by the logged ``b_crit_online_envs``, whose window still holds the estimates of the
        sizes the run left: the estimate grows with the batch it is read at, so after the timing
        probe the start size's estimate would set the lr at the smallest size)."""
        return self._b if self._seen > 0 else None  # _b is the old size's until then (logged as the target)

    # ------------------------------------------------------------------ the target
    def ratio_mean(self) -> float | None:
        """The current target (envs), logged as ``drbs_target_envs``; None before the first estimate."""
        target, _ = self.target()
        return target

    def iteration_time(self, size: int) -> float | None:
        """The iteration seconds ``t(B)`` at ``size`` that :meth:`time_fit` uses: the median over
        the measured iterations there (the ones that logged a noise estimate), leaving out the
        first one at the size when there are more (it runs both programs for the first time:
        0.05-0.08 s more on a CPU, 3x a B = 32 iteration); None when the size was never timed."""
        times = self._times.get(int(size))
        if not times:
            return None
        return float(np.median(times[1:] if len(times) > 1 else times))

    def time_fit(self) -> tuple[float, float] | None:
        """``(a, k)`` of ``t(B) = a + k B`` (least squares over :meth:`iteration_time` per timed
        size) once at least two sizes were timed; either term may come out <= 0 (:meth:`target`)."""
        sizes = sorted(self._times)
        if len(sizes) < 2:
            return None
        from tclock.critical import fit_linear_time

        f = fit_linear_time(sizes, [self.iteration_time(b) for b in sizes])
        return f.a, f.k

    def target(self) -> tuple[float | None, str]:
        """``(target envs, "b_star" | "b_crit")``; ``(None, "")`` before an estimate exists.

        With two sizes timed the target is ``B* = sqrt(b a / k)``.  A fit with ``a <= 0`` (the
        per-env cost grows faster than linearly: on a CPU a large B misses the caches) says the
        fixed cost is too small to see, ``B* -> 0``: the target is the ladder's smallest size,
        not ``b`` (falling back to ``b`` there sent a reacher run from 32 up to 512 late in
        training, once its intercept crossed 0).  One with ``k <= 0`` (the time does not grow with
        B, or no timings: all zero) carries no per-env cost to weigh, and the target stays ``b``."""
        if self._b is None:
            return None, ""
        fit = self.time_fit()
        if fit is None:
            return self._b, "b_crit"
        a, k = fit
        if k <= 0:
            return self._b, "b_crit"
        if a <= 0:
            return float(self._ladder[0]), "b_star"
        from tclock.critical import wallclock_optimum

        return wallclock_optimum(self._b, a, k), "b_star"

    # ------------------------------------------------------------------ the rule
    def observe(self, record: dict) -> int:
        """Takes one iteration's record; returns the batch size for the next rollout."""
        rt, learn, b_now = record.get("rt_s"), record.get("learn_s"), record.get("num_envs")
        ratio = self._estimates.add(record)  # None on a plain iteration (no estimate logged)
        if ratio is not None and finite_number(rt) and finite_number(learn) and is_int(b_now):
            # only measured iterations are timed: every size has them
            first_timing = not self._times
            self._times.setdefault(int(b_now), []).append(float(rt) + float(learn))
            if len(self._times[int(b_now)]) > 50:  # keep the first (the warm-up iteration_time leaves out)
                del self._times[int(b_now)][1]
            if first_timing and self._timing_probe and self._size > self._ladder[0]:
                # the start size is timed (a resumed run keeps its timings): time the cheapest size next
                self._change(self._ladder[0], float(self._ladder[0]), "timing_probe")
                return self._size
        b = seed_median(ratio) if ratio is not None else None
        if b is None or b <= 0:
            return self._size
        self._b = b
        self._seen += 1
        if self._seen < self._min_estimates:
            return self._size
        target, source = self.target()
        new = self._size
        if self._size > self._band * target:
            new = self._move_towards(target, down=True, log=True)
        elif self._size * self._band < target:
            new = self._move_towards(target, down=False, log=True)
        if new != self._size:
            self._change(new, float(target), source)
        return self._size

    def _change(self, size: int, target: float, source: str) -> None:
        """Moves to ``size``: the estimates start again there (judged only on its own)."""
        self._size, self._seen = size, 0
        self._estimates = OnlineCriticalBatch(self._window)
        self._history.append(Move(target, source, size))

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict:
        return {"batch_size": self._size, "seen": self._seen, "b": self._b, "estimates": self._estimates.state_dict(),
                "times": {str(k): v for k, v in self._times.items()},
                "history": [list(m) for m in self._history], "ladder": list(self._ladder)}

    def load_state_dict(self, state: dict) -> None:
        try:
            size = int(state["batch_size"])
            seen = int(state.get("seen", 0))
            b = state.get("b")
            times = {int(k): [float(x) for x in v] for k, v in (state.get("times") or {}).items()}
            history = [Move(float(t), str(src), int(s)) for t, src, s in state.get("history", [])]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"DRBS state is malformed ({e!r}); pass the dict returned by "
                             "CriticalBatchController.state_dict()") from e
        self._check_saved_size(size, "resume with the same drbs_min/drbs_max/drbs_step as the original run")
        self._size, self._seen, self._times, self._history = size, seen, times, history
        self._estimates = OnlineCriticalBatch(self._window, state.get("estimates"))
        self._b = float(b) if b is not None else None
