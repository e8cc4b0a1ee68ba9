"""gae / hae / vtrace against plain NumPy loop references (tests/reference_advantages.py)."""
from __future__ import annotations

import itertools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_advantages import (  # noqa: E402
    discounted_returns_ref,
    gae_ref,
    hae_ref,
    vtrace_ref,
)

from tclock.advantages import gae, hae, vtrace  # noqa: E402

OPTION_COMBOS = list(itertools.product(("none", "value"), ("sum", "reward"), ("zero", "gae")))

gae_jit = jax.jit(gae)
vtrace_jit = jax.jit(vtrace)
hae_jit = jax.jit(
    hae,
    static_argnames=("window", "window_bootstrap", "combine", "outside", "max_events", "return_info"),
)


def close(actual, expected, tol=1e-5):
    """Equal to within ``tol`` relative to the expected array's scale (float32 sums of up to
    ``window`` local advantages carry rounding proportional to their size)."""
    expected = np.asarray(expected, dtype=np.float64)
    scale = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), expected, rtol=0, atol=tol * scale)


def make_inputs(rng, T, tail=(4,), event_rate=0.1, term_rate=0.05, trunc_rate=0.05, dtype=np.float32):
    shape = (T,) + tuple(tail)
    events = rng.random(shape) < event_rate
    # Non-events are 0 or negative, so `rewards > 0` picks exactly `events`.
    rewards = np.where(events, rng.uniform(0.1, 2.0, shape), np.where(rng.random(shape) < 0.5, 0.0, -rng.random(shape)))
    values = rng.normal(size=shape)
    next_values = rng.normal(size=shape)
    terms = rng.random(shape) < term_rate
    truncs = (rng.random(shape) < trunc_rate) & ~terms
    return tuple(np.asarray(x, dtype=dtype) for x in (rewards, values, next_values, terms, truncs))


def to_jnp(arrays):
    return tuple(jnp.asarray(a) for a in arrays)


# ------------------------------------------------------------------------------------------- GAE


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("T", [23, 200])
@pytest.mark.parametrize("done_rate", [0.0, 0.03, 0.3])
def test_gae_matches_reference(seed, T, done_rate):
    rng = np.random.default_rng(seed)
    xs = make_inputs(rng, T, (4,), term_rate=done_rate, trunc_rate=done_rate)
    gamma, lam = [(0.99, 0.95), (0.9, 0.5), (1.0, 1.0)][seed]
    adv, ret = gae_jit(*to_jnp(xs), gamma, lam)
    ref_adv, ref_ret = gae_ref(*xs, gamma=gamma, lam=lam)
    close(adv, ref_adv)
    close(ret, ref_ret)


def test_gae_all_done_is_one_step_delta():
    rng = np.random.default_rng(3)
    r, v, nv, _, _ = make_inputs(rng, 40, (3,))
    terms = (rng.random(r.shape) < 0.5).astype(np.float32)
    truncs = 1.0 - terms  # every step ends an episode, half by termination, half by time limit
    adv, _ = gae(*to_jnp((r, v, nv, terms, truncs)))
    one_step = r + 0.99 * (1.0 - terms) * nv - v
    close(adv, one_step)
    close(adv, gae_ref(r, v, nv, terms, truncs)[0])


def test_gae_truncation_bootstraps_termination_does_not():
    # Step 1 ends an episode; the next episode's numbers (step 2) must not leak into step 1.
    r = np.array([0.0, 1.0, 5.0], np.float32)
    v = np.array([0.0, 0.0, 0.0], np.float32)
    nv = np.array([0.0, 10.0, 0.0], np.float32)
    z = np.zeros(3, np.float32)
    g, lam = 0.5, 1.0
    trunc = np.array([0.0, 1.0, 0.0], np.float32)
    adv_tr, _ = gae(*to_jnp((r, v, nv, z, trunc)), g, lam)
    adv_te, _ = gae(*to_jnp((r, v, nv, trunc, z)), g, lam)
    np.testing.assert_allclose(np.asarray(adv_tr), [g * (1 + g * 10), 1 + g * 10, 5.0], atol=1e-6)
    np.testing.assert_allclose(np.asarray(adv_te), [g * 1.0, 1.0, 5.0], atol=1e-6)


