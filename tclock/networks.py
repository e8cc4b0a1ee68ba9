"""Flax modules: the actor-critic Gaussian policy (state-independent log-std) and value MLP; SAC's squashed-Gaussian actor and twin Q."""
from __future__ import annotations

import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "swish": nn.swish}
LOG_2PI = math.log(2.0 * math.pi)  # a Python float: importing tclock must not start a JAX backend


class MLP(nn.Module):
    hidden: Sequence[int]
    out: int
    activation: str = "tanh"
    out_scale: float = 1.0

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        for width in self.hidden:
            x = act(nn.Dense(width, kernel_init=nn.initializers.orthogonal(jnp.sqrt(2.0)))(x))
        return nn.Dense(self.out, kernel_init=nn.initializers.orthogonal(self.out_scale))(x)


class GaussianPolicy(nn.Module):
    """Mean from an MLP, log-std a learned vector; actions are clipped to [-1, 1] by the caller."""

    hidden: Sequence[int]
    action_size: int
    activation: str = "tanh"

    @nn.compact
    def __call__(self, obs):
        mean = MLP(self.hidden, self.action_size, self.activation, out_scale=0.01)(obs)
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_size,))
        return mean, jnp.broadcast_to(log_std, mean.shape)


class ValueNet(nn.Module):
    hidden: Sequence[int]
    activation: str = "tanh"

    @nn.compact
    def __call__(self, obs):
        return MLP(self.hidden, 1, self.activation, out_scale=1.0)(obs)[..., 0]


def gaussian_log_prob(mean, log_std, x):
    return jnp.sum(-0.5 * jnp.square((x - mean) / jnp.exp(log_std)) - log_std - 0.5 * LOG_2PI, axis=-1)


def gaussian_entropy(log_std):
    return jnp.sum(log_std + 0.5 * (1.0 + LOG_2PI), axis=-1)


def sample_gaussian(key, mean, log_std):
    return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)


# ---------------------------------------------------------------------------- SAC
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # the squashed Gaussian's log-std range (SAC)


class TanhGaussianActor(nn.Module):
    """SAC's actor: mean and a state-dependent log-std (squashed into [LOG_STD_MIN, LOG_STD_MAX])
    of a Gaussian whose sample ``u`` acts as ``tanh(u)``."""

    hidden: Sequence[int]
    action_size: int
    activation: str = "relu"

    @nn.compact
    def __call__(self, obs):
        out = MLP(self.hidden, 2 * self.action_size, self.activation, out_scale=0.01)(obs)
        mean, raw = jnp.split(out, 2, axis=-1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (jnp.tanh(raw) + 1.0)
        return mean, log_std


class TwinQ(nn.Module):
    """Two independent Q MLPs on ``concat(obs, action)``; returns ``[..., 2]``."""

    hidden: Sequence[int]
    activation: str = "relu"

    @nn.compact
    def __call__(self, obs, action):
        x = jnp.concatenate([obs, action], axis=-1)
        return jnp.stack([MLP(self.hidden, 1, self.activation, name=f"q{i}")(x)[..., 0] for i in range(2)], -1)


def tanh_gaussian_log_prob(mean, log_std, u):
    """log-density of ``tanh(u)`` for ``u ~ N(mean, exp(log_std))``: the Gaussian's minus
    ``sum log(1 - tanh(u)^2)``, written as ``2 (log 2 - u - softplus(-2u))`` (stable for large |u|)."""
    log_det = 2.0 * (jnp.log(2.0) - u - jax.nn.softplus(-2.0 * u))
    return gaussian_log_prob(mean, log_std, u) - jnp.sum(log_det, axis=-1)


def sample_tanh_gaussian(key, mean, log_std):
    """``(tanh(u), log-density of tanh(u))`` for ``u ~ N(mean, exp(log_std))`` (reparameterised)."""
    u = sample_gaussian(key, mean, log_std)
    return jnp.tanh(u), tanh_gaussian_log_prob(mean, log_std, u)
