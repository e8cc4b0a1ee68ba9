"""The device mesh of one run: which devices it spans and how its arrays lie on them.

Every array of a run carries a leading seed axis S; the learner's env-carrying state fields
(:attr:`tclock.agents.Learner` ``env_sharded_fields``, ``("env",)`` by default, SAC adds its
replay ring) have the env axis B second, and a trajectory is ``[T, S, B, ...]``
(:class:`tclock.agents.acting.Trajectory`).  The mesh has two named axes:

* ``seeds``: the seed axis is split over it.  Seeds never talk to each other, so a seed-sharded
  program is the one-device program on fewer seeds per device.
* ``envs``: the env axis is split over it (parameters and optimiser state are replicated along
  it).  The programs keep their one-device meaning: they are ``jax.jit`` programs over sharded
  arrays (GSPMD), so every mean over the rollout's transitions (the losses, the advantage and
  observation statistics) is taken over all shards, and an E-way run computes the update of one
  device up to float rounding (reductions add in another order).

``--mesh seeds=S,envs=E`` asks for ``S*E`` devices (``jax.devices()``: with several processes,
the devices of all of them).  The default (``""``) puts every device on the envs axis when each
batch size divides by their number, else runs on the first device and says why
(:func:`resolve`).  Inside a sweep each batch size runs on the device the sweep gives it.

Pure helpers plus :func:`resolve`; nothing here compiles or moves data.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tclock.errors import ConfigError

__all__ = ["AXES", "MeshShape", "parse_mesh", "check_divides", "RunMesh", "resolve", "single_device", "to_host"]

AXES = ("seeds", "envs")


@dataclass(frozen=True)
class MeshShape:
    """Devices along each mesh axis."""

    seeds: int = 1
    envs: int = 1

    @property
    def size(self) -> int:
        return self.seeds * self.envs

    def text(self) -> str:
        return f"seeds={self.seeds},envs={self.envs}"


def parse_mesh(text: str) -> MeshShape | None:
    """``"seeds=2,envs=4"`` (either part may be left out: it is 1) -> :class:`MeshShape`; ``""``
    -> None (the automatic mesh).  Raises ``ConfigError`` naming ``mesh``."""
    text = (text or "").strip()
    if not text or text == "auto":
        return None
    sizes = {}
    for part in text.split(","):
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq or name not in AXES:
            raise ConfigError(f"mesh: cannot read {part.strip()!r} in {text!r}; write axis=size pairs over "
                              f"{' and '.join(AXES)}, e.g. --mesh seeds=2,envs=4 (or leave it empty for all devices)")
        if name in sizes:
            raise ConfigError(f"mesh: {name} given twice in {text!r}; give each axis once")
        try:
            size = int(value)
        except ValueError:
            size = 0
        if size <= 0:
            raise ConfigError(f"mesh: {name}={value.strip()!r} is not a positive integer; e.g. --mesh {name}=2")
        sizes[name] = size
    return MeshShape(**sizes)


def check_divides(shape: MeshShape, seeds: int, batch_sizes: Sequence[int]) -> None:
    """Raises ``ConfigError`` when the mesh does not divide the seeds or a batch size."""
    if seeds % shape.seeds:
        ok = [d for d in range(1, seeds + 1) if seeds % d == 0]
        raise ConfigError(f"mesh: seeds={shape.seeds} does not divide the run's {seeds} seeds; pick seeds= from "
                          f"{ok} in --mesh or change --seeds")
    bad = [b for b in batch_sizes if b % shape.envs]
    if bad:
        raise ConfigError(f"mesh: envs={shape.envs} does not divide num_envs {bad[0]}"
                          + (f" (batch sizes {bad})" if len(bad) > 1 else "")
                          + f"; use batch sizes that are multiples of {shape.envs} or a smaller envs= in --mesh")


def _leaf_spec(dims: tuple, env_axis: int | None, shape: MeshShape) -> PartitionSpec:
    """For an array of shape ``dims``: seeds on axis 0 (unless it is a scalar); envs on ``env_axis``
    when it exists and divides."""
    if not dims:
        return PartitionSpec()
    spec: list = ["seeds" if shape.seeds > 1 else None] + [None] * (len(dims) - 1)
    if env_axis is not None and len(dims) > env_axis and shape.envs > 1 and dims[env_axis] % shape.envs == 0:
        spec[env_axis] = "envs"
    return PartitionSpec(*spec)


@dataclass(frozen=True)
class RunMesh:
    """The mesh a run trains on, and the shardings of its arrays."""

    mesh: Mesh
    shape: MeshShape
    note: str = ""

    @property
    def devices(self) -> list:
        return list(self.mesh.devices.flat)

    @property
    def spans_processes(self) -> bool:
        """Whether the mesh holds devices of more than one process (a multi-host run)."""
        return len({d.process_index for d in self.devices}) > 1

    @property
    def blocks(self) -> tuple[int, int]:
        """``(seeds, envs)`` devices: how the rollout orders its flat batch of envs."""
        return self.shape.seeds, self.shape.envs

    def sharding(self, spec: PartitionSpec) -> NamedSharding:
        return NamedSharding(self.mesh, spec)

    def replicated(self) -> NamedSharding:
        return self.sharding(PartitionSpec())

    def state_shardings(self, state, env_fields: Sequence[str] = ("env",)) -> Any:
        """A pytree of shardings like ``state``: the fields in ``env_fields`` split along seeds and
        envs (their axis 1), every other leaf along seeds."""
        if not hasattr(state, "replace"):
            return jax.tree.map(lambda x: self.sharding(_leaf_spec(np.shape(x), None, self.shape)), state)
        fields = {name: getattr(state, name) for name in env_fields if hasattr(state, name)}
        rest = state.replace(**{name: None for name in fields})
        out = jax.tree.map(lambda x: self.sharding(_leaf_spec(np.shape(x), None, self.shape)), rest)
        sharded = {name: jax.tree.map(lambda x: self.sharding(_leaf_spec(np.shape(x), 1, self.shape)), value)
                   for name, value in fields.items()}
        return out.replace(**sharded)

    def place(self, state, env_fields: Sequence[str] = ("env",)) -> Any:
        """``state`` laid out on the mesh (:meth:`state_shardings`).  With several processes every
        process holds the same host values (the same init or checkpoint) and contributes its own
        devices' pieces of them."""
        shardings = self.state_shardings(state, env_fields)
        if jax.process_count() == 1:
            return jax.device_put(state, shardings)

        def one(x, sharding):
            host = np.asarray(x)
            return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

        return jax.tree.map(one, state, shardings)

    def trajectory_shardings(self, traj) -> Any:
        """A time-major trajectory ``[T, S, B, ...]``: seeds on axis 1, envs on axis 2."""
        def spec(x):
            return self.sharding(PartitionSpec(None, *_leaf_spec(tuple(x.shape[1:]), 1, self.shape)))

        return jax.tree.map(spec, traj)


