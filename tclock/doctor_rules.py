"""The doctor's signal rules on the RT/UT ratio, the activation rate and the advantage skew,
with the row type and the series helpers that every rule uses.

A rule takes the run's records (``tclock.runlog.read_metrics``) and returns one ``Row``.  Per-seed
metrics are averaged across seeds (nulls ignored) before a rule is applied; seed spread is
reported as evidence.  Thresholds follow section 3 of the user's write-up (stated in
``docs/design.md``) and live in ``tclock.thresholds`` (names in brackets; the numbers are their
defaults); where the write-up is vague the definition chosen here is stated.  The gradient rules
and the solved-task downgrade are in ``tclock.doctor_gradients``; ``tclock.doctor_diagnose``
applies every rule to a run directory.  Nothing here reads a file or imports JAX, the loop or an
agent.

Signals (one row each; verdict is healthy | watch | risk | two-clocks | not-checkable; ``info``
rows carry numbers but no verdict)
-----------------------------------------------------------------------------------------------
``rt_ut_ratio_w50``   The windowed RT/UT ratio (mean of the last <= 50 [RATIO_WINDOW] non-null
                      ratios; when a run lacks the key it is recomputed from ``rt_ut_ratio``),
                      judged on its latest value: 0.3-0.7 [RT_LOW, RT_HIGH] healthy; < 0.3 watch
                      ("rollout cheap; batch may be small"); > 0.7 risk; > 1.0 [RT_STALL] for a
                      *sustained* stretch (the last >= 20 [SUSTAIN] consecutive iterations)
                      two-clocks ("stalled"); > 1.0 for fewer risk.  A past sustained stall that
                      has ended lifts a healthy verdict to watch.
``rt_ut_plateau``     The write-up's pattern "a sustained plateau of the windowed ratio > 0.8 while
                      the return slope falls".  Plateau: >= 20 [SUSTAIN] consecutive iterations with
                      the windowed ratio > 0.8 [PLATEAU_LEVEL].  Return slope: least-squares slope of
                      the seed-mean ``episode_return`` against ``env_steps`` (iteration if absent),
                      reported per 1M env steps.  It is computed over the plateau and over the
                      iterations just before it (as many as the plateau is long, at least 10
                      [PRE_MIN_ITERS], fewer if the run is shorter; >= 5 [SLOPE_MIN_POINTS] points
                      with a return are needed).  Falling: the slope before is > 0 and the plateau
                      slope is < 0.5x [SLOPE_FALL] it.  Any plateau with a falling slope ->
                      two-clocks; a plateau whose return keeps its slope -> watch; no plateau ->
                      healthy; not-checkable without returns or without history before it.
``activation_rate``   Share of transitions with reward > 0.  The first 3 [ACT_WARMUP] iterations are
                      warm-up and ignored.  Dead: seed mean < 1e-6 [ACT_ZERO].  Dead for the last
                      >= 10 [ACT_DEAD_STREAK] consecutive rollouts -> two-clocks; only some seeds
                      dead that long -> risk.  On the last 20 [RECENT] rollouts: oscillating = >= 4
                      [ACT_FLIPS] dead<->alive flips and coefficient of variation (std/mean) > 0.5
                      [ACT_CV_OSC] -> risk; variance > 0.05 [ACT_VAR] (the write-up's bound), CV > 1
                      [ACT_CV_HIGH], or >= 4 flips -> watch.  A dead stretch of >= 10 that has
                      ended, or a fall of the last-10 mean (the recent window's second half) below
                      0.5 [ACT_FALL] x the previous-10 mean -> watch.  Otherwise (rising or
                      stable) healthy.
``adv_skew``          Skewness of advantages.  Recent window = the last 20 [RECENT] iterations.  A
                      run of >= 7 [SKEW_STREAK] consecutive iterations with |skew| > 2 [SKEW_LIMIT]
                      that ends inside the recent window -> two-clocks ("strong sign"); any
                      |skew| > 2 in the window, or one seed with such a run -> risk; an older run
                      of 7, or median |skew| > 1 [SKEW_NORMAL] in the window (outside the
                      write-up's normal -1..1) -> watch; else healthy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from tclock.runlog import nanmean_rows, seed_matrix, trailing_mean
from tclock.textfmt import fmt
from tclock.thresholds import (ACT_CV_HIGH, ACT_CV_OSC, ACT_DEAD_STREAK, ACT_FALL, ACT_FLIPS, ACT_VAR, ACT_WARMUP,
                               ACT_ZERO, PLATEAU_LEVEL, PRE_MIN_ITERS, RATIO_WINDOW, RECENT, RT_HIGH, RT_LOW,
                               RT_STALL, SKEW_LIMIT, SKEW_NORMAL, SKEW_STREAK, SLOPE_FALL, SLOPE_MIN_POINTS, SUSTAIN)

VERDICTS = ("healthy", "watch", "risk", "two-clocks", "not-checkable", "info")
RANK = {"healthy": 0, "watch": 1, "risk": 2, "two-clocks": 3}  # the judged verdicts, mildest first
ACT_RISE = 1.1  # trend label only (never a verdict): last-half mean above this x the first half is "rising"
W50 = "rt_ut_ratio_w50"


@dataclass
class Row:
    """One line of the report: a signal (verdict) or a checklist item (ok/missing/not-checkable)."""
    signal: str
    value: str
    threshold: str
    verdict: str
    kind: str = "signal"
    data: dict = field(default_factory=dict)


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
    """Length of the run of True at the end of ``mask``."""
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


def key_present(records: Sequence[dict], key: str) -> bool:
    """True when any record carries ``key`` (even as null)."""
    return any(key in r for r in records)


def seed_series(records: Sequence[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-record seed matrix (rows aligned with records) and its seed mean."""
    _, m = seed_matrix(records, key, keep_missing=True)
    return m, nanmean_rows(m)


