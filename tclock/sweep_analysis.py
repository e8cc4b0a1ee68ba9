"""Analysis of a batch-size sweep: steps to target per B, the critical batch size, the wall-clock
optimum, and the diagnostics beside them, as one JSON-friendly dict (:func:`summarize`).  Reads
run directories only (through :mod:`tclock.runlog`); never imports JAX, the loop, an agent or
matplotlib, and formats no text (that is :mod:`tclock.sweep_render`).

(About 520 lines, ~100 of them the definitions below, kept beside the code that implements
them: the summary is one pipeline from run directories to the dict, read top to bottom.)

A sweep directory holds one run directory per batch size, named ``B*`` (``B0032``, ``B0064``,
...), each with ``config.yaml`` (``num_envs``, ``unroll_length``, ``seeds``, ``target_success``),
``metrics.jsonl`` and ``status.json``.

Units (docs/design.md §2), used in every key below:

* ``B``    = ``num_envs``, in **envs**.
* ``T``    = ``unroll_length``; one rollout is ``B*T`` transitions.
* ``S``    = **iterations** (updates) to reach the target.
* ``E``    = ``S*B*T``, **env steps per seed** to reach the target.
* wall     = ``wall_s`` at that iteration, **seconds** of loop time (compilation excluded).
* ``b_simple`` is logged in **transitions**; ``/T`` gives **envs** (:func:`tclock.critical.b_simple_to_envs`),
  the unit of ``B_crit``.

Along SAC's gradient batch (``sweep.yaml``'s ``spec.axis: sac_batch_size``; :data:`AXES`) ``B`` is
``sac_batch_size`` in **transitions**, ``S`` the **gradient steps** to target (the running sum of
the logged ``grad_steps``), ``E = S*B`` the **replay samples** drawn, and ``B_crit`` comes out in
transitions; num_envs, T and so the smoothing window stay fixed across the runs.

Steps to target (per run, per seed)
-----------------------------------
:func:`tclock.critical.steps_to_target` on each logged row, a row standing for one iteration of
``B*T`` env steps: the first iteration at which the trailing mean of ``metric`` over the last
``k`` iterations reaches ``target``, with ``k = max(1, ceil(smooth_steps / (B*T)))``
(:func:`smoothing_window`): every batch size is smoothed over about the same number of env
steps (``smooth_steps``), not over the same number of iterations.  The window must be full
(iterations ``1..k-1`` cannot count) and nulls inside it are skipped.  **Bias:** for a curve that
stays at or above the target once it gets there, the detected iteration lies between the first
raw crossing and ``k-1`` iterations after it, i.e. it is *late* by up to ``k-1`` iterations (up
to about ``smooth_steps`` env steps) and never early; for a curve that is locally linear around
the crossing the lag is ``(k-1)/2`` iterations (the trailing mean of a line is its value at the
window's centre).  Because ``k`` is larger at small ``B``, the lag in iterations is larger there,
which inflates ``S`` at small ``B`` and so ``c = E_min/T`` and ``B_crit`` slightly; pass
``smooth_steps=0`` to switch smoothing off (``k = 1``, the raw first crossing, sensitive to noise).

Per batch size, across seeds: a seed that never reaches the target counts as infinitely late,
so the **median** of ``S`` (and ``E``, wall) is finite only when more than half of the seeds
reached; ``q25``/``q75`` follow the same rule, ``min``/``max`` are over the seeds that reached.
The same convention (``inf`` = not reached) is passed to the bootstrap, so the point fit and the
resamples agree.  Not reached is NaN in Python numbers and ``null`` in JSON.

The fit
-------
:func:`tclock.critical.fit_steps_to_target` on the per-B median ``S`` (B where it is finite),
``S(B) = S_min + c/B``, ``B_crit = c/S_min`` envs (``*T`` transitions), with a percentile CI from
:func:`tclock.critical.bootstrap_b_crit` (seeds resampled per B).  With fewer than 2 batch sizes
whose median reached the target, the fit is ``null`` and ``fit_note`` says why.  Beside it: the
GDC cliff (first B whose mean GDC < :data:`tclock.thresholds.GDC_LOW`), the online ``b_simple``
(median over B, in envs), and the wall-clock optimum ``B* = sqrt(B_crit*a/k)`` from a linear fit
``t(B) = a + k*B`` of the mean iteration time (``rt_s + learn_s``), next to the measured argmin
of the median wall seconds to target (over B where that median is finite).
"""
from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from tclock import critical, online_critical, runlog, sweep_lr, thresholds
from tclock.runlog import RunFormatError, nanmean_rows, seed_matrix
from tclock.sweep_axes import sweep_axis, units

