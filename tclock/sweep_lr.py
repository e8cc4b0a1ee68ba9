"""The learning rate in a batch-size sweep: the B x lr grid's analysis, and the warning that a
fixed-lr sweep's small-B points measure the step size rather than the batch.  NumPy only; reads
the run rows of :func:`tclock.sweep_analysis.summarize_run` (each carries its ``lr``).

Why (docs/metrics.md, "Critical batch size and the learning rate"): McCandlish et al. (2018)
define the critical batch with the step size tuned at every B.  With one lr for every B, a lr that
is right for large batches can be too large for small ones; the env steps to target E(B) then
*rise* as B falls, which ``E(B) = E_min (1 + B/B_crit)`` cannot produce, and the fit mixes the
two effects (a raised E at small B raises ``c = E_min/T`` and so ``B_crit``).

* :func:`step_size_limited`: on one lr's rows, the smallest B whose E is clearly above the best E
  at a larger B (median above :data:`tclock.thresholds.STEP_LIMITED_RISE` x it, and the quartiles
  apart).  The sweep report warns, names the grid command that resolves it, and does not trust
  that fit.
* :func:`analyse_grid`: with more than one lr, the best lr per B (its bootstrap frequency), the
  tuned rows the critical-batch fit uses (:func:`tclock.critical.bootstrap_tuned_b_crit` puts the
  selection inside every resample), one fixed-lr fit per lr beside it, the heat map's cells, and
  the B whose best lr sits at an edge of the grid (the tuned S there is only an upper bound, so
  the tuned fit is not trusted until the grid is widened).
"""
from __future__ import annotations

import math

import numpy as np

from tclock import thresholds

__all__ = ["lr_key", "split_by_lr", "step_size_limited", "grid_steps", "suggested_lrs", "grid_command",
           "analyse_grid"]


def lr_key(lr: float) -> str:
    """The text of a learning rate in run names and summary keys: ``3e-04``."""
    return f"{float(lr):.0e}" if float(lr) == float(f"{float(lr):.0e}") else f"{float(lr):.3g}"


def split_by_lr(rows: list[dict]) -> dict[float, list[dict]]:
    """Rows grouped by their ``lr`` (ascending), each group sorted by B."""
    out: dict[float, list[dict]] = {}
    for r in sorted(rows, key=lambda r: (r["lr"], r["batch"])):
        out.setdefault(r["lr"], []).append(r)
    return out


def _e(r: dict, q: str) -> float:
    v = r["samples_to_target"][q]
    return v if isinstance(v, (int, float)) and math.isfinite(v) else math.inf


def step_size_limited(rows: list[dict]) -> dict | None:
    """On one lr's rows (sorted by B): the evidence that E rises as B falls, or None.

    For each B (smallest first) the best (lowest median E) larger B is found; B is flagged when
    its median E is above ``STEP_LIMITED_RISE`` x that E and its 25th percentile lies above the
    other's 75th (a median not reached counts as infinitely late).  Returns
    ``{"batch", "samples", "best_batch", "best_samples", "rise", "limited"}`` (E in the axis's
    samples, env steps per seed for ``num_envs``) for the
    largest flagged B (``limited``: every flagged B), or None when no B is flagged or nothing
    larger reached the target.
    """
    limited = []
    found = None
    for i, r in enumerate(rows):
        larger = [o for o in rows[i + 1:] if math.isfinite(_e(o, "median"))]
        if not larger:
            continue
        best = min(larger, key=lambda o: _e(o, "median"))
        e, e_best = _e(r, "median"), _e(best, "median")
        if e > thresholds.STEP_LIMITED_RISE * e_best and _e(r, "q25") > _e(best, "q75"):
            limited.append(r["batch"])
            found = {"batch": r["batch"], "samples": e if math.isfinite(e) else math.nan,
                     "best_batch": best["batch"], "best_samples": e_best,
                     "rise": e / e_best if math.isfinite(e) else math.inf}
    if found is None:
        return None
    return {**found, "limited": limited}


def suggested_lrs(lr: float, widen: bool = False) -> list[float]:
    """A log grid in ~3x steps: ending at ``lr`` (small batches want a smaller step when E rises as
    B falls; McCandlish: eps_opt(B) = eps_max / (1 + B_noise/B)), or with ``widen`` two steps on
    each side of it."""
    exps = (-2, -1, 0, 1, 2) if widen else (-2, -1, 0)
    return [float(lr) if e == 0 else float(f"{lr * 10 ** (e / 2):.0e}") for e in exps]


def grid_command(lr: float, batch_sizes: list[int], out: str, widen: bool = False) -> str:
    """The ``tclock sweep`` command that re-measures a sweep with the lr tuned per B."""
    lrs = " ".join(lr_key(x) for x in suggested_lrs(lr, widen))
    sizes = " ".join(str(b) for b in batch_sizes)
    return f"tclock sweep --lrs {lrs} --batch-sizes {sizes} --out {out}"


