"""The online step-size signal (tclock.step_size) on a noisy quadratic, where the optimal step
is known in closed form (McCandlish et al. 2018): L(theta) = theta'H theta / 2, per-env gradient
noise covariance Sigma, G = H theta, eps_opt(B) = |G|^2 / (G'HG + tr(H Sigma)/B),
eps_max = |G|^2 / G'HG, B_noise = tr(H Sigma) / G'HG.

The learning phase is one SGD step on the mean gradient of the envs it sees; the held-out loss
of the other half is the quadratic plus that half's (independent) linear noise term.  The
estimator in tclock.agents.actor_critic.split_update_noise runs as it does in training (JAX,
vmapped); the window sums and the conversions are tclock.step_size's."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from synthetic_phase import State

from tclock import step_size, thresholds
from tclock.agents.actor_critic import split_update_noise
from tclock.online_critical import windowed_ratio

D, B = 6, 64
H = jnp.array([4.0, 2.0, 1.0, 0.5, 0.25, 0.1])
SIGMA = jnp.array([30.0, 10.0, 20.0, 5.0, 8.0, 2.0])  # per-env gradient noise variances (diagonal)
THETA = jnp.array([1.0, -0.5, 0.8, 1.5, -1.0, 2.0])
G = H * THETA
GHG = float(jnp.sum(G * H * G))
TR_H_SIGMA = float(jnp.sum(H * SIGMA))
G2 = float(jnp.sum(G * G))
B_NOISE = TR_H_SIGMA / GHG
EPS_MAX = G2 / GHG


def eps_opt(b: float) -> float:
    return G2 / (GHG + TR_H_SIGMA / b)


@struct.dataclass
class Traj:
    noise: jax.Array  # [1, B, D]: each env's gradient noise
    reward: jax.Array  # [1, B] (the estimator reads B from it)


def gains(eps: float, n: int = 4000, seed: int = 0) -> dict:
    def update_one(state, traj, lr, with_gdc):
        grad = H * state.params + traj.noise.mean(axis=(0, 1))
        return state.replace(params=state.params - lr * grad), {}

    def heldout_loss(state, traj):
        noise = traj.noise.mean(axis=(0, 1))
        return lambda p: 0.5 * jnp.sum(H * p * p) + jnp.sum(noise * p)

    def one(k):
        kn, ks = jax.random.split(k)
        traj = Traj(jax.random.normal(kn, (1, B, D)) * jnp.sqrt(SIGMA), jnp.zeros((1, B)))
        return split_update_noise(update_one, State(params=THETA, key=ks), traj, eps, heldout_loss)

    out = jax.jit(jax.vmap(one))(jax.random.split(jax.random.PRNGKey(seed), n))
    return {k: np.asarray(v) for k, v in out.items()}


@pytest.mark.parametrize("eps_factor", [0.5, 1.0, 2.5])
def test_the_ratio_recovers_eps_over_eps_opt_on_a_noisy_quadratic(eps_factor):
    eps = eps_factor * eps_opt(B)
    g = gains(eps)
    actual_over_linear = windowed_ratio(g["step_gain_actual"][:, None], g["step_gain_linear"][:, None])[0]
    r_half = step_size.ratio_from_gains(actual_over_linear)
    assert r_half == pytest.approx(eps / eps_opt(B / 2), rel=0.08)  # the half phase sees B/2 envs
    r_full = step_size.full_batch_ratio(r_half, B_NOISE, B)
    assert r_full == pytest.approx(eps / eps_opt(B), rel=0.08)  # = eps_factor
    a = step_size.advice(r_full, B_NOISE, B)
    assert a["too_large"] == (eps_factor > thresholds.STEP_TOO_LARGE)
    assert a["lower_lr_by"] == pytest.approx(eps_factor, rel=0.08)
    if eps < EPS_MAX:  # a larger batch would make this eps the best step: eps = eps_opt(B')
        b_needed = B_NOISE / (EPS_MAX / eps - 1)
        assert a["raise_batch_to"] == pytest.approx(b_needed, rel=0.25)
    else:
        assert a["raise_batch_to"] is None


def test_conversions_and_edge_cases():
    assert math.isnan(step_size.ratio_from_gains(None)) and step_size.ratio_from_gains(1.0) == 0.0
    assert step_size.ratio_from_gains(0.0) == 2.0  # no held-out gain: twice the best step
    assert step_size.full_batch_ratio(2.0, None, 64) == 2.0  # no noise scale: the half-batch bound
    assert step_size.full_batch_ratio(2.0, 1e9, 64) == pytest.approx(1.0, rel=1e-6)  # noise-dominated: r/2
    assert math.isnan(step_size.full_batch_ratio(float("nan"), 10.0, 64))
    a = step_size.advice(float("nan"), 10.0, 64)
    assert not a["too_large"] and a["raise_batch_to"] is None and math.isnan(a["lower_lr_by"])
    assert step_size.advice(3.0, 10.0, 64)["raise_batch_to"] is None  # eps/eps_max = 3/1.16 > 1
    assert step_size.median_ratio([1.0, None, float("nan"), 3.0]) == 2.0
    assert math.isnan(step_size.median_ratio([]))
