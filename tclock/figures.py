"""Figure plumbing shared by every PNG tclock writes (``tclock.plots`` for one run, the sweep
figures for a sweep directory): an Agg figure without pyplot, an atomic save, seed lines and
empty-panel notes.  Matplotlib is imported lazily."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from tclock.runlog import nanmean_rows, seed_matrix

DPI = 110


def figure(nrows: int, ncols: int, figsize: tuple[float, float]):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, dpi=DPI, format="png")
    os.replace(tmp, path)
    return path


def run_title(config: dict, run_dir: Path, what: str) -> str:
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


def seed_lines(ax, x: np.ndarray, values: np.ndarray, color: str, label: str) -> None:
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


def note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def x_axis(records: Sequence[dict], key: str) -> tuple[np.ndarray, str]:
    """A per-record x coordinate (seed mean if per-seed); falls back to the iteration."""
    labels = {"env_steps": "env steps (per seed)", "wall_s": "wall time (s)"}
    _, m = seed_matrix(records, key, keep_missing=True)
    x = nanmean_rows(m)
    if x.size and np.isfinite(x).any():
        return x, labels.get(key, key)
    its, _ = seed_matrix(records, "iteration", keep_missing=True)
    return its.astype(float), "iteration"


def finish_axes(ax, xlabel: str, ylabel: str, which: str = "major") -> None:
    """Axis labels, a light grid (``which``: major or both) and the legend, as every tclock figure has them."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which=which)
    ax.legend(loc="best", fontsize=8)