def test_gae_batch_dims_jit_and_vmap():
    rng = np.random.default_rng(4)
    xs = make_inputs(rng, 64, (3, 5), term_rate=0.05, trunc_rate=0.05)  # [T, S, B]
    ref_adv, _ = gae_ref(*xs)
    adv, _ = gae_jit(*to_jnp(xs))
    close(adv, ref_adv)
    # vmap over the seed axis (each call sees [T, B]), then over env columns (each sees [T]).
    vm = jax.vmap(gae, in_axes=1, out_axes=1)
    close(jax.jit(vm)(*to_jnp(xs))[0], ref_adv)
    vm2 = jax.vmap(jax.vmap(gae, in_axes=1, out_axes=1), in_axes=1, out_axes=1)
    close(vm2(*to_jnp(xs))[0], ref_adv)


# ------------------------------------------------------------------------------------------- HAE


def hae_scenarios():
    """(name, inputs, kwargs): random columns of several densities plus the edge cases."""
    rng = np.random.default_rng(10)
    out = []
    out.append(("sparse", make_inputs(rng, 150, (4,), event_rate=0.03), dict(window=16)))
    out.append(("dense_overlap", make_inputs(rng, 120, (3,), event_rate=0.4, term_rate=0.02, trunc_rate=0.02),
                dict(window=20)))
    out.append(("dones_in_windows", make_inputs(rng, 90, (3,), event_rate=0.1, term_rate=0.15, trunc_rate=0.15),
                dict(window=12)))
    out.append(("odd_window_gamma1", make_inputs(rng, 60, (2,), event_rate=0.15), dict(window=9, gamma=1.0, lam=1.0)))
    out.append(("window_longer_than_T", make_inputs(rng, 25, (3,), event_rate=0.1), dict(window=80)))
    xs = make_inputs(rng, 30, (3,), event_rate=0.0)
    r = xs[0].copy()
    r[0, :] = 1.0       # event at index 0 in every column
    r[-1, :] = 2.0      # and at T-1
    r[5, 1] = 0.7
    out.append(("edges", (r,) + xs[1:], dict(window=8)))
    out.append(("threshold", make_inputs(rng, 70, (3,), event_rate=0.2), dict(window=10, threshold=0.8)))
    out.append(("negative_threshold", make_inputs(rng, 50, (2,), event_rate=0.1), dict(window=6, threshold=-0.5)))
    out.append(("cap", make_inputs(rng, 80, (3,), event_rate=0.3), dict(window=10, max_events=5)))
    return out


@pytest.mark.parametrize("window_bootstrap,combine,outside", OPTION_COMBOS)
def test_hae_matches_reference_all_options(window_bootstrap, combine, outside):
    opts = dict(window_bootstrap=window_bootstrap, combine=combine, outside=outside)
    for name, xs, kw in hae_scenarios():
        kw = dict(kw)
        gamma, lam = kw.pop("gamma", 0.99), kw.pop("lam", 0.95)
        thr = kw.pop("threshold", 0.0)
        adv, ret, info = hae_jit(*to_jnp(xs), gamma, lam, threshold=thr, return_info=True, **kw, **opts)
        ref_adv, ref_ret, found, dropped = hae_ref(*xs, gamma=gamma, lam=lam, threshold=thr, **kw, **opts)
        try:
            close(adv, ref_adv)
            close(ret, ref_ret)
            np.testing.assert_array_equal(np.asarray(info["events"]), found)
            np.testing.assert_array_equal(np.asarray(info["dropped_events"]), dropped)
        except AssertionError as e:
            raise AssertionError(f"scenario {name!r}: {e}") from None


@pytest.mark.parametrize("window_bootstrap,combine,outside", OPTION_COMBOS)
def test_hae_exact_in_float64(window_bootstrap, combine, outside):
    """In float64 the vectorised formulation agrees with the loop to ~1e-10: it is exact, not an
    approximation that happens to sit inside float32 tolerance."""
    opts = dict(window_bootstrap=window_bootstrap, combine=combine, outside=outside)
    with jax.enable_x64(True):
        rng = np.random.default_rng(11)
        for T, rate, window, gl in [(100, 0.3, 14, (0.99, 0.95)), (64, 0.8, 30, (1.0, 1.0)), (40, 0.05, 7, (0.9, 0.0))]:
            xs = make_inputs(rng, T, (3,), event_rate=rate, term_rate=0.05, trunc_rate=0.05, dtype=np.float64)
            adv, _ = hae_jit(*to_jnp(xs), *gl, window=window, **opts)
            assert adv.dtype == jnp.float64
            ref, _, _, _ = hae_ref(*xs, gamma=gl[0], lam=gl[1], window=window, **opts)
            close(adv, ref, tol=1e-10)


