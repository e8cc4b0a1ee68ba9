"""The learner contract and the learner registry.

A learner is a registry entry (:class:`LearnerSpec`, added with :func:`register_learner`, the
way ``tclock.envs.register`` adds a task).  The loops, clocks, diagnostics, sweeps, the doctor
and the asynchronous pipeline only ever talk to the :class:`Learner` protocol below; none of
them names a learner, so adding one touches no other module.

What a learner object provides (all functions pure, so the loop can ``jit`` them; every array
carries a leading seed axis ``S``):

``init(seed, num_seeds) -> state``
    The training state for ``num_seeds`` seeds (seed ``i`` from ``fold_in(seed, i)``).
``rollout(state, active=None) -> (state, traj, metrics)``
    ``unroll_length`` steps of the first ``active`` envs of the pool (all by default).  Timed
    as RT.  ``metrics`` values are ``[S]`` arrays.
``update(state, traj, lr, with_gdc) -> (state, metrics)``
    One learning phase at learning rate ``lr`` (an argument: schedules never recompile).
    ``with_gdc`` adds the gradient diagnostics (``gdc``, ``b_simple``, ...).  ``metrics`` must
    hold ``finite`` (a bool per seed; the run bookkeeper stops the run when one is false).
``behaviour(state) -> pytree`` and ``with_behaviour(state, behaviour) -> state``
    What an actor needs to act (the parameters and the observation normaliser); the
    asynchronous pipeline publishes it to actor threads.
``env``, ``cfg``
    The batched env the learner steps and its config.
``env_sharded_fields``, ``env_blocks`` (optional, :class:`MeshLayout`)
    How its state splits over a device mesh.

What the registry entry adds (:class:`LearnerSpec`): the factory, the config defaults in which
the learner differs from ``TrainConfig``'s (so every learner's defaults learn the default
task), the config fields only it reads, the batch-size multiple its minibatching needs, its
own config checks, and the per-iteration metric keys it logs beyond the shared ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Protocol, runtime_checkable


class LossTerms(NamedTuple):
    """Per-minibatch loss terms of an actor-critic learner: what the SGD step combines
    (``policy + vf_coef*value - ent_coef*entropy``) and what the gradient diagnostics
    differentiate term by term.  ``aux`` holds scalar metrics (averaged over the steps)."""

    policy: Any
    value: Any
    entropy: Any
    aux: dict


@runtime_checkable
class Learner(Protocol):
    cfg: Any
    env: Any

    def init(self, seed: int, num_seeds: int) -> Any: ...

    def rollout(self, state: Any, active: int | None = None) -> tuple[Any, Any, dict]: ...

    def update(self, state: Any, traj: Any, lr: Any, with_gdc: bool = False) -> tuple[Any, dict]: ...

    def behaviour(self, state: Any) -> Any: ...

    def with_behaviour(self, state: Any, behaviour: Any) -> Any: ...


class MeshLayout:
    """Where a learner's arrays split on a device mesh (:mod:`tclock.mesh`); a learner without it
    gets these defaults.  ``env_sharded_fields``: the state fields whose leaves are ``[S, B, ...]``
    (their axis 1 splits over the mesh's ``envs`` axis; SAC adds its replay ring, split along its
    capacity).  ``env_blocks``: the ``(seeds, envs)`` devices of the run's mesh, set by the loop
    before it compiles; the rollout orders its flat batch of envs by them."""

    env_sharded_fields: tuple = ("env",)
    env_blocks: tuple = (1, 1)


def _one(cfg) -> int:
    return 1


@dataclass(frozen=True)
class LearnerSpec:
    """A registered learner.

    ``factory(cfg, env)`` builds the :class:`Learner`.  ``defaults`` are the config values in
    which this learner differs from ``TrainConfig``'s defaults; ``load_config`` applies them
    to every field the user did not set.  ``fields`` are the config fields only this learner
    reads (documentation; ``tclock learners`` lists them).  ``batch_multiple(cfg)``: every
    batch size (``num_envs``, each DRBS ladder size) must be a multiple of it.
    ``validate(cfg)`` raises ``ConfigError`` for a config this learner cannot run, before
    anything compiles.  ``metrics``: the per-iteration keys it logs beyond the shared ones.
    ``on_policy``: False for a learner that learns from a replay buffer (SAC)."""

    name: str
    factory: Callable[[Any, Any], Learner]
    description: str = ""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    fields: tuple = ()
    batch_multiple: Callable[[Any], int] = _one
    validate: Callable[[Any], None] | None = None
    metrics: tuple = ()
    on_policy: bool = True  # learns from its own latest rollout (the half-phase noise split applies)


_LEARNERS: dict[str, LearnerSpec] = {}


def register_learner(spec: LearnerSpec, overwrite: bool = False) -> LearnerSpec:
    """Adds a learner under ``spec.name`` (``--algo <name>``)."""
    if spec.name in _LEARNERS and not overwrite:
        raise ValueError(f"learner {spec.name!r} is already registered; pass overwrite=True to replace it")
    _LEARNERS[spec.name] = spec
    return spec


def learner_names() -> list[str]:
    return sorted(_LEARNERS)


def learner_spec(name: str) -> LearnerSpec:
    if name not in _LEARNERS:
        raise KeyError(f"algo: no learner named {name!r}; registered: {', '.join(learner_names())}")
    return _LEARNERS[name]


def make_agent(cfg, env) -> Learner:
    """The learner named by ``cfg.algo`` for a batched env."""
    return learner_spec(cfg.algo).factory(cfg, env)
