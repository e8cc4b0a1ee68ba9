"""The doctor's gradient rules (``gdc``, ``b_simple``) and the solved-task downgrade.

Same conventions as ``tclock.doctor_rules`` (seed means, ``tclock.thresholds`` names in brackets
with their default numbers, one ``Row`` per signal); ``tclock.doctor_diagnose`` applies them.

``gdc``               Mean pairwise cosine of K minibatch gradients, logged on diagnostic
                      iterations only.  Judged on the median of the last 3 [GDC_RECENT]
                      measurements: > 0.85 [GDC_FRESH] healthy (fresh), 0.6 [GDC_LOW]-0.85 watch,
                      < 0.6 two-clocks (dominated).  Never logged -> not-checkable.
(solved task)         When the seeds' mean ``success_rate`` over the last 10 [SOLVED_WINDOW]
                      iterations is >= 0.9 [SOLVED_SUCCESS], a two-clocks/risk verdict of ``gdc`` or
                      ``adv_skew`` is downgraded to watch: at an optimum the mean gradient vanishes
                      (low GDC) and the rare failures skew the advantages, so neither means stale
                      data there.  (This departs from the write-up, whose thresholds would flag
                      every solved run.)
``b_simple``          (info) Median gradient noise scale over the run, in transitions and in envs
                      (``tclock.critical.b_simple_to_envs``: transitions / ``unroll_length``), next
                      to the run's ``num_envs``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tclock.critical import b_simple_to_envs
from tclock.doctor_rules import Row, key_present, num, seed_range
from tclock.runlog import nanmean_rows, seed_matrix
from tclock.thresholds import GDC_FRESH, GDC_LOW, GDC_RECENT, SOLVED_SUCCESS, SOLVED_WINDOW

GDC_THRESHOLD = (f">{GDC_FRESH} healthy; {GDC_LOW}–{GDC_FRESH} watch; <{GDC_LOW} two-clocks "
                 f"(median of last {GDC_RECENT})")


def _recent_median(records: Sequence[dict], key: str) -> float | None:
    _, m = seed_matrix(records, key)
    mean = nanmean_rows(m)
    mean = mean[np.isfinite(mean)]
    return float(np.median(mean[-GDC_RECENT:])) if mean.size else None


def gdc_row(records: Sequence[dict]) -> Row:
    """The GDC rule; a solved task is left to ``downgrade_if_solved``."""
    if not key_present(records, "gdc"):
        return Row("gdc", "gdc never logged (enable gradient diagnostics with gdc_every >= 1)", GDC_THRESHOLD,
                   "not-checkable")
    its, m = seed_matrix(records, "gdc")
    mean = nanmean_rows(m)
    ok = np.isfinite(mean)
    if not ok.any():
        return Row("gdc", "gdc logged but only ever null", GDC_THRESHOLD, "not-checkable")
    vals, vi, mat = mean[ok], its[ok], m[ok]
    recent = float(np.median(vals[-GDC_RECENT:]))
    evidence = (f"recent {num(recent)} (median of last {min(GDC_RECENT, vals.size)} of {vals.size}); latest "
                f"{num(float(vals[-1]))} at it {int(vi[-1])}{seed_range(mat[-1])}; run min {num(float(vals.min()))}")
    data = {"recent": recent, "latest": float(vals[-1]), "min": float(vals.min()), "measurements": int(vals.size)}
    for part in ("gdc_policy", "gdc_value"):
        p = _recent_median(records, part) if key_present(records, part) else None
        if p is not None:
            data[part] = p
            evidence += f"; {part.split('_')[1]} {num(p)}"
    if recent > GDC_FRESH:
        return Row("gdc", evidence, GDC_THRESHOLD, "healthy", data=data)
    if recent >= GDC_LOW:
        return Row("gdc", evidence, GDC_THRESHOLD, "watch", data=data)
    return Row("gdc", evidence + " — minibatch gradients disagree: two clocks dominate", GDC_THRESHOLD,
               "two-clocks", data=data)


def _in_envs(b_simple: float, unroll_length) -> float | None:
    """``b_simple`` in envs, or None when ``unroll_length`` is not a positive number."""
    if isinstance(unroll_length, bool) or not isinstance(unroll_length, (int, float)):
        return None
    try:
        return b_simple_to_envs(b_simple, unroll_length)
    except ValueError:  # zero, negative or not finite
        return None


def b_simple_row(records: Sequence[dict], config: dict, num_envs) -> Row:
    """The info row: median b_simple in transitions and envs, and ``num_envs`` over it."""
    thr = "info: compare with num_envs (same unit)"
    if not key_present(records, "b_simple"):
        return Row("b_simple", "b_simple never logged", thr, "not-checkable")
    _, m = seed_matrix(records, "b_simple")
    mean = nanmean_rows(m)
    mean = mean[np.isfinite(mean)]
    if not mean.size:
        return Row("b_simple", "b_simple logged but only ever null", thr, "not-checkable")
    med = float(np.median(mean))
    data: dict = {"median_transitions": med, "measurements": int(mean.size)}
    evidence = f"median {num(med)} transitions over {mean.size} measurements"
    T = config.get("unroll_length")
    envs = _in_envs(med, T)
    if envs is None:
        return Row("b_simple", evidence + "; unroll_length unknown, cannot convert to envs", thr, "info", data=data)
    data["median_envs"] = envs
    evidence += f" ≈ {num(envs)} envs (unroll_length {int(T)})"
    if isinstance(num_envs, (int, float)) and envs > 0:
        data["num_envs_over_b_simple"] = float(num_envs) / envs
        evidence += f"; num_envs {int(num_envs)} = {num(float(num_envs) / envs)}× that"
    return Row("b_simple", evidence, thr, "info", data=data)


def solved_success(records: Sequence[dict]) -> float | None:
    """Mean success over the last SOLVED_WINDOW iterations when it is >= SOLVED_SUCCESS, else None."""
    if not key_present(records, "success_rate"):
        return None
    _, m = seed_matrix(records[-SOLVED_WINDOW:], "success_rate")
    mean = nanmean_rows(m)
    mean = mean[np.isfinite(mean)]
    if not mean.size or mean.size < min(SOLVED_WINDOW, len(records)):
        return None
    level = float(mean.mean())
    return level if level >= SOLVED_SUCCESS else None


def downgrade_if_solved(row: Row, success: float | None) -> Row:
    """A risk/two-clocks ``row`` becomes watch on a solved task (``success`` from ``solved_success``).

    At a solved task the mean gradient vanishes, so minibatch gradients point every which way
    (low GDC) and the rare failures skew the advantages: signals of stale data elsewhere, but
    expected here."""
    if success is None or row.verdict not in ("risk", "two-clocks"):
        return row
    note = (f" — but the task is solved (success {num(success)} >= {SOLVED_SUCCESS} over the last "
            f"{SOLVED_WINDOW} iterations), where this is expected: downgraded to watch")
    return Row(row.signal, row.value + note, row.threshold, "watch", data={**row.data, "converged_success": success})