@pytest.mark.parametrize("window_bootstrap,combine", list(itertools.product(("none", "value"), ("sum", "reward"))))
def test_hae_no_events(window_bootstrap, combine):
    rng = np.random.default_rng(12)
    xs = make_inputs(rng, 50, (3,), event_rate=0.0)
    assert not (xs[0] > 0).any()
    opts = dict(window_bootstrap=window_bootstrap, combine=combine)
    adv, ret, info = hae_jit(*to_jnp(xs), window=8, return_info=True, **opts)
    np.testing.assert_array_equal(np.asarray(adv), 0.0)
    np.testing.assert_allclose(np.asarray(ret), xs[1])
    np.testing.assert_array_equal(np.asarray(info["events"]), 0)
    np.testing.assert_array_equal(np.asarray(info["window_count"]), 0)
    adv_g, _ = hae_jit(*to_jnp(xs), window=8, outside="gae", **opts)
    close(adv_g, gae_ref(*xs)[0])


def test_hae_windows_at_both_edges_and_their_support():
    T, L = 12, 6  # h = 3
    rng = np.random.default_rng(13)
    _, v, nv, _, _ = make_inputs(rng, T, (1,))
    r = np.zeros((T, 1), np.float32)
    z = np.zeros((T, 1), np.float32)
    r[0] = 1.0
    r[T - 1] = 1.0
    adv, _, info = hae_jit(*to_jnp((r, v, nv, z, z)), window=L, return_info=True)
    # event 0 -> [0, 3); event 11 -> [8, 12); nothing in between.
    count = np.asarray(info["window_count"])[:, 0]
    np.testing.assert_array_equal(count, [1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1])
    a = np.asarray(adv)[:, 0]
    assert np.all(a[3:8] == 0.0) and np.all(a[[0, 1, 2, 8, 9, 10, 11]] != 0.0)
    # window_bootstrap="none": step 2 is the first window's last step -> delta = r - V there.
    np.testing.assert_allclose(a[2], r[2, 0] - v[2, 0], atol=1e-6)
    np.testing.assert_allclose(a[11], r[11, 0] - v[11, 0], atol=1e-6)
    close(adv, hae_ref(r, v, nv, z, z, window=L)[0])


def test_hae_overlapping_windows_sum_local_gaes():
    T = 20
    rng = np.random.default_rng(14)
    _, v, nv, _, _ = make_inputs(rng, T, (1,))
    z = np.zeros((T, 1), np.float32)
    r = np.zeros((T, 1), np.float32)
    r[8], r[10] = 1.0, 3.0  # windows [4, 12) and [6, 14) overlap on [6, 12)
    adv, _, info = hae_jit(*to_jnp((r, v, nv, z, z)), window=8, return_info=True)
    assert np.asarray(info["window_count"])[6:12, 0].tolist() == [2] * 6
    from reference_advantages import gae_column

    col = [x[:, 0].astype(np.float64) for x in (r, v, nv, z, z)]
    w1 = gae_column(*(c[4:12] for c in col), 0.99, 0.95, last_bootstrap=False)
    w2 = gae_column(*(c[6:14] for c in col), 0.99, 0.95, last_bootstrap=False)
    expect = np.zeros(T)
    expect[4:12] += w1
    expect[6:14] += w2
    close(np.asarray(adv)[:, 0], expect)
    # combine="reward": weights 1 and 3, normalised on the overlap.
    adv_w, _ = hae_jit(*to_jnp((r, v, nv, z, z)), window=8, combine="reward")
    expect_w = np.zeros(T)
    expect_w[4:6] = w1[:2]
    expect_w[6:12] = (1.0 * w1[2:] + 3.0 * w2[:6]) / 4.0
    expect_w[12:14] = w2[6:]
    close(np.asarray(adv_w)[:, 0], expect_w)


