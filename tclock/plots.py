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

A figure whose keys are absent from ``metrics.jsonl`` (or only ever null) is skipped: it is not
written and not returned.  Matplotlib is imported lazily and drives the Agg canvas directly (no
pyplot, no global backend switch), so importing this module is cheap and safe in notebooks.

``seed_matrix(records, key)`` turns a metric into an ``[n_iter, n_seeds]`` float array; the
doctor (``tclock.doctor``) uses the same helper.  This module never imports JAX, the loop or
an agent.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tclock import runlog
from tclock.runlog import RunFormatError

DPI = 110
RT_UT_BANDS = (0.3, 0.7, 1.0)
GDC_LINES = (0.6, 0.85)
SKEW_LIMIT = 2.0
ACTIVATION_VAR_LIMIT = 0.05
ACTIVATION_VAR_WINDOW = 20

FIGURES = ("return.png", "rt_ut.png", "activation.png", "adv_skew.png", "gdc.png")


# --------------------------------------------------------------------------- shared helper
def _to_float(value: Any, key: str, record: dict) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RunFormatError(
            f"metrics.jsonl: iteration {record.get('iteration', '?')}: {key!r} holds "
            f"{value!r} ({type(value).__name__}); expected a number, null or a list of them")
    return float(value)


def seed_matrix(records: Sequence[dict], key: str, keep_missing: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(iterations, values)`` of one metric across records.

    ``values`` is a float array ``[n_iter, n_seeds]`` with NaN for null or missing entries.
    A scalar metric is one column; ragged per-seed lists are padded with NaN.  Records that
    lack ``key`` are dropped, unless ``keep_missing`` is true (then every record gives a row,
    all NaN where the key is absent, so rows line up with ``records``).  ``iterations`` is an
    int array (``-1`` where a record has no ``iteration``).  A key found nowhere gives shapes
    ``(0,)`` and ``(0, 0)`` (or ``(n, 0)`` with ``keep_missing``).  A non-numeric value raises
    ``RunFormatError`` naming the key and iteration.
    """
    rows: list[list[float]] = []
    iters: list[int] = []
    for record in records:
        if key not in record and not keep_missing:
            continue
        raw = record.get(key)
        if isinstance(raw, (list, tuple)):
            row = [_to_float(v, key, record) for v in raw]
        elif key in record:
            row = [_to_float(raw, key, record)]
        else:
            row = []
        rows.append(row)
        it = record.get("iteration")
        iters.append(int(it) if isinstance(it, (int, float)) and not isinstance(it, bool) else -1)
    n_seeds = max((len(r) for r in rows), default=0)
    if not any(key in r for r in records):
        n_seeds = 0
    out = np.full((len(rows), n_seeds), np.nan, dtype=float)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return np.asarray(iters, dtype=int), out


def nanmean_rows(values: np.ndarray) -> np.ndarray:
    """Mean over seeds (axis 1) ignoring NaN; NaN where a row has no finite value."""
    if values.ndim != 2 or values.shape[1] == 0:
        return np.full(values.shape[0] if values.ndim else 0, np.nan)
    finite = np.isfinite(values)
    count = finite.sum(axis=1)
    total = np.where(finite, values, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def has_values(records: Sequence[dict], key: str) -> bool:
    """True when at least one record carries a finite value for ``key``."""
    _, m = seed_matrix(records, key)
    return bool(m.size and np.isfinite(m).any())


# --------------------------------------------------------------------------- figure plumbing
def _figure(nrows: int, ncols: int, figsize: tuple[float, float]):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, dpi=DPI, format="png")
    os.replace(tmp, path)
    return path


def _title(config: dict, run_dir: Path, what: str) -> str:
    env = config.get("env", "?")
    algo = config.get("algo")
    num_envs = config.get("num_envs", "?")
    drbs = config.get("drbs")
    drbs_on = bool(drbs.get("enabled")) if isinstance(drbs, dict) else bool(drbs)
    parts = [f"{what} — {run_dir.name}", f"env={env}"]
    if algo:
        parts.append(f"algo={algo}")
    parts.append(f"num_envs={num_envs}" + (" (DRBS)" if drbs_on else ""))
    return "  ".join(parts)


def _seed_lines(ax, x: np.ndarray, values: np.ndarray, color: str, label: str) -> None:
    """Each seed a thin line, the seed mean a thick one (NaN points dropped per line)."""
    if values.size == 0:
        return
    n_seeds = values.shape[1]
    if n_seeds > 1:
        for s in range(n_seeds):
            ok = np.isfinite(x) & np.isfinite(values[:, s])
            if ok.any():
                ax.plot(x[ok], values[ok, s], color=color, lw=0.7, alpha=0.35)
    mean = nanmean_rows(values)
    ok = np.isfinite(x) & np.isfinite(mean)
    marker = "o" if ok.sum() <= 30 else None
    ax.plot(x[ok], mean[ok], color=color, lw=2.0, marker=marker, ms=3,
            label=f"{label} (mean of {n_seeds} seeds)" if n_seeds > 1 else label)


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _x_axis(records: Sequence[dict], key: str) -> tuple[np.ndarray, str]:
    """A per-record x coordinate (seed mean if per-seed); falls back to the iteration."""
    labels = {"env_steps": "env steps (per seed)", "wall_s": "wall time (s)"}
    _, m = seed_matrix(records, key, keep_missing=True)
    x = nanmean_rows(m)
    if x.size and np.isfinite(x).any():
        return x, labels.get(key, key)
    its, _ = seed_matrix(records, "iteration", keep_missing=True)
    return its.astype(float), "iteration"


# --------------------------------------------------------------------------- figures
def _plot_return(records, config, run_dir, path) -> Path | None:
    keys = [k for k in ("episode_return", "success_rate") if has_values(records, k)]
    if not keys:
        return None
    fig, axes = _figure(2, 2, (12, 7.5))
    xs = [_x_axis(records, "env_steps"), _x_axis(records, "wall_s")]
    for row, (key, color, ylabel) in enumerate(
            (("episode_return", "tab:blue", "episode return"), ("success_rate", "tab:green", "success rate"))):
        _, m = seed_matrix(records, key, keep_missing=True)
        for col, (x, xlabel) in enumerate(xs):
            ax = axes[row, col]
            if key not in keys:
                _note(ax, f"{key} not logged")
                continue
            _seed_lines(ax, x, m, color, ylabel)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if key == "success_rate":
                ax.set_ylim(-0.03, 1.03)
            ax.legend(loc="best", fontsize=8)
    fig.suptitle(_title(config, run_dir, "return and success"))
    return _save(fig, path)


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
        w = trailing_mean(raw, 50)
        w_label = "windowed (last <=50, recomputed)"
    x = its.astype(float)
    fig, axes = _figure(1, 1, (11, 5))
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
    fig.suptitle(_title(config, run_dir, "rollout time / update interval"))
    return _save(fig, path)


def trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last <= ``window`` finite values up to each index (NaN before the first)."""
    out = np.full(values.shape, np.nan)
    seen: list[float] = []
    for i, v in enumerate(values):
        if np.isfinite(v):
            seen.append(float(v))
        if seen:
            out[i] = float(np.mean(seen[-window:]))
    return out


def _plot_activation(records, config, run_dir, path) -> Path | None:
    if not has_values(records, "activation_rate"):
        return None
    its, m = seed_matrix(records, "activation_rate", keep_missing=True)
    x = its.astype(float)
    fig, axes = _figure(2, 1, (11, 6.5))
    ax = axes[0, 0]
    _seed_lines(ax, x, m, "tab:green", "activation rate")
    ax.axhline(0.0, color="0.5", lw=0.8)
    ax.set_ylabel("share of transitions with reward > 0")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    mean = nanmean_rows(m)
    var = np.full(mean.shape, np.nan)
    for i in range(len(mean)):
        win = mean[max(0, i - ACTIVATION_VAR_WINDOW + 1): i + 1]
        win = win[np.isfinite(win)]
        if win.size >= 2:
            var[i] = float(np.var(win))
    ax = axes[1, 0]
    ok = np.isfinite(var)
    ax.plot(x[ok], var[ok], color="tab:olive", lw=1.5, label=f"variance of mean, last {ACTIVATION_VAR_WINDOW} rollouts")
    ax.axhline(ACTIVATION_VAR_LIMIT, color="tab:red", ls="--", lw=1, label=f"{ACTIVATION_VAR_LIMIT} (write-up bound)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("rolling variance")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.suptitle(_title(config, run_dir, "activation rate"))
    return _save(fig, path)


def _plot_adv_skew(records, config, run_dir, path) -> Path | None:
    if not has_values(records, "adv_skew"):
        return None
    its, m = seed_matrix(records, "adv_skew", keep_missing=True)
    x = its.astype(float)
    fig, axes = _figure(1, 1, (11, 5))
    ax = axes[0, 0]
    ax.axhspan(-1.0, 1.0, color="tab:green", alpha=0.08, label="normal range ±1")
    for sign in (1, -1):
        ax.axhline(sign * SKEW_LIMIT, color="tab:red", ls="--", lw=1,
                   label=f"±{SKEW_LIMIT:g} (risk)" if sign > 0 else None)
    _seed_lines(ax, x, m, "tab:purple", "advantage skew")
    ax.set_xlabel("iteration")
    ax.set_ylabel("skewness of advantages")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.suptitle(_title(config, run_dir, "advantage skew"))
    return _save(fig, path)


def _plot_gdc(records, config, run_dir, path) -> Path | None:
    gdc_keys = [k for k in ("gdc", "gdc_policy", "gdc_value") if has_values(records, k)]
    has_b = has_values(records, "b_simple")
    if not gdc_keys and not has_b:
        return None
    fig, axes = _figure(2, 1, (11, 7))
    ax = axes[0, 0]
    if gdc_keys:
        styles = {"gdc": ("black", "-", "GDC (all parameters)"),
                  "gdc_policy": ("tab:blue", "--", "GDC policy"),
                  "gdc_value": ("tab:orange", ":", "GDC value")}
        for key in gdc_keys:
            its, m = seed_matrix(records, key)
            x = its.astype(float)
            mean = nanmean_rows(m)
            ok = np.isfinite(mean)
            color, ls, label = styles[key]
            ax.plot(x[ok], mean[ok], color=color, ls=ls, marker="o", ms=3, lw=1.6, label=label)
            if key == "gdc" and m.shape[1] > 1:
                finite = np.isfinite(m)
                if finite.any(axis=1).any():
                    lo = np.where(finite, m, np.inf).min(axis=1)
                    hi = np.where(finite, m, -np.inf).max(axis=1)
                    band = finite.any(axis=1)
                    ax.fill_between(x[band], lo[band], hi[band], color="0.5", alpha=0.2, label="GDC seed range")
        ax.axhline(GDC_LINES[1], color="tab:green", ls="--", lw=1, label=f"{GDC_LINES[1]} (fresh)")
        ax.axhline(GDC_LINES[0], color="tab:red", ls="--", lw=1, label=f"{GDC_LINES[0]} (two clocks dominate)")
        ax.set_ylabel("mean pairwise cosine")
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    else:
        _note(ax, "gdc not logged")
    ax = axes[1, 0]
    if has_b:
        its, m = seed_matrix(records, "b_simple")
        x = its.astype(float)
        m = np.where(m > 0, m, np.nan)  # log scale: drop nulls and non-positive estimates
        _seed_lines(ax, x, m, "tab:brown", "b_simple")
        if np.isfinite(m).any():
            ax.set_yscale("log")
        T = config.get("unroll_length")
        ax.set_ylabel("b_simple (transitions)")
        if isinstance(T, (int, float)) and T > 0:
            ax.set_title(f"gradient noise scale; divide by unroll_length={T} for envs", fontsize=9)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3, which="both")
        ax.legend(loc="best", fontsize=8)
    else:
        _note(ax, "b_simple not logged")
    fig.suptitle(_title(config, run_dir, "gradient direction consistency"))
    return _save(fig, path)


_PLOTTERS = {
    "return.png": _plot_return,
    "rt_ut.png": _plot_rt_ut,
    "activation.png": _plot_activation,
    "adv_skew.png": _plot_adv_skew,
    "gdc.png": _plot_gdc,
}


def load_config_or_empty(run_dir: Path) -> dict:
    """The run's config, or {} when the run has no config file (a malformed one still raises)."""
    if not (run_dir / runlog.CONFIG_FILE).exists():
        return {}
    return runlog.read_config(run_dir)


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
