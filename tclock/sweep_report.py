"""Summarise a batch-size sweep: steps to target per B, the critical batch size, the wall-clock
optimum, and the diagnostics beside them.  Reads run directories only (through
:mod:`tclock.runlog`); never imports JAX, the loop or an agent.

A sweep directory holds one run directory per batch size, named ``B*`` (``B0032``, ``B0064``,
...), each with ``config.yaml`` (``num_envs``, ``unroll_length``, ``seeds``, ``target_success``),
``metrics.jsonl`` and ``status.json``.

Units (DESIGN.md section 2), used in every key and header below:

* ``B``    = ``num_envs``, in **envs**.
* ``T``    = ``unroll_length``; one rollout is ``B*T`` transitions.
* ``S``    = **iterations** (updates) to reach the target.
* ``E``    = ``S*B*T``, **env steps per seed** to reach the target.
* wall     = ``wall_s`` at that iteration, **seconds** of loop time (compilation excluded).
* ``b_simple`` is logged in **transitions**; ``/T`` gives **envs**, the unit of ``B_crit``.

Steps to target (per run, per seed)
-----------------------------------
The first iteration at which the trailing mean of ``metric`` over the last ``k`` iterations
reaches ``target``, with ``k = max(1, ceil(smooth_steps / (B*T)))``: every batch size is
smoothed over about the same number of env steps (``smooth_steps``), not over the same number
of iterations.  The window must be full (iterations ``1..k-1`` cannot count) and nulls inside it
are skipped.  **Bias:** for a curve that stays at or above the target once it gets there, the
detected iteration lies between the first raw crossing and ``k-1`` iterations after it, i.e. it
is *late* by up to ``k-1`` iterations (up to about ``smooth_steps`` env steps) and never early;
for a curve that is locally linear around the crossing the lag is ``(k-1)/2`` iterations (the
trailing mean of a line is its value at the window's centre).  Because ``k`` is larger at small ``B``, the lag in iterations is larger there, which inflates
``S`` at small ``B`` and so ``c = E_min/T`` and ``B_crit`` slightly; pass ``smooth_steps=0`` to
switch smoothing off (``k = 1``, the raw first crossing, sensitive to noise).

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
GDC cliff (first B whose mean GDC < 0.6), the online ``b_simple`` (median over B, in envs), and
the wall-clock optimum ``B* = sqrt(B_crit*a/k)`` from a linear fit ``t(B) = a + k*B`` of the mean
iteration time (``rt_s + learn_s``), next to the measured argmin of the median wall seconds to
target (over B where that median is finite).

Outputs (``write=True``, into the sweep directory)
--------------------------------------------------
``summary.json`` (layout: :func:`summarize_sweep`), ``report.md`` and the PNGs in
:data:`FIGURES`; a figure whose data are absent is skipped (not written, not listed).
"""
from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tclock import critical, runlog
from tclock.plots import _figure, _note, _save, nanmean_rows, seed_matrix
from tclock.runlog import RunFormatError

__all__ = [
    "FIGURES",
    "GDC_CLIFF",
    "smoothing_window",
    "steps_to_target_smoothed",
    "summarize_sweep",
    "format_summary",
    "write_report",
    "main",
]

SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
FIGURES = (
    "sweep_return_vs_steps.png",
    "sweep_return_vs_wall.png",
    "sweep_steps_to_target.png",
    "sweep_gdc_bsimple.png",
    "sweep_rt_ut.png",
)
GDC_CLIFF = 0.6
GDC_FRESH = 0.85
FINAL_FRACTION = 0.1  # "final" = mean of the last 10% of iterations
UNITS = {
    "B": "envs (num_envs)",
    "T": "env steps per env per rollout (unroll_length)",
    "S": "iterations (updates) to target",
    "E": "env steps per seed to target (S*B*T)",
    "wall": "seconds of loop time to target (wall_s; compilation excluded)",
    "b_crit": "envs",
    "b_crit_transitions": "transitions per rollout (b_crit*T)",
    "b_simple_envs": "envs (b_simple / T)",
    "b_simple_transitions": "transitions",
    "iteration_s": "seconds per iteration (rt_s + learn_s)",
    "time_fit": "t(B) = a + k*B; a in seconds, k in seconds per env",
    "b_star": "envs",
}


