"""The doctor's calibrated verdicts: is the rollout batch above the critical batch, and (in the
asynchronous pipeline) is the learner training on stale data.

``critical_batch``    B (the latest ``num_envs``) against the run's online critical batch
                      ``b_crit_online_envs`` (:mod:`tclock.online_critical`; the seed median of its
                      latest value; recomputed from ``noise_env_trace`` / ``noise_env_grad_sq`` when
                      only those were logged).  B > 2 [BATCH_ABOVE] x it -> two-clocks ("above the
                      critical batch"); 1 [BATCH_NEAR]-2 x -> watch; below -> healthy.  The cost is
                      stated with the S-E relation of McCandlish et al. (docs/design.md §2):
                      ``E/E_min = 1 + B/B_crit`` env steps relative to the minimum, against
                      ``1 + 1 = 2`` at B = B_crit; the advice is B ≈ B_crit or, when a latency
                      profile gives ``t(B) = a + k·B``, the wall-clock optimum ``B* = sqrt(B_crit·a/k)``.
                      Never logged -> not-checkable.  Validated against sweeps:
                      ``experiments/doctor_agreement.py`` (RESULTS.md).
``staleness``         Asynchronous runs only (``policy_lag`` logged): median policy lag over the last
                      20 [RECENT] updates > 2 [LAG_STALE] updates, or median ``kl_behavior`` > 0.05
                      [KL_STALE] -> risk; both -> two-clocks; else healthy.  Synchronous runs -> info
                      (the policy lag is 0 by construction).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tclock import online_critical
from tclock.doctor_rules import Row, key_present, num, seed_series
from tclock.runlog import seed_matrix
from tclock.thresholds import BATCH_ABOVE, BATCH_NEAR, KL_STALE, LAG_STALE, RECENT

BATCH_THRESHOLD = (f"B > {BATCH_ABOVE:g}x online B_crit two-clocks; {BATCH_NEAR:g}-{BATCH_ABOVE:g}x watch; "
                   "below healthy")
STALE_THRESHOLD = f"async: median lag > {LAG_STALE:g} or KL > {KL_STALE:g} risk; both two-clocks"


def online_critical_batch(records: Sequence[dict], window: int = 20) -> tuple[float | None, int]:
    """``(B_crit online in envs, estimates behind it)``: the seed median of the latest logged
    ``b_crit_online_envs``, else the windowed ratio of the last ``window`` per-env estimates."""
    _, m = seed_matrix(records, online_critical.ONLINE_KEY)
    rows = [r for r in m if np.isfinite(r).any()]
    _, trace = seed_matrix(records, online_critical.TRACE_KEY)
    n = int(np.isfinite(trace).any(axis=1).sum()) if trace.size else 0
    if rows:
        return float(np.nanmedian(rows[-1])), min(n, window) or 1
    if not n:
        return None, 0
    _, grad_sq = seed_matrix(records, online_critical.GRAD_KEY)
    keep = np.isfinite(trace).any(axis=1)
    per_seed = online_critical.windowed_ratio(trace[keep][-window:], grad_sq[keep][-window:])
    finite = [v for v in per_seed if v is not None]
    return (float(np.median(finite)) if finite else None), min(n, window)


def _b_star(b_crit: float, time_fit: dict | None) -> float | None:
    if not time_fit or not (time_fit.get("a", 0) > 0 and time_fit.get("k", 0) > 0):
        return None
    return float(np.sqrt(b_crit * time_fit["a"] / time_fit["k"]))


def critical_batch_row(records: Sequence[dict], config: dict, num_envs, time_fit: dict | None = None) -> Row:
    """The calibrated batch verdict (see the module docstring); ``time_fit``: ``{a, k}`` of a
    latency profile's ``t(B) = a + k·B``, when one is known."""
    window = int(config.get("noise_window") or 20)
    b_crit, n = online_critical_batch(records, window)
    if n == 0:
        return Row("critical_batch", "no per-env noise estimate logged (gdc_every >= 1 and noise_groups >= 2 "
                   "log it)", BATCH_THRESHOLD, "not-checkable")
    if b_crit is None or not b_crit > 0:
        return Row("critical_batch", f"per-env noise logged {n}x but |G|^2 not yet detectable (the gradient "
                   "signal is below its noise)", BATCH_THRESHOLD, "not-checkable", data={"estimates": n})
    _, ne = seed_series(records, "num_envs")
    ne = ne[np.isfinite(ne)]
    B = float(ne[-1]) if ne.size else (float(num_envs) if isinstance(num_envs, (int, float)) else None)
    if B is None:
        return Row("critical_batch", f"online B_crit {num(b_crit)} envs but num_envs unknown", BATCH_THRESHOLD,
                   "not-checkable", data={"b_crit_online_envs": b_crit})
    ratio = B / b_crit
    cost = 1.0 + ratio  # E/E_min at this B
    data = {"b_crit_online_envs": b_crit, "num_envs": B, "ratio": ratio, "env_steps_vs_min": cost,
            "estimates": n}
    evidence = (f"B = {num(B)} envs vs online B_crit ≈ {num(b_crit)} envs ({num(ratio)}x; last {n} estimates); "
                f"env steps to a target ≈ {num(cost)}x the minimum (E/E_min = 1 + B/B_crit)")
    if ratio > BATCH_ABOVE:
        b_star = _b_star(b_crit, time_fit)
        target = f"B* ≈ {num(b_star)} envs (wall-clock optimum)" if b_star else f"B ≈ {num(b_crit)} envs"
        data["suggested_num_envs"] = b_star or b_crit
        return Row("critical_batch", evidence + f" — above the critical batch: try {target} "
                   f"(≈ {num(cost / 2.0)}x fewer env steps)", BATCH_THRESHOLD, "two-clocks", data=data)
    verdict = "watch" if ratio > BATCH_NEAR else "healthy"
    return Row("critical_batch", evidence, BATCH_THRESHOLD, verdict, data=data)


def staleness_row(records: Sequence[dict]) -> Row:
    """Asynchronous runs: policy lag and behaviour-vs-learner KL over the recent window."""
    if not key_present(records, "policy_lag"):
        return Row("staleness", "synchronous run: policy lag 0 by construction", STALE_THRESHOLD, "info")
    _, lag = seed_series(records[-RECENT:], "policy_lag")
    _, kl = seed_series(records[-RECENT:], "kl_behavior")
    lag, kl = lag[np.isfinite(lag)], kl[np.isfinite(kl)]
    if not lag.size:
        return Row("staleness", "policy_lag logged but only ever null", STALE_THRESHOLD, "not-checkable")
    lag_med = float(np.median(lag))
    kl_med = float(np.median(kl)) if kl.size else None
    stale_lag, stale_kl = lag_med > LAG_STALE, kl_med is not None and kl_med > KL_STALE
    verdict = "two-clocks" if stale_lag and stale_kl else "risk" if stale_lag or stale_kl else "healthy"
    return Row("staleness", f"median policy lag {num(lag_med)} updates, KL(behaviour‖learner) "
               f"{num(kl_med)} over the last {lag.size} updates", STALE_THRESHOLD, verdict,
               data={"policy_lag": lag_med, "kl_behavior": kl_med})