def num(v) -> str:
    """A number for evidence text (``n/a`` when missing)."""
    return fmt(v, missing="n/a")


def seed_range(values: np.ndarray) -> str:
    """`` (seeds LO–HI)`` over one record's finite per-seed values; empty with fewer than two."""
    v = values[np.isfinite(values)]
    return f" (seeds {num(float(v.min()))}–{num(float(v.max()))})" if v.size >= 2 else ""


def iters_label(iters: np.ndarray, a: int, b: int) -> str:
    """``iterations A–B`` for the index range ``a..b``."""
    return f"iterations {int(iters[a])}–{int(iters[b])}"


# --------------------------------------------------------------------------- RT/UT level and plateau
RATIO_THRESHOLD = (f"healthy {RT_LOW}–{RT_HIGH}; <{RT_LOW} watch; >{RT_HIGH} risk; "
                   f">{RT_STALL} for >={SUSTAIN} iterations two-clocks")
PLATEAU_THRESHOLD = (f"windowed > {PLATEAU_LEVEL} for >={SUSTAIN} iterations while return slope "
                     f"< {SLOPE_FALL}x the slope before")


def _windowed_ratio(records: Sequence[dict]) -> tuple[np.ndarray, np.ndarray, str]:
    """``(raw, windowed, source)`` seed means per record; recomputes the window when the key is absent."""
    _, raw = seed_series(records, "rt_ut_ratio")
    if key_present(records, W50):
        return raw, seed_series(records, W50)[1], W50
    return raw, trailing_mean(raw, RATIO_WINDOW), f"recomputed from rt_ut_ratio (no {W50} key)"


def _ratio_verdict(latest: float, tail: int) -> tuple[str, str]:
    if tail >= SUSTAIN:
        return "two-clocks", f"stalled: > {RT_STALL} for the last {tail} iterations"
    if latest > RT_STALL:
        return "risk", f"> {RT_STALL} for only {tail} iterations (< {SUSTAIN}: not yet sustained)"
    if latest > RT_HIGH:
        return "risk", "rollout takes most of the update interval"
    if latest < RT_LOW:
        return "watch", "rollout cheap; batch may be small"
    return "healthy", ""


def _ratio_row(raw: np.ndarray, wv: np.ndarray, wi: np.ndarray, source: str) -> Row:
    """The level rule on the finite windowed values ``wv`` at iterations ``wi``."""
    latest, typical, top = float(wv[-1]), float(np.median(wv)), float(wv.max())
    stalled = wv > RT_STALL
    tail = trailing_streak(stalled)
    past = [(a, b) for a, b in streaks(stalled) if b - a + 1 >= SUSTAIN and b != len(wv) - 1]
    finite_raw = raw[np.isfinite(raw)]
    raw_latest = float(finite_raw[-1]) if finite_raw.size else math.nan
    evidence = (f"latest {num(latest)} (it {int(wi[-1])}), median {num(typical)}, max {num(top)}"
                f" over {wv.size} iterations; raw latest {num(raw_latest)}")
    if source != W50:
        evidence += f"; {source}"
    verdict, why = _ratio_verdict(latest, tail)
    if past and verdict == "healthy":
        a, b = past[-1]
        verdict, why = "watch", f"stalled earlier (> {RT_STALL} at {iters_label(wi, a, b)}), recovered since"
    if why:
        evidence += f" — {why}"
    return Row(W50, evidence, RATIO_THRESHOLD, verdict,
               data={"latest": latest, "median": typical, "max": top, "stall_streak": tail, "source": source})