def grid_steps(by_lr: dict[float, list[dict]], batch_sizes: list[int]) -> np.ndarray:
    """``[n_lr, n_b, n_seeds]`` iterations to target per seed (inf = not reached, NaN = no run or
    no such seed), the input of :func:`tclock.critical.bootstrap_tuned_b_crit`."""
    n_seeds = max(len(r["steps_to_target"]["per_seed"]) for rows in by_lr.values() for r in rows)
    sp = np.full((len(by_lr), len(batch_sizes), n_seeds), np.nan)
    col = {b: j for j, b in enumerate(batch_sizes)}
    for i, rows in enumerate(by_lr.values()):
        for r in rows:
            ps = np.array(r["steps_to_target"]["per_seed"], dtype=float)
            sp[i, col[r["batch"]], : ps.size] = np.where(np.isfinite(ps), ps, np.inf)
    return sp


def _cell(r: dict) -> dict:
    st = r["samples_to_target"]
    return {"batch": r["batch"], "lr": r["lr"], "run": r["run"], "n_reached": r["n_reached"],
            "seeds": r["seeds"], "samples_median": st["median"], "samples_q25": st["q25"],
            "samples_q75": st["q75"], "steps_median": r["steps_to_target"]["median"],
            "b_crit_online_envs": r.get("b_crit_online_envs"), "b_simple_envs": r.get("b_simple_envs"),
            "online_estimates_envs": r.get("online_estimates_envs")}


def analyse_grid(rows: list[dict], frequency: np.ndarray, fixed: dict[float, dict]) -> tuple[dict, list[dict]]:
    """The ``lr_grid`` section of a grid sweep's summary and the tuned rows.

    Args:
      rows: every (B, lr) run row.
      frequency: ``[n_b, n_lr]`` best-lr frequencies over the bootstrap
        (:class:`tclock.critical.TunedBootstrap`), B and lr ascending.
      fixed: per lr, the fixed-lr analysis (:func:`tclock.sweep_analysis.analyse_runs` on that lr's
        rows).

    Returns ``(section, tuned_rows)``: ``section`` holds ``lrs``, ``batch_sizes``, ``cells`` (one
    per run: E median and quartiles, seeds reached), ``best_lr`` (per B: ``lr``, ``lr_low`` /
    ``lr_high`` (the smallest and largest lr chosen in at least 5% of the resamples),
    ``frequency`` per lr key), ``edge`` (B whose best lr is the smallest or largest of the grid,
    with the side) and ``fixed`` (per lr key: ``b_crit``, ``b_crit_ci``, ``r2``, ``trusted``,
    ``distrust``, ``step_size_limited``).  ``tuned_rows``: at each B the best lr's row (the lr
    whose median S is lowest; B without any reached lr keep the smallest lr's row).
    """
    by_lr = split_by_lr(rows)
    lrs = list(by_lr)
    batch_sizes = sorted({r["batch"] for r in rows})
    cells = {(r["batch"], r["lr"]): r for r in rows}
    tuned_rows, best, edge = [], [], []
    for j, b in enumerate(batch_sizes):
        ran = [lr for lr in lrs if (b, lr) in cells]
        steps = [cells[(b, lr)]["steps_to_target"]["median"] for lr in ran]
        finite = [(s, lr) for s, lr in zip(steps, ran) if isinstance(s, (int, float)) and math.isfinite(s)]
        chosen = min(finite)[1] if finite else ran[0]
        tuned_rows.append(cells[(b, chosen)])
        freq = {lr_key(lr): float(frequency[j, i]) for i, lr in enumerate(lrs)}
        picked = [lr for i, lr in enumerate(lrs) if frequency[j, i] >= 0.05]
        best.append({"batch": b, "lr": chosen if finite else None, "frequency": freq,
                     "lr_low": min(picked) if picked else None, "lr_high": max(picked) if picked else None})
        if finite and len(lrs) > 1 and chosen in (lrs[0], lrs[-1]):
            edge.append({"batch": b, "lr": chosen, "side": "smallest" if chosen == lrs[0] else "largest"})
    fixed_out = {lr_key(lr): {"lr": lr, "b_crit": a["b_crit"], "b_crit_ci": a["b_crit_ci"], "r2": a["r2"],
                              "trusted": a["b_crit_trusted"], "distrust": a["b_crit_distrust"],
                              "step_size_limited": a.get("step_size_limited")}
                 for lr, a in fixed.items()}
    section = {"lrs": lrs, "batch_sizes": batch_sizes, "cells": [_cell(r) for r in rows], "best_lr": best,
               "edge": edge, "fixed": fixed_out}
    return section, tuned_rows
