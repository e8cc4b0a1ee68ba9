"""The doctor's calibrated verdicts: is the rollout batch above the critical batch, and (in the
asynchronous pipeline) is the learner training on stale data.

``critical_batch``    B (the latest ``num_envs``) against a critical batch in envs.  The verdict
                      rests on a **measured** B_crit: the sweep's fit in the parent directory's
                      ``summary.json`` (the run is one batch size of a sweep, or the user put it
                      there), when the sweep marks it trusted (``b_crit_trusted``: R² >= 0.8, CI
                      within 10x from >= 90% of the resamples, >= 3 batch sizes reached).  B > 2 [BATCH_ABOVE] x B_crit -> two-clocks ("above the critical
                      batch"); 1 [BATCH_NEAR]-2 x -> watch; below -> healthy.  The cost is stated
                      with the S-E relation of McCandlish et al. (docs/design.md §2):
                      ``E/E_min = 1 + B/B_crit`` env steps relative to the minimum; the advice is
                      B ≈ B_crit or, when ``t(B) = a + k·B`` is known (the sweep's time fit or a
                      latency profile), the wall-clock optimum ``B* = sqrt(B_crit·a/k)``.
                      Without a sweep, the run's online estimate ``b_crit_online_envs``
                      (:mod:`tclock.online_critical`) is reported with the same arithmetic but as
                      ``info`` (``ONLINE_VALIDATED`` below says why: alone, it misses about a
                      quarter of the runs above the lr-tuned B_crit and one of 70 below).
                      Neither known -> not-checkable.
``step_size``         Is the lr too large for this batch: the run's step ratio ``r_B``
                      (:mod:`tclock.step_size`: the half learning phase's update judged on the
                      other half of the envs; 1 = the best multiple of the update, 2 = no held-out
                      gain), median over seeds of the median over the learning phase (the
                      iterations before the seed-mean success first reached ``target_success``;
                      the whole run if it never did).  r_B > 1.63 [STEP_TOO_LARGE] -> risk, "lr too
                      large": lower the lr by about r_B x, or raise B to the size at which this lr
                      is the best step when the batch is what limits it; else healthy.  Not logged
                      (``noise_split`` off) -> not-checkable.  Validated on B x lr grids
                      (``STEP_VERDICT_VALIDATED``; a False there makes it info, without advice).
``staleness``         Asynchronous runs only (``policy_lag`` logged): median policy lag over the last
                      20 [RECENT] updates > 2 [LAG_STALE] updates, or median ``kl_behavior`` > 0.05
                      [KL_STALE] -> risk; both -> two-clocks; else healthy.  Synchronous runs -> info
                      (the policy lag is 0 by construction).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tclock import online_critical, step_size
from tclock.doctor_rules import Row, key_present, num, seed_series
from tclock.runlog import seed_matrix
from tclock.thresholds import BATCH_ABOVE, BATCH_NEAR, KL_STALE, LAG_STALE, RECENT, STEP_TOO_LARGE

BATCH_THRESHOLD = (f"B > {BATCH_ABOVE:g}x the sweep's B_crit two-clocks; {BATCH_NEAR:g}-{BATCH_ABOVE:g}x watch; "
                   "below healthy (online estimate: info)")
# Online estimates the batch verdict may rest on without a sweep, by source
# (tclock.online_critical.SOURCES).  experiments/calibration.py (RESULTS.md; B x lr grids of
# experiments/lr_batch.py on seven tasks; trusted tuned fits on six: pointmass_reach (3 seeds), its
# half- and twice-radius variants, its dense-reward variant, a reach-and-hold Brax reacher and the
# same reacher on Brax's dense reward (those five pooled from two base seeds, 6 seeds); a
# first-touch reacher grid gave no trusted fit and no labels):
# the learning phase's noise per env ("update", two disjoint halves of the envs without the inherited
# momentum, logged with --noise-split), judged without the sweep, left 69 of 70 runs below B_crit/2
# alone (99%) and classed the best-lr run right at 11 of 12 B above and 11 of 11 below, but over every
# lr put only 67 of 91 runs above 2x the lr-tuned B_crit in "above" (74%): the misses are runs still
# near their initial policy at the end of the budget (260-4500 envs there), lr 1e-1 runs, and runs
# at 2-3x B_crit that it calls "near".  Its best-lr median is 0.69x, 0.39x, 1.13x, 0.49x, 0.74x and
# 0.51x of the tuned B_crit.  The target is >= 90% on both classes over every lr, so no source is a
# verdict yet; the per-env gradient noise sits 5-58x below.  Nor does another flag threshold make it
# one: chosen on the other tasks from 0.5-3x and scored on the held-out task, it agrees on 79 of 91
# above and 62 of 70 below (the half-radius task, read 0.39x, fails below): the estimate's bias
# differs between tasks.
ONLINE_VALIDATED: tuple = ()
ONLINE_VALIDATION = ("on B x lr grids of six tasks with a trusted fit it classed the best-lr run right at 11 of 12 "
                     "B above and 11 of 11 below, RESULTS.md")
ONLINE_NOT_VALIDATED = ("over every lr alone it put 67 of 91 runs above the lr-tuned B_crit in 'above' and 69 of 70 "
                        "below it in 'not above', RESULTS.md")
# Whether the step-size rule may give a verdict.  Measured in experiments/lr_batch.py (B x lr grids
# on pointmass_reach and its half- and twice-radius variants, 3 seeds; RESULTS.md): r_B > 1.63
# flagged 10 of 11 runs a smaller lr beat with <= 0.6x the env steps, and 95 of 103 other runs not.
STEP_VERDICT_VALIDATED = True
# The verdict against a trusted sweep, scored in experiments/calibration.py with another base seed's
# grid of the same task as labels (four pointmass tasks, both ways round, every lr; RESULTS.md):
# "batch above" on 133 of 154 runs above 2x B_crit and on 0 of 70 below B_crit/2; 15 of the 21 misses
# on the half-radius task, whose two trusted grids read 481 and 127 envs.
SWEEP_VALIDATION = ("against another base seed's sweep as labels it flagged 133 of 154 runs above 2x B_crit and "
                    "0 of 70 below B_crit/2, RESULTS.md")
STEP_NOT_VALIDATED = ("not validated as a verdict here, so no lr advice from it")
STEP_THRESHOLD = f"r_B > {STEP_TOO_LARGE:.2f} (update > its best multiple by that factor) risk: lr too large"
STALE_THRESHOLD = f"async: median lag > {LAG_STALE:g} or KL > {KL_STALE:g} risk; both two-clocks"


def online_source(records: Sequence[dict]) -> str | None:
    """Which estimate the run's ``b_crit_online_envs`` comes from (``update`` or ``gradient``)."""
    return online_critical.source_of(set().union(*(r.keys() for r in records)) if records else set())