# --------------------------------------------------------------------------- small helpers
def _nan(x) -> float:
    """Python float; None/inf/non-numeric -> NaN."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def _fmt(v, digits: int = 3) -> str:
    v = _nan(v)
    if math.isnan(v):
        return "—"
    if v == 0:
        return "0"
    if abs(v) >= 10 ** digits or float(v).is_integer() and abs(v) < 1e7:
        return f"{v:,.0f}" if abs(v) >= 10000 else f"{v:.0f}"
    return f"{v:.{digits}g}"


def _quiet_nanmean(a) -> float:
    a = np.asarray(a, dtype=float)
    a = a[np.isfinite(a)]
    return float(a.mean()) if a.size else math.nan


def smoothing_window(num_envs: int, unroll_length: int, smooth_steps: float) -> int:
    """``k = max(1, ceil(smooth_steps / (B*T)))`` iterations (``smooth_steps`` in env steps)."""
    if not (isinstance(smooth_steps, (int, float)) and math.isfinite(smooth_steps) and smooth_steps >= 0):
        raise ValueError(f"smooth_steps must be a finite number >= 0 (env steps), got {smooth_steps!r}")
    per_iter = float(num_envs) * float(unroll_length)
    if not per_iter > 0:
        raise ValueError(f"num_envs*unroll_length must be > 0, got {num_envs}*{unroll_length}")
    return max(1, math.ceil(smooth_steps / per_iter))


def steps_to_target_smoothed(values: np.ndarray, target: float, k: int) -> np.ndarray:
    """Per seed, the row index of the first full ``k``-window whose mean reaches ``target``.

    ``values`` is ``[n_iter, n_seeds]`` (NaN = null, skipped inside a window; a window with no
    finite value does not count).  Returns a float array ``[n_seeds]`` of 0-based row indices,
    NaN where the target is never reached.
    """
    v = np.asarray(values, dtype=float)
    if v.ndim == 1:
        v = v[:, None]
    n, s = v.shape
    out = np.full(s, np.nan)
    if n < k or s == 0:
        return out
    finite = np.isfinite(v)
    csum = np.concatenate([np.zeros((1, s)), np.cumsum(np.where(finite, v, 0.0), axis=0)])
    ccnt = np.concatenate([np.zeros((1, s)), np.cumsum(finite, axis=0)])
    wsum = csum[k:] - csum[:-k]  # window ending at row i = k-1+j
    wcnt = ccnt[k:] - ccnt[:-k]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(wcnt > 0, wsum / np.maximum(wcnt, 1), np.nan)
        hit = mean >= target
    for j in range(s):
        idx = np.flatnonzero(hit[:, j])
        if idx.size:
            out[j] = float(idx[0] + k - 1)
    return out


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
    return {
        "median": _nan(med),
        "q25": _nan(q25),
        "q75": _nan(q75),
        "min": float(reached.min()) if reached.size else math.nan,
        "max": float(reached.max()) if reached.size else math.nan,
        "per_seed": [_nan(v) for v in x],
    }


def _per_seed_columns(m: np.ndarray, n_seeds: int) -> np.ndarray:
    """A scalar metric ([n, 1]) broadcast to [n, n_seeds]; a per-seed one padded/cut to n_seeds."""
    n = m.shape[0]
    if m.shape[1] == 1 and n_seeds > 1:
        return np.repeat(m, n_seeds, axis=1)
    out = np.full((n, n_seeds), np.nan)
    c = min(n_seeds, m.shape[1])
    out[:, :c] = m[:, :c]
    return out


# --------------------------------------------------------------------------- one run
def _summarize_run(name: str, records: list[dict], config: dict, state: str, target: float,
                   metric: str, smooth_steps: float) -> tuple[dict, list[str]]:
    B = int(config["num_envs"])
    T = int(config["unroll_length"])
    k = smoothing_window(B, T, smooth_steps)
    its, mvals = seed_matrix(records, metric, keep_missing=True)
    n_seeds = mvals.shape[1] if mvals.shape[1] else int(config.get("seeds") or 1)
    notes = []
    if not mvals.shape[1] and records:
        notes.append(f"{name}: {metric!r} never logged; target counted as not reached")
    mvals = _per_seed_columns(mvals, n_seeds) if mvals.shape[1] else np.full((len(records), n_seeds), np.nan)
    iters = np.where(its >= 0, its, np.arange(1, len(records) + 1)).astype(float)
    _, wall = seed_matrix(records, "wall_s", keep_missing=True)
    wall = _per_seed_columns(wall, n_seeds) if wall.shape[1] else np.full((len(records), n_seeds), np.nan)

    idx = steps_to_target_smoothed(mvals, target, k)
    s_seed = np.full(n_seeds, np.nan)
    w_seed = np.full(n_seeds, np.nan)
    for j, i in enumerate(idx):
        if np.isfinite(i):
            s_seed[j] = iters[int(i)]
            w_seed[j] = wall[int(i), j]
    e_seed = s_seed * B * T

    def final(m: np.ndarray) -> tuple[float, list]:
        if m.size == 0 or m.shape[1] == 0:
            return math.nan, []
        tail = max(1, math.ceil(FINAL_FRACTION * m.shape[0]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            per = np.nanmean(m[-tail:], axis=0)
            med = float(np.nanmedian(per)) if np.isfinite(per).any() else math.nan
        return _nan(med), [_nan(v) for v in per]

    final_metric, final_metric_seeds = final(mvals)
    _, ret = seed_matrix(records, "episode_return", keep_missing=True)
    final_ret, final_ret_seeds = final(ret)
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
    n_reached = int(np.isfinite(s_seed).sum())
    return {
        "run": name,
        "num_envs": B,
        "unroll_length": T,
        "state": state,
        "complete": state == "finished",
        "seeds": int(n_seeds),
        "iterations": int(np.nanmax(iters)) if len(records) else 0,
        "env_steps": float(np.nanmax(iters)) * B * T if len(records) else 0.0,
        "target": float(target),
        "smooth_k": int(k),
        "steps_to_target": _stats(s_seed),
        "env_steps_to_target": _stats(e_seed),
        "wall_to_target": _stats(w_seed),
        "n_reached": n_reached,
        "reached_fraction": n_reached / n_seeds if n_seeds else math.nan,
        "final_metric": final_metric,
        "final_metric_per_seed": final_metric_seeds,
        "final_episode_return": final_ret,
        "final_episode_return_per_seed": final_ret_seeds,
        "gdc_mean": _quiet_nanmean(gdc),
        "gdc_n": int(np.isfinite(gdc).sum()),
        "b_simple_transitions": b_simple_t,
        "b_simple_envs": b_simple_t / T,
        "rt_ut_ratio_mean": _quiet_nanmean(rtut),
        "iteration_s_mean": _quiet_nanmean(rt_row + learn_row),
        "rt_s_mean": _quiet_nanmean(rt_row),
        "learn_s_mean": _quiet_nanmean(learn_row),
    }, notes


def _discover(sweep_dir: Path) -> list[Path]:
    if not sweep_dir.is_dir():
        raise RunFormatError(f"{sweep_dir} is not a directory: expected a tclock sweep directory")
    runs = sorted(p for p in sweep_dir.iterdir()
                  if p.is_dir() and p.name.startswith("B") and (p / runlog.CONFIG_FILE).exists())
    if not runs:
        raise RunFormatError(f"{sweep_dir} holds no run directories (B*/ with {runlog.CONFIG_FILE}): "
                             f"is it a tclock sweep directory?")
    return runs


# --------------------------------------------------------------------------- the sweep
def summarize_sweep(sweep_dir: str | os.PathLike, target: float | None = None, metric: str = "success_rate",
                    smooth_steps: float = 16384, write: bool = True, include_incomplete: bool = False,
                    n_boot: int = 1000, ci: float = 0.9, rng: Any = 0) -> dict:
    """Summarise the sweep in ``sweep_dir``; with ``write`` also write summary.json, report.md, PNGs.

    Args:
      target: value of ``metric`` that counts as reached; default: each run's ``target_success``.
      metric: per-iteration key of the learning curve (``docs/metrics.md``), e.g. ``success_rate``
        or ``episode_return``.
      smooth_steps: env steps (per seed) of the trailing-mean window; see the module docstring.
      include_incomplete: also use what unfinished runs logged (they are listed either way).
      n_boot, ci, rng: passed to :func:`tclock.critical.bootstrap_b_crit`.

    Returns a JSON-friendly dict (NaN where JSON has ``null``), the content of summary.json:

    * ``sweep_dir``, ``metric``, ``target`` (common target, or None if runs differ),
      ``smooth_steps``, ``unroll_length`` (None if runs differ), ``units``.
    * ``runs``: one dict per batch size used, ascending ``num_envs``: ``run``, ``num_envs``,
      ``unroll_length``, ``state``, ``complete``, ``seeds``, ``iterations``, ``env_steps``,
      ``target``, ``smooth_k``; ``steps_to_target`` / ``env_steps_to_target`` /
      ``wall_to_target`` each ``{median, q25, q75, min, max, per_seed}``; ``n_reached``,
      ``reached_fraction``, ``final_metric`` (+ ``_per_seed``), ``final_episode_return``
      (+ ``_per_seed``), ``gdc_mean``, ``gdc_n``, ``b_simple_transitions``, ``b_simple_envs``,
      ``rt_ut_ratio_mean``, ``iteration_s_mean``, ``rt_s_mean``, ``learn_s_mean``.
    * ``batch_sizes``; ``not_reached``: B whose median did not reach the target.
    * ``incomplete``: ``[{run, num_envs, state, reason, used}]`` runs not finished or unreadable.
    * ``fit``: None, or the :class:`~tclock.critical.CriticalFit` fields plus ``ci_low``,
      ``ci_high``, ``ci_level``, ``bootstrap_success_fraction``, ``n_boot``,
      ``batch_sizes_used``, ``median_steps_used``; ``fit_note``: why it is None or degenerate.
    * ``b_crit`` (envs), ``b_crit_transitions``, ``b_crit_ci`` ([low, high] envs or None),
      ``r2`` -- copies of the fit for readers such as ``tclock doctor``.
    * ``gdc_threshold``, ``gdc_cliff`` (B or None), ``b_simple_envs``,
      ``b_simple_transitions`` (median over B of the per-B medians).
    * ``time_fit``: None or ``{a, k, r2, n_points}``; ``b_star`` (envs); ``b_best_measured``
      (argmin of the median wall to target) and ``best_wall_s``.
    * ``headline``, ``notes``, ``figures`` (file names written).
    """
    sweep_dir = Path(sweep_dir)
    smoothing_window(1, 1, smooth_steps)  # validates smooth_steps before any file is read
    rows: list[dict] = []
    incomplete: list[dict] = []
    notes: list[str] = []
    for run_dir in _discover(sweep_dir):
        name = run_dir.name
        try:
            config = runlog.read_config(run_dir)
            B, T = config.get("num_envs"), config.get("unroll_length")
            if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (B, T)):
                raise RunFormatError(f"{run_dir / runlog.CONFIG_FILE}: num_envs and unroll_length must be "
                                     f"positive integers, got {B!r} and {T!r}")
            status = runlog.read_status(run_dir)
            state = str(status.get("state", "missing")) if isinstance(status, dict) else "missing"
        except RunFormatError as e:
            incomplete.append({"run": name, "num_envs": None, "state": "unreadable", "reason": str(e), "used": False})
            continue
        finished = state == "finished"
        use = finished or include_incomplete
        if not finished:
            incomplete.append({"run": name, "num_envs": B, "state": state,
                               "reason": f"status is {state!r}, not 'finished'", "used": False})
        if not use:
            continue
        try:
            records = runlog.read_metrics(run_dir, missing_ok=not finished)
        except RunFormatError as e:
            reason = f"metrics unreadable: {e}"
            if finished:
                incomplete.append({"run": name, "num_envs": B, "state": state, "reason": reason, "used": False})
            else:
                incomplete[-1]["reason"] += f"; {reason}"
            continue
        run_target = target if target is not None else config.get("target_success")
        if not isinstance(run_target, (int, float)) or isinstance(run_target, bool) or not math.isfinite(run_target):
            raise ValueError(f"{run_dir / runlog.CONFIG_FILE} has no numeric target_success "
                             f"({run_target!r}); pass target=")
        row, run_notes = _summarize_run(name, records, config, state, float(run_target), metric, smooth_steps)
        notes.extend(run_notes)
        if not finished:
            incomplete[-1]["used"] = True
        rows.append(row)
    rows.sort(key=lambda r: r["num_envs"])
    seen: dict[int, str] = {}
    for r in rows:
        if r["num_envs"] in seen:
            raise RunFormatError(f"{seen[r['num_envs']]} and {r['run']} in {sweep_dir} both have num_envs="
                                 f"{r['num_envs']}; keep one run per batch size")
        seen[r["num_envs"]] = r["run"]

    summary = _analyse(rows, notes, n_boot=n_boot, ci=ci, rng=rng)
    targets = {r["target"] for r in rows}
    t_values = {r["unroll_length"] for r in rows}
    summary = {
        "sweep_dir": str(sweep_dir),
        "metric": metric,
        "target": targets.pop() if len(targets) == 1 else None,
        "smooth_steps": smooth_steps,
        "smoothing": ("trailing mean over k = max(1, ceil(smooth_steps/(B*T))) iterations (full window); "
                      "detection is late by up to k-1 iterations, never early, for curves that stay above "
                      "the target once they reach it"),
        "unroll_length": t_values.pop() if len(t_values) == 1 else None,
        "units": dict(UNITS),
        "include_incomplete": include_incomplete,
        "batch_sizes": [r["num_envs"] for r in rows],
        "incomplete": incomplete,
        **summary,
    }
    summary["headline"] = _headline(summary)
    summary["figures"] = []
    if write:
        write_report(summary, sweep_dir)
    return summary


def _analyse(rows: list[dict], notes: list[str], n_boot: int, ci: float, rng) -> dict:
    Bs = np.array([r["num_envs"] for r in rows], dtype=float)
    med_s = np.array([r["steps_to_target"]["median"] for r in rows], dtype=float)
    not_reached = [r["num_envs"] for r, s in zip(rows, med_s) if not np.isfinite(s)]
    t_values = sorted({r["unroll_length"] for r in rows})
    fit = None
    fit_note = ""
    reached_b = [int(b) for b, s in zip(Bs, med_s) if np.isfinite(s)]
    if len(t_values) > 1:
        fit_note = (f"runs differ in unroll_length ({t_values}); iterations to target are not comparable "
                    f"across them, so S(B) is not fitted")
    elif len(reached_b) < 2:
        where = f" (B={reached_b[0]})" if reached_b else ""
        fit_note = (f"fewer than 2 batch sizes reached the target (median over seeds): {len(reached_b)} of "
                    f"{len(rows)}{where}; S(B) = S_min + c/B needs at least 2, so B_crit is not fitted")
    else:
        T = t_values[0]
        cf = critical.fit_steps_to_target(Bs, med_s, T)
        fit = cf.to_dict()
        fit_note = cf.note
        fit.update({"batch_sizes_used": reached_b,
                    "median_steps_used": [float(s) for s in med_s if np.isfinite(s)]})
        # per-seed matrix: inf = seed did not reach, NaN = no such seed (ragged seed counts)
        n_seeds = max(len(r["steps_to_target"]["per_seed"]) for r in rows)
        sp = np.full((len(rows), n_seeds), np.nan)
        for i, r in enumerate(rows):
            ps = np.array(r["steps_to_target"]["per_seed"], dtype=float)
            sp[i, : ps.size] = np.where(np.isfinite(ps), ps, np.inf)
        boot = critical.bootstrap_b_crit(Bs, sp, T, n_boot=n_boot, ci=ci, rng=rng)
        fit.update({"ci_low": boot.low, "ci_high": boot.high, "ci_level": ci,
                    "bootstrap_success_fraction": boot.success_fraction, "n_boot": int(n_boot)})
        if boot.success_fraction < 0.9:
            notes.append(f"only {boot.success_fraction:.0%} of bootstrap resamples gave a finite B_crit; "
                         f"the CI is conditional on those and optimistic")
    b_crit = fit["b_crit"] if fit else math.nan
    gdc = [r["gdc_mean"] for r in rows]
    cliff = critical.gdc_cliff(Bs.astype(int), gdc, GDC_CLIFF) if rows else None
    bse = np.array([r["b_simple_envs"] for r in rows], dtype=float)
    bst = np.array([r["b_simple_transitions"] for r in rows], dtype=float)
    b_simple_envs = float(np.median(bse[np.isfinite(bse)])) if np.isfinite(bse).any() else math.nan
    b_simple_tr = float(np.median(bst[np.isfinite(bst)])) if np.isfinite(bst).any() else math.nan
    it_s = np.array([r["iteration_s_mean"] for r in rows], dtype=float)
    time_fit = None
    b_star = math.nan
    ok = np.isfinite(it_s)
    if np.unique(Bs[ok]).size >= 2:
        tf = critical.fit_linear_time(Bs[ok], it_s[ok])
        time_fit = tf._asdict()
        b_star = critical.wallclock_optimum(b_crit, tf.a, tf.k)
        if not (tf.a > 0 and tf.k > 0):
            notes.append(f"iteration time fit t(B) = {tf.a:.3g} + {tf.k:.3g}*B s has a non-positive term; "
                         f"B* = sqrt(B_crit*a/k) is undefined")
    wall = np.array([r["wall_to_target"]["median"] for r in rows], dtype=float)
    if np.isfinite(wall).any():
        i_best = int(np.nanargmin(np.where(np.isfinite(wall), wall, np.inf)))
        b_best, best_wall = int(Bs[i_best]), float(wall[i_best])
    else:
        b_best, best_wall = None, math.nan
    ks = {r["smooth_k"] for r in rows}
    if any(k > 1 for k in ks):
        notes.append("steps to target use a trailing mean of k iterations (k per B in the table); "
                     "each S can be up to k-1 iterations late (about (k-1)/2 on a locally linear curve), "
                     "more at small B, which biases B_crit upwards; compare with smooth_steps=0")
    return {
        "runs": rows,
        "not_reached": not_reached,
        "fit": fit,
        "fit_note": fit_note,
        "b_crit": b_crit,
        "b_crit_transitions": fit["b_crit_transitions"] if fit else math.nan,
        "b_crit_ci": [fit["ci_low"], fit["ci_high"]] if fit and np.isfinite(fit["ci_low"]) else None,
        "r2": fit["r2"] if fit else math.nan,
        "gdc_threshold": GDC_CLIFF,
        "gdc_cliff": cliff,
        "b_simple_envs": b_simple_envs,
        "b_simple_transitions": b_simple_tr,
        "time_fit": time_fit,
        "b_star": b_star,
        "b_best_measured": b_best,
        "best_wall_s": best_wall,
        "notes": notes,
    }


def _headline(s: dict) -> str:
    rows = s["runs"]
    if not rows:
        return (f"no finished runs to summarise yet ({len(s['incomplete'])} incomplete); "
                f"rerun with include_incomplete=True to use what they logged")
    fit = s["fit"]
    parts = []
    if fit is None:
        n_reached = len(rows) - len(s["not_reached"])
        parts.append(f"target not reached at enough batch sizes to fit (median seed reached "
                     f"{s['metric']} target at {n_reached} of {len(rows)} batch sizes)")
    elif not np.isfinite(_nan(fit["b_crit"])):
        if not fit["s_min"] > 0:
            parts.append(f"B_crit undefined: steps to target still fall like 1/B up to B={rows[-1]['num_envs']} "
                         f"(B_crit above the sweep)")
        else:
            parts.append(f"B_crit undefined: larger batches did not reduce steps to target "
                         f"(B_crit at or below B={rows[0]['num_envs']})")
    else:
        lo, hi = (fit["ci_low"], fit["ci_high"])
        ci_txt = (f"{fit['ci_level']:.0%} CI {_fmt(lo)}–{_fmt(hi)}" if np.isfinite(_nan(lo))
                  else "CI n/a")
        parts.append(f"critical batch size B_crit ≈ {_fmt(fit['b_crit'])} envs ({ci_txt}), R² {fit['r2']:.2f}")
    if np.isfinite(_nan(s["b_simple_envs"])):
        parts.append(f"online b_simple ≈ {_fmt(s['b_simple_envs'])} envs")
    gdc_known = [r for r in rows if np.isfinite(_nan(r["gdc_mean"]))]
    if s["gdc_cliff"] is not None:
        parts.append(f"GDC falls below {GDC_CLIFF} at B={s['gdc_cliff']}")
    elif gdc_known:
        parts.append(f"GDC stays ≥ {GDC_CLIFF} up to B={gdc_known[-1]['num_envs']}")
    best = s["b_best_measured"]
    best_txt = f"measured best: {best}" if best is not None else "measured best: none reached"
    if np.isfinite(_nan(s["b_star"])):
        parts.append(f"wall-clock optimum B* ≈ {_fmt(s['b_star'])} envs ({best_txt})")
    else:
        parts.append(f"wall-clock optimum B* n/a ({best_txt})")
    return "; ".join(parts)


# --------------------------------------------------------------------------- report files
def write_report(summary: dict, out_dir: str | os.PathLike) -> list[Path]:
    """Writes the PNGs, summary.json and report.md into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    records = _load_curves(Path(summary["sweep_dir"]), summary["runs"])
    figures = []
    for name, fn in _PLOTTERS.items():
        path = fn(summary, records, out / name)
        if path is not None:
            figures.append(path)
    summary["figures"] = [p.name for p in figures]
    runlog.write_json(out / SUMMARY_FILE, summary)
    runlog.write_text(out / REPORT_FILE, _markdown(summary))
    return [out / SUMMARY_FILE, out / REPORT_FILE, *figures]


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _range(st: dict) -> str:
    if not np.isfinite(_nan(st["min"])):
        return "—"
    return f"{_fmt(st['min'])}–{_fmt(st['max'])}"