def rt_ut_rows(records: Sequence[dict], iters: np.ndarray) -> list[Row]:
    """The ``rt_ut_ratio_w50`` row and the ``rt_ut_plateau`` row."""
    raw, w, source = _windowed_ratio(records)
    ok = np.isfinite(w)
    if not ok.any():
        return [Row(W50, "no RT/UT value yet (needs >= 2 iterations)", RATIO_THRESHOLD, "not-checkable"),
                Row("rt_ut_plateau", "no RT/UT value yet", PLATEAU_THRESHOLD, "not-checkable")]
    return [_ratio_row(raw, w[ok], iters[ok], source), plateau_row(records, iters, w)]


def _slope_if_enough(x: np.ndarray, y: np.ndarray) -> float | None:
    enough = int((np.isfinite(x) & np.isfinite(y)).sum()) >= SLOPE_MIN_POINTS
    return slope(x, y) if enough else None


def _plateau_slopes(xs: np.ndarray, ret: np.ndarray, iters: np.ndarray, a: int, b: int, scale: float) -> dict:
    """Return slopes over the plateau ``a..b`` and the stretch before it (scaled by ``scale``)."""
    p0 = max(0, a - max(b - a + 1, PRE_MIN_ITERS))
    s_pre = _slope_if_enough(xs[p0:a], ret[p0:a])
    s_in = _slope_if_enough(xs[a:b + 1], ret[a:b + 1])
    falling = s_pre is not None and s_in is not None and s_pre > 0 and s_in < SLOPE_FALL * s_pre
    return {"start": int(iters[a]), "end": int(iters[b]), "length": b - a + 1,
            "before_from": int(iters[p0]) if a > p0 else None,
            "slope_before": None if s_pre is None else s_pre * scale,
            "slope_plateau": None if s_in is None else s_in * scale, "falling": falling}


def plateau_row(records: Sequence[dict], iters: np.ndarray, w: np.ndarray) -> Row:
    """The plateau rule on the windowed ratio ``w`` (one value per record, NaN where missing)."""
    ok = np.isfinite(w)
    mask = ok & (np.where(ok, w, 0.0) > PLATEAU_LEVEL)
    plateaus = [(a, b) for a, b in streaks(mask) if b - a + 1 >= SUSTAIN]
    if not plateaus:
        longest = max((b - a + 1 for a, b in streaks(mask)), default=0)
        return Row("rt_ut_plateau", f"no plateau: windowed > {PLATEAU_LEVEL} for at most {longest} "
                   f"consecutive iterations", PLATEAU_THRESHOLD, "healthy", data={"plateaus": []})
    if not key_present(records, "episode_return"):
        a, b = plateaus[-1]
        return Row("rt_ut_plateau", f"plateau at {iters_label(iters, a, b)} but episode_return is not logged",
                   PLATEAU_THRESHOLD, "not-checkable", data={"plateaus": [[int(iters[a]), int(iters[b])]]})
    _, ret = seed_series(records, "episode_return")
    _, xs = seed_series(records, "env_steps")
    unit, scale = "per 1M env steps", 1e6
    if not np.isfinite(xs).any():
        xs, unit, scale = iters.astype(float), "per iteration", 1.0
    results = [_plateau_slopes(xs, ret, iters, a, b, scale) for a, b in plateaus]
    flagged = [r for r in results if r["falling"]]
    checkable = [r for r in results if r["slope_before"] is not None and r["slope_plateau"] is not None]
    shown = flagged[-1] if flagged else (checkable[-1] if checkable else results[-1])
    evidence = (f"plateau > {PLATEAU_LEVEL} at iterations {shown['start']}–{shown['end']} ({shown['length']} its); "
                f"return slope {unit}: before {num(shown['slope_before'])} → plateau {num(shown['slope_plateau'])}")
    if flagged:
        verdict, why = "two-clocks", "return growth slowed while the windowed ratio stayed high"
    elif checkable:
        verdict, why = "watch", "return slope held up"
    else:
        verdict = "not-checkable"
        why = f"too little return history (need >= {SLOPE_MIN_POINTS} points before and during)"
    return Row("rt_ut_plateau", f"{evidence} — {why}", PLATEAU_THRESHOLD, verdict,
               data={"plateaus": results, "slope_unit": unit})


