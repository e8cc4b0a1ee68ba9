"""What every training loop needs besides the run bookkeeping (``runbook.py``): the learner
for a config and its ahead-of-time compiled programs (cached per process), and the
learning-rate clock.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import jax
import jax.numpy as jnp

from tclock import envs
from tclock.agents import Learner, learner_spec, make_agent
from tclock.config import TrainConfig
from tclock.control import LRClock
from tclock.envs import make_training_env

# Fields that do not change the compiled programs (they live on the host or are arguments).
_HOST_ONLY_FIELDS = {"out", "total_steps", "progress", "checkpoint_every", "seed", "target_success", "lr",
                     "lr_schedule", "lr_clock", "lr_scaling", "lr_base_envs", "gdc_every", "drbs", "drbs_min",
                     "drbs_max", "drbs_window", "drbs_high", "drbs_low", "drbs_step", "drbs_precompile", "purm",
                     "purm_t_base", "purm_alpha", "purm_t_cycle", "total_seconds", "num_envs", "arp",
                     "arp_actors", "arp_capacity", "arp_max_age_s", "arp_calibration_rollouts", "keep_checkpoints",
                     "tensorboard", "wandb"}


def _env_kwargs(cfg: TrainConfig) -> dict:
    kwargs = dict(cfg.env_kwargs)
    if cfg.backend:
        kwargs["backend"] = cfg.backend
    return kwargs


def pool_size(cfg: TrainConfig) -> int:
    """Envs kept alive per seed: the DRBS ladder's top, else num_envs."""
    return cfg.drbs_max if cfg.drbs else cfg.num_envs


def build_agent(cfg: TrainConfig, num_envs: int | None = None) -> Learner:
    env = make_training_env(cfg.env, num_envs or pool_size(cfg), cfg.episode_length or None, **_env_kwargs(cfg))
    return make_agent(cfg, env)


@dataclass
class CompiledAgent:
    """Ahead-of-time compiled rollout and update programs for one batch size."""

    rollout: Callable
    update_plain: Callable | None
    update_gdc: Callable | None
    compile_s: float
    programs: int
    compile_times: dict = field(default_factory=dict)  # seconds per program: rollout, update_plain, update_gdc


def update_variants(cfg: TrainConfig) -> tuple:
    """The learning-phase programs a run needs: ``plain`` unless gradient diagnostics run every
    iteration (then it never runs), ``gdc`` when they run at all."""
    return tuple(v for v, needed in (("plain", cfg.gdc_every != 1), ("gdc", cfg.gdc_every > 0)) if needed)


_COMPILED: dict = {}  # program_key -> (CompiledAgent, the learner spec it was built from)


def program_key(cfg: TrainConfig, pool: int, active: int, with_gdc: bool, device=None) -> str:
    """What the compiled programs depend on: the config fields that shape them, the sizes, the
    device, and the registry entries behind the names (the programs close over the env and the
    learner, so a task or learner registered again under the same name gets new programs)."""
    fields = {k: v for k, v in cfg.to_dict().items() if k not in _HOST_ONLY_FIELDS}
    plain = cfg.gdc_every != 1
    entries = (envs.spec(cfg.env).revision, id(learner_spec(cfg.algo)))  # the spec is kept alive in _COMPILED
    return repr((sorted(fields.items()), pool, active, with_gdc, plain, jax.default_backend(), str(device), entries))


def compiled_for(agent: Learner, state, active: int, with_gdc: bool, announce: Callable[[str], None] = lambda s: None,
                 device=None) -> tuple[CompiledAgent, bool]:
    """Compiled programs for this agent, batch size and device, reused within the process.

    Returns ``(programs, fresh)`` where ``fresh`` says whether this call compiled them."""
    key = program_key(agent.cfg, agent.env.num_envs, active, with_gdc, device)
    if key in _COMPILED:
        return _COMPILED[key][0], False
    variants = tuple(v for v in update_variants(agent.cfg) if with_gdc or v == "plain")
    _COMPILED[key] = (compile_agent(agent, state, active, variants, announce), learner_spec(agent.cfg.algo))
    return _COMPILED[key][0], True


def compile_agent(agent: Learner, state, active: int, variants: tuple = ("plain", "gdc"),
                  announce: Callable[[str], None] = lambda s: None) -> CompiledAgent:
    """Compiles the rollout of the first ``active`` envs and the learning phases in ``variants``
    (``plain``, ``gdc``: with gradient diagnostics) for ``state``'s shapes.

    Tracing and lowering run one program after another (they hold the GIL); the XLA compiles
    then run side by side in threads, so start-up waits for the longest compile rather than
    their sum.  ``compile_times`` holds each program's own lowering + compile seconds (they
    overlap); ``compile_s`` is the wall time of the whole."""
    t0 = time.perf_counter()
    announce(f"compiling rollout and update (num_envs={active}, unroll_length={agent.cfg.unroll_length}"
             + (", with gradient diagnostics" if "gdc" in variants else "") + ")")
    rollout_fn = lambda s: agent.rollout(s, active)  # noqa: E731
    lowered = {"rollout": jax.jit(rollout_fn).lower(state)}
    lower_s = {"rollout": time.perf_counter() - t0}
    traj_shape = lowered["rollout"].out_info[1]
    lr = jnp.float32(0.0)
    for variant in variants:
        t1 = time.perf_counter()
        gdc = variant == "gdc"
        lowered[f"update_{variant}"] = jax.jit(lambda s, t, l, g=gdc: agent.update(s, t, l, g)).lower(
            state, traj_shape, lr)
        lower_s[f"update_{variant}"] = time.perf_counter() - t1

    def compile_one(name):
        t1 = time.perf_counter()
        return name, lowered[name].compile(), lower_s[name] + time.perf_counter() - t1

    with ThreadPoolExecutor(max_workers=len(lowered)) as pool:
        done = {name: (program, seconds) for name, program, seconds in pool.map(compile_one, list(lowered))}
    programs = {name: program for name, (program, _) in done.items()}
    return CompiledAgent(programs["rollout"], programs.get("update_plain"), programs.get("update_gdc"),
                         time.perf_counter() - t0, len(programs), {name: s for name, (_, s) in done.items()})


def make_lr_clock(cfg: TrainConfig) -> LRClock:
    """The learning-rate schedule on its clock: env steps per seed, wall seconds, or hybrid; of the
    unscaled ``lr`` (the loop applies ``lr_scaling`` at the current batch size,
    :func:`tclock.control.coscale.lr_multiplier`)."""
    return LRClock(cfg.lr_clock, cfg.lr_schedule, cfg.lr, total_steps=float(cfg.total_steps),
                   total_seconds=cfg.total_seconds or None)
