"""Tests for tclock.critical on synthetic sweeps with known answers."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tclock import critical as crit

B = np.array([16, 32, 64, 128, 256, 512, 1024, 2048, 4096], dtype=float)
S_MIN, B_CRIT, T = 100.0, 256.0, 16
C = S_MIN * B_CRIT  # E_min / T


def s_of_b(b):
    return S_MIN + C / np.asarray(b, dtype=float)


# --------------------------------------------------------------------------- fit


def test_fit_exact_data_recovers_everything_with_units():
    fit = crit.fit_steps_to_target(B, s_of_b(B), T)
    assert fit.s_min == pytest.approx(S_MIN, rel=1e-9)
    assert fit.c == pytest.approx(C, rel=1e-9)
    assert fit.e_min == pytest.approx(C * T, rel=1e-9)  # env steps
    assert fit.b_crit == pytest.approx(B_CRIT, rel=1e-9)  # envs
    assert fit.b_crit_transitions == pytest.approx(B_CRIT * T, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12)
    assert fit.n_points == B.size and fit.n_dropped == 0 and fit.note == "" and fit.ok
    np.testing.assert_allclose(fit.predict(B), s_of_b(B), rtol=1e-9)
    # E = S*B*T identity: env steps to target -> E_min as B -> 0
    assert fit.to_dict()["e_min"] == pytest.approx(S_MIN * B_CRIT * T)


def test_fit_with_multiplicative_noise_recovers_b_crit():
    """5% log-normal noise on S: every one of 20 noisy sweeps gives B_crit within 25%, the
    median error is under 8% (observed ~4%), and relative weighting beats plain least squares."""
    errs_rel, errs_none = [], []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        s = s_of_b(B) * np.exp(rng.normal(0.0, 0.05, size=B.size))
        fit = crit.fit_steps_to_target(B, s, T)
        assert fit.ok, fit.note
        assert fit.b_crit == pytest.approx(B_CRIT, rel=0.25)
        assert fit.r2 > 0.95
        errs_rel.append(abs(fit.b_crit / B_CRIT - 1))
        errs_none.append(abs(crit.fit_steps_to_target(B, s, T, weighting="none").b_crit / B_CRIT - 1))
    assert np.median(errs_rel) < 0.08
    assert np.median(errs_rel) < np.median(errs_none)


def test_fit_drops_not_reached_points():
    s = list(s_of_b(B))
    s_missing = s.copy()
    s_missing[0] = None
    s_missing[3] = float("nan")
    fit = crit.fit_steps_to_target(B, s_missing, T)
    ref = crit.fit_steps_to_target(np.delete(B, [0, 3]), np.delete(np.array(s), [0, 3]), T)
    assert fit.n_dropped == 2 and fit.n_points == B.size - 2
    assert fit.b_crit == pytest.approx(ref.b_crit, rel=1e-12)
    assert fit.b_crit == pytest.approx(B_CRIT, rel=1e-9)


def test_fit_needs_two_distinct_batch_sizes():
    with pytest.raises(ValueError, match="2 distinct"):
        crit.fit_steps_to_target([64, 128, 256], [None, np.nan, 30.0], T)
    with pytest.raises(ValueError, match="2 distinct"):
        crit.fit_steps_to_target([64, 64, 64], [30.0, 31.0, 29.0], T)
    with pytest.raises(ValueError):
        crit.fit_steps_to_target([64, 128], [10.0], T)  # length mismatch
    with pytest.raises(ValueError):
        crit.fit_steps_to_target([64, 128], [10.0, 5.0], 0)  # bad unroll_length
    with pytest.raises(ValueError):
        crit.fit_steps_to_target([64, 128], [10.0, 5.0], T, weighting="bogus")
    # repeated batch sizes (one point per seed) are fine once there are two distinct ones
    fit = crit.fit_steps_to_target([64, 64, 256, 256], s_of_b([64, 64, 256, 256]), T)
    assert fit.b_crit == pytest.approx(B_CRIT, rel=1e-9)


def test_fit_degenerate_returns_nan_with_note():
    # larger batches need MORE iterations: c < 0
    fit = crit.fit_steps_to_target(B, 50.0 + 0.1 * B, T)
    assert math.isnan(fit.b_crit) and math.isnan(fit.b_crit_transitions)
    assert not fit.ok and "c = E_min/T" in fit.note
    assert fit.c < 0
    # S still falling like 1/B with no plateau and a negative intercept: S_min <= 0
    fit = crit.fit_steps_to_target(B, 5000.0 / B - 0.5, T)
    assert math.isnan(fit.b_crit)
    assert "S_min" in fit.note and fit.s_min < 0
    assert fit.n_points == B.size


# --------------------------------------------------------------------------- bootstrap


def multi_seed(rng, n_seeds=5, noise=0.10):
    return s_of_b(B)[:, None] * np.exp(rng.normal(0.0, noise, size=(B.size, n_seeds)))


def test_bootstrap_ci_contains_truth_and_is_reproducible():
    steps = multi_seed(np.random.default_rng(100))
    res = crit.bootstrap_b_crit(B, steps, T, n_boot=300, ci=0.9, rng=0)
    low, high, point, frac = res
    assert low < point < high
    assert low <= B_CRIT <= high
    assert high / low < 2.0  # informative, not a trivially wide interval
    assert frac == 1.0
    again = crit.bootstrap_b_crit(B, steps, T, n_boot=300, ci=0.9, rng=0)
    assert again == res
    narrower = crit.bootstrap_b_crit(B, steps, T, n_boot=300, ci=0.5, rng=0)
    assert low <= narrower.low <= narrower.high <= high
    # the point estimate is the fit on per-batch-size medians
    assert point == pytest.approx(crit.fit_steps_to_target(B, np.median(steps, 1), T).b_crit)


def test_bootstrap_coverage_on_many_synthetic_sweeps():
    """Nominal 90% CI; observed coverage ~0.9 over synthetic sweeps; require >= 75% of 30."""
    hits = 0
    for s in range(30):
        steps = multi_seed(np.random.default_rng(1000 + s))
        r = crit.bootstrap_b_crit(B, steps, T, n_boot=150, ci=0.9, rng=s)
        hits += r.low <= B_CRIT <= r.high
    assert hits >= 23


def test_bootstrap_handles_not_reached_seeds_and_failures():
    rng = np.random.default_rng(7)
    steps = multi_seed(rng)
    steps[0, :4] = np.nan  # smallest batch: only one seed reached the target
    steps[1, 1] = np.nan
    res = crit.bootstrap_b_crit(B, steps, T, n_boot=200, rng=1)
    assert np.isfinite(res.point) and np.isfinite(res.low) and np.isfinite(res.high)
    assert res.success_fraction == 1.0  # other batch sizes always keep the fit alive
    # only two batch sizes, one mostly missing: some resamples lose it and fail
    two = np.array([[np.nan, np.nan, np.nan, 150.0], [120.0, 118.0, 121.0, 119.0]])
    res = crit.bootstrap_b_crit([64, 512], two, T, n_boot=400, rng=2)
    # P(resample misses the lone reached seed) = (3/4)^4 ~ 0.32
    assert 0.55 < res.success_fraction < 0.8
    # nothing reached anywhere: all NaN, no exception
    res = crit.bootstrap_b_crit([64, 512], np.full((2, 3), np.nan), T, n_boot=20)
    assert all(math.isnan(v) for v in (res.low, res.high, res.point))
    assert res.success_fraction == 0.0
    with pytest.raises(ValueError):
        crit.bootstrap_b_crit([64, 512, 1024], two, T)  # shape mismatch


# --------------------------------------------------------------------------- timing


def test_fit_linear_time_recovers_a_and_k():
    rng = np.random.default_rng(3)
    a, k = 0.05, 2e-4
    bs = np.repeat(B, 3)
    t = (a + k * bs) * (1 + rng.normal(0, 0.02, size=bs.size))
    fit = crit.fit_linear_time(bs, t)
    assert fit.a == pytest.approx(a, rel=0.10)
    assert fit.k == pytest.approx(k, rel=0.05)
    assert fit.r2 > 0.99 and fit.n_points == bs.size
    t_nan = t.copy()
    t_nan[2] = np.nan
    assert crit.fit_linear_time(bs, t_nan).n_points == bs.size - 1
    with pytest.raises(ValueError):
        crit.fit_linear_time([128, 128], [0.1, 0.2])


def test_wallclock_optimum_minimises_total_time():
    a, k = 0.05, 2e-4
    b_star = crit.wallclock_optimum(B_CRIT, a, k)
    assert b_star == pytest.approx(math.sqrt(B_CRIT * a / k))
    grid = np.exp(np.linspace(np.log(1.0), np.log(1e5), 200001))
    total = (S_MIN + C / grid) * (a + k * grid)  # iterations x seconds per iteration
    assert b_star == pytest.approx(grid[np.argmin(total)], rel=1e-3)
    for bad in [(np.nan, a, k), (B_CRIT, 0.0, k), (B_CRIT, a, -1.0), (-5.0, a, k), (None, a, k)]:
        assert math.isnan(crit.wallclock_optimum(*bad))


# --------------------------------------------------------------------------- thresholds


def test_gdc_cliff():
    bs = [1024, 128, 512, 256]
    g = [0.33, 0.91, 0.52, 0.75]
    assert crit.gdc_cliff(bs, g) == 512
    assert crit.gdc_cliff(bs, g, threshold=0.8) == 256
    assert crit.gdc_cliff(bs, g, threshold=0.3) is None  # never below
    assert crit.gdc_cliff(bs, g, threshold=0.52) == 1024  # equal is not below
    assert crit.gdc_cliff([128, 256, 512], [np.nan, 0.7, 0.4]) == 512  # NaN skipped
    assert crit.gdc_cliff([128, 256], [0.1, 0.9]) == 128


def test_b_simple_to_envs():
    assert crit.b_simple_to_envs(4096.0, 16) == pytest.approx(256.0)
    np.testing.assert_allclose(crit.b_simple_to_envs([64.0, np.nan], 32), [2.0, np.nan])
    with pytest.raises(ValueError):
        crit.b_simple_to_envs(1.0, 0)


def test_rt_ut_crossings():
    bs = [512, 64, 4096, 256, 1024]
    r = [0.75, 0.2, 1.3, 0.5, 0.95]
    assert crit.rt_ut_crossings(bs, r) == {0.7: 512, 1.0: 4096}
    assert crit.rt_ut_crossings(bs, r, levels=(0.5, 2.0)) == {0.5: 256, 2.0: None}
    assert crit.rt_ut_crossings([64, 128], [0.1, 0.2]) == {0.7: None, 1.0: None}
    assert crit.rt_ut_crossings([64, 128], [np.nan, 1.0]) == {0.7: 128, 1.0: 128}


def test_steps_to_target():
    x = np.arange(1, 11) * 1000
    v = np.array([0.0, 0.1, 0.3, 0.2, 0.5, 0.8, 0.7, 0.9, 1.0, 1.0])
    hit = crit.steps_to_target(x, v, 0.5)
    assert hit == (5000.0, 4)
    assert crit.steps_to_target(x, v, 0.25).index == 2  # first crossing, not the sustained one
    miss = crit.steps_to_target(x, v, 1.5)
    assert math.isnan(miss.env_steps) and miss.index is None
    v_nan = v.copy()
    v_nan[:5] = np.nan
    assert crit.steps_to_target(x, v_nan, 0.5) == (6000.0, 5)
    with pytest.raises(ValueError):
        crit.steps_to_target(x[:3], v, 0.5)


def test_steps_to_target_smoothed():
    x = np.arange(1, 61) * 256.0  # B*T = 256 env steps per point
    step = np.where(np.arange(1, 61) >= 10, 1.0, 0.0)  # 0 -> 1 at point 10 (index 9)
    assert crit.steps_to_target(x, step, 0.5, smooth_steps=0) == (2560.0, 9)
    assert crit.steps_to_target(x, step, 0.5, smooth_steps=256) == (2560.0, 9)  # k = 1: raw
    assert crit.steps_to_target(x, step, 0.5, smooth_steps=1024).index == 10  # k = 4: 2 of 4 at 1
    assert crit.steps_to_target(x, step, 0.5, smooth_steps=1025).index == 11  # k = 5, ceil
    assert crit.steps_to_target(x, np.ones(60), 0.5, smooth_steps=1024).index == 3  # the window must be full
    assert crit.steps_to_target(x, step, 0.5, smooth_steps=16384).index is None  # k = 64 > 60 points
    spike = step.copy()
    spike[2] = 1.0
    assert crit.steps_to_target(x, spike, 0.5).index == 2
    assert crit.steps_to_target(x, spike, 0.5, smooth_steps=1024).index == 10
    gaps = step.copy()
    gaps[10:12] = np.nan  # skipped inside a window
    assert crit.steps_to_target(x, gaps, 0.5, smooth_steps=1024).index == 11  # [0, 1, nan, nan]: 1/2
    # a changing batch (DRBS): the window holds the fewest trailing points with >= smooth_steps env steps
    xv = np.cumsum([512, 512, 512, 128, 128, 128, 128, 128])
    vv = np.array([0, 0, 0, 1, 1, 1, 0, 1], dtype=float)
    assert crit.steps_to_target(xv, vv, 0.5, smooth_steps=512).index == 3  # points 2-3 (512 + 128 steps)
    assert crit.steps_to_target(xv, vv, 0.5, smooth_steps=1024).index == 4  # points 1-4 (512 + 512 + 2 x 128)
    with pytest.raises(ValueError):
        crit.steps_to_target(x[::-1], step, 0.5, smooth_steps=1024)
    with pytest.raises(ValueError):
        crit.steps_to_target(x, step, 0.5, smooth_steps=-1)
