"""The PNGs of a sweep summary (the dict of :func:`tclock.sweep_analysis.summarize`), built on
:mod:`tclock.figures`; matplotlib is imported lazily.  Units as in :mod:`tclock.sweep_analysis`
(docs/design.md §2).

:data:`FIGURES`, each skipped (not written, not listed) when its data are absent:

* ``sweep_return_vs_steps.png`` / ``sweep_return_vs_wall.png``: learning curves per B (seed mean)
  against env steps per seed and against wall seconds, with the target line.
* ``sweep_steps_to_target.png``: S (iterations) and E (env steps per seed) per seed and their
  median per B, the fit ``S = S_min + c/B``, ``B_crit`` and its CI.
* ``sweep_gdc_bsimple.png``: mean GDC per B with the fresh and cliff lines, and ``b_simple``
  in envs against ``B_crit``.
* ``sweep_rt_ut.png``: mean RT/UT per B with the risk and stall lines, and seconds per
  iteration with the fit ``t(B) = a + k*B``.
* ``sweep_lr_heatmap.png`` (B x lr grids only): median env steps to target over (B, lr), log
  colour, "x" where the median seed did not reach, the best lr per B circled.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tclock import runlog, thresholds
from tclock.figures import figure, finish_axes, note, save
from tclock.runlog import RunFormatError, nanmean_rows, seed_matrix
from tclock.sweep_analysis import as_float
from tclock.sweep_axes import axis_of
from tclock.textfmt import fmt

__all__ = ["FIGURES", "write_figures"]


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
    logs = np.log2([r["batch"] for r in rows])
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
    fig, axes = figure(1, len(keys), (6.5 * len(keys), 4.8))
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
                ax.plot(x[ok], y[ok], color=color, lw=1.6, label=f"B={r['batch']}")
                drawn = True
        if not drawn:
            note(ax, f"{key} vs {xkey} not logged")
            continue
        if key == metric and summary["target"] is not None:
            ax.axhline(summary["target"], color="tab:red", ls="--", lw=1, label=f"target {fmt(summary['target'])}")
        finish_axes(ax, xlabel, f"{key} (mean over seeds)")
    fig.suptitle(f"learning curves by batch size B (envs) — {Path(summary['sweep_dir']).name}")
    return save(fig, path)


def _plot_return_steps(summary, records, path):
    return _curve_figure(summary, records, path, "env_steps")


def _plot_return_wall(summary, records, path):
    return _curve_figure(summary, records, path, "wall_s")


def _plot_steps_to_target(summary, records, path) -> Path | None:
    rows = summary["runs"]
    if not any(r["n_reached"] for r in rows):
        return None
    fit = summary["fit"]
    axis = axis_of(summary)
    per_b = summary["unroll_length"] if axis.field == "num_envs" else 1  # E = S * B * per_b
    fig, axes = figure(1, 2, (13, 5))
    B = np.array([r["batch"] for r in rows], dtype=float)
    for ax, key, unit, scale in ((axes[0, 0], "steps_to_target", axis.steps, 1.0),
                                 (axes[0, 1], "samples_to_target", axis.samples, None)):
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
            y = s_fit if scale == 1.0 else s_fit * grid * per_b
            ax.plot(grid, y, color="tab:blue", lw=1.8, label="fit S = S_min + c/B" if scale == 1.0 else
                    ("fit E = S_min·B·T + E_min" if per_b != 1 else "fit E = S_min·B + E_min"))
            bc = as_float(fit["b_crit"])
            if np.isfinite(bc):
                ax.axvline(bc, color="tab:red", ls="--", lw=1.2, label=f"B_crit ≈ {fmt(bc)} {axis.unit}")
                if np.isfinite(as_float(fit["ci_low"])):
                    ax.axvspan(fit["ci_low"], fit["ci_high"], color="tab:red", alpha=0.1,
                               label=f"{fit['ci_level']:.0%} CI")
        for b, r in zip(B, rows):
            if not np.isfinite(r[key]["median"]):
                ax.annotate("not reached", (b, 1.0), xycoords=("data", "axes fraction"), ha="center", va="top",
                            fontsize=8, color="tab:red", rotation=90)
        ax.set_xscale("log", base=2)
        if scale is None:
            ax.set_yscale("log")
        finish_axes(ax, f"{axis.label} B ({axis.unit})", f"to target ({unit})", which="both")
    why = summary["fit_note"] if fit is None else ""
    fig.suptitle(f"steps to {summary['metric']} target — {Path(summary['sweep_dir']).name}"
                 + (f"\n{why}" if why else ""), fontsize=10 if why else None)
    return save(fig, path)


def _plot_gdc_bsimple(summary, records, path) -> Path | None:
    rows = summary["runs"]
    axis = axis_of(summary)
    B = np.array([r["batch"] for r in rows], dtype=float)
    gdc = np.array([r["gdc_mean"] for r in rows], dtype=float)
    # b_simple in B's unit: envs (transitions / T) for the rollout batch, transitions for SAC's gradient batch
    bse = np.array([r["b_simple_envs" if axis.field == "num_envs" else "b_simple_transitions"] for r in rows],
                   dtype=float)
    if not (np.isfinite(gdc).any() or np.isfinite(bse).any()):
        return None
    fig, axes = figure(2, 1, (10, 7.5))
    bc = as_float(summary["b_crit"])
    ax = axes[0, 0]
    if np.isfinite(gdc).any():
        ok = np.isfinite(gdc)
        ax.plot(B[ok], gdc[ok], "o-", color="black", lw=1.6, label="GDC (mean over diagnostic iterations, seeds)")
        fresh, low = thresholds.GDC_FRESH, thresholds.GDC_LOW
        ax.axhline(fresh, color="tab:green", ls="--", lw=1, label=f"{fresh} (fresh)")
        ax.axhline(low, color="tab:red", ls="--", lw=1, label=f"{low} (two clocks dominate)")
        if summary["gdc_cliff"] is not None:
            ax.axvline(summary["gdc_cliff"], color="tab:red", lw=0.8, alpha=0.6)
        if np.isfinite(bc):
            ax.axvline(bc, color="tab:blue", ls=":", lw=1.4, label=f"B_crit ≈ {fmt(bc)} {axis.unit}")
        ax.set_xscale("log", base=2)
        finish_axes(ax, f"{axis.label} B ({axis.unit})", "mean pairwise cosine")
    else:
        note(ax, "gdc not logged")
    ax = axes[1, 0]
    if np.isfinite(bse).any():
        ok = np.isfinite(bse)
        ax.plot(B[ok], bse[ok], "s-", color="tab:brown", lw=1.6,
                label="b_simple (envs = transitions / T)" if axis.field == "num_envs" else "b_simple (transitions)")
        if np.isfinite(bc):
            ax.axhline(bc, color="tab:blue", ls=":", lw=1.4, label=f"B_crit ≈ {fmt(bc)} {axis.unit}")
            ci = summary["b_crit_ci"]
            if ci is not None:
                ax.axhspan(ci[0], ci[1], color="tab:blue", alpha=0.1, label="B_crit CI")
        ax.set_xscale("log", base=2)
        if (bse[ok] > 0).all():
            ax.set_yscale("log")
        finish_axes(ax, f"{axis.label} B ({axis.unit})", f"gradient noise scale ({axis.unit})", which="both")
    else:
        note(ax, "b_simple not logged")
    fig.suptitle(f"gradient diagnostics vs batch size — {Path(summary['sweep_dir']).name}")
    return save(fig, path)


def _plot_rt_ut(summary, records, path) -> Path | None:
    rows = summary["runs"]
    axis = axis_of(summary)
    B = np.array([r["batch"] for r in rows], dtype=float)
    ratio = np.array([r["rt_ut_ratio_mean"] for r in rows], dtype=float)
    it_s = np.array([r["iteration_s_mean"] for r in rows], dtype=float)
    rt_s = np.array([r["rt_s_mean"] for r in rows], dtype=float)
    if not (np.isfinite(ratio).any() or np.isfinite(it_s).any() or np.isfinite(rt_s).any()):
        return None
    fig, axes = figure(1, 2, (13, 4.8))
    ax = axes[0, 0]
    if np.isfinite(ratio).any():
        ok = np.isfinite(ratio)
        ax.plot(B[ok], ratio[ok], "o-", color="black", lw=1.6, label="mean RT/UT")
        for level, color, what in ((thresholds.RT_HIGH, "tab:orange", "risk"),
                                  (thresholds.RT_STALL, "tab:red", "stalled")):
            ax.axhline(level, color=color, ls="--", lw=1, label=f"{level} ({what})")
        ax.set_ylim(0.0, max(1.1, float(np.nanmax(ratio[ok])) * 1.1))
        ax.set_xscale("log", base=2)
        finish_axes(ax, f"{axis.label} B ({axis.unit})", "RT / UT")
    else:
        note(ax, "rt_ut_ratio not logged")
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
                    label=f"fit t = {fmt(tf['a'])} s + {tf['k']:.3g} s/{axis.unit[:-1]} · B")
        finish_axes(ax, f"{axis.label} B ({axis.unit})", "seconds per iteration (mean)")
    else:
        note(ax, "rt_s / learn_s not logged")
    fig.suptitle(f"clocks vs batch size — {Path(summary['sweep_dir']).name}")
    return save(fig, path)


def _plot_lr_heatmap(summary, records, path) -> Path | None:
    grid = summary.get("lr_grid")
    if not grid:
        return None
    from matplotlib.colors import LogNorm

    from tclock.sweep_lr import lr_key

    lrs, sizes = grid["lrs"], grid["batch_sizes"]
    e = np.full((len(lrs), len(sizes)), np.nan)
    for c in grid["cells"]:
        e[lrs.index(c["lr"]), sizes.index(c["batch"])] = as_float(c["samples_median"])
    fig, axes = figure(1, 1, (1.6 + 1.1 * len(sizes), 1.6 + 0.8 * len(lrs)))
    ax = axes[0, 0]
    finite = e[np.isfinite(e)]
    norm = LogNorm(vmin=finite.min(), vmax=finite.max()) if finite.size and finite.min() > 0 else None
    im = ax.imshow(np.ma.masked_invalid(e), origin="lower", aspect="auto", cmap="viridis_r", norm=norm)
    for i in range(len(lrs)):
        for j in range(len(sizes)):
            ax.text(j, i, fmt(e[i, j]) if np.isfinite(e[i, j]) else "x", ha="center", va="center", fontsize=8,
                    color="white" if np.isfinite(e[i, j]) else "tab:red")
    for b in grid["best_lr"]:
        if b["lr"] is not None:
            ax.scatter(sizes.index(b["batch"]), lrs.index(b["lr"]), s=900, facecolors="none",
                       edgecolors="tab:red", linewidths=1.5)
    ax.set_xticks(range(len(sizes)), [str(b) for b in sizes])
    ax.set_yticks(range(len(lrs)), [lr_key(x) for x in lrs])
    axis = axis_of(summary)
    ax.set_xlabel(f"{axis.label} B ({axis.unit})")
    ax.set_ylabel("learning rate")
    fig.colorbar(im, ax=ax, label=f"median {axis.samples} to target")
    fig.suptitle(f"E to target over (B, lr) — {Path(summary['sweep_dir']).name} (circle: best lr per B)",
                 fontsize=10)
    return save(fig, path)


_PLOTTERS = {
    "sweep_return_vs_steps.png": _plot_return_steps,
    "sweep_return_vs_wall.png": _plot_return_wall,
    "sweep_steps_to_target.png": _plot_steps_to_target,
    "sweep_gdc_bsimple.png": _plot_gdc_bsimple,
    "sweep_rt_ut.png": _plot_rt_ut,
    "sweep_lr_heatmap.png": _plot_lr_heatmap,
}
FIGURES = tuple(_PLOTTERS)  # the file names, in the order they are written


def write_figures(summary: dict, out_dir: str | os.PathLike) -> list[Path]:
    """Writes the figures whose data are present into ``out_dir``; returns their paths, in FIGURES order."""
    out = Path(out_dir)
    records = _load_curves(Path(summary["sweep_dir"]), summary["runs"])
    written = []
    for name, plot in _PLOTTERS.items():
        path = plot(summary, records, out / name)
        if path is not None:
            written.append(path)
    return written