# --------------------------------------------------------------------------- activation rate
ACTIVATION_THRESHOLD = (f"dead (<{ACT_ZERO:g}) for last >={ACT_DEAD_STREAK} rollouts two-clocks; last {RECENT}: "
                        f">={ACT_FLIPS} flips & CV>{ACT_CV_OSC} risk; var>{ACT_VAR} or CV>{ACT_CV_HIGH} watch")


def _activation_trend(vals: np.ndarray) -> tuple[str, float, float]:
    """``(trend, previous_half_mean, last_half_mean)`` over the recent window (``n/a`` when shorter)."""
    half = RECENT // 2
    if vals.size < RECENT:
        return "n/a", math.nan, math.nan
    prev, last = float(vals[-RECENT:-half].mean()), float(vals[-half:].mean())
    if prev > ACT_ZERO and last < ACT_FALL * prev:
        return "falling", prev, last
    if last > ACT_RISE * prev + ACT_ZERO:
        return "rising", prev, last
    return "stable", prev, last


def _activation_stats(vals: np.ndarray, mat: np.ndarray) -> dict:
    """Everything the activation rule looks at, from seed means ``vals`` and the seed matrix ``mat``."""
    dead = vals < ACT_ZERO
    recent = vals[-RECENT:]
    r_mean = float(recent.mean())
    seed_dead = [np.isfinite(mat[:, s]) & (np.nan_to_num(mat[:, s], nan=1.0) < ACT_ZERO) for s in range(mat.shape[1])]
    trend, prev, last = _activation_trend(vals)
    return {"latest": float(vals[-1]), "dead_streak": trailing_streak(dead),
            "dead_seeds": sum(1 for d in seed_dead if trailing_streak(d) >= ACT_DEAD_STREAK),
            "recent_mean": r_mean, "recent_var": float(recent.var()),
            "recent_cv": float(recent.std() / r_mean) if r_mean > ACT_ZERO else math.nan,
            "flips": flips(list(dead[-RECENT:])), "trend": trend, "prev10_mean": prev, "last10_mean": last,
            "recent_size": int(recent.size),
            "past_dead": [(a, b) for a, b in streaks(list(dead))
                          if b - a + 1 >= ACT_DEAD_STREAK and b != len(dead) - 1]}


def _activation_verdict(st: dict, its: np.ndarray, n_seeds: int) -> tuple[str, str]:
    """``(verdict, prefix)``: the prefix leads the evidence with the reason."""
    tail, cv = st["dead_streak"], st["recent_cv"]
    if tail >= ACT_DEAD_STREAK:
        return "two-clocks", f"≈0 for the last {tail} rollouts (since iteration {int(its[-tail])}); "
    if st["dead_seeds"]:
        return "risk", f"{st['dead_seeds']}/{n_seeds} seeds ≈0 for >= {ACT_DEAD_STREAK} rollouts; "
    if st["flips"] >= ACT_FLIPS and cv > ACT_CV_OSC:
        return "risk", "oscillating between reward and no reward; "
    if st["recent_var"] > ACT_VAR or cv > ACT_CV_HIGH or st["flips"] >= ACT_FLIPS:
        return "watch", "noisy; "
    if st["past_dead"]:
        a, b = st["past_dead"][-1]
        return "watch", f"was ≈0 at {iters_label(its, a, b)}, recovered; "
    return ("watch" if st["trend"] == "falling" else "healthy"), ""


def activation_row(records: Sequence[dict], iters: np.ndarray) -> Row:
    """The activation-rate rule (warm-up iterations dropped)."""
    if not key_present(records, "activation_rate"):
        return Row("activation_rate", "activation_rate not logged", ACTIVATION_THRESHOLD, "not-checkable")
    m, mean = seed_series(records, "activation_rate")
    keep = np.isfinite(mean) & (iters > ACT_WARMUP)
    vals, its, mat = mean[keep], iters[keep], m[keep]
    if vals.size == 0:
        return Row("activation_rate", f"no value after the {ACT_WARMUP}-iteration warm-up", ACTIVATION_THRESHOLD,
                   "not-checkable")
    st = _activation_stats(vals, mat)
    verdict, prefix = _activation_verdict(st, its, mat.shape[1])
    evidence = (f"{prefix}latest {num(st['latest'])}{seed_range(mat[-1])}, last-{st['recent_size']} mean "
                f"{num(st['recent_mean'])}, var {num(st['recent_var'])}, CV {num(st['recent_cv'])}, "
                f"flips {st['flips']}, trend {st['trend']}")
    data = {k: v for k, v in st.items() if k not in ("recent_size", "past_dead")}
    return Row("activation_rate", evidence, ACTIVATION_THRESHOLD, verdict, data=data)