def _table_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    m = summary["metric"]
    headers = ["B (envs)", "k (iters)", "seeds reached", "S median (iterations)", "S min–max (iterations)",
               "E median (env steps/seed)", "wall median (s)", f"final {m}", "final return", "GDC (mean)",
               "b_simple (envs)", "b_simple (transitions)", "RT/UT (mean)", "iteration (s)", "RT (s)"]
    rows = []
    for r in summary["runs"]:
        rows.append([
            f"{r['num_envs']}" + ("" if r["complete"] else f" ({r['state']})"),
            str(r["smooth_k"]),
            f"{r['n_reached']}/{r['seeds']}",
            _fmt(r["steps_to_target"]["median"]),
            _range(r["steps_to_target"]),
            _fmt(r["env_steps_to_target"]["median"]),
            _fmt(r["wall_to_target"]["median"]),
            _fmt(r["final_metric"]),
            _fmt(r["final_episode_return"]),
            _fmt(r["gdc_mean"]),
            _fmt(r["b_simple_envs"]),
            _fmt(r["b_simple_transitions"]),
            _fmt(r["rt_ut_ratio_mean"]),
            _fmt(r["iteration_s_mean"]),
            _fmt(r["rt_s_mean"]),
        ])
    return headers, rows


def _fit_lines(summary: dict) -> list[str]:
    fit = summary["fit"]
    T = summary["unroll_length"]
    lines = []
    if fit is None:
        lines.append(f"No fit: {summary['fit_note']}.")
    else:
        lines.append(f"S(B) = S_min + c/B fitted to the per-B median S over B = {fit['batch_sizes_used']} "
                     f"(weighting: {fit['weighting']}; {fit['n_dropped']} B dropped as not reached):")
        lines.append("")
        lines.append(f"- S_min = {_fmt(fit['s_min'])} iterations; c = E_min/T = {_fmt(fit['c'])} iterations·envs; "
                     f"E_min = {_fmt(fit['e_min'])} env steps per seed (T = {T})")
        lines.append(f"- **B_crit = {_fmt(fit['b_crit'])} envs** = {_fmt(fit['b_crit_transitions'])} transitions "
                     f"per rollout; {fit['ci_level']:.0%} bootstrap CI {_fmt(fit['ci_low'])}–{_fmt(fit['ci_high'])} "
                     f"envs ({fit['n_boot']} resamples of seeds per B, "
                     f"{fit['bootstrap_success_fraction']:.0%} gave a finite B_crit); R² = {_fmt(fit['r2'])}")
        if fit["note"]:
            lines.append(f"- {fit['note']}")
    lines.append(f"- GDC cliff (first B with mean GDC < {summary['gdc_threshold']}): "
                 f"{summary['gdc_cliff'] if summary['gdc_cliff'] is not None else 'none in the sweep'}")
    lines.append(f"- online b_simple (median over B): {_fmt(summary['b_simple_envs'])} envs = "
                 f"{_fmt(summary['b_simple_transitions'])} transitions")
    tf = summary["time_fit"]
    if tf is None:
        lines.append("- iteration time: fewer than 2 batch sizes timed, no t(B) fit")
    else:
        lines.append(f"- iteration time t(B) = a + k·B: a = {_fmt(tf['a'])} s, k = {tf['k']:.3g} s/env, "
                     f"R² = {_fmt(tf['r2'])}; wall-clock optimum B* = sqrt(B_crit·a/k) = {_fmt(summary['b_star'])} envs")
    best = summary["b_best_measured"]
    lines.append(f"- measured best B (lowest median wall seconds to target): "
                 f"{best if best is not None else 'none reached'}"
                 + (f" ({_fmt(summary['best_wall_s'])} s)" if best is not None else ""))
    return lines