def test_hae_episode_ends_inside_a_window_cut_the_trace():
    T = 16
    rng = np.random.default_rng(15)
    _, v, nv, _, _ = make_inputs(rng, T, (1,))
    r = np.zeros((T, 1), np.float32)
    r[8] = 1.0  # window [4, 12)
    base = np.zeros((T, 1), np.float32)
    done = base.copy()
    done[6] = 1.0
    for terms, truncs in [(done, base), (base, done)]:
        adv, _ = hae_jit(*to_jnp((r, v, nv, terms, truncs)), window=8, window_bootstrap="value")
        a = np.asarray(adv)[:, 0]
        boot = 0.0 if terms[6, 0] else 0.99 * nv[6, 0]
        np.testing.assert_allclose(a[6], r[6, 0] + boot - v[6, 0], atol=1e-6)  # trace cut at 6
        ref = hae_ref(r, v, nv, terms, truncs, window=8, window_bootstrap="value")[0]
        close(adv, ref)


def test_hae_cap_keeps_first_events_and_counts_dropped():
    T = 60
    rng = np.random.default_rng(16)
    xs = make_inputs(rng, T, (4,), event_rate=0.5)
    found = (xs[0] > 0).sum(0)
    cap = 6
    assert (found > cap).all()
    adv, _, info = hae_jit(*to_jnp(xs), window=10, max_events=cap, return_info=True)
    np.testing.assert_array_equal(np.asarray(info["events"]), found)
    np.testing.assert_array_equal(np.asarray(info["dropped_events"]), found - cap)
    # First come, first served: the sum of the local GAEs of each column's first `cap` events.
    from reference_advantages import gae_column

    expect = np.zeros(xs[0].shape)
    for b in range(xs[0].shape[1]):
        col = [x[:, b].astype(np.float64) for x in xs]
        for idx in np.flatnonzero(col[0] > 0)[:cap]:
            s, e = max(0, idx - 5), min(T, idx + 5)
            expect[s:e, b] += gae_column(*(c[s:e] for c in col), 0.99, 0.95, last_bootstrap=False)
    close(adv, expect)
    close(adv, hae_ref(*xs, window=10, max_events=cap)[0])
    # and it does differ from the uncapped estimate (the cap matters here).
    assert np.max(np.abs(np.asarray(adv) - hae_ref(*xs, window=10)[0])) > 1e-2
    # No cap: nothing dropped even with an event at every step.
    every = (np.abs(xs[0]) + 0.1,) + xs[1:]
    adv_all, _, info_all = hae_jit(*to_jnp(every), window=10, return_info=True)
    np.testing.assert_array_equal(np.asarray(info_all["dropped_events"]), 0)
    np.testing.assert_array_equal(np.asarray(info_all["events"]), T)
    close(adv_all, hae_ref(*every, window=10)[0])


def test_hae_window_longer_than_rollout():
    rng = np.random.default_rng(17)
    xs = make_inputs(rng, 20, (3,), event_rate=0.1)
    xs[0][3, 0] = 1.0
    # every window is clipped to [0, T): the sum counts each event once per step
    adv, _, info = hae_jit(*to_jnp(xs), window=100, window_bootstrap="value", return_info=True)
    n = (xs[0] > 0).sum(0)
    np.testing.assert_array_equal(np.asarray(info["window_count"]), np.broadcast_to(n, xs[0].shape))
    # value bootstrap + every window == the whole rollout: n copies of full GAE.
    close(adv, n * gae_ref(*xs)[0])
    close(adv, hae_ref(*xs, window=100, window_bootstrap="value")[0])


