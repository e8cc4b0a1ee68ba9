"""Critical batch size from a sweep: fits, bootstrap CI, wall-clock optimum.  NumPy only.

(About 440 lines, a third of them the docstrings that define each estimator, its units and
its edge cases; the estimators share their input checks and the inf = "not reached"
convention, so they stay in one module.)

Units (docs/design.md §2):

* ``B``  = ``num_envs`` (rollout batch size, in **envs**).
* ``T``  = ``unroll_length`` (steps each env takes per rollout).
* ``S``  = iterations (updates) to reach the target.
* env steps to target ``E = S * B * T``.

The steps-to-target model (McCandlish et al. 2018) is ``S(B) = S_min + c / B`` with
``c = E_min / T``, so

* ``E_min = c * T`` (env steps; the data needed in the small-batch limit),
* ``B_crit = c / S_min = E_min / (T * S_min)`` (**envs**),
* ``B_crit * T`` = the same point in **transitions** per rollout.

``b_simple`` from :mod:`tclock.diagnostics` is in transitions; convert it with
:func:`b_simple_to_envs` before comparing it with ``B_crit``.

:func:`steps_to_target` is tclock's one rule for when a learning curve reached its target (the
sweep analysis, the experiments and the benchmarks call it).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import NamedTuple, Optional, Sequence
import warnings

import numpy as np

from tclock import thresholds

__all__ = ["CriticalFit", "BootstrapResult", "TunedBootstrap", "LinearTimeFit", "TargetHit", "fit_steps_to_target",
           "bootstrap_b_crit", "tuned_medians", "bootstrap_tuned_b_crit", "fit_linear_time", "wallclock_optimum", "gdc_cliff", "b_simple_to_envs",
           "rt_ut_crossings", "steps_to_target"]


def _float_array(x, name: str) -> np.ndarray:
    """1-D float array; ``None`` entries become NaN."""
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:  # pragma: no cover - message only
        raise ValueError(f"{name} must be numeric (None/NaN allowed for missing): {exc}") from None
    return arr


def _check_unroll(unroll_length) -> float:
    t = float(unroll_length)
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"unroll_length must be a positive number, got {unroll_length!r}")
    return t


def _r2(y: np.ndarray, y_hat: np.ndarray, w: Optional[np.ndarray] = None) -> float:
    """Coefficient of determination ``1 - SS_res/SS_tot`` (weighted if ``w`` is given)."""
    if w is None:
        w = np.ones_like(y)
    ybar = np.sum(w * y) / np.sum(w)
    ss_res = float(np.sum(w * (y - y_hat) ** 2))
    ss_tot = float(np.sum(w * (y - ybar) ** 2))
    if ss_tot <= 0.0:
        return 1.0 if ss_res <= 0.0 else float("nan")
    return 1.0 - ss_res / ss_tot


# --------------------------------------------------------------------------- S(B) fit


@dataclass(frozen=True)
class CriticalFit:
    """Result of :func:`fit_steps_to_target`.  Units in the field names' docs.

    * ``s_min``: iterations to target in the large-batch limit.
    * ``c``: ``E_min / T`` (iterations x envs).
    * ``e_min``: env steps to target in the small-batch limit (``c * T``).
    * ``b_crit``: critical batch size in **envs** (``c / s_min``); NaN when the fit is degenerate.
    * ``b_crit_transitions``: ``b_crit * T`` (transitions per rollout); NaN when degenerate.
    * ``r2``: weighted coefficient of determination of the fit (same weights as the fit).
    * ``n_points``: points used; ``n_dropped``: points dropped as "target not reached".
    * ``unroll_length``: T used for the conversions.
    * ``weighting``: ``"relative"`` or ``"none"``.
    * ``note``: empty when all is well, otherwise why ``b_crit`` is NaN.
    """

    s_min: float
    c: float
    e_min: float
    b_crit: float
    b_crit_transitions: float
    r2: float
    n_points: int
    n_dropped: int
    unroll_length: float
    weighting: str
    note: str = ""

    @property
    def ok(self) -> bool:
        """True when ``b_crit`` is a finite positive number."""
        return bool(np.isfinite(self.b_crit))

    def predict(self, batch_sizes) -> np.ndarray:
        """Fitted iterations to target ``S(B) = s_min + c / B`` (B in envs)."""
        b = np.asarray(batch_sizes, dtype=float)
        return self.s_min + self.c / b

    def to_dict(self) -> dict:
        """Plain dict (JSON-friendly apart from NaN floats)."""
        return asdict(self)


def _lstsq_inverse(b: np.ndarray, s: np.ndarray, w: np.ndarray):
    """Weighted least squares of ``s ~ s_min + c * (1/b)``; returns ``(s_min, c, r2)``."""
    x = 1.0 / b
    sw = np.sqrt(w)
    design = np.stack([np.ones_like(x), x], axis=1) * sw[:, None]
    coef, *_ = np.linalg.lstsq(design, s * sw, rcond=None)
    s_min, c = float(coef[0]), float(coef[1])
    return s_min, c, _r2(s, s_min + c * x, w)


def _weights(s: np.ndarray, weighting: str) -> np.ndarray:
    if weighting == "relative":
        return 1.0 / s**2
    if weighting == "none":
        return np.ones_like(s)
    raise ValueError(f"weighting must be 'relative' or 'none', got {weighting!r}")


def fit_steps_to_target(
    batch_sizes: Sequence[float],
    steps: Sequence[Optional[float]],
    unroll_length: float,
    weighting: str = "relative",
) -> CriticalFit:
    """Fit ``S(B) = S_min + c/B`` (linear least squares in ``1/B``) and derive ``B_crit``.

    Args:
      batch_sizes: ``B`` (num_envs) per point; repeats are allowed (e.g. one point per seed).
      steps: iterations to target per point; ``None``/NaN/inf = target not reached (dropped and
        counted in ``n_dropped``).  Reached points must be > 0.
      unroll_length: ``T``, to convert ``c`` to env steps (``E_min = c*T``) and ``B_crit`` to
        transitions.
      weighting: ``"relative"`` (default) minimises ``sum(((S - S_fit)/S)^2)``, i.e. weights
        ``1/S^2``.  Seed-to-seed scatter of steps-to-target is roughly proportional to S, so
        this keeps the small-B points (large S, large absolute scatter) from drowning the
        large-B points that pin down ``S_min`` -- and ``S_min`` sets ``B_crit``.  ``"none"``
        is ordinary least squares.

    Returns a :class:`CriticalFit` with ``b_crit = c / S_min`` (envs), ``e_min = c*T`` (env
    steps), ``b_crit_transitions = b_crit*T``.  If ``S_min <= 0`` or ``c <= 0`` the model does
    not describe the data (no diminishing returns seen, or no benefit from larger batches):
    ``b_crit`` is NaN and ``note`` says why; the raw ``s_min``/``c`` are still reported.

    Raises ValueError when fewer than 2 distinct batch sizes have a reached target, or on
    non-positive/non-finite batch sizes, non-positive reached steps, or mismatched lengths.
    """
    t = _check_unroll(unroll_length)
    b = _float_array(batch_sizes, "batch_sizes").reshape(-1)
    s = _float_array(steps, "steps").reshape(-1)
    if b.shape != s.shape:
        raise ValueError(f"batch_sizes and steps differ in length ({b.size} vs {s.size})")
    if not np.all(np.isfinite(b)) or np.any(b <= 0):
        raise ValueError(f"batch_sizes must be finite and positive, got {b.tolist()}")
    keep = np.isfinite(s)
    n_dropped = int(np.sum(~keep))
    b, s = b[keep], s[keep]
    if np.any(s <= 0):
        raise ValueError(f"steps to target must be > 0 where reached, got {s.tolist()}")
    n_distinct = np.unique(b).size
    if n_distinct < 2:
        raise ValueError(
            f"fit_steps_to_target needs points at >= 2 distinct batch sizes that reached the "
            f"target; got {n_distinct} distinct ({b.size} points kept, {n_dropped} dropped as "
            f"not reached). Widen the sweep or lower the target."
        )
    s_min, c, r2 = _lstsq_inverse(b, s, _weights(s, weighting))
    notes = []
    if not s_min > 0:
        notes.append(
            f"S_min = {s_min:.4g} <= 0: steps to target keep falling like 1/B over the swept "
            f"range (no large-batch plateau yet), so B_crit lies above the largest batch swept"
        )
    if not c > 0:
        notes.append(
            f"c = E_min/T = {c:.4g} <= 0: larger batches did not reduce steps to target, so "
            f"B_crit lies at or below the smallest batch swept"
        )
    if notes:
        b_crit = float("nan")
        note = "degenerate fit, B_crit undefined: " + "; ".join(notes)
    else:
        b_crit = c / s_min
        note = ""
    return CriticalFit(s_min=s_min, c=c, e_min=c * t, b_crit=b_crit, b_crit_transitions=b_crit * t, r2=r2,
                       n_points=int(b.size), n_dropped=n_dropped, unroll_length=t, weighting=weighting, note=note)


class BootstrapResult(NamedTuple):
    """``(low, high, point, success_fraction)``; ``b_crit`` values in **envs**.

    ``low``/``high``: percentile CI over the bootstrap fits that succeeded (NaN if none did).
    ``point``: the fit on the per-batch-size nanmedian of all seeds (NaN if it fails).
    ``success_fraction``: share of the ``n_boot`` resamples whose fit gave a finite B_crit.
    """

    low: float
    high: float
    point: float
    success_fraction: float


def _b_crit_or_nan(b, s, t, weighting) -> float:
    try:
        return fit_steps_to_target(b, s, t, weighting=weighting).b_crit
    except ValueError:
        return float("nan")


def bootstrap_b_crit(
    batch_sizes: Sequence[float],
    steps_per_seed,
    unroll_length: float,
    n_boot: int = 1000,
    ci: float = 0.9,
    rng=0,
    weighting: str = "relative",
) -> BootstrapResult:
    """Bootstrap confidence interval for ``B_crit`` (envs) from a multi-seed sweep.

    Args:
      batch_sizes: ``[n_b]`` num_envs of the sweep.
      steps_per_seed: ``[n_b, n_seeds]`` iterations to target; NaN/None = not reached.
      unroll_length: T.
      n_boot: number of bootstrap resamples.
      ci: central coverage of the interval (0.9 -> 5th and 95th percentiles).
      rng: seed or ``np.random.Generator``.
      weighting: passed to :func:`fit_steps_to_target`.

    Each resample draws ``n_seeds`` seeds with replacement, independently per batch size (seeds
    of different batch sizes are independent runs), takes the per-batch-size ``nanmedian``
    (a batch size whose drawn seeds all missed the target drops out), and fits
    :func:`fit_steps_to_target`.  Resamples whose fit raises or is degenerate count as failures;
    the interval is the percentile interval of the successful ones, so read it together with
    ``success_fraction`` (a low fraction means the interval is conditional on success and
    optimistic).
    """
    t, b, sp = _bootstrap_inputs(unroll_length, ci, n_boot, batch_sizes, steps_per_seed)
    if sp.ndim == 1:
        sp = sp[:, None]
    if sp.ndim != 2 or sp.shape[0] != b.size:
        raise ValueError(
            f"steps_per_seed must be [n_batch_sizes, n_seeds] = [{b.size}, n_seeds], got {sp.shape}"
        )
    gen = np.random.default_rng(rng)
    n_b, n_seeds = sp.shape
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices -> NaN, on purpose
        point = _b_crit_or_nan(b, np.nanmedian(sp, axis=1), t, weighting)
        idx = gen.integers(0, n_seeds, size=(int(n_boot), n_b, n_seeds))
        draws = sp[np.arange(n_b)[None, :, None], idx]  # [n_boot, n_b, n_seeds]
        medians = np.nanmedian(draws, axis=2)  # [n_boot, n_b]
    fits = np.array([_b_crit_or_nan(b, m, t, weighting) for m in medians])
    return _interval(fits, point, ci)


def _bootstrap_inputs(unroll_length, ci, n_boot, batch_sizes, steps_per_seed):
    """The checks both bootstraps share: ``(T, batch sizes [n_b], steps as a float array)``."""
    t = _check_unroll(unroll_length)
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    if int(n_boot) < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    return t, _float_array(batch_sizes, "batch_sizes").reshape(-1), _float_array(steps_per_seed, "steps_per_seed")


def _interval(fits: np.ndarray, point: float, ci: float) -> BootstrapResult:
    """The percentile interval of the finite resampled fits, with their share."""
    good = fits[np.isfinite(fits)]
    if good.size == 0:
        return BootstrapResult(float("nan"), float("nan"), float(point), 0.0)
    alpha = (1.0 - ci) / 2.0
    low, high = np.percentile(good, [100.0 * alpha, 100.0 * (1.0 - alpha)])
    return BootstrapResult(float(low), float(high), float(point), float(good.size / fits.size))


def tuned_medians(steps_per_seed) -> tuple[np.ndarray, np.ndarray]:
    """Per batch size, the best learning rate's median steps to target (McCandlish's definition:
    the step size tuned at each B).

    ``steps_per_seed``: ``[n_lr, n_b, n_seeds]``, inf = the seed did not reach, NaN = no such seed
    (or no such run).  Returns ``(medians [n_b], best [n_b])``: the smallest per-lr median at each
    B (inf when no lr's median reached, NaN when no lr was run) and the index of that lr (-1 then).
    Ties go to the smaller index (the grid's lrs ascend, so the smaller lr).
    """
    sp = _float_array(steps_per_seed, "steps_per_seed")
    if sp.ndim != 3:
        raise ValueError(f"steps_per_seed must be [n_lr, n_b, n_seeds], got shape {sp.shape}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(sp, axis=2)  # [n_lr, n_b]; NaN where the run is absent
    ranked = np.where(np.isnan(med), np.inf, med)
    best = np.argmin(ranked, axis=0)
    out = ranked[best, np.arange(med.shape[1])]
    ran = ~np.all(np.isnan(med), axis=0)
    reached = np.isfinite(out)
    return np.where(ran, out, np.nan), np.where(ran & reached, best, -1)


class TunedBootstrap(NamedTuple):
    """:func:`bootstrap_tuned_b_crit`: the B_crit interval (as :class:`BootstrapResult`) and, per
    batch size, how often each lr was the best one across the resamples (``[n_b, n_lr]``
    fractions; a row sums to the share of resamples in which some lr reached)."""

    b_crit: BootstrapResult
    best_lr_frequency: np.ndarray


def bootstrap_tuned_b_crit(
    batch_sizes: Sequence[float],
    steps_per_seed,
    unroll_length: float,
    n_boot: int = 1000,
    ci: float = 0.9,
    rng=0,
    weighting: str = "relative",
) -> TunedBootstrap:
    """Bootstrap of the lr-tuned ``B_crit`` from a B x lr grid.

    ``steps_per_seed``: ``[n_lr, n_b, n_seeds]`` (inf = not reached, NaN = no seed).  Each resample
    draws seeds with replacement independently in every (lr, B) cell, takes each cell's median,
    keeps at each B the best lr's median (:func:`tuned_medians`; the selection is inside the
    resample, so its optimism is part of the interval) and fits :func:`fit_steps_to_target`.
    The point estimate is the fit on the un-resampled tuned medians.
    """
    t, b, sp = _bootstrap_inputs(unroll_length, ci, n_boot, batch_sizes, steps_per_seed)
    if sp.ndim != 3 or sp.shape[1] != b.size:
        raise ValueError(f"steps_per_seed must be [n_lr, n_batch_sizes={b.size}, n_seeds], got {sp.shape}")
    n_lr, n_b, n_seeds = sp.shape
    gen = np.random.default_rng(rng)
    point = _b_crit_or_nan(b, tuned_medians(sp)[0], t, weighting)
    fits = np.full(int(n_boot), np.nan)
    counts = np.zeros((n_b, n_lr))
    for i in range(int(n_boot)):
        idx = gen.integers(0, n_seeds, size=(n_lr, n_b, n_seeds))
        draw = np.take_along_axis(sp, idx, axis=2)
        med, best = tuned_medians(draw)
        fits[i] = _b_crit_or_nan(b, med, t, weighting)
        ok = best >= 0
        counts[np.arange(n_b)[ok], best[ok]] += 1
    return TunedBootstrap(_interval(fits, point, ci), counts / int(n_boot))


# --------------------------------------------------------------------------- timing


class LinearTimeFit(NamedTuple):
    """``t(B) = a + k*B``: ``a`` seconds per iteration at B -> 0, ``k`` seconds per env."""

    a: float
    k: float
    r2: float
    n_points: int


def fit_linear_time(batch_sizes, times) -> LinearTimeFit:
    """Ordinary least squares of iteration time ``t(B) = a + k*B``.

    ``batch_sizes`` in envs, ``times`` in seconds (e.g. mean RT+UT per iteration); pairs with a
    non-finite time are dropped.  Returns ``(a, k, r2, n_points)``: ``a`` in seconds (fixed
    per-iteration overhead), ``k`` in seconds per env.  Raises ValueError with fewer than two
    distinct batch sizes.
    """
    b = _float_array(batch_sizes, "batch_sizes").reshape(-1)
    y = _float_array(times, "times").reshape(-1)
    if b.shape != y.shape:
        raise ValueError(f"batch_sizes and times differ in length ({b.size} vs {y.size})")
    keep = np.isfinite(b) & np.isfinite(y)
    b, y = b[keep], y[keep]
    if np.unique(b).size < 2:
        raise ValueError("fit_linear_time needs timings at >= 2 distinct batch sizes")
    design = np.stack([np.ones_like(b), b], axis=1)
    (a, k), *_ = np.linalg.lstsq(design, y, rcond=None)
    return LinearTimeFit(float(a), float(k), _r2(y, a + k * b), int(b.size))


def wallclock_optimum(b_crit: float, a: float, k: float) -> float:
    """Wall-clock-optimal batch size ``B* = sqrt(B_crit * a / k)``.

    Minimises ``S(B) * t(B) = (S_min + c/B)(a + k B)``.  ``B*`` comes out in the unit of
    ``b_crit`` provided ``k`` is per that unit (envs with the tclock conventions).  NaN unless
    all three inputs are finite and positive.
    """
    vals = [float(v) if v is not None else float("nan") for v in (b_crit, a, k)]
    if not all(math.isfinite(v) and v > 0 for v in vals):
        return float("nan")
    bc, a_, k_ = vals
    return math.sqrt(bc * a_ / k_)


# --------------------------------------------------------------------------- thresholds


def _sorted_finite(batch_sizes, values, name):
    b = np.asarray(batch_sizes).reshape(-1)
    v = _float_array(values, name).reshape(-1)
    if b.shape != v.shape:
        raise ValueError(f"batch_sizes and {name} differ in length ({b.size} vs {v.size})")
    order = np.argsort(b.astype(float), kind="stable")
    return b[order], v[order]


def _py(x):
    """NumPy scalar -> Python scalar (int stays int)."""
    return x.item() if hasattr(x, "item") else x


def gdc_cliff(batch_sizes, gdc_values, threshold: float = thresholds.GDC_LOW):
    """First batch size (ascending) whose GDC is below ``threshold``, or None.

    NaN GDC values are skipped.  The batch size is returned as given (same unit, Python scalar).
    """
    b, g = _sorted_finite(batch_sizes, gdc_values, "gdc_values")
    for bi, gi in zip(b, g):
        if np.isfinite(gi) and gi < threshold:
            return _py(bi)
    return None


def b_simple_to_envs(b_simple_transitions, unroll_length):
    """Convert ``b_simple`` from transitions to envs: ``b_simple / T``.

    Works on scalars and arrays (NaN passes through).  Each env contributes T transitions per
    rollout, so a rollout of ``B`` envs holds ``B*T`` transitions.
    """
    t = _check_unroll(unroll_length)
    out = np.asarray(b_simple_transitions, dtype=float) / t
    return float(out) if out.ndim == 0 else out


def rt_ut_crossings(batch_sizes, ratios, levels=thresholds.RT_UT_CROSSINGS) -> dict:
    """For each level, the first batch size (ascending) where ``rt_ut_ratio >= level``.

    Returns ``{level: batch_size or None}`` (None: the ratio never reaches that level in the
    sweep).  NaN ratios are skipped.
    """
    b, r = _sorted_finite(batch_sizes, ratios, "ratios")
    out = {}
    for level in levels:
        hit = None
        for bi, ri in zip(b, r):
            if np.isfinite(ri) and ri >= level:
                hit = _py(bi)
                break
        out[level] = hit
    return out


class TargetHit(NamedTuple):
    """``env_steps`` at the first point where the curve reaches the target (NaN if never) and
    its ``index`` into the curve (None if never)."""

    env_steps: float
    index: Optional[int]


def steps_to_target(env_steps, values, target: float, smooth_steps: float = 0.0) -> TargetHit:
    """First point of one seed's learning curve whose trailing mean reaches ``target`` (``>=``).

    ``env_steps`` (cumulative env steps per seed) and ``values`` (e.g. success rate or eval
    return; NaN = not logged) are same-length 1-D sequences in logging order; point ``i`` stands
    for the ``env_steps[i] - env_steps[i-1]`` env steps logged since the one before (point 0 for
    ``env_steps[0]``).  The window ending at point ``i`` is the fewest trailing points holding at
    least ``smooth_steps`` env steps (one point when ``smooth_steps=0``); it must be full, so
    points with ``env_steps[i] < smooth_steps`` never count.  NaN values inside a window are
    skipped; a window without a finite value does not count.  With a fixed ``B*T`` env steps per
    point the window is ``k = max(1, ceil(smooth_steps / (B*T)))`` points; under DRBS it follows
    the changing batch.

    ``smooth_steps=0`` gives the raw first crossing (no requirement to stay above; NaN never
    reaches).  Smoothing makes the detection late, never early, for a curve that stays at or
    above the target once there: by up to ``k-1`` points, ``(k-1)/2`` on a locally linear curve.
    Returns ``TargetHit(env_steps=NaN, index=None)`` when never reached.  Divide ``env_steps`` by
    ``B*T`` for iterations ``S`` (:func:`fit_steps_to_target`).  Raises ValueError on mismatched
    lengths, a negative or non-finite ``smooth_steps``, or (when smoothing) non-finite, negative
    or decreasing ``env_steps``.
    """
    x = _float_array(env_steps, "env_steps").reshape(-1)
    v = _float_array(values, "values").reshape(-1)
    if x.shape != v.shape:
        raise ValueError(f"env_steps and values differ in length ({x.size} vs {v.size})")
    if not (isinstance(smooth_steps, (int, float)) and math.isfinite(smooth_steps) and smooth_steps >= 0):
        raise ValueError(f"smooth_steps must be a finite number >= 0 (env steps), got {smooth_steps!r}")
    with np.errstate(invalid="ignore"):
        single = v >= target  # one-point windows: the value itself
    if smooth_steps > 0 and x.size:
        if not np.all(np.isfinite(x)) or x[0] < 0 or np.any(np.diff(x) < 0):
            raise ValueError("env_steps must be finite, >= 0 and non-decreasing to smooth over env steps")
        before = np.concatenate([[0.0], x[:-1]])  # env steps logged before each point
        # the window ending at i starts at the last point j with x[i] - before[j] >= smooth_steps
        start = np.searchsorted(before, x - smooth_steps, side="right") - 1
        finite = np.isfinite(v)
        csum = np.concatenate([[0.0], np.cumsum(np.where(finite, v, 0.0))])
        ccnt = np.concatenate([[0], np.cumsum(finite)])
        lo = np.maximum(start, 0)
        hi = np.arange(1, x.size + 1)
        wsum, wcnt = csum[hi] - csum[lo], ccnt[hi] - ccnt[lo]
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(wcnt > 0, wsum / np.maximum(wcnt, 1), np.nan)
            reached_at = np.where(start == hi - 1, single, mean >= target) & (start >= 0)
    else:
        reached_at = single
    reached = np.flatnonzero(reached_at)
    if reached.size == 0:
        return TargetHit(float("nan"), None)
    i = int(reached[0])
    return TargetHit(float(x[i]), i)