def online_critical_batch(records: Sequence[dict], window: int = 20) -> tuple[float | None, int]:
    """``(B_crit online in envs, estimates behind it)``: the seed median of the latest logged
    ``b_crit_online_envs``, else the windowed ratio of the last ``window`` per-env estimates."""
    _, m = seed_matrix(records, online_critical.ONLINE_KEY)
    rows = [r for r in m if np.isfinite(r).any()]
    source = online_source(records)
    if source is None:
        return None, 0
    trace_key, signal_key = online_critical.SOURCES[source]
    _, trace = seed_matrix(records, trace_key)
    n = int(np.isfinite(trace).any(axis=1).sum()) if trace.size else 0
    if rows:
        return float(np.nanmedian(rows[-1])), min(n, window) or 1
    if not n:
        return None, 0
    _, grad_sq = seed_matrix(records, signal_key)
    keep = np.isfinite(trace).any(axis=1)
    per_seed = online_critical.windowed_ratio(trace[keep][-window:], grad_sq[keep][-window:])
    finite = [v for v in per_seed if v is not None]
    return (float(np.median(finite)) if finite else None), min(n, window)


def _b_star(b_crit: float, time_fit: dict | None) -> float | None:
    if not time_fit or not (time_fit.get("a", 0) > 0 and time_fit.get("k", 0) > 0):
        return None
    return float(np.sqrt(b_crit * time_fit["a"] / time_fit["k"]))


def _measured(sweep: dict | None) -> tuple[float | None, str]:
    """The sweep's B_crit in envs and its CI text, when the summary holds a finite one (a sweep of
    SAC's gradient batch measures transitions per gradient step, not envs: not used)."""
    if not sweep or sweep.get("b_crit_trusted") is False:  # an untrustworthy fit is not a measurement
        return None, ""
    if sweep.get("sweep_axis", "num_envs") != "num_envs":
        return None, ""
    b = sweep.get("b_crit")
    if not isinstance(b, (int, float)) or isinstance(b, bool) or not np.isfinite(b) or b <= 0:
        return None, ""
    ci = sweep.get("b_crit_ci")
    return float(b), (f", 90% CI {num(ci[0])}–{num(ci[1])}" if ci and None not in ci else "")


