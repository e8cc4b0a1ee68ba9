"""Tests for tclock.diagnostics against plain NumPy / Python-loop references."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from tclock import diagnostics as diag


# --------------------------------------------------------------------------- references


def skew_ref(x):
    x = np.asarray(x, dtype=np.float64).ravel()
    d = x - x.mean()
    return np.mean(d**3) / np.mean(d**2) ** 1.5


def top1_ref(x):
    a = np.sort(np.abs(np.asarray(x, dtype=np.float64).ravel()))[::-1]
    k = max(1, math.ceil(a.size / 100))
    return a[:k].sum() / a.sum()


def cos_pairs_ref(vectors):
    """Mean pairwise cosine over i<j by a double loop (zero vectors: cosine 0)."""
    k = len(vectors)
    total, n = 0.0, 0
    for i in range(k):
        for j in range(i + 1, k):
            ni, nj = np.linalg.norm(vectors[i]), np.linalg.norm(vectors[j])
            total += 0.0 if ni == 0 or nj == 0 else float(vectors[i] @ vectors[j]) / (ni * nj)
            n += 1
    return total / n


def flat_ref(tree, k):
    leaves = jax.tree_util.tree_leaves(tree)
    return np.concatenate([np.asarray(l, dtype=np.float64).reshape(k, -1) for l in leaves], 1)


def random_tree(rng, k):
    return {
        "dense": {"kernel": rng.normal(size=(k, 7, 3)), "bias": rng.normal(size=(k, 3))},
        "head": rng.normal(size=(k, 11)),
        "scalar": rng.normal(size=(k,)),
    }


# --------------------------------------------------------------------------- activation rate


def test_activation_rate_matches_numpy_on_random_rewards():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(16, 8, 3)) * (rng.uniform(size=(16, 8, 3)) < 0.3)
    got = float(diag.activation_rate(jnp.asarray(r)))
    assert got == pytest.approx(np.mean(r > 0), abs=1e-6)
    assert 0.0 < got < 0.3  # a sparse batch: guards against counting nonzeros instead of > 0


def test_activation_rate_edge_cases():
    assert float(diag.activation_rate(jnp.zeros((5, 4)))) == 0.0
    assert float(diag.activation_rate(-jnp.ones((5, 4)))) == 0.0  # negative rewards do not count
    assert float(diag.activation_rate(jnp.ones((5, 4)) * 1e-3)) == 1.0
    r = jnp.zeros((10, 2)).at[3, 1].set(1.0)
    assert float(diag.activation_rate(r)) == pytest.approx(1 / 20)
    assert float(jax.jit(diag.activation_rate)(r)) == pytest.approx(1 / 20)


# --------------------------------------------------------------------------- success rate


def success_ref(success, dones):
    n, s = 0, 0
    for t in range(success.shape[0]):
        for b in range(success.shape[1]):
            if dones[t, b] > 0:
                n += 1
                s += int(success[t, b] > 0)
    return (s / n if n else 0.0), n


def test_finished_episode_success_random_matches_loop():
    rng = np.random.default_rng(1)
    dones = (rng.uniform(size=(50, 6)) < 0.1).astype(np.float32)
    success = (rng.uniform(size=(50, 6)) < 0.4).astype(np.float32)
    rate, count = diag.finished_episode_success(jnp.asarray(success), jnp.asarray(dones))
    ref_rate, ref_n = success_ref(success, dones)
    assert ref_n > 0
    assert float(count) == ref_n
    assert float(rate) == pytest.approx(ref_rate, abs=1e-6)


def test_finished_episode_success_edge_cases():
    T, B = 4, 3
    # no dones: rate is 0 (documented), count 0, no NaN
    rate, count = diag.finished_episode_success(jnp.ones((T, B)), jnp.zeros((T, B)))
    assert float(count) == 0.0 and float(rate) == 0.0
    # all dones, half succeed
    succ = jnp.asarray(np.tile([1.0, 0.0, 1.0], (T, 1)))
    rate, count = diag.finished_episode_success(succ, jnp.ones((T, B), dtype=bool))
    assert float(count) == T * B
    assert float(rate) == pytest.approx(2 / 3)
    # success flags at steps that are not episode ends are ignored
    succ = jnp.zeros((T, B)).at[1, 0].set(1.0)
    dones = jnp.zeros((T, B)).at[3, 0].set(1.0)
    rate, count = diag.finished_episode_success(succ, dones)
    assert float(count) == 1.0 and float(rate) == 0.0
    rate, count = jax.jit(diag.finished_episode_success)(succ.at[3, 0].set(1.0), dones)
    assert float(count) == 1.0 and float(rate) == 1.0


# --------------------------------------------------------------------------- advantage stats


@pytest.mark.parametrize("n", [1, 7, 100, 101, 1000, 2345])
def test_advantage_stats_match_numpy_and_scipy(n):
    rng = np.random.default_rng(n)
    a = rng.exponential(size=n) - 0.7 + 0.1 * rng.normal(size=n)  # right-skewed
    out = diag.advantage_stats(jnp.asarray(a, dtype=jnp.float32))
    assert float(out["adv_mean"]) == pytest.approx(a.mean(), abs=1e-5)
    assert float(out["adv_std"]) == pytest.approx(a.std(), rel=1e-4)
    assert float(out["adv_top1_share"]) == pytest.approx(top1_ref(a), rel=1e-5)
    if n > 1:
        assert float(out["adv_skew"]) == pytest.approx(skew_ref(a), rel=1e-3, abs=1e-5)
        assert float(out["adv_skew"]) == pytest.approx(scipy.stats.skew(a, bias=True), rel=1e-3, abs=1e-5)
    else:
        assert float(out["adv_skew"]) == 0.0
    if n >= 100:
        assert float(out["adv_skew"]) > 1.0  # exponential-like: skew ~2, sign matters


def test_advantage_stats_shapes_flattened_and_skew_sign():
    rng = np.random.default_rng(3)
    a = -(rng.exponential(size=(32, 4, 2)))  # left-skewed, multi-dim
    out = jax.jit(diag.advantage_stats)(jnp.asarray(a, dtype=jnp.float32))
    assert float(out["adv_skew"]) == pytest.approx(scipy.stats.skew(a.ravel()), rel=1e-3)
    assert float(out["adv_skew"]) < 0
    assert float(out["adv_top1_share"]) == pytest.approx(top1_ref(a), rel=1e-5)


def test_advantage_stats_top1_concentrated():
    a = np.zeros(1000)
    a[:10] = 5.0
    a[10:] = 0.01
    out = diag.advantage_stats(jnp.asarray(a, dtype=jnp.float32))
    expected = 50.0 / (50.0 + 990 * 0.01)
    assert float(out["adv_top1_share"]) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("value", [0.0, 0.1, 3.7, -1234.5])
def test_advantage_stats_constant_input_gives_zero_skew(value):
    out = diag.advantage_stats(jnp.full((1000,), value, dtype=jnp.float32))
    for key, v in out.items():
        assert np.isfinite(float(v)), key
    assert float(out["adv_skew"]) == 0.0
    assert float(out["adv_std"]) <= 1e-6 * max(1.0, abs(value))
    assert float(out["adv_top1_share"]) == pytest.approx(0.0 if value == 0 else 0.01, abs=1e-6)


def test_advantage_stats_vmaps_over_seeds():
    rng = np.random.default_rng(4)
    a = rng.gamma(2.0, size=(3, 200)).astype(np.float32)
    out = jax.vmap(diag.advantage_stats)(jnp.asarray(a))
    for s in range(3):
        assert float(out["adv_skew"][s]) == pytest.approx(skew_ref(a[s]), rel=1e-3)
        assert float(out["adv_top1_share"][s]) == pytest.approx(top1_ref(a[s]), rel=1e-5)


# --------------------------------------------------------------------------- flatten / gdc


def test_flatten_stacked_order_and_shape():
    rng = np.random.default_rng(5)
    tree = random_tree(rng, 5)
    flat = diag.flatten_stacked(jax.tree_util.tree_map(jnp.asarray, tree))
    assert flat.shape == (5, 7 * 3 + 3 + 11 + 1)
    np.testing.assert_allclose(np.asarray(flat), flat_ref(tree, 5), rtol=1e-6)


def test_flatten_stacked_rejects_mismatched_k():
    with pytest.raises(ValueError, match="leading axis"):
        diag.flatten_stacked({"a": jnp.ones((3, 2)), "b": jnp.ones((4, 2))})


def test_gdc_identical_orthogonal_opposite():
    g = np.random.default_rng(6).normal(size=(1, 40))
    assert float(diag.gdc_from_flat(jnp.asarray(np.repeat(g, 5, 0)))) == pytest.approx(1.0, abs=1e-5)
    # scaled copies are still identical directions
    scaled = g * np.array([[0.1], [1.0], [7.0]])
    assert float(diag.gdc_from_flat(jnp.asarray(scaled))) == pytest.approx(1.0, abs=1e-5)
    assert float(diag.gdc_from_flat(jnp.eye(4) * 3.0)) == pytest.approx(0.0, abs=1e-6)
    assert float(diag.gdc_from_flat(jnp.asarray(np.concatenate([g, -2 * g])))) == pytest.approx(-1.0, abs=1e-5)


def test_gdc_matches_pairwise_loop_on_random_pytrees():
    rng = np.random.default_rng(7)
    for trial in range(3):
        tree = random_tree(rng, 5)
        # a shared direction so the answer is well away from 0
        shared = random_tree(rng, 1)
        tree = jax.tree_util.tree_map(lambda x, s: x + (trial + 0.5) * s, tree, shared)
        expected = cos_pairs_ref(list(flat_ref(tree, 5)))
        got = diag.gdc(jax.tree_util.tree_map(jnp.asarray, tree))
        got_jit = jax.jit(diag.gdc)(jax.tree_util.tree_map(jnp.asarray, tree))
        assert float(got) == pytest.approx(expected, abs=1e-5)
        assert float(got_jit) == pytest.approx(expected, abs=1e-5)
    assert abs(expected) > 0.1


def test_gdc_zero_gradient_is_guarded():
    rng = np.random.default_rng(8)
    flat = rng.normal(size=(4, 30))
    flat[2] = 0.0
    got = float(diag.gdc_from_flat(jnp.asarray(flat)))
    assert np.isfinite(got)
    assert got == pytest.approx(cos_pairs_ref(list(flat)), abs=1e-5)
    assert float(diag.gdc_from_flat(jnp.zeros((3, 5)))) == 0.0


def test_gdc_needs_two_gradients():
    with pytest.raises(ValueError, match="K=2"):
        diag.gdc_from_flat(jnp.ones((1, 4)))


def test_gdc_vmaps_over_seeds():
    rng = np.random.default_rng(9)
    flat = rng.normal(size=(3, 5, 20)) + rng.normal(size=(3, 1, 20))
    got = jax.vmap(diag.gdc_from_flat)(jnp.asarray(flat))
    for s in range(3):
        assert float(got[s]) == pytest.approx(cos_pairs_ref(list(flat[s])), abs=1e-5)


# --------------------------------------------------------------------------- noise scale


def noise_ref(flat, b):
    flat = np.asarray(flat, dtype=np.float64)
    k = flat.shape[0]
    gram = flat @ flat.T
    p = (gram.sum() - np.trace(gram)) / (k * (k - 1))
    m2 = np.trace(gram) / k
    return p, m2, b * (m2 - p)


def test_noise_scale_matches_gram_reference_on_pytree():
    rng = np.random.default_rng(10)
    tree = random_tree(rng, 5)
    shared = random_tree(rng, 1)
    tree = jax.tree_util.tree_map(lambda x, s: x + 2.0 * s, tree, shared)
    out = jax.jit(diag.noise_scale, static_argnums=1)(jax.tree_util.tree_map(jnp.asarray, tree), 64)
    p, m2, tr = noise_ref(flat_ref(tree, 5), 64)
    assert p > 0
    assert float(out["grad_norm_sq"]) == pytest.approx(p, rel=1e-4)
    assert float(out["mean_grad_sq_norm"]) == pytest.approx(m2, rel=1e-5)
    assert float(out["trace_sigma"]) == pytest.approx(tr, rel=1e-4)
    assert float(out["b_simple"]) == pytest.approx(tr / p, rel=1e-4)
    assert bool(out["b_simple_valid"])


def test_noise_scale_estimates_are_unbiased():
    """g_i = G + noise, Cov(noise) = Sigma/b: averaged over 4000 draws, p -> |G|^2 and
    b(m2 - p) -> tr(Sigma).  Monte-Carlo relative error ~0.3% (std); tolerance 3%.  The
    naive estimates (m2 for |G|^2, or dropping the p correction) are off by > 50% here."""
    rng = np.random.default_rng(11)
    d, k, b, n = 32, 5, 64, 4000
    g_true = rng.normal(size=d)
    g_true *= np.sqrt(2.0) / np.linalg.norm(g_true)  # |G|^2 = 2
    sigma_diag = rng.uniform(0.5, 2.0, size=d) * 4.0  # per-transition variances
    tr_true = sigma_diag.sum()  # ~150, so tr/b ~ 2.4 ~ |G|^2: signal and noise comparable
    draws = g_true + rng.normal(size=(n, k, d)) * np.sqrt(sigma_diag / b)
    out = jax.jit(jax.vmap(lambda f: diag.noise_scale_from_flat(f, b)))(jnp.asarray(draws, jnp.float32))
    p_mean = float(jnp.mean(out["grad_norm_sq"]))
    tr_mean = float(jnp.mean(out["trace_sigma"]))
    assert p_mean == pytest.approx(2.0, rel=0.03)
    assert tr_mean == pytest.approx(tr_true, rel=0.03)
    # the uncorrected estimate would fail the same check
    assert float(jnp.mean(out["mean_grad_sq_norm"])) > 1.5 * 2.0


def test_b_simple_agrees_with_gdc_in_high_dimensions():
    """Isotropic noise in D=20000 dims: cos(g_i, g_j) concentrates at c = 1/(1 + b_simple/b),
    so b(1-c)/c from GDC matches b_simple from the noise-scale estimate and the truth (10%)."""
    rng = np.random.default_rng(12)
    d, k = 20000, 5
    for b, ratio in [(64, 1.0), (256, 3.0)]:  # ratio = b_simple_true / b
        g_true = rng.normal(size=d)
        g_true /= np.linalg.norm(g_true)  # |G|^2 = 1
        var = ratio * b / d  # per-transition per-dim variance: tr(Sigma) = ratio * b
        b_simple_true = var * d / 1.0
        flat = jnp.asarray(g_true + rng.normal(size=(k, d)) * np.sqrt(var / b), jnp.float32)
        ns = diag.noise_scale_from_flat(flat, b)
        c = float(diag.gdc_from_flat(flat))
        assert c == pytest.approx(1.0 / (1.0 + ratio), rel=0.05)
        assert float(ns["b_simple"]) == pytest.approx(b_simple_true, rel=0.10)
        assert float(ns["b_simple"]) == pytest.approx(b * (1 - c) / c, rel=0.10)
        # in envs: divide by T
        from tclock.critical import b_simple_to_envs

        assert b_simple_to_envs(float(ns["b_simple"]), 16) == pytest.approx(float(ns["b_simple"]) / 16)


def test_noise_scale_nan_when_signal_not_detectable():
    g = np.random.default_rng(13).normal(size=(1, 10))
    out = diag.noise_scale_from_flat(jnp.asarray(np.concatenate([g, -g])), 32)
    assert float(out["grad_norm_sq"]) < 0
    assert np.isnan(float(out["b_simple"]))
    assert not bool(out["b_simple_valid"])
    assert np.isfinite(float(out["trace_sigma"]))
    # K=1 is refused up front
    with pytest.raises(ValueError, match="K=2"):
        diag.noise_scale_from_flat(jnp.ones((1, 3)), 8)