def to_host(tree) -> Any:
    """NumPy copies of a pytree of arrays; arrays that span other processes' devices are gathered
    first, so every process gets the whole value."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return jax.device_get(x)

    return jax.tree.map(one, tree)


def single_device(device) -> RunMesh:
    """A 1x1 mesh on ``device``."""
    return RunMesh(Mesh(np.array([device]).reshape(1, 1), AXES), MeshShape())


def resolve(text: str, seeds: int, batch_sizes: Sequence[int], devices: Sequence | None = None) -> RunMesh:
    """The run's mesh from ``--mesh`` (``text``) over ``devices`` (default ``jax.devices()``).

    Explicit: checks that the devices suffice and that the mesh divides the seeds and every batch
    size (``ConfigError`` naming ``mesh``).  Automatic (``""``): every device on the envs axis when
    each batch size divides by their number, else the first device with a note saying why."""
    devices = list(jax.devices() if devices is None else devices)
    shape = parse_mesh(text)
    note = ""
    if shape is None:
        n = len(devices)
        if n == 1 or all(b % n == 0 for b in batch_sizes):
            shape = MeshShape(envs=n)
        else:
            shape = MeshShape()
            note = (f"mesh: {n} devices, but num_envs {sorted(set(batch_sizes))} does not divide by {n}; running on "
                    f"one device (pass --mesh seeds=..,envs=.. or a num_envs divisible by {n} to use them all)")
    elif shape.size > len(devices):
        raise ConfigError(f"mesh: {shape.text()} needs {shape.size} devices, but this run sees {len(devices)} "
                          f"({devices[0].platform}); use a mesh of at most {len(devices)} devices")
    check_divides(shape, seeds, batch_sizes)
    grid = np.array(devices[: shape.size], dtype=object).reshape(shape.seeds, shape.envs)
    return RunMesh(Mesh(grid, AXES), shape, note)

