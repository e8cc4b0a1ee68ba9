"""A jitted replay buffer: a fixed-capacity ring of transitions in device memory, one seed.

Pure functions on a :class:`Replay` pytree (a learner vmaps them over its leading seed axis
like everything else).  ``add`` writes a batch at the ring's position, overwriting the oldest
slots once the ring is full; ``sample`` draws uniformly, with replacement, from the slots
written so far.  A ring rather than Brax's ``UniformSamplingQueue``: the queue rolls its whole
storage on every insert once full (O(capacity) per rollout), the ring scatters only the new
rows.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Replay:
    data: dict  # leaves [capacity, ...]
    pos: jax.Array  # int32: the slot the next transition goes to
    size: jax.Array  # int32: slots written so far (at most capacity)

    @property
    def capacity(self) -> int:
        return jax.tree.leaves(self.data)[0].shape[0]


def empty(capacity: int, example: dict) -> Replay:
    """An empty ring of ``capacity`` transitions shaped like ``example`` (one transition)."""
    data = jax.tree.map(lambda x: jnp.zeros((capacity,) + jnp.shape(x), jnp.asarray(x).dtype), example)
    return Replay(data=data, pos=jnp.zeros((), jnp.int32), size=jnp.zeros((), jnp.int32))


def add(buf: Replay, batch: dict) -> Replay:
    """``buf`` with the ``n`` transitions of ``batch`` (leaves ``[n, ...]``, ``n <= capacity``)
    written at slots ``pos, pos+1, ...`` modulo the capacity."""
    cap = buf.capacity
    n = jax.tree.leaves(batch)[0].shape[0]
    if n > cap:
        raise ValueError(f"replay: a batch of {n} transitions does not fit a ring of {cap}")
    idx = (buf.pos + jnp.arange(n, dtype=jnp.int32)) % cap
    data = jax.tree.map(lambda d, x: d.at[idx].set(x.astype(d.dtype)), buf.data, batch)
    return Replay(data=data, pos=(buf.pos + n) % cap, size=jnp.minimum(buf.size + n, cap))


def sample(buf: Replay, key: jax.Array, n: int) -> dict:
    """``n`` transitions drawn uniformly with replacement from the written slots (``size`` must
    be at least 1; a learner samples only after its warm-up)."""
    idx = jax.random.randint(key, (n,), 0, jnp.maximum(buf.size, 1))
    return jax.tree.map(lambda d: d[idx], buf.data)
