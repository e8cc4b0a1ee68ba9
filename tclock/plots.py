"""PNG plots of one run directory (reads files through ``tclock.runlog`` only).

``plot_run(run_dir, out_dir=None)`` writes, into the run directory (or ``out_dir``):

==================  ======================================================================
``return.png``      2x2: episode return and success rate vs env steps and vs wall time
                    (each seed a thin line, the seed mean a thick one)
``rt_ut.png``       raw and windowed (``rt_ut_ratio_w50``) RT/UT vs iteration, shaded bands
                    at 0.3 / 0.7 / 1.0 (cheap / healthy / risk / stalled); ``num_envs`` on a
                    second axis when it changes during the run (DRBS)
``activation.png``  activation rate per seed + mean, and its rolling variance (20 rollouts)
                    against the write-up's 0.05 bound
``adv_skew.png``    advantage skew per seed + mean, lines at +-2 (the +-1 normal band shaded)
``gdc.png``         GDC, GDC(policy), GDC(value) with lines at 0.6 / 0.85, and ``b_simple``
                    (transitions, log scale) on a second panel
==================  ======================================================================

The lines and bands are the doctor's thresholds (``tclock.thresholds``: ``RT_UT_BANDS``,
``RECENT``, ``ACT_VAR``, ``SKEW_LIMIT``, ``SKEW_NORMAL``, ``GDC_LOW``, ``GDC_FRESH``; the numbers
above are their defaults).

A figure whose keys are absent from ``metrics.jsonl`` (or only ever null) is skipped: it is not
written and not returned.  Matplotlib is imported lazily and drives the Agg canvas directly (no
pyplot, no global backend switch), so importing this module is cheap and safe in notebooks.

``tclock.runlog.seed_matrix(records, key)`` turns a metric into an ``[n_iter, n_seeds]`` float
array, as in the doctor; the figure plumbing is ``tclock.figures``.  This module never imports
JAX, the loop or an agent.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tclock import runlog
from tclock.figures import figure, finish_axes, note, run_title, save, seed_lines, x_axis
from tclock.runlog import RunFormatError, has_values, load_config_or_empty, nanmean_rows, seed_matrix, trailing_mean
from tclock.thresholds import (ACT_VAR, GDC_FRESH, GDC_LOW, RATIO_WINDOW, RECENT, RT_UT_BANDS, SKEW_LIMIT,
                               SKEW_NORMAL)

FIGURES = ("return.png", "rt_ut.png", "activation.png", "adv_skew.png", "gdc.png")


def _plot_return(records, config, run_dir, path) -> Path | None:
    keys = [k for k in ("episode_return", "success_rate") if has_values(records, k)]
    if not keys:
        return None
    fig, axes = figure(2, 2, (12, 7.5))
    xs = [x_axis(records, "env_steps"), x_axis(records, "wall_s")]
    for row, (key, color, ylabel) in enumerate(
            (("episode_return", "tab:blue", "episode return"), ("success_rate", "tab:green", "success rate"))):
        _, m = seed_matrix(records, key, keep_missing=True)
        for col, (x, xlabel) in enumerate(xs):
            ax = axes[row, col]
            if key not in keys:
                note(ax, f"{key} not logged")
                continue
            seed_lines(ax, x, m, color, ylabel)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if key == "success_rate":
                ax.set_ylim(-0.03, 1.03)
            ax.legend(loc="best", fontsize=8)
    fig.suptitle(run_title(config, run_dir, "return and success"))
    return save(fig, path)


def _plot_rt_ut(records, config, run_dir, path) -> Path | None:
    if not has_values(records, "rt_ut_ratio"):
        return None
    its, raw = seed_matrix(records, "rt_ut_ratio", keep_missing=True)
    raw = nanmean_rows(raw)
    if has_values(records, "rt_ut_ratio_w50"):
        _, w = seed_matrix(records, "rt_ut_ratio_w50", keep_missing=True)
        w = nanmean_rows(w)
        w_label = "windowed (rt_ut_ratio_w50)"
    else:
        w = trailing_mean(raw, RATIO_WINDOW)
        w_label = f"windowed (last <={RATIO_WINDOW}, recomputed)"
    x = its.astype(float)
    fig, axes = figure(1, 1, (11, 5))
    ax = axes[0, 0]
    finite = np.concatenate([raw[np.isfinite(raw)], w[np.isfinite(w)]])
    top = max(1.4, float(np.percentile(finite, 98)) * 1.15) if finite.size else 1.4
    lo, mid, hi = RT_UT_BANDS
    ax.axhspan(0.0, lo, color="tab:blue", alpha=0.07, label=f"< {lo}: rollout cheap")
    ax.axhspan(lo, mid, color="tab:green", alpha=0.12, label=f"{lo}–{mid}: healthy")
    ax.axhspan(mid, hi, color="tab:orange", alpha=0.12, label=f"{mid}–{hi}: risk")
    ax.axhspan(hi, top, color="tab:red", alpha=0.10, label=f"> {hi}: stalled")
    ok = np.isfinite(raw)
    ax.plot(x[ok], raw[ok], color="0.35", lw=0.8, alpha=0.7, label="raw RT/UT")
    ok = np.isfinite(w)
    ax.plot(x[ok], w[ok], color="black", lw=2.0, label=w_label)
    ax.set_ylim(0.0, top)
    ax.set_xlabel("iteration")
    ax.set_ylabel("RT / UT")
    ax.grid(alpha=0.3)
    _, ne = seed_matrix(records, "num_envs", keep_missing=True)
    ne = nanmean_rows(ne)
    ne_ok = np.isfinite(ne)
    if ne_ok.sum() > 1 and np.nanmax(ne) != np.nanmin(ne):
        ax2 = ax.twinx()
        ax2.step(x[ne_ok], ne[ne_ok], where="post", color="tab:purple", lw=1.2, alpha=0.8, label="num_envs")
        ax2.set_ylabel("num_envs", color="tab:purple")
        ax2.legend(loc="upper right", fontsize=8)
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    fig.suptitle(run_title(config, run_dir, "rollout time / update interval"))
    return save(fig, path)


def _plot_activation(records, config, run_dir, path) -> Path | None:
    if not has_values(records, "activation_rate"):
        return None
    its, m = seed_matrix(records, "activation_rate", keep_missing=True)
    x = its.astype(float)
    fig, axes = figure(2, 1, (11, 6.5))
    ax = axes[0, 0]
    seed_lines(ax, x, m, "tab:green", "activation rate")
    ax.axhline(0.0, color="0.5", lw=0.8)
    ax.set_ylabel("share of transitions with reward > 0")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    mean = nanmean_rows(m)
    var = np.full(mean.shape, np.nan)
    for i in range(len(mean)):
        win = mean[max(0, i - RECENT + 1): i + 1]
        win = win[np.isfinite(win)]
        if win.size >= 2:
            var[i] = float(np.var(win))
    ax = axes[1, 0]
    ok = np.isfinite(var)
    ax.plot(x[ok], var[ok], color="tab:olive", lw=1.5, label=f"variance of mean, last {RECENT} rollouts")
    ax.axhline(ACT_VAR, color="tab:red", ls="--", lw=1, label=f"{ACT_VAR} (write-up bound)")
    finish_axes(ax, "iteration", "rolling variance")
    fig.suptitle(run_title(config, run_dir, "activation rate"))
    return save(fig, path)


def _plot_adv_skew(records, config, run_dir, path) -> Path | None:
    if not has_values(records, "adv_skew"):
        return None
    its, m = seed_matrix(records, "adv_skew", keep_missing=True)
    x = its.astype(float)
    fig, axes = figure(1, 1, (11, 5))
    ax = axes[0, 0]
    ax.axhspan(-SKEW_NORMAL, SKEW_NORMAL, color="tab:green", alpha=0.08, label=f"normal range ±{SKEW_NORMAL:g}")
    for sign in (1, -1):
        ax.axhline(sign * SKEW_LIMIT, color="tab:red", ls="--", lw=1,
                   label=f"±{SKEW_LIMIT:g} (risk)" if sign > 0 else None)
    seed_lines(ax, x, m, "tab:purple", "advantage skew")
    finish_axes(ax, "iteration", "skewness of advantages")
    fig.suptitle(run_title(config, run_dir, "advantage skew"))
    return save(fig, path)


GDC_STYLES = {"gdc": ("black", "-", "GDC (all parameters)"),
              "gdc_policy": ("tab:blue", "--", "GDC policy"),
              "gdc_value": ("tab:orange", ":", "GDC value")}


def _gdc_panel(ax, records, gdc_keys) -> None:
    """Seed-mean GDC lines (the all-parameter one with its seed range) and the threshold lines."""
    for key in gdc_keys:
        its, m = seed_matrix(records, key)
        x = its.astype(float)
        mean = nanmean_rows(m)
        ok = np.isfinite(mean)
        color, ls, label = GDC_STYLES[key]
        ax.plot(x[ok], mean[ok], color=color, ls=ls, marker="o", ms=3, lw=1.6, label=label)
        finite = np.isfinite(m)
        band = finite.any(axis=1)
        if key == "gdc" and m.shape[1] > 1 and band.any():
            lo = np.where(finite, m, np.inf).min(axis=1)
            hi = np.where(finite, m, -np.inf).max(axis=1)
            ax.fill_between(x[band], lo[band], hi[band], color="0.5", alpha=0.2, label="GDC seed range")
    ax.axhline(GDC_FRESH, color="tab:green", ls="--", lw=1, label=f"{GDC_FRESH} (fresh)")
    ax.axhline(GDC_LOW, color="tab:red", ls="--", lw=1, label=f"{GDC_LOW} (two clocks dominate)")
    ax.set_ylabel("mean pairwise cosine")
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)


def _b_simple_panel(ax, records, config) -> None:
    """Per-seed b_simple in transitions on a log axis (non-positive estimates dropped)."""
    its, m = seed_matrix(records, "b_simple")
    x = its.astype(float)
    m = np.where(m > 0, m, np.nan)  # log scale: drop nulls and non-positive estimates
    seed_lines(ax, x, m, "tab:brown", "b_simple")
    if np.isfinite(m).any():
        ax.set_yscale("log")
    T = config.get("unroll_length")
    ax.set_ylabel("b_simple (transitions)")
    if isinstance(T, (int, float)) and T > 0:
        ax.set_title(f"gradient noise scale; divide by unroll_length={T} for envs", fontsize=9)
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="best", fontsize=8)


def _plot_gdc(records, config, run_dir, path) -> Path | None:
    gdc_keys = [k for k in GDC_STYLES if has_values(records, k)]
    has_b = has_values(records, "b_simple")
    if not gdc_keys and not has_b:
        return None
    fig, axes = figure(2, 1, (11, 7))
    if gdc_keys:
        _gdc_panel(axes[0, 0], records, gdc_keys)
    else:
        note(axes[0, 0], "gdc not logged")
    if has_b:
        _b_simple_panel(axes[1, 0], records, config)
    else:
        note(axes[1, 0], "b_simple not logged")
    fig.suptitle(run_title(config, run_dir, "gradient direction consistency"))
    return save(fig, path)


_PLOTTERS = {
    "return.png": _plot_return,
    "rt_ut.png": _plot_rt_ut,
    "activation.png": _plot_activation,
    "adv_skew.png": _plot_adv_skew,
    "gdc.png": _plot_gdc,
}


def plot_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Writes the run's PNGs (see module docstring) and returns their paths, in FIGURES order.

    Raises ``RunFormatError`` if the directory or its metrics cannot be read or hold no record.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunFormatError(f"{run_dir} is not a directory: expected a tclock run directory")
    records = runlog.read_metrics(run_dir)
    if not records:
        raise RunFormatError(f"{run_dir / runlog.METRICS_FILE} holds no records: nothing to plot yet")
    config = load_config_or_empty(run_dir)
    out = Path(out_dir) if out_dir is not None else run_dir
    written: list[Path] = []
    for name in FIGURES:
        path = _PLOTTERS[name](records, config, run_dir, out / name)
        if path is not None:
            written.append(path)
    return written
