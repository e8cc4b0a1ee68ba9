"""Environment registry: ``make(name, **kwargs)``, ``register(name, factory)``, ``names()``.

Every Brax environment is available under its Brax name (``ant``, ``halfcheetah``,
``reacher``, ...; pass ``backend=`` to choose the physics pipeline), beside tclock's
verifiable-reward tasks.  ``make`` returns the bare per-env task; ``make_training_env``
adds the time limit and the batched auto-reset used by the learners.
"""
from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field
from typing import Callable

from brax import envs as brax_envs
from brax.envs.base import Env

from tclock.envs import tasks
from tclock.envs.wrappers import BatchedEnv, EpisodeLimit

DEFAULT_ENV = "pointmass_reach"


_REVISIONS = itertools.count()


@dataclass(frozen=True)
class EnvSpec:
    factory: Callable[..., Env]
    episode_length: int = 1000
    description: str = ""
    # unique per registration: compiled programs close over the env, so they are keyed by it
    revision: int = field(default_factory=lambda: next(_REVISIONS), compare=False)


_REGISTRY: dict[str, EnvSpec] = {}


class UnknownEnvError(ValueError):
    """Raised for a name that is not registered; the message lists the known names."""


def register(name: str, factory: Callable[..., Env], episode_length: int = 1000, description: str = "",
             overwrite: bool = False) -> None:
    """Adds a task. ``factory(**kwargs)`` must return a Brax ``Env`` (one unbatched env)."""
    if not name or not isinstance(name, str):
        raise ValueError("register: name must be a non-empty string")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"register: {name!r} is already registered; pass overwrite=True to replace it")
    if episode_length <= 0:
        raise ValueError(f"register: episode_length must be positive, got {episode_length}")
    _REGISTRY[name] = EnvSpec(factory, int(episode_length), description)


def names() -> list[str]:
    return sorted(_REGISTRY)


def spec(name: str) -> EnvSpec:
    if name not in _REGISTRY:
        raise UnknownEnvError(f"unknown env {name!r}; known envs: {', '.join(names())}. "
                              "Register your own with tclock.envs.register(name, factory).")
    return _REGISTRY[name]


def make(name: str, **kwargs) -> Env:
    """The bare task (one env, no time limit, no auto-reset)."""
    with _model_on_local_device():
        return spec(name).factory(**kwargs)


@contextlib.contextmanager
def _model_on_local_device():
    """Brax builds a task's physics model with ``mujoco.mjx.put_model``, which, given no device,
    commits it to ``jax.devices()[0]``.  With several processes that device belongs to process 0,
    so every other process would hold model constants it cannot read (the jitted step then fails
    to lower).  While a task is built in a multi-process run, the model goes to this process's
    first local device instead; with one process nothing changes."""
    import jax

    if jax.process_count() == 1:
        yield
        return
    from mujoco.mjx._src import io as mjx_io

    original = mjx_io._resolve_impl_and_device

    def local_default(impl=None, device=None):
        return original(impl, jax.local_devices()[0] if device is None and impl is None else device)

    mjx_io._resolve_impl_and_device = local_default
    try:
        yield
    finally:
        mjx_io._resolve_impl_and_device = original


def make_training_env(name: str, num_envs: int, episode_length: int | None = None, **kwargs) -> BatchedEnv:
    """``num_envs`` copies of the task with a time limit (truncation) and real auto-resets."""
    length = episode_length or spec(name).episode_length
    return BatchedEnv(EpisodeLimit(make(name, **kwargs), length), num_envs)


def _register_builtins() -> None:
    for brax_name in sorted(brax_envs._envs):  # every Brax env, by its Brax name
        register(brax_name, lambda _n=brax_name, **kw: brax_envs.get_environment(_n, **kw),
                 description=f"Brax {brax_name} (shaped reward)")
    register("pointmass", tasks.PointMass, episode_length=100, description="point mass, shaped -distance reward")
    register("pointmass_reach", tasks.pointmass_reach, episode_length=100,
             description="point mass reach, binary success reward (default)")
    register("reacher_sparse", tasks.reacher_sparse, episode_length=100,
             description="Brax reacher, binary success reward")
    register("ant_goal_sparse", tasks.ant_goal_sparse, episode_length=1000,
             description="Brax ant reaching a goal, binary success reward")


_register_builtins()
