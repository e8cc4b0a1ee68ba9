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
from tclock.mesh import RunMesh

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


def release_compiled() -> None:
    """Drops every compiled program this process holds (tclock's and JAX's caches) and collects
    them.  A process that compiles hundreds of XLA executables keeps their code mapped; near the
    kernel's ``vm.max_map_count`` XLA fails inside a later compile ("Cannot allocate memory", or
    a crash).  Long processes (the test suite after each module, experiment scripts between
    tasks) call this between pieces of work that share no programs; what is dropped recompiles on
    next use (from the persistent compilation cache when one is set)."""
    import gc

    jax.clear_caches()
    _COMPILED.clear()
    gc.collect()


def _placement_key(device=None, mesh: RunMesh | None = None) -> str:
    if mesh is None:
        return str(device)
    return f"{mesh.shape.text()} on {[d.id for d in mesh.devices]}"


def program_key(cfg: TrainConfig, pool: int, active: int, with_gdc: bool, device=None,
                mesh: RunMesh | None = None) -> str:
    """What the compiled programs depend on: the config fields that shape them, the sizes, the
    device (or the mesh), and the registry entries behind the names (the programs close over the
    env and the learner, so a task or learner registered again under the same name gets new
    programs)."""
    fields = {k: v for k, v in cfg.to_dict().items() if k not in _HOST_ONLY_FIELDS}
    plain = cfg.gdc_every != 1
    entries = (envs.spec(cfg.env).revision, id(learner_spec(cfg.algo)))  # the spec is kept alive in _COMPILED
    return repr((sorted(fields.items()), pool, active, with_gdc, plain, jax.default_backend(),
                 _placement_key(device, mesh), entries))


def compiled_for(agent: Learner, state, active: int, with_gdc: bool, announce: Callable[[str], None] = lambda s: None,
                 device=None, mesh: RunMesh | None = None) -> tuple[CompiledAgent, bool]:
    """Compiled programs for this agent, batch size and device (or mesh), reused within the process.

    Returns ``(programs, fresh)`` where ``fresh`` says whether this call compiled them."""
    key = program_key(agent.cfg, agent.env.num_envs, active, with_gdc, device, mesh)
    if key in _COMPILED:
        return _COMPILED[key][0], False
    variants = tuple(v for v in update_variants(agent.cfg) if with_gdc or v == "plain")
    _COMPILED[key] = (compile_agent(agent, state, active, variants, announce, mesh), learner_spec(agent.cfg.algo))
    return _COMPILED[key][0], True


def _jit_programs(agent: Learner, state, active: int, mesh: RunMesh | None):
    """``(rollout, update(gdc))`` as ``jax.jit`` objects; on a mesh with the state's and the
    trajectory's shardings fixed on both (:mod:`tclock.mesh`), so one program's outputs are the
    next one's inputs without a copy."""
    if mesh is None:
        return (jax.jit(lambda s: agent.rollout(s, active)),
                lambda gdc, traj_info: jax.jit(lambda s, t, l: agent.update(s, t, l, gdc)))
    fields = getattr(agent, "env_sharded_fields", ("env",))
    state_sh = mesh.state_shardings(state, fields)

    def rollout_fn(s):
        s, traj, metrics = agent.rollout(s, active)
        return s, jax.lax.with_sharding_constraint(traj, mesh.trajectory_shardings(traj)), metrics

    def update_jit(gdc, traj_info):
        return jax.jit(lambda s, t, l: agent.update(s, t, l, gdc),
                       in_shardings=(state_sh, mesh.trajectory_shardings(traj_info), mesh.replicated()),
                       out_shardings=(state_sh, None))

    return jax.jit(rollout_fn, in_shardings=(state_sh,), out_shardings=(state_sh, None, None)), update_jit


def compile_agent(agent: Learner, state, active: int, variants: tuple = ("plain", "gdc"),
                  announce: Callable[[str], None] = lambda s: None, mesh: RunMesh | None = None) -> CompiledAgent:
    """Compiles the rollout of the first ``active`` envs and the learning phases in ``variants``
    (``plain``, ``gdc``: with gradient diagnostics) for ``state``'s shapes (on ``mesh``, with its
    shardings; else for the device ``state`` lives on).

    Tracing and lowering run one program after another (they hold the GIL); the XLA compiles
    then run side by side in threads, so start-up waits for the longest compile rather than
    their sum.  ``compile_times`` holds each program's own lowering + compile seconds (they
    overlap); ``compile_s`` is the wall time of the whole."""
    t0 = time.perf_counter()
    announce(f"compiling rollout and update (num_envs={active}, unroll_length={agent.cfg.unroll_length}"
             + (", with gradient diagnostics" if "gdc" in variants else "")
             + (f", mesh {mesh.shape.text()}" if mesh is not None and mesh.shape.size > 1 else "") + ")")
    rollout_jit, update_jit = _jit_programs(agent, state, active, mesh)
    lowered = {"rollout": rollout_jit.lower(state)}
    lower_s = {"rollout": time.perf_counter() - t0}
    traj_shape = lowered["rollout"].out_info[1]
    lr = jnp.float32(0.0)
    for variant in variants:
        t1 = time.perf_counter()
        lowered[f"update_{variant}"] = update_jit(variant == "gdc", traj_shape).lower(state, traj_shape, lr)
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