def _markdown(summary: dict) -> str:
    target = summary["target"]
    lines = [f"# Batch-size sweep: {Path(summary['sweep_dir']).name}", "", f"**{summary['headline']}**", "",
             f"Target: `{summary['metric']}` ≥ {_fmt(target) if target is not None else 'per run (see summary.json)'}; "
             f"steps to target = first iteration where the trailing mean over k = max(1, ceil({summary['smooth_steps']:g} / "
             f"(B·T))) iterations reaches it. This smooths over about the same env steps at every B; it is late by "
             f"up to k−1 iterations (never early for curves that stay above the target), more at small B. "
             f"Medians count a seed that never reached as infinitely late (finite only if more than half reached). "
             f"Units: B in envs, S in iterations, E in env steps per seed, wall in seconds; b_simple in envs = "
             f"transitions / T (T = {summary['unroll_length']}).", ""]
    headers, rows = _table_rows(summary)
    lines += ["## Per batch size", ""] + _md_table(headers, rows) + [""]
    if summary["not_reached"]:
        lines += [f"Target not reached (median over seeds) at B = {summary['not_reached']}.", ""]
    lines += ["## Critical batch size", ""] + _fit_lines(summary) + [""]
    if summary["incomplete"]:
        lines += ["## Incomplete runs", ""]
        for r in summary["incomplete"]:
            lines.append(f"- {r['run']} (B={r['num_envs']}): {r['reason']}"
                         + (" — included" if r["used"] else " — not used"))
        lines.append("")
    if summary["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in summary["notes"]] + [""]
    if summary["figures"]:
        lines += ["## Figures", ""]
        for name in summary["figures"]:
            lines += [f"![{name[:-4]}]({name})", ""]
    return "\n".join(lines)


def format_summary(summary: dict) -> str:
    """A plain-text table of the sweep and the headline, for the terminal."""
    headers, rows = _table_rows(summary)
    keep = [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 12, 13]
    short = ["B envs", "k", "reached", "S iters", "S min-max", "E env steps", "wall s", f"final {summary['metric']}",
             "GDC", "b_simple envs", "RT/UT", "iter s"]
    table = [short] + [[r[i] for i in keep] for r in rows]
    widths = [max(len(str(t[c])) for t in table) for c in range(len(short))]
    lines = [f"sweep {summary['sweep_dir']}  (metric {summary['metric']}, target "
             f"{_fmt(summary['target']) if summary['target'] is not None else 'per run'}, T={summary['unroll_length']})"]
    for i, t in enumerate(table):
        lines.append("  ".join(str(c).rjust(w) for c, w in zip(t, widths)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    lines += [ln.replace("**", "") for ln in _fit_lines(summary)]
    for r in summary["incomplete"]:
        lines.append(f"incomplete: {r['run']} (B={r['num_envs']}): {r['reason']}"
                     + (" [included]" if r["used"] else " [not used]"))
    lines.append("")
    lines.append(summary["headline"])
    return "\n".join(lines)


# --------------------------------------------------------------------------- figures
def _load_curves(sweep_dir: Path, rows: list[dict]) -> dict[str, list[dict]]:
    out = {}
    for r in rows:
        try:
            out[r["run"]] = runlog.read_metrics(sweep_dir / r["run"], missing_ok=True)
        except RunFormatError:
            out[r["run"]] = []
    return out


def _colors(rows: list[dict]) -> list:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    if len(rows) <= 1:
        return [cmap(0.0)] * len(rows)
    logs = np.log2([r["num_envs"] for r in rows])
    span = logs.max() - logs.min() or 1.0
    return [cmap(0.9 * (v - logs.min()) / span) for v in logs]


def _curve_figure(summary, records, path: Path, xkey: str) -> Path | None:
    rows = summary["runs"]
    metric = summary["metric"]
    keys = []
    for key in ("episode_return", metric):
        if key not in keys and any(np.isfinite(seed_matrix(records.get(r["run"], []), key)[1]).any() for r in rows):
            keys.append(key)
    if not keys:
        return None
    fig, axes = _figure(1, len(keys), (6.5 * len(keys), 4.8))
    colors = _colors(rows)
    xlabel = {"env_steps": "env steps (per seed)", "wall_s": "wall time (s, compilation excluded)"}[xkey]
    for ax, key in zip(axes[0], keys):
        drawn = False
        for r, color in zip(rows, colors):
            recs = records.get(r["run"], [])
            _, m = seed_matrix(recs, key, keep_missing=True)
            if not m.shape[1]:
                continue
            y = nanmean_rows(m)
            _, xm = seed_matrix(recs, xkey, keep_missing=True)
            x = nanmean_rows(xm) if xm.shape[1] else np.full(len(recs), np.nan)
            if xkey == "env_steps" and not np.isfinite(x).any():
                its, _ = seed_matrix(recs, "iteration", keep_missing=True)
                x = its.astype(float) * r["num_envs"] * r["unroll_length"]
            ok = np.isfinite(x) & np.isfinite(y)
            if ok.any():
                ax.plot(x[ok], y[ok], color=color, lw=1.6, label=f"B={r['num_envs']}")
                drawn = True
        if not drawn:
            _note(ax, f"{key} vs {xkey} not logged")
            continue
        if key == metric and summary["target"] is not None:
            ax.axhline(summary["target"], color="tab:red", ls="--", lw=1, label=f"target {_fmt(summary['target'])}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{key} (mean over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    fig.suptitle(f"learning curves by batch size B (envs) — {Path(summary['sweep_dir']).name}")
    return _save(fig, path)


def _plot_return_steps(summary, records, path):
    return _curve_figure(summary, records, path, "env_steps")


def _plot_return_wall(summary, records, path):
    return _curve_figure(summary, records, path, "wall_s")


def _plot_steps_to_target(summary, records, path) -> Path | None:
    rows = summary["runs"]
    if not any(r["n_reached"] for r in rows):
        return None
    fit = summary["fit"]
    T = summary["unroll_length"]
    fig, axes = _figure(1, 2, (13, 5))
    B = np.array([r["num_envs"] for r in rows], dtype=float)
    for ax, key, unit, scale in ((axes[0, 0], "steps_to_target", "iterations", 1.0),
                                 (axes[0, 1], "env_steps_to_target", "env steps per seed", None)):
        for b, r in zip(B, rows):
            ps = np.array(r[key]["per_seed"], dtype=float)
            ok = np.isfinite(ps)
            ax.scatter(np.full(ok.sum(), b), ps[ok], color="0.45", s=14, alpha=0.7,
                       label="seeds" if b == B[0] else None)
        med = np.array([r[key]["median"] for r in rows], dtype=float)
        lo = np.array([r[key]["min"] for r in rows], dtype=float)
        hi = np.array([r[key]["max"] for r in rows], dtype=float)
        ok = np.isfinite(med)
        ax.errorbar(B[ok], med[ok], yerr=[med[ok] - np.fmin(lo[ok], med[ok]), np.fmax(hi[ok], med[ok]) - med[ok]],
                    fmt="o", color="black", ms=6, capsize=3, label="median (bars: seed min–max)")
        if fit is not None:
            grid = np.geomspace(B.min() / 1.5, B.max() * 1.5, 200)
            s_fit = fit["s_min"] + fit["c"] / grid
            y = s_fit if scale == 1.0 else s_fit * grid * T
            ax.plot(grid, y, color="tab:blue", lw=1.8,
                    label="fit S = S_min + c/B" if scale == 1.0 else "fit E = S_min·B·T + E_min")
            bc = _nan(fit["b_crit"])
            if np.isfinite(bc):
                ax.axvline(bc, color="tab:red", ls="--", lw=1.2, label=f"B_crit ≈ {_fmt(bc)} envs")
                if np.isfinite(_nan(fit["ci_low"])):
                    ax.axvspan(fit["ci_low"], fit["ci_high"], color="tab:red", alpha=0.1,
                               label=f"{fit['ci_level']:.0%} CI")
        for b, r in zip(B, rows):
            if not np.isfinite(r[key]["median"]):
                ax.annotate("not reached", (b, 1.0), xycoords=("data", "axes fraction"), ha="center", va="top",
                            fontsize=8, color="tab:red", rotation=90)
        ax.set_xscale("log", base=2)
        if scale is None:
            ax.set_yscale("log")
        ax.set_xlabel("rollout batch size B (envs)")
        ax.set_ylabel(f"to target ({unit})")
        ax.grid(alpha=0.3, which="both")
        ax.legend(loc="best", fontsize=8)
    note = summary["fit_note"] if fit is None else ""
    fig.suptitle(f"steps to {summary['metric']} target — {Path(summary['sweep_dir']).name}"
                 + (f"\n{note}" if note else ""), fontsize=10 if note else None)
    return _save(fig, path)


def _plot_gdc_bsimple(summary, records, path) -> Path | None:
    rows = summary["runs"]
    B = np.array([r["num_envs"] for r in rows], dtype=float)
    gdc = np.array([r["gdc_mean"] for r in rows], dtype=float)
    bse = np.array([r["b_simple_envs"] for r in rows], dtype=float)
    if not (np.isfinite(gdc).any() or np.isfinite(bse).any()):
        return None
    fig, axes = _figure(2, 1, (10, 7.5))
    bc = _nan(summary["b_crit"])
    ax = axes[0, 0]
    if np.isfinite(gdc).any():
        ok = np.isfinite(gdc)
        ax.plot(B[ok], gdc[ok], "o-", color="black", lw=1.6, label="GDC (mean over diagnostic iterations, seeds)")
        ax.axhline(GDC_FRESH, color="tab:green", ls="--", lw=1, label=f"{GDC_FRESH} (fresh)")
        ax.axhline(GDC_CLIFF, color="tab:red", ls="--", lw=1, label=f"{GDC_CLIFF} (two clocks dominate)")
        if summary["gdc_cliff"] is not None:
            ax.axvline(summary["gdc_cliff"], color="tab:red", lw=0.8, alpha=0.6)
        if np.isfinite(bc):
            ax.axvline(bc, color="tab:blue", ls=":", lw=1.4, label=f"B_crit ≈ {_fmt(bc)} envs")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rollout batch size B (envs)")
        ax.set_ylabel("mean pairwise cosine")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    else:
        _note(ax, "gdc not logged")
    ax = axes[1, 0]
    if np.isfinite(bse).any():
        ok = np.isfinite(bse)
        ax.plot(B[ok], bse[ok], "s-", color="tab:brown", lw=1.6, label="b_simple (envs = transitions / T)")
        if np.isfinite(bc):
            ax.axhline(bc, color="tab:blue", ls=":", lw=1.4, label=f"B_crit ≈ {_fmt(bc)} envs")
            ci = summary["b_crit_ci"]
            if ci is not None:
                ax.axhspan(ci[0], ci[1], color="tab:blue", alpha=0.1, label="B_crit CI")
        ax.set_xscale("log", base=2)
        if (bse[ok] > 0).all():
            ax.set_yscale("log")
        ax.set_xlabel("rollout batch size B (envs)")
        ax.set_ylabel("gradient noise scale (envs)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(loc="best", fontsize=8)
    else:
        _note(ax, "b_simple not logged")
    fig.suptitle(f"gradient diagnostics vs batch size — {Path(summary['sweep_dir']).name}")
    return _save(fig, path)


def _plot_rt_ut(summary, records, path) -> Path | None:
    rows = summary["runs"]
    B = np.array([r["num_envs"] for r in rows], dtype=float)
    ratio = np.array([r["rt_ut_ratio_mean"] for r in rows], dtype=float)
    it_s = np.array([r["iteration_s_mean"] for r in rows], dtype=float)
    rt_s = np.array([r["rt_s_mean"] for r in rows], dtype=float)
    if not (np.isfinite(ratio).any() or np.isfinite(it_s).any() or np.isfinite(rt_s).any()):
        return None
    fig, axes = _figure(1, 2, (13, 4.8))
    ax = axes[0, 0]
    if np.isfinite(ratio).any():
        ok = np.isfinite(ratio)
        ax.plot(B[ok], ratio[ok], "o-", color="black", lw=1.6, label="mean RT/UT")
        for level, color, what in ((0.7, "tab:orange", "risk"), (1.0, "tab:red", "stalled")):
            ax.axhline(level, color=color, ls="--", lw=1, label=f"{level} ({what})")
        ax.set_ylim(0.0, max(1.1, float(np.nanmax(ratio[ok])) * 1.1))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rollout batch size B (envs)")
        ax.set_ylabel("RT / UT")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    else:
        _note(ax, "rt_ut_ratio not logged")
    ax = axes[0, 1]
    if np.isfinite(it_s).any() or np.isfinite(rt_s).any():
        for y, style, label in ((it_s, "o-", "iteration (RT + learn)"), (rt_s, "s--", "rollout RT")):
            ok = np.isfinite(y)
            if ok.any():
                ax.plot(B[ok], y[ok], style, lw=1.4, label=label)
        tf = summary["time_fit"]
        if tf is not None:
            grid = np.linspace(0, B.max() * 1.05, 100)
            ax.plot(grid, tf["a"] + tf["k"] * grid, color="tab:red", lw=1,
                    label=f"fit t = {_fmt(tf['a'])} s + {tf['k']:.3g} s/env · B")
        ax.set_xlabel("rollout batch size B (envs)")
        ax.set_ylabel("seconds per iteration (mean)")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    else:
        _note(ax, "rt_s / learn_s not logged")
    fig.suptitle(f"clocks vs batch size — {Path(summary['sweep_dir']).name}")
    return _save(fig, path)


_PLOTTERS = {
    "sweep_return_vs_steps.png": _plot_return_steps,
    "sweep_return_vs_wall.png": _plot_return_wall,
    "sweep_steps_to_target.png": _plot_steps_to_target,
    "sweep_gdc_bsimple.png": _plot_gdc_bsimple,
    "sweep_rt_ut.png": _plot_rt_ut,
}
assert tuple(_PLOTTERS) == FIGURES


# --------------------------------------------------------------------------- command line
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tclock.sweep_report SWEEP_DIR [--target X] [--metric KEY] ...``"""
    import argparse

    p = argparse.ArgumentParser(prog="python -m tclock.sweep_report", description=__doc__.splitlines()[0])
    p.add_argument("sweep_dir")
    p.add_argument("--target", type=float, default=None)
    p.add_argument("--metric", default="success_rate")
    p.add_argument("--smooth-steps", type=float, default=16384)
    p.add_argument("--include-incomplete", action="store_true")
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args(argv)
    try:
        s = summarize_sweep(a.sweep_dir, target=a.target, metric=a.metric, smooth_steps=a.smooth_steps,
                            write=not a.no_write, include_incomplete=a.include_incomplete)
    except (RunFormatError, ValueError) as e:
        print(f"error: {e}")
        return 2
    print(format_summary(s))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
