"""``tclock doctor``: read one run directory and say whether the two clocks have come apart.

The doctor reads ``config.yaml``, ``metrics.jsonl`` and ``status.json`` through
``tclock.runlog`` (never the files directly), plus ``profile.json`` (run directory or its
parent) and the sweep's ``summary.json`` (parent).  It imports no JAX, loop or agent code.

Per-seed metrics are averaged across seeds (nulls ignored) before a rule is applied; seed
spread is reported as evidence.  Thresholds follow section 3 of the user's write-up; where the
write-up is vague the definition chosen here is stated.

Signals (one row each; verdict is healthy | watch | risk | two-clocks | not-checkable; ``info``
rows carry numbers but no verdict)
-----------------------------------------------------------------------------------------------
``rt_ut_ratio_w50``   The windowed RT/UT ratio (mean of the last <= 50 non-null ratios; when a run
                      lacks the key it is recomputed from ``rt_ut_ratio``), judged on its latest
                      value: 0.3-0.7 healthy; < 0.3 watch ("rollout cheap; batch may be small");
                      > 0.7 risk; > 1.0 for a *sustained* stretch (the last >= 20 consecutive
                      iterations, ``SUSTAIN``) two-clocks ("stalled"); > 1.0 for fewer risk.  A
                      past sustained stall that has ended lifts a healthy verdict to watch.
``rt_ut_plateau``     The write-up's pattern "a sustained plateau of the windowed ratio > 0.8 while
                      the return slope falls".  Plateau: >= 20 consecutive iterations with the
                      windowed ratio > 0.8.  Return slope: least-squares slope of the seed-mean
                      ``episode_return`` against ``env_steps`` (iteration if absent), reported per
                      1M env steps.  It is computed over the plateau and over the iterations just
                      before it (as many as the plateau is long, at least 10, fewer if the run is
                      shorter; >= 5 points with a return are needed).  Falling: the slope before
                      is > 0 and the plateau slope is < 0.5x it.  Any plateau with a falling slope
                      -> two-clocks; a plateau whose return keeps its slope -> watch; no plateau
                      -> healthy; not-checkable without returns or without history before it.
``activation_rate``   Share of transitions with reward > 0.  The first 3 iterations are warm-up
                      and ignored.  Dead: seed mean < 1e-6.  Dead for the last >= 10 consecutive
                      rollouts -> two-clocks; only some seeds dead that long -> risk.  On the
                      last 20 rollouts: oscillating = >= 4 dead<->alive flips and coefficient of
                      variation (std/mean) > 0.5 -> risk; variance > 0.05 (the write-up's bound),
                      CV > 1, or >= 4 flips -> watch.  A dead stretch of >= 10 that has ended, or
                      a fall of the last-10 mean below half of the previous-10 mean -> watch.
                      Otherwise (rising or stable) healthy.
``adv_skew``          Skewness of advantages.  Recent window = the last 20 iterations.  A run of
                      >= 7 consecutive iterations with |skew| > 2 that ends inside the recent
                      window -> two-clocks ("strong sign"); any |skew| > 2 in the window, or one
                      seed with such a run -> risk; an older run of 7, or median |skew| > 1 in
                      the window (outside the write-up's normal -1..1) -> watch; else healthy.
``gdc``               Mean pairwise cosine of K minibatch gradients, logged on diagnostic
                      iterations only.  Judged on the median of the last 3 measurements:
                      > 0.85 healthy (fresh), 0.6-0.85 watch, < 0.6 two-clocks (dominated).
                      Never logged -> not-checkable.
(solved task)         When the seeds' mean ``success_rate`` over the last 10 iterations is
                      >= 0.9, a two-clocks/risk verdict of ``gdc`` or ``adv_skew`` is downgraded
                      to watch: at an optimum the mean gradient vanishes (low GDC) and the rare
                      failures skew the advantages, so neither means stale data there.  (This
                      departs from the write-up, whose thresholds would flag every solved run.)
``b_simple``          (info) Median gradient noise scale over the run, in transitions and in envs
                      (transitions / ``unroll_length``), next to the run's ``num_envs``.

Checklist (the write-up's section 6; each row ok | missing | not-checkable; advice only, it
never changes the exit code): diagnostics logged (``rt_ut_ratio``, ``adv_skew``, ``gdc`` keys
present); latency baseline (``profile.json`` in the run directory or its parent); initial
``num_envs`` <= 0.7 x ``b_crit`` (when the parent's ``summary.json`` holds a number); DRBS on;
reward-event unit test (not checkable from a run); HAE window calibrated (``advantage: hae``,
``hae_window`` set, and, when the run logs a non-zero activation rate, the window inside the
write-up's 0.5-0.8 x mean distance between reward events, estimated as 1 / mean activation rate
of the last 20 rollouts and capped at ``unroll_length``); GPU memory < 85% (not checkable from a run); LR
schedule on wall time (``lr_clock`` wall or hybrid).  A config field that is absent makes its row
not-checkable.

Overall verdict: the worst signal verdict (healthy < watch < risk < two-clocks).
Exit codes of ``run_doctor`` / ``main``:
    0  no two-clocks row (healthy, or only watch / risk)
    1  at least one signal row says two-clocks
    2  unreadable input: missing directory, malformed ``config.yaml`` / metrics JSON line, a record
       without ``iteration`` or ``rt_ut_ratio``, a non-numeric metric, or no records at all
``--json`` prints ``report_to_dict(report)`` (on exit 2: ``{"verdict": "unreadable", "exit_code":
2, "error": ...}``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence, TextIO

import numpy as np

from tclock import runlog
from tclock.plots import load_config_or_empty, nanmean_rows, seed_matrix, trailing_mean
from tclock.runlog import RunFormatError

# --------------------------------------------------------------------------- thresholds
RT_LOW, RT_HIGH, RT_STALL = 0.3, 0.7, 1.0
RT_WINDOW = 50
PLATEAU_LEVEL = 0.8
SUSTAIN = 20
SLOPE_FALL = 0.5
PRE_MIN_ITERS = 10
SLOPE_MIN_POINTS = 5

ACT_ZERO = 1e-6
ACT_WARMUP = 3
ACT_DEAD_STREAK = 10
RECENT = 20
ACT_FLIPS = 4
ACT_CV_OSC = 0.5
ACT_CV_HIGH = 1.0
ACT_VAR = 0.05
ACT_FALL = 0.5

SKEW_LIMIT = 2.0
SKEW_STREAK = 7
SKEW_NORMAL = 1.0

GDC_FRESH, GDC_LOW = 0.85, 0.6
GDC_RECENT = 3

CRIT_FRACTION = 0.7
HAE_LOW, HAE_HIGH = 0.5, 0.8
REQUIRED_KEYS = ("iteration", "rt_ut_ratio")

VERDICTS = ("healthy", "watch", "risk", "two-clocks", "not-checkable", "info")
CHECK_STATES = ("ok", "missing", "not-checkable")
_RANK = {"healthy": 0, "watch": 1, "risk": 2, "two-clocks": 3}

PROFILE_FILE = "profile.json"
SUMMARY_FILE = "summary.json"


@dataclass
class Row:
    """One line of the report: a signal (verdict) or a checklist item (ok/missing/not-checkable)."""
    signal: str
    value: str
    threshold: str
    verdict: str
    kind: str = "signal"
    data: dict = field(default_factory=dict)


@dataclass
class Report:
    run_dir: str
    rows: list[Row]
    verdict: str
    exit_code: int
    run: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def signals(self) -> list[Row]:
        return [r for r in self.rows if r.kind == "signal"]

    @property
    def checklist(self) -> list[Row]:
        return [r for r in self.rows if r.kind == "checklist"]

    def row(self, signal: str) -> Row:
        for r in self.rows:
            if r.signal == signal:
                return r
        raise KeyError(signal)


# --------------------------------------------------------------------------- small helpers
def streaks(mask: Sequence[bool]) -> list[tuple[int, int]]:
    """Runs of True as ``(start, end)`` index pairs, end inclusive."""
    out, start = [], None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i - 1))
            start = None
    if start is not None:
        out.append((start, len(mask) - 1))
    return out


def trailing_streak(mask: Sequence[bool]) -> int:
    n = 0
    for m in reversed(list(mask)):
        if not m:
            break
        n += 1
    return n


def slope(x: np.ndarray, y: np.ndarray) -> float | None:
    """Least-squares slope of y on x over finite pairs; None with < 2 distinct x."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if x.size < 2 or np.ptp(x) == 0:
        return None
    xc = x - x.mean()
    return float((xc * (y - y.mean())).sum() / (xc * xc).sum())


