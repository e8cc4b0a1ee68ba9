"""Flax actor-critic modules: a Gaussian policy with a state-independent log-std and a value MLP."""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "swish": nn.swish}
LOG_2PI = jnp.log(2.0 * jnp.pi)


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