def test_hae_default_matches_writeup_sketch():
    """The write-up's PyTorch sketch transcribed literally: ``compute_gae`` on the slice with the
    slice's values only (next value ``values[t+1]`` inside, 0 at the slice's end)."""

    def compute_gae(r, d, v, gamma, lam):
        adv = np.zeros(len(r))
        last = 0.0
        for t in reversed(range(len(r))):
            next_v = v[t + 1] if t + 1 < len(r) else 0.0
            nonterminal = 1.0 - d[t]
            delta = r[t] + gamma * next_v * nonterminal - v[t]
            last = delta + gamma * lam * nonterminal * last
            adv[t] = last
        return adv

    def hierarchical_gae(rewards, dones, values, gamma=0.99, lam=0.95, window_len=64):
        advs = np.zeros_like(rewards)
        for idx in np.flatnonzero(rewards > 0):
            start = max(0, idx - window_len // 2)
            end = min(len(rewards), idx + window_len // 2)
            advs[start:end] += compute_gae(rewards[start:end], dones[start:end], values[start:end], gamma, lam)
        return advs

    rng = np.random.default_rng(18)
    T = 300
    for rate in (0.01, 0.05, 0.3):
        r, v, _, _, _ = make_inputs(rng, T, (1,), event_rate=rate)
        r, v = r[:, 0].astype(np.float64), v[:, 0].astype(np.float64)
        d = (rng.random(T) < 0.03).astype(np.float64)
        nv = np.append(v[1:], rng.normal())  # consistent with the sketch's values[t+1]
        expect = hierarchical_gae(r, d, v)
        adv, _ = hae_jit(*to_jnp(x.astype(np.float32) for x in (r, v, nv, d, np.zeros(T))))
        close(adv, expect)


def test_hae_jit_and_vmap_over_seeds_and_columns():
    rng = np.random.default_rng(19)
    xs = make_inputs(rng, 64, (3, 4), event_rate=0.1)  # [T, S, B]
    kw = dict(window=12, combine="reward", outside="gae")
    ref = hae_ref(*xs, **kw)[0]
    close(hae_jit(*to_jnp(xs), **kw)[0], ref)
    per_seed = jax.jit(jax.vmap(lambda *a: hae(*a, **kw)[0], in_axes=1, out_axes=1))
    close(per_seed(*to_jnp(xs)), ref)
    per_col = jax.vmap(jax.vmap(lambda *a: hae(*a, **kw)[0], in_axes=1, out_axes=1), in_axes=1, out_axes=1)
    close(per_col(*to_jnp(xs)), ref)


@pytest.mark.parametrize(
    "kw",
    [dict(window=1), dict(window=8.5), dict(window_bootstrap="zero"), dict(combine="mean"), dict(outside="nan"),
     dict(max_events=-1)],
)
def test_hae_rejects_bad_options(kw):
    xs = to_jnp(make_inputs(np.random.default_rng(0), 8, (1,)))
    with pytest.raises(ValueError):
        hae(*xs, **kw)


# ---------------------------------------------------------------------------------------- V-trace


def make_logps(rng, shape, spread):
    b = rng.normal(size=shape).astype(np.float32)
    return b, (b + spread * rng.normal(size=shape)).astype(np.float32)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("T,done_rate", [(20, 0.0), (120, 0.05), (60, 0.4)])
def test_vtrace_matches_reference(seed, T, done_rate):
    rng = np.random.default_rng(100 + seed)
    xs = make_inputs(rng, T, (4,), term_rate=done_rate, trunc_rate=done_rate)
    mu, pi = make_logps(rng, xs[0].shape, 0.7)
    kw = [dict(), dict(gamma=0.9, lam=0.8, rho_bar=1.5, c_bar=0.7), dict(gamma=0.97, lam=0.95, rho_bar=0.8, c_bar=1.2)][seed]
    vs, pg = vtrace_jit(jnp.asarray(mu), jnp.asarray(pi), *to_jnp(xs), **kw)
    ref_vs, ref_pg = vtrace_ref(mu, pi, *xs, **kw)
    close(vs, ref_vs)
    close(pg, ref_pg)


@pytest.mark.parametrize("done_rate", [0.0, 0.1])
def test_vtrace_on_policy_is_discounted_return_and_gae_lam1(done_rate):
    rng = np.random.default_rng(200)
    r, v, nv, te, tr = make_inputs(rng, 80, (3,), term_rate=done_rate, trunc_rate=done_rate)
    # Consistent values (next_values[t] = values[t+1] within an episode), so targets telescope.
    within = (te + tr == 0)[:-1]
    nv[:-1] = np.where(within, v[1:], nv[:-1])
    xs = (r, v, nv, te, tr)
    logp = jnp.asarray(rng.normal(size=xs[0].shape).astype(np.float32))
    vs, pg = vtrace(logp, logp, *to_jnp(xs), gamma=0.97)
    close(vs, discounted_returns_ref(xs[0], xs[2], xs[3], xs[4], gamma=0.97))
    adv1, _ = gae(*to_jnp(xs), gamma=0.97, lam=1.0)
    close(np.asarray(vs) - xs[1], adv1)
    # on-policy pg advantage is the one-step TD error against the v-trace target of the next state
    vs_np = np.asarray(vs)
    done = (xs[3] + xs[4]) > 0
    nxt = np.where(done, xs[2], np.concatenate([vs_np[1:], xs[2][-1:]]))
    close(pg, xs[0] + 0.97 * (1 - xs[3]) * nxt - xs[1])


def test_vtrace_truncation_bootstraps_termination_does_not():
    r = np.array([[0.0], [1.0], [5.0]], np.float32)
    v = np.zeros((3, 1), np.float32)
    nv = np.array([[0.0], [10.0], [0.0]], np.float32)
    z = np.zeros((3, 1), np.float32)
    end = np.array([[0.0], [1.0], [0.0]], np.float32)
    logp = jnp.zeros((3, 1))
    g = 0.5
    vs_tr, pg_tr = vtrace(logp, logp, *to_jnp((r, v, nv, z, end)), gamma=g)
    vs_te, pg_te = vtrace(logp, logp, *to_jnp((r, v, nv, end, z)), gamma=g)
    np.testing.assert_allclose(np.asarray(vs_tr)[:, 0], [g * (1 + g * 10), 1 + g * 10, 5.0], atol=1e-6)
    np.testing.assert_allclose(np.asarray(vs_te)[:, 0], [g * 1.0, 1.0, 5.0], atol=1e-6)
    np.testing.assert_allclose(np.asarray(pg_tr)[:, 0], [g * (1 + g * 10), 1 + g * 10, 5.0], atol=1e-6)
    np.testing.assert_allclose(np.asarray(pg_te)[:, 0], [g * 1.0, 1.0, 5.0], atol=1e-6)


def test_vtrace_clipping_changes_targets_and_jit_vmap():
    rng = np.random.default_rng(300)
    xs = make_inputs(rng, 40, (2, 3), term_rate=0.05, trunc_rate=0.05)  # [T, S, B]
    mu, pi = make_logps(rng, xs[0].shape, 1.0)
    ref = vtrace_ref(mu, pi, *xs, rho_bar=1.0, c_bar=1.0)
    vm = jax.jit(jax.vmap(lambda *a: vtrace(*a), in_axes=1, out_axes=1))
    out = vm(jnp.asarray(mu), jnp.asarray(pi), *to_jnp(xs))
    close(out[0], ref[0])
    close(out[1], ref[1])
    loose = vtrace_jit(jnp.asarray(mu), jnp.asarray(pi), *to_jnp(xs), rho_bar=100.0, c_bar=100.0)
    assert np.max(np.abs(np.asarray(loose[0]) - ref[0])) > 1e-2  # clipping is active in this data
    close(loose[0], vtrace_ref(mu, pi, *xs, rho_bar=100.0, c_bar=100.0)[0])


def test_vtrace_outputs_are_constants():
    rng = np.random.default_rng(400)
    r, v, nv, te, tr = to_jnp(make_inputs(rng, 10, (2,)))
    mu, pi = (jnp.asarray(x) for x in make_logps(rng, r.shape, 0.3))

    def loss(values, next_values, target_logp):
        vs, pg = vtrace(mu, target_logp, r, values, next_values, te, tr)
        return jnp.sum(vs) + jnp.sum(pg)

    grads = jax.grad(loss, argnums=(0, 1, 2))(v, nv, pi)
    for g in grads:
        np.testing.assert_array_equal(np.asarray(g), 0.0)


def test_hae_max_events_zero_means_no_cap_as_in_the_config():
    """``hae_max_events: 0`` is "no cap" in the config; ``hae(max_events=0)`` means the same."""
    xs = make_inputs(np.random.default_rng(3), 40, (3,), event_rate=0.4)
    adv0, _, info0 = hae_jit(*to_jnp(xs), window=10, max_events=0, return_info=True)
    adv_none, _, info_none = hae_jit(*to_jnp(xs), window=10, return_info=True)
    close(adv0, adv_none)
    assert (np.asarray(info0["events"]) > 0).all() and (np.asarray(info0["dropped_events"]) == 0).all()
    assert np.abs(np.asarray(adv0)).max() > 0.1  # the events got their windows
    close(adv0, hae_ref(*xs, window=10, max_events=0)[0])
