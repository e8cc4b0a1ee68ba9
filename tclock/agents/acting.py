"""Acting: T steps of S*B envs with a Gaussian policy, one time-major trajectory out.

Shared by every learner that acts with :class:`tclock.networks.GaussianPolicy`.  The policy is
vmapped over seeds; the env steps one flat batch of S*B envs (so the auto-reset's ``lax.cond``
is real, not a select).  Only the first ``active`` envs of the pool step; the rest stay paused
mid-episode, so changing the batch size (DRBS) never throws an episode away.

On a device mesh (:mod:`tclock.mesh`) the flat batch is ordered device by device
(:func:`flatten_envs`), so each device's envs stay contiguous and stepping them moves no data
between devices; on one device the order is the plain row-major one.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import struct

from tclock import diagnostics
from tclock.envs.wrappers import BatchedEnv
from tclock.networks import gaussian_log_prob, sample_gaussian


@struct.dataclass
class Trajectory:
    """A rollout, time-major: leaves ``[T, S, B, ...]`` (``[T, B, ...]`` inside a per-seed update)."""

    obs: jax.Array
    action: jax.Array  # the sampled action (PPO/IMPALA: unclipped Gaussian; the env sees it clipped to [-1, 1])
    logp: jax.Array  # behaviour log-probability of ``action``
    reward: jax.Array
    termination: jax.Array
    truncation: jax.Array
    final_obs: jax.Array
    success: jax.Array
    done_return: jax.Array
    done_success: jax.Array


def gaussian_sample(key, mean, log_std):
    """The actor-critic learners' action: an unclipped Gaussian sample and its log-probability."""
    action = sample_gaussian(key, mean, log_std)
    return action, gaussian_log_prob(mean, log_std, action)


def flatten_envs(x: jax.Array, blocks: tuple[int, int] = (1, 1)) -> jax.Array:
    """``[S, B, ...] -> [S*B, ...]`` with the envs of each of the ``blocks = (seed devices, env
    devices)`` contiguous: ``[s0, S/s0, e0, B/e0] -> [s0, e0, S/s0, B/e0]`` before flattening (the
    identity reshape when ``e0 == 1``).  Stepping envs does not depend on their order."""
    S, B = x.shape[:2]
    ns, ne = blocks
    if ne == 1:
        return x.reshape((S * B,) + x.shape[2:])
    y = x.reshape((ns, S // ns, ne, B // ne) + x.shape[2:])
    return jnp.swapaxes(y, 1, 2).reshape((S * B,) + x.shape[2:])


def unflatten_envs(x: jax.Array, S: int, B: int, blocks: tuple[int, int] = (1, 1)) -> jax.Array:
    """The inverse of :func:`flatten_envs`: ``[S*B, ...] -> [S, B, ...]``."""
    ns, ne = blocks
    if ne == 1:
        return x.reshape((S, B) + x.shape[1:])
    y = x.reshape((ns, ne, S // ns, B // ne) + x.shape[1:])
    return jnp.swapaxes(y, 1, 2).reshape((S, B) + x.shape[1:])


def rollout(env: BatchedEnv, unroll_length: int, policy_dist: Callable, state, active: int | None = None,
            sample: Callable = gaussian_sample, blocks: tuple[int, int] = (1, 1)):
    """``(state, traj, metrics)`` after ``unroll_length`` steps of the first ``active`` envs.

    ``policy_dist(params, normalizer, obs) -> (mean, log_std)`` for one seed; ``sample(key,
    mean, log_std) -> (action, logp)`` draws the action (the env sees it clipped to [-1, 1]);
    SAC passes a squashed Gaussian (:func:`tclock.networks.sample_tanh_gaussian`).  ``state`` needs
    the fields ``params``, ``normalizer``, ``env``, ``key``, ``last_return``, ``last_success``
    (leading seed axis); the returned state has new ``env``, ``key`` and episode statistics.
    ``blocks``: the (seeds, envs) devices of the run's mesh (:func:`flatten_envs`)."""
    S = state.key.shape[0]
    pool = env.num_envs
    B = active or pool
    flat = lambda x: flatten_envs(x, blocks)  # noqa: E731
    unflat = lambda x: unflatten_envs(x, S, B, blocks)  # noqa: E731
    keys = jax.vmap(lambda k: jax.random.split(k, unroll_length + 1))(state.key)
    step_keys = jnp.swapaxes(keys[:, 1:], 0, 1)  # [T, S, 2]

    def act(params, normalizer, obs, key):
        return sample(key, *policy_dist(params, normalizer, obs))

    def step(env_carry, key_s):
        obs = unflat(env_carry.state.obs)
        action, logp = jax.vmap(act)(state.params, state.normalizer, obs, key_s)
        env_carry, tr = env.step(env_carry, flat(jnp.clip(action, -1.0, 1.0)))
        out = Trajectory(obs=obs, action=action, logp=logp, reward=unflat(tr.reward),
                         termination=unflat(tr.termination), truncation=unflat(tr.truncation),
                         final_obs=unflat(tr.final_obs), success=unflat(tr.success),
                         done_return=unflat(tr.done_return), done_success=unflat(tr.done_success))
        return env_carry, out

    env_carry = jax.tree.map(lambda x: flat(x[:, :B]), state.env)
    env_carry, traj = jax.lax.scan(step, env_carry, step_keys)
    env_carry = jax.tree.map(unflat, env_carry)
    if B < pool:
        env_carry = jax.tree.map(lambda p, a: p.at[:, :B].set(a), state.env, env_carry)
    state, metrics = episode_metrics(state.replace(env=env_carry, key=keys[:, 0]), traj)
    return state, traj, metrics


def episode_metrics(state, traj: Trajectory):
    """The rollout's per-seed curve metrics; the last return and success carry over rollouts
    in which no episode finished."""
    dones = traj.termination + traj.truncation
    episodes = dones.sum(axis=(0, 2))
    finished = episodes > 0
    ep_return = jnp.where(finished, traj.done_return.sum(axis=(0, 2)) / jnp.maximum(episodes, 1), state.last_return)
    rate, _ = jax.vmap(diagnostics.finished_episode_success, in_axes=1)(traj.done_success, dones)
    success_rate = jnp.where(finished, rate, state.last_success)
    state = state.replace(last_return=ep_return, last_success=success_rate)
    metrics = {
        "episode_return": ep_return,
        "success_rate": success_rate,
        "episodes": episodes,
        "success_episode_rate": jnp.where(finished, success_rate, jnp.nan),
        "activation_rate": jax.vmap(diagnostics.activation_rate, in_axes=1)(traj.reward),
    }
    return state, metrics
