"""The online step-size signal: is the learning rate too large for this batch, and by how much.

Measured on the iterations that run the half learning phase (``noise_split``): the half phase's
update ``D`` (from a random half of the envs) is judged on the *other* half, whose data are
independent of it (:func:`tclock.agents.actor_critic.split_update_noise`):

* ``step_gain_linear = -g . D``: the first-order gain (``g`` the held-out loss gradient at the
  behaviour parameters);
* ``step_gain_actual = L(theta) - L(theta + D)``: the gain on the held-out data.

Along the direction of ``D`` the loss is ``L(theta + a D) ≈ L - a g.D + a^2/2 D'HD``, so the best
multiple of this update is ``a* = |g.D| / D'HD`` and

    r = 1 / a* = 2 (1 - gain_actual / gain_linear)

says how many times larger the update is than the best scaling of itself: 1 at the best step,
2 where the held-out loss no longer improves.  For SGD on a quadratic, ``D = -eps (G + noise)``
and ``E[r] = eps / eps_opt(B/2)`` with McCandlish et al.'s (2018) ``eps_opt(B) = eps_max /
(1 + B_noise / B)`` at the half batch.  The run's own batch has ``B`` envs, so

    r_B = r * (1 + b/B) / (1 + 2 b/B)       (b: the noise scale in envs, ``b_crit_online_envs``)

is the ratio for the update the run makes (:func:`full_batch_ratio`; between r/2 and r).  Like
the noise scale, the gains are summed separately over the last ``noise_window`` estimates
before dividing (:class:`tclock.online_critical.OnlineCriticalBatch` with :data:`SOURCE`), since
one estimate's ``gain_linear`` can be near 0 or negative.

What to do (:func:`advice`): ``r_B > thresholds.STEP_TOO_LARGE`` means the lr is too large for
this batch: lower it by about ``r_B`` times, or, if the batch is what limits it (``eps/eps_max
= r_B/(1 + b/B) < 1``), raise B to about ``b / (eps_max/eps - 1)`` envs.  The threshold comes
from the same model: progress per step relative to the best step is ``r(2 - r)``, and a lr whose
smaller sibling needs <= 0.6x the env steps (the label of docs/metrics.md) has ``r(2 - r) <=
0.6``, i.e. ``r >= 1 + sqrt(0.4) ≈ 1.63``.  Adam, several epochs and PPO's clip make the update
non-linear in the lr, so this is a model, validated in experiments/lr_batch.py.
Plain Python and NumPy.
"""
from __future__ import annotations

import math

import numpy as np

from tclock import thresholds
from tclock.runlog import seed_median

__all__ = ["SOURCE", "STEP_KEY", "ratio_from_gains", "full_batch_ratio", "advice", "median_ratio",
           "learning_phase_end", "run_ratio"]

SOURCE = {"step": ("step_gain_actual", "step_gain_linear")}  # windowed like the noise scale
STEP_KEY = "step_ratio_online"  # r_B per seed, logged on measured iterations


def ratio_from_gains(actual_over_linear) -> float:
    """``r = 2 (1 - gain_actual / gain_linear)`` (NaN for a missing ratio)."""
    v = float("nan") if actual_over_linear is None else float(actual_over_linear)
    return 2.0 * (1.0 - v) if math.isfinite(v) else float("nan")


def full_batch_ratio(r_half: float, b_noise_envs, num_envs: int) -> float:
    """``r_B = r (1 + b/B) / (1 + 2b/B)``; without a positive noise scale ``b``, ``r`` itself
    (the half-batch ratio, an upper bound: the full batch is less noisy)."""
    b = float("nan") if b_noise_envs is None else float(b_noise_envs)
    if not (math.isfinite(r_half) and num_envs > 0):
        return float("nan")
    if not (math.isfinite(b) and b > 0):
        return float(r_half)
    x = b / num_envs
    return float(r_half * (1 + x) / (1 + 2 * x))


def advice(r_full: float, b_noise_envs, num_envs: int) -> dict:
    """What the ratio says: ``too_large`` (``r_B > STEP_TOO_LARGE``), ``lower_lr_by`` (about
    ``r_B``: the factor that brings the update to its best scaling) and ``raise_batch_to``
    (envs at which this lr would be the best step, or None when even an infinite batch would
    not make it: ``eps >= eps_max``, or no noise scale)."""
    out = {"ratio": r_full, "too_large": bool(math.isfinite(r_full) and r_full > thresholds.STEP_TOO_LARGE),
           "lower_lr_by": float(r_full) if math.isfinite(r_full) else float("nan"), "raise_batch_to": None}
    b = float("nan") if b_noise_envs is None else float(b_noise_envs)
    if math.isfinite(r_full) and math.isfinite(b) and b > 0 and num_envs > 0:
        eps_over_max = r_full / (1 + b / num_envs)
        if 0 < eps_over_max < 1:
            out["raise_batch_to"] = float(b / (1 / eps_over_max - 1))
    return out


def median_ratio(values) -> float:
    """Median over seeds of per-seed ratios (None/NaN skipped; NaN when none is finite)."""
    m = seed_median(values)
    return float("nan") if m is None else m


def learning_phase_end(records, target) -> float:
    """The first iteration at which the seed-mean ``success_rate`` reached ``target`` (NaN when it
    never did, or no target/success is known): the end of the phase a step size is judged on."""
    from tclock.runlog import nanmean_rows, seed_matrix

    if not isinstance(target, (int, float)) or isinstance(target, bool) or not math.isfinite(target):
        return float("nan")
    its, m = seed_matrix(records, "success_rate")
    if not m.size:
        return float("nan")
    mean = nanmean_rows(m)
    hit = np.nonzero(np.isfinite(mean) & (mean >= target))[0]
    return float(its[hit[0]]) if hit.size else float("nan")


def run_ratio(records, until_iteration: float = float("nan")) -> tuple[float, int]:
    """``(r_B, n)``: the run's step ratio, the median over seeds of each seed's median logged
    ``step_ratio_online`` over the iterations up to ``until_iteration`` (all when NaN, or when
    nothing was logged before it), and the number of iterations behind it."""
    from tclock.runlog import seed_matrix

    its, m = seed_matrix(records, STEP_KEY)
    if not m.size:
        return float("nan"), 0
    if math.isfinite(until_iteration) and (its <= until_iteration).any():
        m = m[its <= until_iteration]
    per_seed = [float(np.nanmedian(m[:, j])) for j in range(m.shape[1]) if np.isfinite(m[:, j]).any()]
    n = int(np.isfinite(m).any(axis=1).sum())
    return (float(np.median(per_seed)) if per_seed else float("nan")), n