def flips(dead: Sequence[bool]) -> int:
    """Number of dead<->alive transitions between consecutive rollouts."""
    return int(sum(1 for a, b in zip(dead[:-1], dead[1:]) if a != b))


def _fmt(v: float | None, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if v != 0 and (abs(v) >= 1e4 or abs(v) < 1e-3):
        return f"{v:.{max(1, digits - 1)}e}"
    return f"{v:.{digits}g}"


def _series(records: Sequence[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-record seed matrix (rows aligned with records) and its seed mean."""
    _, m = seed_matrix(records, key, keep_missing=True)
    return m, nanmean_rows(m)


def _present(records: Sequence[dict], key: str) -> bool:
    return any(key in r for r in records)


def _seed_range(values: np.ndarray) -> str:
    v = values[np.isfinite(values)]
    if v.size < 2:
        return ""
    return f" (seeds {_fmt(float(v.min()))}–{_fmt(float(v.max()))})"


def _iters_label(iters: np.ndarray, a: int, b: int) -> str:
    return f"iterations {int(iters[a])}–{int(iters[b])}"


# --------------------------------------------------------------------------- signals
def _rt_ut_rows(records, iters) -> list[Row]:
    _, raw = _series(records, "rt_ut_ratio")
    if _present(records, "rt_ut_ratio_w50"):
        _, w = _series(records, "rt_ut_ratio_w50")
        source = "rt_ut_ratio_w50"
    else:
        w = trailing_mean(raw, RT_WINDOW)
        source = "recomputed from rt_ut_ratio (no rt_ut_ratio_w50 key)"
    thr = (f"healthy {RT_LOW}–{RT_HIGH}; <{RT_LOW} watch; >{RT_HIGH} risk; "
           f">{RT_STALL} for >={SUSTAIN} iterations two-clocks")
    ok = np.isfinite(w)
    if not ok.any():
        rows = [Row("rt_ut_ratio_w50", "no RT/UT value yet (needs >= 2 iterations)", thr, "not-checkable")]
        rows.append(Row("rt_ut_plateau", "no RT/UT value yet", _plateau_threshold(), "not-checkable"))
        return rows
    wv, wi = w[ok], iters[ok]
    latest = float(wv[-1])
    typical = float(np.median(wv))
    stall_mask = wv > RT_STALL
    tail = trailing_streak(stall_mask)
    past = [(a, b) for a, b in streaks(stall_mask) if b - a + 1 >= SUSTAIN and b != len(wv) - 1]
    raw_latest = raw[np.isfinite(raw)][-1] if np.isfinite(raw).any() else math.nan
    evidence = (f"latest {_fmt(latest)} (it {int(wi[-1])}), median {_fmt(typical)}, max {_fmt(float(wv.max()))}"
                f" over {wv.size} iterations; raw latest {_fmt(float(raw_latest))}")
    if source != "rt_ut_ratio_w50":
        evidence += f"; {source}"
    if tail >= SUSTAIN:
        verdict, why = "two-clocks", f"stalled: > {RT_STALL} for the last {tail} iterations"
    elif latest > RT_STALL:
        verdict, why = "risk", f"> {RT_STALL} for only {tail} iterations (< {SUSTAIN}: not yet sustained)"
    elif latest > RT_HIGH:
        verdict, why = "risk", "rollout takes most of the update interval"
    elif latest < RT_LOW:
        verdict, why = "watch", "rollout cheap; batch may be small"
    else:
        verdict, why = "healthy", ""
    if past and verdict == "healthy":
        a, b = past[-1]
        verdict, why = "watch", f"stalled earlier (> {RT_STALL} at {_iters_label(wi, a, b)}), recovered since"
    if why:
        evidence += f" — {why}"
    row = Row("rt_ut_ratio_w50", evidence, thr, verdict,
              data={"latest": latest, "median": typical, "max": float(wv.max()), "stall_streak": tail,
                    "source": source})
    return [row, _plateau_row(records, iters, w)]


def _plateau_threshold() -> str:
    return (f"windowed > {PLATEAU_LEVEL} for >={SUSTAIN} iterations while return slope "
            f"< {SLOPE_FALL}x the slope before")


def _plateau_row(records, iters, w) -> Row:
    thr = _plateau_threshold()
    ok = np.isfinite(w)
    mask = ok & (np.where(ok, w, 0.0) > PLATEAU_LEVEL)
    plateaus = [(a, b) for a, b in streaks(mask) if b - a + 1 >= SUSTAIN]
    if not plateaus:
        longest = max((b - a + 1 for a, b in streaks(mask)), default=0)
        return Row("rt_ut_plateau", f"no plateau: windowed > {PLATEAU_LEVEL} for at most {longest} "
                   f"consecutive iterations", thr, "healthy", data={"plateaus": []})
    if not _present(records, "episode_return"):
        a, b = plateaus[-1]
        return Row("rt_ut_plateau", f"plateau at {_iters_label(iters, a, b)} but episode_return is not logged",
                   thr, "not-checkable", data={"plateaus": [[int(iters[a]), int(iters[b])]]})
    _, ret = _series(records, "episode_return")
    _, xs = _series(records, "env_steps")
    unit = "per 1M env steps"
    scale = 1e6
    if not np.isfinite(xs).any():
        xs, unit, scale = iters.astype(float), "per iteration", 1.0
    results = []
    for a, b in plateaus:
        pre_len = max(b - a + 1, PRE_MIN_ITERS)
        p0 = max(0, a - pre_len)
        pre_pts = int((np.isfinite(ret[p0:a]) & np.isfinite(xs[p0:a])).sum())
        in_pts = int((np.isfinite(ret[a:b + 1]) & np.isfinite(xs[a:b + 1])).sum())
        s_pre = slope(xs[p0:a], ret[p0:a]) if pre_pts >= SLOPE_MIN_POINTS else None
        s_in = slope(xs[a:b + 1], ret[a:b + 1]) if in_pts >= SLOPE_MIN_POINTS else None
        falling = s_pre is not None and s_in is not None and s_pre > 0 and s_in < SLOPE_FALL * s_pre
        results.append({"start": int(iters[a]), "end": int(iters[b]), "length": b - a + 1,
                        "before_from": int(iters[p0]) if a > p0 else None,
                        "slope_before": None if s_pre is None else s_pre * scale,
                        "slope_plateau": None if s_in is None else s_in * scale, "falling": falling})
    flagged = [r for r in results if r["falling"]]
    checkable = [r for r in results if r["slope_before"] is not None and r["slope_plateau"] is not None]
    shown = flagged[-1] if flagged else (checkable[-1] if checkable else results[-1])
    evidence = (f"plateau > {PLATEAU_LEVEL} at iterations {shown['start']}–{shown['end']} ({shown['length']} its); "
                f"return slope {unit}: before {_fmt(shown['slope_before'])} → plateau {_fmt(shown['slope_plateau'])}")
    if flagged:
        verdict = "two-clocks"
        evidence += " — return growth slowed while the windowed ratio stayed high"
    elif checkable:
        verdict = "watch"
        evidence += " — return slope held up"
    else:
        verdict = "not-checkable"
        evidence += f" — too little return history (need >= {SLOPE_MIN_POINTS} points before and during)"
    return Row("rt_ut_plateau", evidence, thr, verdict, data={"plateaus": results, "slope_unit": unit})


def _activation_row(records, iters) -> Row:
    thr = (f"dead (<{ACT_ZERO:g}) for last >={ACT_DEAD_STREAK} rollouts two-clocks; last {RECENT}: "
           f">={ACT_FLIPS} flips & CV>{ACT_CV_OSC} risk; var>{ACT_VAR} or CV>{ACT_CV_HIGH} watch")
    if not _present(records, "activation_rate"):
        return Row("activation_rate", "activation_rate not logged", thr, "not-checkable")
    m, mean = _series(records, "activation_rate")
    keep = np.isfinite(mean) & (iters > ACT_WARMUP)
    vals, its, mat = mean[keep], iters[keep], m[keep]
    if vals.size == 0:
        return Row("activation_rate", f"no value after the {ACT_WARMUP}-iteration warm-up", thr, "not-checkable")
    dead = vals < ACT_ZERO
    tail = trailing_streak(dead)
    recent = vals[-RECENT:]
    r_dead = dead[-RECENT:]
    n_flips = flips(list(r_dead))
    r_mean = float(recent.mean())
    r_var = float(recent.var())
    cv = float(recent.std() / r_mean) if r_mean > ACT_ZERO else math.nan
    seed_tails = [trailing_streak(list(np.isfinite(mat[:, s]) & (np.nan_to_num(mat[:, s], nan=1.0) < ACT_ZERO)))
                  for s in range(mat.shape[1])]
    dead_seeds = sum(1 for t in seed_tails if t >= ACT_DEAD_STREAK)
    past_dead = [(a, b) for a, b in streaks(list(dead)) if b - a + 1 >= ACT_DEAD_STREAK and b != len(dead) - 1]
    trend = "n/a"
    prev10 = last10 = math.nan
    if vals.size >= 20:
        prev10, last10 = float(vals[-20:-10].mean()), float(vals[-10:].mean())
        if prev10 > ACT_ZERO and last10 < ACT_FALL * prev10:
            trend = "falling"
        elif last10 > 1.1 * prev10 + ACT_ZERO:
            trend = "rising"
        else:
            trend = "stable"
    evidence = (f"latest {_fmt(float(vals[-1]))}{_seed_range(mat[-1])}, last-{recent.size} mean {_fmt(r_mean)}, "
                f"var {_fmt(r_var)}, CV {_fmt(cv)}, flips {n_flips}, trend {trend}")
    data = {"latest": float(vals[-1]), "dead_streak": tail, "dead_seeds": dead_seeds, "recent_mean": r_mean,
            "recent_var": r_var, "recent_cv": cv, "flips": n_flips, "trend": trend,
            "prev10_mean": prev10, "last10_mean": last10}
    if tail >= ACT_DEAD_STREAK:
        verdict = "two-clocks"
        evidence = f"≈0 for the last {tail} rollouts (since iteration {int(its[-tail])}); " + evidence
    elif dead_seeds:
        verdict = "risk"
        evidence = f"{dead_seeds}/{mat.shape[1]} seeds ≈0 for >= {ACT_DEAD_STREAK} rollouts; " + evidence
    elif n_flips >= ACT_FLIPS and cv > ACT_CV_OSC:
        verdict = "risk"
        evidence = "oscillating between reward and no reward; " + evidence
    elif r_var > ACT_VAR or cv > ACT_CV_HIGH or n_flips >= ACT_FLIPS:
        verdict = "watch"
        evidence = "noisy; " + evidence
    elif past_dead:
        a, b = past_dead[-1]
        verdict = "watch"
        evidence = f"was ≈0 at iterations {int(its[a])}–{int(its[b])}, recovered; " + evidence
    elif trend == "falling":
        verdict = "watch"
    else:
        verdict = "healthy"
    return Row("activation_rate", evidence, thr, verdict, data=data)


def _skew_row(records, iters) -> Row:
    thr = (f"|skew|>{SKEW_LIMIT:g} in last {RECENT} risk; >={SKEW_STREAK} consecutive two-clocks; "
           f"normal within ±{SKEW_NORMAL:g}")
    if not _present(records, "adv_skew"):
        return Row("adv_skew", "adv_skew not logged", thr, "not-checkable")
    m, mean = _series(records, "adv_skew")
    keep = np.isfinite(mean)
    vals, its, mat = mean[keep], iters[keep], m[keep]
    if vals.size == 0:
        return Row("adv_skew", "adv_skew only ever null", thr, "not-checkable")
    n = vals.size
    start_recent = max(0, n - RECENT)
    high = np.abs(vals) > SKEW_LIMIT
    runs = [(a, b) for a, b in streaks(list(high))]
    recent_runs = [(a, b) for a, b in runs if b >= start_recent]
    long_recent = [(a, b) for a, b in recent_runs if b - a + 1 >= SKEW_STREAK]
    long_old = [(a, b) for a, b in runs if b < start_recent and b - a + 1 >= SKEW_STREAK]
    recent = vals[start_recent:]
    n_high = int(high[start_recent:].sum())
    med_abs = float(np.median(np.abs(recent)))
    seed_runs = []
    for s in range(mat.shape[1]):
        col = mat[:, s]
        h = np.isfinite(col) & (np.abs(np.nan_to_num(col)) > SKEW_LIMIT)
        if any(b >= start_recent and b - a + 1 >= SKEW_STREAK for a, b in streaks(list(h))):
            seed_runs.append(s)
    longest = max((b - a + 1 for a, b in recent_runs), default=0)
    evidence = (f"latest {_fmt(float(vals[-1]))}{_seed_range(mat[-1])}; last {recent.size}: "
                f"{n_high} with |skew|>{SKEW_LIMIT:g}, longest run {longest}, median |skew| {_fmt(med_abs)}")
    data = {"latest": float(vals[-1]), "recent_high": n_high, "longest_recent_run": longest,
            "recent_median_abs": med_abs, "seeds_with_run": seed_runs}
    if long_recent:
        a, b = long_recent[-1]
        verdict = "two-clocks"
        evidence += f" — strong sign: |skew|>{SKEW_LIMIT:g} for {b - a + 1} consecutive ({_iters_label(its, a, b)})"
    elif n_high:
        verdict = "risk"
    elif seed_runs:
        verdict = "risk"
        evidence += f" — seed(s) {seed_runs} have |skew|>{SKEW_LIMIT:g} for >= {SKEW_STREAK} consecutive"
    elif long_old:
        a, b = long_old[-1]
        verdict = "watch"
        evidence += f" — earlier run of {b - a + 1} at {_iters_label(its, a, b)}"
    elif med_abs > SKEW_NORMAL:
        verdict = "watch"
        evidence += f" — outside the normal ±{SKEW_NORMAL:g}"
    else:
        verdict = "healthy"
    return Row("adv_skew", evidence, thr, verdict, data=data)


CONVERGED_SUCCESS, CONVERGED_WINDOW = 0.9, 10


def _converged(records) -> float | None:
    """Mean success over the last iterations when it is >= CONVERGED_SUCCESS, else None.

    At a solved task the mean gradient vanishes, so minibatch gradients point every which way
    (low GDC) and the rare failures skew the advantages: signals of stale data elsewhere, but
    expected here.  The GDC and skew rows say so instead of calling it two clocks."""
    if not _present(records, "success_rate"):
        return None
    _, m = seed_matrix(records[-CONVERGED_WINDOW:], "success_rate")
    mean = nanmean_rows(m)
    mean = mean[np.isfinite(mean)]
    if mean.size < min(CONVERGED_WINDOW, len(records)) or not mean.size:
        return None
    level = float(mean.mean())
    return level if level >= CONVERGED_SUCCESS else None


def _converged_note(level: float) -> str:
    return (f" — but the task is solved (success {level:.2f} over the last {CONVERGED_WINDOW} iterations), "
            "where this is expected: downgraded to watch")


def _gdc_row(records, converged: float | None = None) -> Row:
    thr = f">{GDC_FRESH} healthy; {GDC_LOW}–{GDC_FRESH} watch; <{GDC_LOW} two-clocks (median of last {GDC_RECENT})"
    if not _present(records, "gdc"):
        return Row("gdc", "gdc never logged (enable gradient diagnostics with gdc_every >= 1)", thr, "not-checkable")
    its, m = seed_matrix(records, "gdc")
    mean = nanmean_rows(m)
    ok = np.isfinite(mean)
    if not ok.any():
        return Row("gdc", "gdc logged but only ever null", thr, "not-checkable")
    vals, vi, mat = mean[ok], its[ok], m[ok]
    recent = float(np.median(vals[-GDC_RECENT:]))
    evidence = (f"recent {_fmt(recent)} (median of last {min(GDC_RECENT, vals.size)} of {vals.size}); latest "
                f"{_fmt(float(vals[-1]))} at it {int(vi[-1])}{_seed_range(mat[-1])}; run min {_fmt(float(vals.min()))}")
    data = {"recent": recent, "latest": float(vals[-1]), "min": float(vals.min()), "measurements": int(vals.size)}
    for part in ("gdc_policy", "gdc_value"):
        if _present(records, part):
            _, pm = seed_matrix(records, part)
            pmean = nanmean_rows(pm)
            pmean = pmean[np.isfinite(pmean)]
            if pmean.size:
                p = float(np.median(pmean[-GDC_RECENT:]))
                data[part] = p
                evidence += f"; {part.split('_')[1]} {_fmt(p)}"
    if recent > GDC_FRESH:
        verdict = "healthy"
    elif recent >= GDC_LOW:
        verdict = "watch"
    elif converged is not None:
        verdict = "watch"
        evidence += _converged_note(converged)
        data["converged_success"] = converged
    else:
        verdict = "two-clocks"
        evidence += " — minibatch gradients disagree: two clocks dominate"
    return Row("gdc", evidence, thr, verdict, data=data)


def _b_simple_row(records, config, num_envs) -> Row:
    thr = "info: compare with num_envs (same unit)"
    if not _present(records, "b_simple"):
        return Row("b_simple", "b_simple never logged", thr, "not-checkable")
    _, m = seed_matrix(records, "b_simple")
    mean = nanmean_rows(m)
    mean = mean[np.isfinite(mean)]
    if not mean.size:
        return Row("b_simple", "b_simple logged but only ever null", thr, "not-checkable")
    med = float(np.median(mean))
    data: dict[str, Any] = {"median_transitions": med, "measurements": int(mean.size)}
    evidence = f"median {_fmt(med)} transitions over {mean.size} measurements"
    T = config.get("unroll_length")
    if isinstance(T, (int, float)) and not isinstance(T, bool) and T > 0:
        envs = med / float(T)
        data["median_envs"] = envs
        evidence += f" ≈ {_fmt(envs)} envs (unroll_length {int(T)})"
        if isinstance(num_envs, (int, float)) and envs > 0:
            data["num_envs_over_b_simple"] = float(num_envs) / envs
            evidence += f"; num_envs {int(num_envs)} = {_fmt(float(num_envs) / envs)}× that"
    else:
        evidence += "; unroll_length unknown, cannot convert to envs"
    return Row("b_simple", evidence, thr, "info", data=data)


# --------------------------------------------------------------------------- checklist
def _check(name: str, state: str, evidence: str, threshold: str, **data) -> Row:
    return Row(name, evidence, threshold, state, kind="checklist", data=data)


def _checklist(run_dir: Path, records, config, has_config: bool, num_envs, notes: list[str]) -> list[Row]:
    rows = []
    wanted = ("rt_ut_ratio", "adv_skew", "gdc")
    absent = [k for k in wanted if not _present(records, k)]
    rows.append(_check("diagnostics logged", "missing" if absent else "ok",
                       f"not logged: {', '.join(absent)}" if absent else "rt_ut_ratio, adv_skew and gdc present",
                       "rt_ut_ratio, adv_skew, gdc keys in metrics", absent=absent))

    found = [p for p in (run_dir / PROFILE_FILE, run_dir.parent / PROFILE_FILE) if p.exists()]
    if found:
        try:
            runlog.read_json(found[0])
            rows.append(_check("latency baseline", "ok", f"{found[0]}", "profile.json in run or parent dir",
                               path=str(found[0])))
        except RunFormatError as e:
            rows.append(_check("latency baseline", "missing", f"unreadable: {e}", "profile.json in run or parent dir"))
    else:
        rows.append(_check("latency baseline", "missing", "no profile.json here or in the parent (run `tclock profile`)",
                           "profile.json in run or parent dir"))

    thr = f"initial num_envs <= {CRIT_FRACTION} x b_crit (summary.json)"
    summary_path = run_dir.parent / SUMMARY_FILE
    b_crit = None
    if not summary_path.exists():
        rows.append(_check("batch <= 0.7 x critical", "not-checkable", "no summary.json in the parent (no sweep)", thr))
    else:
        try:
            summary = runlog.read_json(summary_path)
            b_crit = summary.get("b_crit") if isinstance(summary, dict) else None
        except RunFormatError as e:
            notes.append(f"summary.json unreadable: {e}")
            summary = None
        if summary is None:
            rows.append(_check("batch <= 0.7 x critical", "not-checkable", "summary.json unreadable", thr))
        elif not isinstance(b_crit, (int, float)) or isinstance(b_crit, bool) or not math.isfinite(b_crit) or b_crit <= 0:
            rows.append(_check("batch <= 0.7 x critical", "not-checkable",
                               f"summary.json has no usable b_crit ({b_crit!r})", thr))
        elif not isinstance(num_envs, (int, float)):
            rows.append(_check("batch <= 0.7 x critical", "not-checkable", f"b_crit {_fmt(b_crit)} but num_envs unknown",
                               thr, b_crit=b_crit))
        else:
            limit = CRIT_FRACTION * b_crit
            good = num_envs <= limit
            rows.append(_check("batch <= 0.7 x critical", "ok" if good else "missing",
                               f"num_envs {int(num_envs)} {'<=' if good else '>'} {CRIT_FRACTION} x b_crit "
                               f"{_fmt(b_crit)} = {_fmt(limit)} envs", thr, b_crit=b_crit, limit=limit,
                               num_envs=num_envs))

    drbs = config.get("drbs")
    thr = "config drbs: true (--drbs)"
    if drbs is None:
        rows.append(_check("DRBS on", "not-checkable", "no drbs field in config", thr))
    else:
        on = bool(drbs.get("enabled")) if isinstance(drbs, dict) else bool(drbs)
        rows.append(_check("DRBS on", "ok" if on else "missing", f"drbs = {on}", thr))

    rows.append(_check("reward-event unit test", "not-checkable",
                       "a property of the code, not of this run", "(rewards > 0) detection tested"))

    thr = "advantage: hae, hae_window within 0.5–0.8 x mean gap between reward events"
    adv = config.get("advantage")
    window = config.get("hae_window")
    T = config.get("unroll_length")
    T = float(T) if isinstance(T, (int, float)) and not isinstance(T, bool) and T > 0 else math.inf
    suggested = None
    if _present(records, "activation_rate"):
        _, act = _series(records, "activation_rate")
        act = act[np.isfinite(act)][-RECENT:]
        if act.size and float(act.mean()) > ACT_ZERO:
            gap = 1.0 / float(act.mean())
            suggested = (min(HAE_LOW * gap, T), min(HAE_HIGH * gap, T))
    hint = ""
    if suggested:
        hint = (f"; reward events every ~{_fmt(1.0 / float(act.mean()))} steps (1/activation, last {act.size} "
                f"rollouts) → window {_fmt(suggested[0])}–{_fmt(suggested[1])}")
    name = "HAE window calibrated"
    if adv is None:
        rows.append(_check(name, "not-checkable", "no advantage field in config" + hint, thr))
    elif str(adv).lower() != "hae":
        rows.append(_check(name, "missing", f"advantage = {adv}: HAE not in use" + hint, thr))
    elif not isinstance(window, (int, float)) or isinstance(window, bool) or window <= 0:
        rows.append(_check(name, "missing", f"advantage = hae but hae_window = {window!r}" + hint, thr))
    elif suggested is None:
        rows.append(_check(name, "ok", f"hae_window = {window} (no reward events logged to calibrate against)", thr,
                           hae_window=window))
    else:
        lo, hi = suggested
        inside = lo * (1 - 1e-9) <= window <= hi * (1 + 1e-9) or (hi == T and window >= T)
        rows.append(_check(name, "ok" if inside else "missing",
                           f"hae_window = {window} {'within' if inside else 'outside'} the suggested range" + hint,
                           thr, hae_window=window, suggested=list(suggested)))

    rows.append(_check("GPU memory < 85%", "not-checkable", "not recorded in a run directory", "< 85% of device memory"))

    thr = "lr_clock: wall or hybrid"
    clock = config.get("lr_clock")
    if clock is None:
        rows.append(_check("LR schedule on wall time", "not-checkable", "no lr_clock field in config", thr))
    else:
        good = str(clock).lower() in ("wall", "hybrid")
        rows.append(_check("LR schedule on wall time", "ok" if good else "missing", f"lr_clock = {clock}", thr))

    if not has_config:
        for r in rows:
            if r.signal in ("DRBS on", "HAE window calibrated", "LR schedule on wall time") and r.verdict == "not-checkable":
                r.value = "no config.yaml in the run directory"
    return rows


# --------------------------------------------------------------------------- entry points
def _validate(records: list[dict], path: Path) -> np.ndarray:
    if not records:
        raise RunFormatError(f"{path} holds no records: the run has not finished an iteration yet")
    iters = []
    for i, r in enumerate(records, 1):
        for key in REQUIRED_KEYS:
            if key not in r:
                where = f"iteration {r['iteration']}" if "iteration" in r else f"record {i}"
                raise RunFormatError(f"{path}: {where} lacks the required key {key!r} "
                                     f"(keys present: {', '.join(sorted(r)) or 'none'})")
        it = r["iteration"]
        if isinstance(it, bool) or not isinstance(it, int):
            raise RunFormatError(f"{path}: record {i} has iteration {it!r}; expected an integer")
        iters.append(it)
    return np.asarray(iters, dtype=int)


def diagnose(run_dir: str | os.PathLike) -> Report:
    """Reads a run directory and builds the report. Raises ``RunFormatError`` on unreadable input."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise RunFormatError(f"{run_dir} does not exist: pass a tclock run directory")
    if not run_dir.is_dir():
        raise RunFormatError(f"{run_dir} is not a directory: pass a tclock run directory")
    notes: list[str] = []
    records = runlog.read_metrics(run_dir)
    iters = _validate(records, run_dir / runlog.METRICS_FILE)
    has_config = (run_dir / runlog.CONFIG_FILE).exists()
    config = load_config_or_empty(run_dir)
    if not has_config:
        notes.append("no config.yaml: config-based checks are not checkable")
    try:
        state = runlog.read_status(run_dir).get("state", "?")
    except (RunFormatError, AttributeError) as e:
        state = "unreadable"
        notes.append(f"status unreadable: {e}")

    _, ne = _series(records, "num_envs")
    ne = ne[np.isfinite(ne)]
    cfg_ne = config.get("num_envs")
    num_envs = cfg_ne if isinstance(cfg_ne, (int, float)) and not isinstance(cfg_ne, bool) else (
        float(ne[0]) if ne.size else None)
    if ne.size and ne.min() != ne.max():
        notes.append(f"num_envs changed during the run: {int(ne.min())}–{int(ne.max())} (latest {int(ne[-1])})")
    _, steps = _series(records, "env_steps")
    _, wall = _series(records, "wall_s")
    _, comp = _series(records, "compiles")
    seeds_m = max((seed_matrix(records, k)[1].shape[1] for k in ("episode_return", "activation_rate", "adv_skew")),
                  default=0)
    run = {
        "env": config.get("env"), "algo": config.get("algo"), "num_envs": num_envs,
        "num_envs_latest": float(ne[-1]) if ne.size else None,
        "unroll_length": config.get("unroll_length"), "seeds": config.get("seeds", seeds_m or None),
        "iterations": int(iters[-1]), "records": len(records),
        "env_steps": float(steps[np.isfinite(steps)][-1]) if np.isfinite(steps).any() else None,
        "wall_s": float(wall[np.isfinite(wall)][-1]) if np.isfinite(wall).any() else None,
        "compiles": float(comp[np.isfinite(comp)][-1]) if np.isfinite(comp).any() else None,
        "state": state,
    }
    if state == "failed":
        notes.append("status.json says the run failed")

    rows = _rt_ut_rows(records, iters)
    rows.append(_activation_row(records, iters))
    converged = _converged(records)
    skew = _skew_row(records, iters)
    if converged is not None and skew.verdict in ("risk", "two-clocks"):
        skew = Row(skew.signal, skew.value + _converged_note(converged), skew.threshold, "watch",
                   data={**skew.data, "converged_success": converged})
    rows.append(skew)
    rows.append(_gdc_row(records, converged))
    rows.append(_b_simple_row(records, config, num_envs))
    rows.extend(_checklist(run_dir, records, config, has_config, num_envs, notes))

    judged = [r.verdict for r in rows if r.kind == "signal" and r.verdict in _RANK]
    verdict = max(judged, key=_RANK.__getitem__) if judged else "not-checkable"
    exit_code = 1 if verdict == "two-clocks" else 0
    return Report(run_dir=str(run_dir), rows=rows, verdict=verdict, exit_code=exit_code, run=run, notes=notes)


def report_to_dict(report: Report) -> dict:
    """A JSON-ready dict: run info, verdict, exit code, signals, checklist, notes."""
    def row(r: Row) -> dict:
        d = asdict(r)
        d.pop("kind")
        if r.kind == "checklist":
            d["status"] = d.pop("verdict")
            d["item"] = d.pop("signal")
        return d
    return runlog.to_jsonable({
        "run_dir": report.run_dir,
        "run": report.run,
        "verdict": report.verdict,
        "exit_code": report.exit_code,
        "signals": [row(r) for r in report.signals],
        "checklist": [row(r) for r in report.checklist],
        "notes": report.notes,
    })


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], widths: Sequence[int]) -> list[str]:
    lines = []
    sep = "  "
    lines.append(sep.join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    lines.append(sep.join("-" * w for w in widths))
    for cells in rows:
        wrapped = [textwrap.wrap(str(c), w) or [""] for c, w in zip(cells, widths)]
        for k in range(max(len(x) for x in wrapped)):
            lines.append(sep.join((x[k] if k < len(x) else "").ljust(w) for x, w in zip(wrapped, widths)).rstrip())
    return lines


def format_table(report: Report) -> str:
    """A plain-text report: run header, signal table, checklist table, overall verdict."""
    run = report.run
    out = [f"tclock doctor: {report.run_dir}"]
    info = [f"{k}={run[k]:g}" if isinstance(run.get(k), float) else f"{k}={run.get(k)}"
            for k in ("env", "algo", "num_envs", "seeds", "iterations", "env_steps", "state") if run.get(k) is not None]
    out.append("  " + "  ".join(info))
    out.append("")
    mark = {"healthy": "healthy", "watch": "watch", "risk": "RISK", "two-clocks": "TWO-CLOCKS",
            "not-checkable": "n/a", "info": "info"}
    out += _table(("signal", "value / evidence", "threshold", "verdict"),
                  [(r.signal, r.value, r.threshold, mark.get(r.verdict, r.verdict)) for r in report.signals],
                  (16, 58, 38, 10))
    out.append("")
    out += _table(("checklist (advice)", "evidence", "wants", "status"),
                  [(r.signal, r.value, r.threshold, r.verdict) for r in report.checklist],
                  (24, 58, 32, 13))
    out.append("")
    for n in report.notes:
        out.append(f"note: {n}")
    flagged = [r.signal for r in report.signals if r.verdict == "two-clocks"]
    tail = f": {', '.join(flagged)}" if flagged else ""
    out.append(f"overall: {report.verdict}{tail} (exit {report.exit_code})")
    return "\n".join(out) + "\n"


def run_doctor(run_dir: str | os.PathLike, as_json: bool = False, stream: TextIO | None = None) -> int:
    """Diagnoses ``run_dir``, prints the table (or JSON) to ``stream`` and returns the exit code."""
    stream = sys.stdout if stream is None else stream
    try:
        report = diagnose(run_dir)
    except RunFormatError as e:
        msg = f"tclock doctor: cannot read {run_dir}: {e}"
        if as_json:  # JSON for the consumer on ``stream``, the sentence for a person on stderr
            stream.write(json.dumps({"run_dir": str(run_dir), "verdict": "unreadable", "exit_code": 2,
                                     "error": str(e)}, indent=1) + "\n")
            print(msg, file=sys.stderr)
        else:
            stream.write(msg + "\n")
        return 2
    if as_json:
        stream.write(json.dumps(report_to_dict(report), indent=1) + "\n")
    else:
        stream.write(format_table(report))
    return report.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tclock doctor", description="Diagnose the two clocks in a run directory.",
                                     epilog="exit codes: 0 no two-clocks signal, 1 two-clocks detected, 2 unreadable input")
    parser.add_argument("run_dir", help="a tclock run directory (holds config.yaml and metrics.jsonl)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    return run_doctor(args.run_dir, as_json=args.json)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