__all__ = ["SMOOTHING", "as_float", "smoothing_window", "discover_runs", "summarize_run", "analyse_runs", "fit_trust", "first_window_hits", "summarize"]

SMOOTHING = ("trailing mean over k = max(1, ceil(smooth_steps/(B*T))) iterations (full window); "
             "detection is late by up to k-1 iterations, never early, for curves that stay above "
             "the target once they reach it")


# --------------------------------------------------------------------------- small helpers
def as_float(x) -> float:
    """Python float; None/inf/non-numeric -> NaN."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def _finite_mean(a) -> float:
    a = np.asarray(a, dtype=float)
    return float(a[np.isfinite(a)].mean()) if np.isfinite(a).any() else math.nan


def _finite_median(a) -> float:
    a = np.asarray(a, dtype=float)
    return float(np.median(a[np.isfinite(a)])) if np.isfinite(a).any() else math.nan


def smoothing_window(num_envs: int, unroll_length: int, smooth_steps: float) -> int:
    """``k = max(1, ceil(smooth_steps / (B*T)))`` iterations (``smooth_steps`` in env steps)."""
    if not (isinstance(smooth_steps, (int, float)) and math.isfinite(smooth_steps) and smooth_steps >= 0):
        raise ValueError(f"smooth_steps must be a finite number >= 0 (env steps), got {smooth_steps!r}")
    per_iter = float(num_envs) * float(unroll_length)
    if not per_iter > 0:
        raise ValueError(f"num_envs*unroll_length must be > 0, got {num_envs}*{unroll_length}")
    return max(1, math.ceil(smooth_steps / per_iter))


def _quantile_inf(x: np.ndarray, q: float) -> float:
    """Linear-interpolation quantile of ``x`` that may hold +inf (as ``np.median`` treats it)."""
    xs = np.sort(x)
    pos = q * (xs.size - 1)
    lo, hi = int(math.floor(pos)), int(math.ceil(pos))
    t = pos - lo
    if t == 0.0 or xs[lo] == xs[hi]:
        return float(xs[lo])
    if not np.isfinite(xs[hi]):
        return math.inf
    return float(xs[lo] + (xs[hi] - xs[lo]) * t)


def _stats(per_seed: np.ndarray) -> dict:
    """median/q25/q75 counting not-reached as +inf (NaN when not finite); min/max over reached."""
    x = np.asarray(per_seed, dtype=float)
    with_inf = np.where(np.isfinite(x), x, np.inf)
    reached = x[np.isfinite(x)]
    q25, med, q75 = ((_quantile_inf(with_inf, q) for q in (0.25, 0.5, 0.75)) if x.size
                     else (math.nan,) * 3)
    return {"median": as_float(med), "q25": as_float(q25), "q75": as_float(q75),
            "min": float(reached.min()) if reached.size else math.nan,
            "max": float(reached.max()) if reached.size else math.nan,
            "per_seed": [as_float(v) for v in x]}


def _seed_columns(m: np.ndarray, n_rows: int, n_seeds: int) -> np.ndarray:
    """``[n_rows, n_seeds]`` from a :func:`~tclock.runlog.seed_matrix` (``keep_missing``): a scalar
    metric broadcast to every seed, a per-seed one padded or cut to ``n_seeds``, all NaN when the
    metric was never logged."""
    if not m.shape[1]:
        return np.full((n_rows, n_seeds), np.nan)
    if m.shape[1] == 1 and n_seeds > 1:
        return np.repeat(m, n_seeds, axis=1)
    out = np.full((n_rows, n_seeds), np.nan)
    c = min(n_seeds, m.shape[1])
    out[:, :c] = m[:, :c]
    return out


def _final(m: np.ndarray) -> tuple[float, list]:
    """Median over seeds of each seed's mean over the last ``FINAL_FRACTION`` of the rows."""
    if m.size == 0 or m.shape[1] == 0:
        return math.nan, []
    tail = max(1, math.ceil(thresholds.FINAL_FRACTION * m.shape[0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        per = np.nanmean(m[-tail:], axis=0)
        med = float(np.nanmedian(per)) if np.isfinite(per).any() else math.nan
    return as_float(med), [as_float(v) for v in per]


# --------------------------------------------------------------------------- one run
def _seed_hits(mvals: np.ndarray, B: int, T: int, target: float, smooth_steps: float) -> np.ndarray:
    """Per seed, the row index at which the target is reached (-1 if never)."""
    n_rows, n_seeds = mvals.shape
    rows_env_steps = np.arange(1, n_rows + 1, dtype=float) * B * T  # a logged row = one iteration
    hits = np.full(n_seeds, -1)
    for j in range(n_seeds):
        hit = critical.steps_to_target(rows_env_steps, mvals[:, j], target, smooth_steps)
        if hit.index is not None:
            hits[j] = hit.index
    return hits


def _at_hits(values: np.ndarray, hits: np.ndarray) -> np.ndarray:
    """``values[hit, seed]`` per seed (``values``: ``[n_rows, n_seeds]``), NaN where never hit."""
    out = np.full(hits.size, np.nan)
    for j, h in enumerate(hits):
        if h >= 0:
            out[j] = values[h, j]
    return out


def _clocks_and_diagnostics(records: list[dict], T: int) -> dict:
    _, gdc = seed_matrix(records, "gdc")
    _, bs = seed_matrix(records, "b_simple")
    bs = np.where(bs > 0, bs, np.nan)  # null or non-positive: not a valid noise scale
    _, rtut = seed_matrix(records, "rt_ut_ratio")
    _, rt = seed_matrix(records, "rt_s", keep_missing=True)
    _, learn = seed_matrix(records, "learn_s", keep_missing=True)
    rt_row = nanmean_rows(rt) if rt.shape[1] else np.full(len(records), np.nan)
    learn_row = nanmean_rows(learn) if learn.shape[1] else np.full(len(records), np.nan)
    # Median, not mean: tr(Σ)/|G|² has a heavy right tail where the |G|² estimate nears 0.
    b_simple_t = float(np.nanmedian(bs)) if np.isfinite(bs).any() else math.nan
    return {"gdc_mean": _finite_mean(gdc), "gdc_n": int(np.isfinite(gdc).sum()),
            "b_crit_online_envs": online_critical.run_estimate(records),
            "b_simple_transitions": b_simple_t, "b_simple_envs": critical.b_simple_to_envs(b_simple_t, T),
            "rt_ut_ratio_mean": _finite_mean(rtut), "iteration_s_mean": _finite_mean(rt_row + learn_row),
            "rt_s_mean": _finite_mean(rt_row), "learn_s_mean": _finite_mean(learn_row)}


def _steps_at(axis: str, records: list[dict], iters: np.ndarray, n_seeds: int) -> np.ndarray:
    """``[n_rows, n_seeds]`` optimisation steps done by each logged row: the iteration, or for the
    gradient-batch axis the running sum of SAC's logged ``grad_steps``."""
    if axis == "num_envs":
        return np.repeat(iters[:, None], n_seeds, axis=1)
    g = _seed_columns(seed_matrix(records, "grad_steps", keep_missing=True)[1], len(records), n_seeds)
    return np.cumsum(np.nan_to_num(g), axis=0)


def summarize_run(name: str, records: list[dict], config: dict, state: str, target: float,
                  metric: str, smooth_steps: float, axis: str = "num_envs") -> tuple[dict, list[str]]:
    """One run directory's row of :func:`summarize` (``runs[i]``) and its notes."""
    B = int(config["num_envs"])
    batch = int(config[axis])
    T = int(config["unroll_length"])
    k = smoothing_window(B, T, smooth_steps)
    its, logged = seed_matrix(records, metric, keep_missing=True)
    n_seeds = logged.shape[1] if logged.shape[1] else int(config.get("seeds") or 1)
    notes = []
    if not logged.shape[1] and records:
        notes.append(f"{name}: {metric!r} never logged; target counted as not reached")
    mvals = _seed_columns(logged, len(records), n_seeds)
    iters = np.where(its >= 0, its, np.arange(1, len(records) + 1)).astype(float)
    wall = _seed_columns(seed_matrix(records, "wall_s", keep_missing=True)[1], len(records), n_seeds)
    hits = _seed_hits(mvals, B, T, target, smooth_steps)
    i_seed = _at_hits(np.repeat(iters[:, None], n_seeds, axis=1), hits)
    s_seed = _at_hits(_steps_at(axis, records, iters, n_seeds), hits)
    w_seed = _at_hits(wall, hits)
    per_step = B * T if axis == "num_envs" else batch  # transitions one optimisation step consumes
    final_metric, final_metric_seeds = _final(mvals)
    _, ret = seed_matrix(records, "episode_return", keep_missing=True)
    final_ret, final_ret_seeds = _final(ret)
    n_reached = int(np.isfinite(s_seed).sum())
    until = float(np.nanmedian(i_seed)) if np.isfinite(i_seed).any() else None
    online = {f"{src}_{span}": online_critical.run_estimate(records, src, until if span == "to_target" else None)
              for src in online_critical.SOURCES for span in ("run", "to_target")}
    return {
        "run": name, "batch": batch, "sweep_axis": axis, "transitions_per_b": T if axis == "num_envs" else 1,
        "num_envs": B, "unroll_length": T, "state": state, "complete": state == "finished",
        "lr": as_float(config.get("lr")), "lr_scaling": str(config.get("lr_scaling", "none")),
        "algo": str(config.get("algo", "ppo")), "replay_ratio": as_float(config.get("sac_replay_ratio"))
        if config.get("algo") == "sac" else None,
        "seeds": int(n_seeds),
        "iterations": int(np.nanmax(iters)) if len(records) else 0,
        "env_steps": float(np.nanmax(iters)) * B * T if len(records) else 0.0,
        "target": float(target), "smooth_k": int(k),
        "steps_to_target": _stats(s_seed), "iterations_to_target": _stats(i_seed),
        "env_steps_to_target": _stats(i_seed * B * T), "samples_to_target": _stats(s_seed * per_step),
        "wall_to_target": _stats(w_seed),
        "n_reached": n_reached, "reached_fraction": n_reached / n_seeds if n_seeds else math.nan,
        "final_metric": final_metric, "final_metric_per_seed": final_metric_seeds,
        "final_episode_return": final_ret, "final_episode_return_per_seed": final_ret_seeds,
        **_clocks_and_diagnostics(records, T), "online_estimates_envs": online,
    }, notes


# --------------------------------------------------------------------------- run directories
def discover_runs(sweep_dir: Path) -> list[Path]:
    """The run directories (``B*/`` with a config file) of a sweep directory, sorted by name."""
    if not sweep_dir.is_dir():
        raise RunFormatError(f"{sweep_dir} is not a directory: expected a tclock sweep directory")
    runs = sorted(p for p in sweep_dir.iterdir()
                  if p.is_dir() and p.name.startswith("B") and (p / runlog.CONFIG_FILE).exists())
    if not runs:
        raise RunFormatError(f"{sweep_dir} holds no run directories (B*/ with {runlog.CONFIG_FILE}): "
                             f"is it a tclock sweep directory?")
    return runs


def _entry(name: str, batch, state: str, reason: str) -> dict:
    return {"run": name, "batch": batch, "state": state, "reason": reason, "used": False}


def _read_run(run_dir: Path, target: float | None, metric: str, smooth_steps: float, include_incomplete: bool,
              incomplete: list[dict], notes: list[str], axis: str = "num_envs") -> dict | None:
    """One run's row, or None when it is not used; appends to ``incomplete`` and ``notes``."""
    name = run_dir.name
    try:
        config = runlog.read_config(run_dir)
        fields = dict.fromkeys(("num_envs", "unroll_length", axis))
        if not all(isinstance(config.get(f), int) and not isinstance(config.get(f), bool) and config[f] > 0
                   for f in fields):
            raise RunFormatError(f"{run_dir / runlog.CONFIG_FILE}: {' and '.join(fields)} must be positive "
                                 f"integers, got {', '.join(repr(config.get(f)) for f in fields)}")
        B = config[axis]
        status = runlog.read_status(run_dir)
        state = str(status.get("state", "missing")) if isinstance(status, dict) else "missing"
    except RunFormatError as e:
        incomplete.append(_entry(name, None, "unreadable", str(e)))
        return None
    finished = state == "finished"
    if not finished:
        why = f": {status['reason']}" if isinstance(status, dict) and status.get("reason") else ""
        incomplete.append({**_entry(name, B, state, f"status is {state!r}, not 'finished'{why}"),
                           "diverged": bool(status.get("diverged")) if isinstance(status, dict) else False})
    if not (finished or include_incomplete):
        return None
    try:
        records = runlog.read_metrics(run_dir, missing_ok=not finished)
    except RunFormatError as e:
        reason = f"metrics unreadable: {e}"
        if finished:
            incomplete.append(_entry(name, B, state, reason))
        else:
            incomplete[-1]["reason"] += f"; {reason}"
        return None
    run_target = target if target is not None else config.get("target_success")
    if not isinstance(run_target, (int, float)) or isinstance(run_target, bool) or not math.isfinite(run_target):
        raise ValueError(f"{run_dir / runlog.CONFIG_FILE} has no numeric target_success "
                         f"({run_target!r}); pass target=")
    row, run_notes = summarize_run(name, records, config, state, float(run_target), metric, smooth_steps, axis)
    notes.extend(run_notes)
    if not finished:
        incomplete[-1]["used"] = True
    return row


# --------------------------------------------------------------------------- across batch sizes
def _fit_b_crit(rows: list[dict], n_boot: int, ci: float, rng,
                tuned: critical.BootstrapResult | None = None) -> tuple[dict | None, str]:
    """The S(B) fit with its bootstrap CI (a dict, or None) and the fit note; ``tuned``: the
    interval of a B x lr grid (:func:`tclock.critical.bootstrap_tuned_b_crit`) used instead of
    resampling these rows alone."""
    Bs = np.array([r["batch"] for r in rows], dtype=float)
    med_s = np.array([r["steps_to_target"]["median"] for r in rows], dtype=float)
    t_values = sorted({r["transitions_per_b"] for r in rows})
    reached_b = [int(b) for b, s in zip(Bs, med_s) if np.isfinite(s)]
    if len(t_values) > 1:
        return None, (f"runs differ in unroll_length ({t_values}); iterations to target are not comparable "
                      f"across them, so S(B) is not fitted")
    if len(reached_b) < 2:
        where = f" (B={reached_b[0]})" if reached_b else ""
        return None, (f"fewer than 2 batch sizes reached the target (median over seeds): {len(reached_b)} of "
                      f"{len(rows)}{where}; S(B) = S_min + c/B needs at least 2, so B_crit is not fitted")
    T = t_values[0]
    cf = critical.fit_steps_to_target(Bs, med_s, T)
    fit = cf.to_dict()
    fit.update({"batch_sizes_used": reached_b,
                "median_steps_used": [float(s) for s in med_s if np.isfinite(s)]})
    # per-seed matrix: inf = seed did not reach, NaN = no such seed (ragged seed counts)
    n_seeds = max(len(r["steps_to_target"]["per_seed"]) for r in rows)
    sp = np.full((len(rows), n_seeds), np.nan)
    for i, r in enumerate(rows):
        ps = np.array(r["steps_to_target"]["per_seed"], dtype=float)
        sp[i, : ps.size] = np.where(np.isfinite(ps), ps, np.inf)
    boot = tuned if tuned is not None else critical.bootstrap_b_crit(Bs, sp, T, n_boot=n_boot, ci=ci, rng=rng)
    fit.update({"ci_low": boot.low, "ci_high": boot.high, "ci_level": ci,
                "bootstrap_success_fraction": boot.success_fraction, "n_boot": int(n_boot)})
    return fit, cf.note


def _time_fit(rows: list[dict], b_crit: float, notes: list[str]) -> tuple[dict | None, float]:
    """``t(B) = a + k*B`` over the timed batch sizes (a dict, or None) and ``B*`` (envs)."""
    Bs = np.array([r["batch"] for r in rows], dtype=float)
    it_s = np.array([r["iteration_s_mean"] for r in rows], dtype=float)
    ok = np.isfinite(it_s)
    if np.unique(Bs[ok]).size < 2:
        return None, math.nan
    tf = critical.fit_linear_time(Bs[ok], it_s[ok])
    if not (tf.a > 0 and tf.k > 0):
        notes.append(f"iteration time fit t(B) = {tf.a:.3g} + {tf.k:.3g}*B s has a non-positive term; "
                     f"B* = sqrt(B_crit*a/k) is undefined")
    return tf._asdict(), critical.wallclock_optimum(b_crit, tf.a, tf.k)


def fit_trust(fit: dict | None, rows: list[dict]) -> tuple[bool, list[str]]:
    """Whether the B_crit fit can be used as a measurement, and why not: R² below
    ``thresholds.FIT_MIN_R2``, a CI wider than ``FIT_MAX_CI_RATIO``x (or none), fewer than
    ``FIT_MIN_BOOT_SUCCESS`` of the bootstrap resamples with a finite B_crit (when the fit
    records it), fewer than ``FIT_MIN_BATCHES`` batch sizes reached, or no finite B_crit."""
    if fit is None or not math.isfinite(as_float(fit.get("b_crit"))):
        return False, ["no finite B_crit"]
    why = []
    if not as_float(fit.get("r2")) >= thresholds.FIT_MIN_R2:
        why.append(f"R² {as_float(fit.get('r2')):.2f} < {thresholds.FIT_MIN_R2}")
    lo, hi = as_float(fit.get("ci_low")), as_float(fit.get("ci_high"))
    if not (math.isfinite(lo) and math.isfinite(hi) and lo > 0):
        why.append("no bootstrap CI")
    elif hi / lo > thresholds.FIT_MAX_CI_RATIO:
        why.append(f"the CI spans {hi / lo:.0f}x (> {thresholds.FIT_MAX_CI_RATIO:g}x)")
    success = as_float(fit.get("bootstrap_success_fraction", 1.0))
    if not success >= thresholds.FIT_MIN_BOOT_SUCCESS:
        why.append(f"only {success:.0%} of bootstrap resamples gave a finite B_crit (< "
                   f"{thresholds.FIT_MIN_BOOT_SUCCESS:.0%}): the CI leaves out the rest, where B_crit fell outside "
                   "the swept range, so it is narrower than the data allow")
    reached = sum(1 for r in rows if math.isfinite(as_float(r["steps_to_target"]["median"])))
    if reached < thresholds.FIT_MIN_BATCHES:
        why.append(f"only {reached} batch sizes reached the target (< {thresholds.FIT_MIN_BATCHES})")
    first = first_window_hits(rows)
    if first:
        why.append(f"the target was reached as soon as the smoothing window filled at B={first} (S there is only an "
                   "upper bound): raise the target or lower smooth_steps")
    return not why, why


def first_window_hits(rows: list[dict]) -> list[int]:
    """B whose median seed reached the target at the first iteration the trailing window allows
    (``S = k``): the metric was already above the target when it could first be read, so S is
    censored there (an upper bound), not a measurement."""
    hits = []
    for r in rows:
        it = as_float((r.get("iterations_to_target") or r["steps_to_target"])["median"])
        if math.isfinite(it) and it <= r["smooth_k"]:
            hits.append(r["batch"])
    return hits


def analyse_runs(rows: list[dict], notes: list[str], n_boot: int = 1000, ci: float = 0.9, rng: Any = 0,
                 tuned: critical.BootstrapResult | None = None) -> dict:
    """The across-B part of :func:`summarize` (from ``runs`` to ``notes``) for rows sorted by B
    (one lr, or with ``tuned`` the best lr's row at each B of a grid)."""
    Bs = np.array([r["batch"] for r in rows], dtype=float)
    not_reached = [r["batch"] for r in rows if not np.isfinite(r["steps_to_target"]["median"])]
    fit, fit_note = _fit_b_crit(rows, n_boot, ci, rng, tuned)
    b_crit = fit["b_crit"] if fit else math.nan
    gdc = [r["gdc_mean"] for r in rows]
    cliff = critical.gdc_cliff(Bs.astype(int), gdc, thresholds.GDC_LOW) if rows else None
    time_fit, b_star = _time_fit(rows, b_crit, notes)
    wall = np.array([r["wall_to_target"]["median"] for r in rows], dtype=float)
    if np.isfinite(wall).any():
        i_best = int(np.nanargmin(np.where(np.isfinite(wall), wall, np.inf)))
        b_best, best_wall = int(Bs[i_best]), float(wall[i_best])
    else:
        b_best, best_wall = None, math.nan
    if any(r["smooth_k"] > 1 for r in rows):
        notes.append("steps to target use a trailing mean of k iterations (k per B in the table); "
                     "each S can be up to k-1 iterations late (about (k-1)/2 on a locally linear curve), "
                     "more at small B, which biases B_crit upwards; compare with smooth_steps=0")
    trusted, distrust = fit_trust(fit, rows)
    limited = sweep_lr.step_size_limited(rows) if tuned is None else None
    if limited is not None:
        distrust.append(f"E rises as B falls (B={limited['batch']}: {limited['rise']:.1f}x the E of "
                        f"B={limited['best_batch']}): the small-B points look step-size-limited")
        trusted = False
    return {
        "runs": rows, "not_reached": not_reached, "fit": fit, "fit_note": fit_note, "b_crit": b_crit,
        "b_crit_trusted": trusted, "b_crit_distrust": distrust, "step_size_limited": limited,
        "b_crit_transitions": fit["b_crit_transitions"] if fit else math.nan,
        "b_crit_ci": [fit["ci_low"], fit["ci_high"]] if fit and np.isfinite(fit["ci_low"]) else None,
        "r2": fit["r2"] if fit else math.nan,
        "gdc_threshold": thresholds.GDC_LOW, "gdc_cliff": cliff,
        "b_simple_envs": _finite_median([r["b_simple_envs"] for r in rows]),
        "b_crit_online_envs": _finite_median([r["b_crit_online_envs"] for r in rows]),
        "b_simple_transitions": _finite_median([r["b_simple_transitions"] for r in rows]),
        "time_fit": time_fit, "b_star": b_star, "b_best_measured": b_best, "best_wall_s": best_wall,
        "notes": notes,
    }


def _analyse_grid(rows: list[dict], notes: list[str], n_boot: int, ci: float, rng: Any) -> dict:
    """A B x lr grid: the fit on the best lr at each B (McCandlish's definition, the selection
    inside the bootstrap) as the sweep's B_crit, one fixed-lr analysis per lr beside it
    (``lr_grid``, :func:`tclock.sweep_lr.analyse_grid`)."""
    by_lr = sweep_lr.split_by_lr(rows)
    fixed = {lr: analyse_runs(rs, [], n_boot=n_boot, ci=ci, rng=rng) for lr, rs in by_lr.items()}
    batch_sizes = sorted({r["batch"] for r in rows})
    t_values = sorted({r["transitions_per_b"] for r in rows})
    boot = critical.bootstrap_tuned_b_crit(batch_sizes, sweep_lr.grid_steps(by_lr, batch_sizes), t_values[0],
                                           n_boot=n_boot, ci=ci, rng=rng) if len(t_values) == 1 else None
    frequency = boot.best_lr_frequency if boot else np.zeros((len(batch_sizes), len(by_lr)))
    section, tuned_rows = sweep_lr.analyse_grid(rows, frequency, fixed)
    across = analyse_runs(tuned_rows, notes, n_boot=n_boot, ci=ci, rng=rng,
                          tuned=boot.b_crit if boot else None)
    if section["edge"]:
        sides = ", ".join(f"B={e['batch']} ({e['side']})" for e in section["edge"])
        across["b_crit_distrust"].append(f"the best lr is at the edge of the grid at {sides}; widen --lrs there")
        across["b_crit_trusted"] = False
    across["lr_grid"] = section
    return across


# --------------------------------------------------------------------------- the sweep
def summarize(sweep_dir: str | os.PathLike, target: float | None = None, metric: str = "success_rate",
              smooth_steps: float = 16384, include_incomplete: bool = False,
              n_boot: int = 1000, ci: float = 0.9, rng: Any = 0) -> dict:
    """The analysis of the sweep in ``sweep_dir`` (arguments: :func:`tclock.sweep_report.summarize_sweep`).

    A JSON-friendly dict (NaN where JSON has ``null``):

    * ``sweep_dir``, ``metric``, ``target`` (common target, or None if runs differ),
      ``smooth_steps``, ``smoothing``, ``unroll_length`` (None if runs differ), ``units``,
      ``include_incomplete``; ``algo`` (the learner, or the list if runs differ),
      ``sweep_axis`` (``num_envs`` or ``sac_batch_size``, from ``sweep.yaml``), ``replay_ratio`` (SAC's fixed gradient steps per env step,
      else None).
    * ``runs``: one dict per batch size used, ascending ``batch`` (the swept value: ``num_envs``, or
      ``sac_batch_size`` along that axis): ``run``, ``batch``, ``sweep_axis``, ``transitions_per_b``
      (T, or 1 for the gradient batch), ``num_envs``, ``unroll_length``, ``state``, ``complete``,
      ``lr``, ``lr_scaling``, ``algo``, ``replay_ratio``, ``seeds``, ``iterations``, ``env_steps``,
      ``target``, ``smooth_k``; ``steps_to_target`` (S in the axis's steps: iterations or gradient
      steps) / ``iterations_to_target`` / ``env_steps_to_target`` / ``samples_to_target`` (E in the
      axis's samples) / ``wall_to_target`` each ``{median, q25, q75, min, max, per_seed}``; ``n_reached``,
      ``reached_fraction``, ``final_metric`` (+ ``_per_seed``), ``final_episode_return``
      (+ ``_per_seed``), ``gdc_mean``, ``gdc_n``, ``b_simple_transitions``, ``b_simple_envs``,
      ``b_crit_online_envs`` (the run's whole-run windowed ratio of the per-env noise estimates,
      :mod:`tclock.online_critical`, median over seeds),
      ``rt_ut_ratio_mean``, ``iteration_s_mean``, ``rt_s_mean``, ``learn_s_mean``.
    * ``batch_sizes``; ``not_reached``: B whose median did not reach the target.
    * ``incomplete``: ``[{run, batch, state, reason, used}]`` runs not finished or unreadable.
    * ``fit``: None, or the :class:`~tclock.critical.CriticalFit` fields plus ``ci_low``,
      ``ci_high``, ``ci_level``, ``bootstrap_success_fraction``, ``n_boot``,
      ``batch_sizes_used``, ``median_steps_used``; ``fit_note``: why it is None or degenerate.
    * ``b_crit_trusted`` (bool) and ``b_crit_distrust`` (the reasons when not: :func:`fit_trust`);
      a reader (``tclock doctor``) uses ``b_crit`` as a measurement only when trusted.
    * ``b_crit`` (envs), ``b_crit_transitions``, ``b_crit_ci`` ([low, high] envs or None),
      ``r2`` -- copies of the fit for readers such as ``tclock doctor``.
    * ``gdc_threshold``, ``gdc_cliff`` (B or None), ``b_simple_envs``,
      ``b_simple_transitions`` (median over B of the per-B medians), ``b_crit_online_envs``
      (median over B).
    * ``time_fit``: None or ``{a, k, r2, n_points}``; ``b_star`` (envs); ``b_best_measured``
      (argmin of the median wall to target) and ``best_wall_s``.
    * ``step_size_limited``: one lr only: None, or the evidence that E rises as B falls
      (:func:`tclock.sweep_lr.step_size_limited`; the fit is then not trusted).
    * ``lr_grid``: None for one lr; for a B x lr grid (runs differ in ``lr``) the section of
      :func:`tclock.sweep_lr.analyse_grid` (cells, best lr per B, fixed-lr fits, edges), and
      ``runs`` / ``fit`` / ``b_crit`` above are then those of the best lr at each B.
    * ``notes``.

    Each run row also carries its ``lr`` and ``lr_scaling``.
    """
    sweep_dir = Path(sweep_dir)
    smoothing_window(1, 1, smooth_steps)  # validates smooth_steps before any file is read
    axis = sweep_axis(sweep_dir)
    rows: list[dict] = []
    incomplete: list[dict] = []
    notes: list[str] = []
    for run_dir in discover_runs(sweep_dir):
        row = _read_run(run_dir, target, metric, smooth_steps, include_incomplete, incomplete, notes, axis)
        if row is not None:
            rows.append(row)
    rows.sort(key=lambda r: (r["batch"], r["lr"]))
    seen: dict[tuple, str] = {}
    for r in rows:
        key = (r["batch"], r["lr"])
        if key in seen:
            raise RunFormatError(f"{seen[key]} and {r['run']} in {sweep_dir} both have {r['sweep_axis']}={r['batch']} "
                                 f"and lr={r['lr']}; keep one run per batch size (and learning rate)")
        seen[key] = r["run"]
    if len({r["lr"] for r in rows}) > 1:
        across = _analyse_grid(rows, notes, n_boot, ci, rng)
    else:
        across = analyse_runs(rows, notes, n_boot=n_boot, ci=ci, rng=rng)
        across["lr_grid"] = None
    targets = {r["target"] for r in rows}
    t_values = {r["unroll_length"] for r in rows}
    algos = sorted({r.get("algo", "ppo") for r in rows})
    ratios = {r.get("replay_ratio") for r in rows}
    return {
        "algo": algos[0] if len(algos) == 1 else algos, "sweep_axis": axis,
        "replay_ratio": ratios.pop() if len(ratios) == 1 else None,
        "sweep_dir": str(sweep_dir), "metric": metric, "target": targets.pop() if len(targets) == 1 else None,
        "smooth_steps": smooth_steps, "smoothing": SMOOTHING,
        "unroll_length": t_values.pop() if len(t_values) == 1 else None, "units": units(axis),
        "include_incomplete": include_incomplete, "batch_sizes": [r["batch"] for r in rows],
        "incomplete": incomplete, **across,
    }
