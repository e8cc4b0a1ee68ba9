"""Per-seed keys and the initial state of every seed, as one program that cannot hang on CPU.

``init_seeds`` runs a learner's one-seed ``init_one`` for each seed **one after another**
(``lax.map``), inside the caller's ``jax.jit``, instead of vmapping it.  The reason is a
deadlock in XLA's CPU runtime, reproduced and root-caused here (docs/design.md, "The jitted
init"): vmapping an orthogonal initialiser turns its QR factorisations into *batched*
LAPACK custom calls (``lapack_sgeqrf_ffi`` / ``lapack_sorgqr_ffi``); the batched kernel splits
its batch into tasks on XLA's intra-op thread pool and blocks until they finish, on a thread
of that same pool.  When the program runs as many independent batched QRs at once as the pool
has threads (two on a 2-core machine: the policy's and the value net's layers), every worker
waits for tasks that no free worker can run, and ``block_until_ready`` never returns.  An
unbatched QR does not fan out, so a sequential map over seeds keeps the whole init jitted
(one program, 2.6-4x faster than op-by-op dispatch) with no batched factorisation in it.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp


def seed_keys(seed: int, num_seeds: int) -> jax.Array:
    """``[num_seeds]`` keys: seed ``i`` gets ``fold_in(PRNGKey(seed), i)``."""
    return jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(seed), i))(jnp.arange(num_seeds))


def init_seeds(init_one: Callable[[jax.Array], Any], keys: jax.Array) -> Any:
    """``init_one`` of every key, stacked on a leading seed axis; seeds one after another so no
    factorisation inside ``init_one`` becomes a batched LAPACK call (see the module docstring)."""
    return jax.lax.map(init_one, keys)


class SeededInit:
    """Gives a learner ``init(seed, num_seeds)`` from its one-seed ``init_one(key)``: one jitted
    program (:func:`init_seeds` over :func:`seed_keys`), compiled on first use and reused for
    every later init of the same learner (the asynchronous pipeline's actors call it again)."""

    _init_program = None

    def init(self, seed: int, num_seeds: int) -> Any:
        if self._init_program is None:
            self._init_program = jax.jit(lambda keys: init_seeds(self.init_one, keys))
        return self._init_program(seed_keys(seed, num_seeds))
