"""JAX 0.10 shims for Brax's trainers, imported (for its effect) before any Brax trainer.

Brax 0.14's trainers call ``jax.device_put_replicated`` / ``jax.device_put_sharded``, removed in
JAX 0.10; this module puts equivalents built on ``NamedSharding`` back, only in the benchmark
process (tclock itself never uses them).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _pmap_axis_name() -> str:
    try:
        from brax.training.agents.ppo import train as _t

        return getattr(_t, "_PMAP_AXIS_NAME", "i")
    except ImportError:
        return "i"


def _stack_on_devices(leaves_per_device, devices):
    # The mesh axis must carry the name of Brax's pmap axis ('i'): JAX 0.10's pmap is a jit over a
    # shard_map whose input shardings name that axis, and an input sharded over a differently named
    # mesh makes the SECOND training epoch (fed the first epoch's outputs) retrace and recompile.
    name = _pmap_axis_name()
    mesh = jax.sharding.Mesh(np.array(devices), (name,))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(name))
    return jax.device_put(jnp.stack([jnp.asarray(x) for x in leaves_per_device]), sharding)


def _device_put_replicated(x, devices):
    """Stand-in for the removed ``jax.device_put_replicated``: leading axis = len(devices)."""
    devices = list(devices)
    return jax.tree.map(lambda a: _stack_on_devices([a] * len(devices), devices), x)


def _device_put_sharded(shards, devices):
    """Stand-in for the removed ``jax.device_put_sharded``: stacks ``shards`` along a new axis 0."""
    devices = list(devices)
    return jax.tree.map(lambda *xs: _stack_on_devices(xs, devices), *shards)


if not hasattr(jax, "device_put_replicated"):
    jax.device_put_replicated = _device_put_replicated
if not hasattr(jax, "device_put_sharded"):
    jax.device_put_sharded = _device_put_sharded

