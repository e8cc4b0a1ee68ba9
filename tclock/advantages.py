"""Advantage estimators: pure array math, time-major ``[T, ...]`` layout.

Every estimator takes the same episode-boundary convention:

* ``rewards[t]``      reward received after acting at step t.
* ``values[t]``       V(s_t).
* ``next_values[t]``  V(s_{t+1}) of the *real* next state.  For a step that ended by a time
  limit this is the value of the final observation before the auto-reset, so truncation
  bootstraps; for a step that ended by termination it is ignored.
* ``terminations[t]`` 1.0 if the episode truly ended at t (no bootstrap).
* ``truncations[t]``  1.0 if the episode was cut at t by a time limit (bootstrap from
  ``next_values[t]``, but the trace does not continue into the next episode).

Trailing axes (envs, seeds) are carried along untouched, so the functions jit and vmap.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def gae(rewards, values, next_values, terminations, truncations, gamma: float = 0.99, lam: float = 0.95):
    """Generalized advantage estimation (Schulman et al. 2016) as a reverse ``lax.scan``.

    ``delta_t = r_t + gamma * (1 - term_t) * next_values_t - values_t``
    ``A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}`` with ``done = term | trunc``
    and ``A_T = 0`` past the rollout's end (its last step bootstraps through next_values).

    Returns ``(advantages, returns)`` with ``returns = advantages + values`` (value targets).
    """
    terminations = terminations.astype(values.dtype)
    dones = jnp.maximum(terminations, truncations.astype(values.dtype))
    deltas = rewards + gamma * (1.0 - terminations) * next_values - values
    decay = gamma * lam * (1.0 - dones)

    def step(carry, xs):
        delta, d = xs
        adv = delta + d * carry
        return adv, adv

    _, advantages = jax.lax.scan(step, jnp.zeros_like(values[0]), (deltas, decay), reverse=True)
    return advantages, advantages + values