def critical_batch_row(records: Sequence[dict], config: dict, num_envs, time_fit: dict | None = None,
                       sweep: dict | None = None) -> Row:
    """The batch verdict (see the module docstring).  ``sweep``: the parent sweep's summary
    (``b_crit``, ``b_crit_ci``); ``time_fit``: ``{a, k}`` of ``t(B) = a + k·B`` when known."""
    window = int(config.get("noise_window") or 20)
    online, n = online_critical_batch(records, window)
    online = online if online is not None and online > 0 else None
    measured, ci_txt = _measured(sweep)
    _, ne = seed_series(records, "num_envs")
    ne = ne[np.isfinite(ne)]
    B = float(ne[-1]) if ne.size else (float(num_envs) if isinstance(num_envs, (int, float)) else None)
    data = {"b_crit_online_envs": online, "online_estimates": n, "b_crit_sweep_envs": measured}
    if measured is None and online is None:
        why = ("no sweep summary.json in the parent and no online estimate logged (gdc_every >= 1 logs it)" if not n
               else f"no sweep summary.json in the parent; online estimate logged {n}x but its signal is not "
                    "yet detectable")
        return Row("critical_batch", why, BATCH_THRESHOLD, "not-checkable", data=data)
    if B is None:
        return Row("critical_batch", "num_envs unknown", BATCH_THRESHOLD, "not-checkable", data=data)
    b_crit = measured if measured is not None else online
    ratio, cost = B / b_crit, 1.0 + B / b_crit  # cost: E/E_min at this B
    data.update(num_envs=B, ratio=ratio, env_steps_vs_min=cost)
    source = f"sweep B_crit ≈ {num(measured)} envs{ci_txt}" if measured is not None else \
        f"online B_crit ≈ {num(online)} envs (last {min(n, window)} estimates)"
    evidence = (f"B = {num(B)} envs vs {source} ({num(ratio)}x); env steps to a target ≈ {num(cost)}x the "
                f"minimum (E/E_min = 1 + B/B_crit)")
    if measured is not None and online is not None:
        evidence += f"; online estimate {num(online)} envs"
    verdict = "two-clocks" if ratio > BATCH_ABOVE else "watch" if ratio > BATCH_NEAR else "healthy"
    data["class"] = {"two-clocks": "above", "watch": "near", "healthy": "below"}[verdict]
    validated = measured is not None or online_source(records) in ONLINE_VALIDATED
    data["online_source"] = online_source(records)
    if verdict == "two-clocks" and validated:  # advice only where the verdict is validated
        b_star = _b_star(b_crit, time_fit)
        target = f"B* ≈ {num(b_star)} envs (wall-clock optimum)" if b_star else f"B ≈ {num(b_crit)} envs"
        data["suggested_num_envs"] = b_star or b_crit
        evidence += f" — above the critical batch: try {target} (≈ {num(cost / 2.0)}x fewer env steps)"
        if measured is not None:
            evidence += f" (the sweep's verdict: {SWEEP_VALIDATION})"
    if measured is None and not validated:
        return Row("critical_batch", evidence + f" — online estimate from the {data['online_source']} noise, not "
                   f"validated as a verdict ({ONLINE_NOT_VALIDATED}); run `tclock sweep --lrs ...` to judge the "
                   "batch", BATCH_THRESHOLD, "info", data=data)
    if measured is None:
        evidence += f" (online estimate from the learning phase's noise: {ONLINE_VALIDATION})"
    return Row("critical_batch", evidence, BATCH_THRESHOLD, verdict, data=data)


def step_size_row(records: Sequence[dict], config: dict, num_envs) -> Row:
    """The step-size verdict (see the module docstring)."""
    end = step_size.learning_phase_end(records, config.get("target_success"))
    r, n = step_size.run_ratio(records, end)
    if not n or not np.isfinite(r):
        why = ("not measured: the step ratio needs the half learning phase (--noise-split, on in sweeps)"
               if not key_present(records, step_size.STEP_KEY) else "step_ratio_online logged but never finite")
        return Row("step_size", why, STEP_THRESHOLD, "not-checkable")
    _, ne = seed_series(records, "num_envs")
    ne = ne[np.isfinite(ne)]
    B = float(ne[-1]) if ne.size else float(num_envs or 0)
    online, _ = online_critical_batch(records, int(config.get("noise_window") or 20))
    adv = step_size.advice(r, online, int(B))
    span = (f"the learning phase (iterations ≤ {num(end)}, before success first reached the target)"
            if np.isfinite(end) else "the whole run")
    lr = config.get("lr")
    evidence = f"step ratio r_B = {num(r)} over {span}, {n} estimates"
    data = {"ratio": r, "estimates": n, "phase_end": end if np.isfinite(end) else None, **adv,
            "class": "lr too large" if adv["too_large"] else "not"}
    if not adv["too_large"]:
        return Row("step_size", evidence + " — the update is within its best scaling range", STEP_THRESHOLD,
                   "healthy" if STEP_VERDICT_VALIDATED else "info", data=data)
    if not STEP_VERDICT_VALIDATED:
        return Row("step_size", evidence + f" — above {STEP_TOO_LARGE:.2f}, which the rule would call lr too large; "
                   f"{STEP_NOT_VALIDATED}", STEP_THRESHOLD, "info", data={**data, "writeup_verdict": "risk"})
    lower = f"lower the lr by about {num(r)}x" + (f" (to ≈ {num(float(lr) / r)})" if isinstance(lr, (int, float)) else "")
    raise_b = adv["raise_batch_to"]
    evidence += (f" — lr too large for B = {num(B)} envs: {lower}"
                 + (f", or raise B to ≈ {num(raise_b)} envs" if raise_b else " (a larger batch alone would not fix it)"))
    return Row("step_size", evidence, STEP_THRESHOLD, "risk", data=data)


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