# --------------------------------------------------------------------------- advantage skew
SKEW_THRESHOLD = (f"|skew|>{SKEW_LIMIT:g} in last {RECENT} risk; >={SKEW_STREAK} consecutive two-clocks; "
                  f"normal within ±{SKEW_NORMAL:g}")


def _seeds_with_skew_run(mat: np.ndarray, start_recent: int) -> list[int]:
    """Seeds with a run of >= SKEW_STREAK high |skew| that ends inside the recent window."""
    out = []
    for s in range(mat.shape[1]):
        col = mat[:, s]
        high = np.isfinite(col) & (np.abs(np.nan_to_num(col)) > SKEW_LIMIT)
        if any(b >= start_recent and b - a + 1 >= SKEW_STREAK for a, b in streaks(list(high))):
            out.append(s)
    return out


def _skew_verdict(runs, start_recent: int, n_high: int, seed_runs: list[int], med_abs: float,
                  its: np.ndarray) -> tuple[str, str]:
    """``(verdict, reason)``; ``runs`` are the streaks of |skew| > SKEW_LIMIT."""
    long_recent = [(a, b) for a, b in runs if b >= start_recent and b - a + 1 >= SKEW_STREAK]
    long_old = [(a, b) for a, b in runs if b < start_recent and b - a + 1 >= SKEW_STREAK]
    if long_recent:
        a, b = long_recent[-1]
        return "two-clocks", (f" — strong sign: |skew|>{SKEW_LIMIT:g} for {b - a + 1} consecutive "
                              f"({iters_label(its, a, b)})")
    if n_high:
        return "risk", ""
    if seed_runs:
        return "risk", f" — seed(s) {seed_runs} have |skew|>{SKEW_LIMIT:g} for >= {SKEW_STREAK} consecutive"
    if long_old:
        a, b = long_old[-1]
        return "watch", f" — earlier run of {b - a + 1} at {iters_label(its, a, b)}"
    if med_abs > SKEW_NORMAL:
        return "watch", f" — outside the normal ±{SKEW_NORMAL:g}"
    return "healthy", ""


def skew_row(records: Sequence[dict], iters: np.ndarray) -> Row:
    """The advantage-skew rule; a solved task is left to ``tclock.doctor_gradients.downgrade_if_solved``."""
    if not key_present(records, "adv_skew"):
        return Row("adv_skew", "adv_skew not logged", SKEW_THRESHOLD, "not-checkable")
    m, mean = seed_series(records, "adv_skew")
    keep = np.isfinite(mean)
    vals, its, mat = mean[keep], iters[keep], m[keep]
    if vals.size == 0:
        return Row("adv_skew", "adv_skew only ever null", SKEW_THRESHOLD, "not-checkable")
    start_recent = max(0, vals.size - RECENT)
    high = np.abs(vals) > SKEW_LIMIT
    runs = streaks(list(high))
    recent = vals[start_recent:]
    n_high = int(high[start_recent:].sum())
    med_abs = float(np.median(np.abs(recent)))
    seed_runs = _seeds_with_skew_run(mat, start_recent)
    longest = max((b - a + 1 for a, b in runs if b >= start_recent), default=0)
    verdict, why = _skew_verdict(runs, start_recent, n_high, seed_runs, med_abs, its)
    evidence = (f"latest {num(float(vals[-1]))}{seed_range(mat[-1])}; last {recent.size}: "
                f"{n_high} with |skew|>{SKEW_LIMIT:g}, longest run {longest}, median |skew| {num(med_abs)}{why}")
    return Row("adv_skew", evidence, SKEW_THRESHOLD, verdict,
               data={"latest": float(vals[-1]), "recent_high": n_high, "longest_recent_run": longest,
                     "recent_median_abs": med_abs, "seeds_with_run": seed_runs})
