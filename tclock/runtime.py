"""What every training loop shares (the synchronous one in ``loop.py``, the asynchronous one in
``arp.py``): the agent and its ahead-of-time compiled programs, opening a run directory
(``--resume`` / ``--overwrite``), the learning-rate clock, the progress bar, per-seed metrics
as JSON, and how a run ends (``run_guard``).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from tclock import runlog
from tclock.agents import make_agent
from tclock.agents.ppo import PPO
from tclock.config import ConfigError, TrainConfig
from tclock.control import LRClock
from tclock.envs import make_training_env

RATIO_WINDOW = 50
_RESUME_MAY_CHANGE = {"total_steps", "total_seconds", "out", "progress", "checkpoint_every"}
# Fields that do not change the compiled programs (they live on the host or are arguments).
_HOST_ONLY_FIELDS = {"out", "total_steps", "progress", "checkpoint_every", "seed", "target_success", "lr",
                     "lr_schedule", "lr_clock", "lr_scaling", "lr_base_envs", "gdc_every", "drbs", "drbs_min",
                     "drbs_max", "drbs_window", "drbs_high", "drbs_low", "drbs_step", "drbs_precompile", "purm",
                     "purm_t_base", "purm_alpha", "purm_t_cycle", "total_seconds", "num_envs", "arp",
                     "arp_actors", "arp_capacity", "arp_max_age_s", "arp_calibration_rollouts"}


class TrainingDiverged(RuntimeError):
    """Loss or parameters became non-finite; the last good state is checkpointed."""


@dataclass
class RunResult:
    run_dir: Path
    iterations: int
    compile_s: float
    wall_s: float
    env_steps_per_s: float  # all seeds together, loop time only
    final: dict = field(default_factory=dict)


def _env_kwargs(cfg: TrainConfig) -> dict:
    kwargs = dict(cfg.env_kwargs)
    if cfg.backend:
        kwargs["backend"] = cfg.backend
    return kwargs


def pool_size(cfg: TrainConfig) -> int:
    """Envs kept alive per seed: the DRBS ladder's top, else num_envs."""
    return cfg.drbs_max if cfg.drbs else cfg.num_envs


def build_agent(cfg: TrainConfig, num_envs: int | None = None) -> PPO:
    env = make_training_env(cfg.env, num_envs or pool_size(cfg), cfg.episode_length or None, **_env_kwargs(cfg))
    return make_agent(cfg, env)


@dataclass
class CompiledAgent:
    """Ahead-of-time compiled rollout and update programs for one batch size."""

    rollout: Callable
    update_plain: Callable
    update_gdc: Callable | None
    compile_s: float
    programs: int


_COMPILED: dict = {}


def program_key(cfg: TrainConfig, pool: int, active: int, with_gdc: bool, device=None) -> str:
    fields = {k: v for k, v in cfg.to_dict().items() if k not in _HOST_ONLY_FIELDS}
    plain = cfg.gdc_every != 1
    return repr((sorted(fields.items()), pool, active, with_gdc, plain, jax.default_backend(), str(device)))


def compiled_for(agent: PPO, state, active: int, with_gdc: bool, announce: Callable[[str], None] = lambda s: None,
                 device=None) -> tuple[CompiledAgent, bool]:
    """Compiled programs for this agent, batch size and device, reused within the process.

    Returns ``(programs, fresh)`` where ``fresh`` says whether this call compiled them."""
    key = program_key(agent.cfg, agent.env.num_envs, active, with_gdc, device)
    if key in _COMPILED:
        return _COMPILED[key], False
    _COMPILED[key] = compile_agent(agent, state, active, with_gdc, announce)
    return _COMPILED[key], True


def compile_agent(agent: PPO, state, active: int, with_gdc: bool,
                  announce: Callable[[str], None] = lambda s: None) -> CompiledAgent:
    t0 = time.perf_counter()
    announce(f"compiling rollout (num_envs={active}, unroll_length={agent.cfg.unroll_length})")
    rollout_fn = lambda s: agent.rollout(s, active)  # noqa: E731
    rollout = jax.jit(rollout_fn).lower(state).compile()
    traj_shape = jax.eval_shape(rollout_fn, state)[1]
    lr = jnp.float32(0.0)
    update_plain = update_gdc = None
    if agent.cfg.gdc_every != 1:  # with gradient diagnostics every iteration the plain update never runs
        announce(f"compiling update (num_envs={active})")
        update_plain = jax.jit(lambda s, t, l: agent.update(s, t, l, False)).lower(state, traj_shape, lr).compile()
    if with_gdc:
        announce(f"compiling update with gradient diagnostics (num_envs={active})")
        update_gdc = jax.jit(lambda s, t, l: agent.update(s, t, l, True)).lower(state, traj_shape, lr).compile()
    programs = 1 + (update_plain is not None) + (update_gdc is not None)
    return CompiledAgent(rollout, update_plain, update_gdc, time.perf_counter() - t0, programs)


def make_lr_clock(cfg: TrainConfig) -> LRClock:
    """The learning-rate schedule on its clock: env steps per seed, wall seconds, or hybrid."""
    return LRClock(cfg.lr_clock, cfg.lr_schedule, cfg.scaled_lr(), total_steps=float(cfg.total_steps),
                   total_seconds=cfg.total_seconds or None)


def open_run(cfg: TrainConfig, resume: bool, overwrite: bool) -> tuple[RunResult | None, tuple | None]:
    """Checks ``--resume``/``--overwrite`` against the run directory.

    Returns ``(finished_result, None)`` for a finished run being resumed, else
    ``(None, checkpoint_or_None)``."""
    run_dir = Path(cfg.out)
    if resume:
        if runlog.read_status(run_dir).get("state") == "finished":
            _check_resume_config(run_dir, cfg)
            return _finished_result(run_dir), None
        if (run_dir / runlog.CONFIG_FILE).exists():
            _check_resume_config(run_dir, cfg)
        return None, runlog.load_checkpoint(run_dir)
    if runlog.read_metrics(run_dir, missing_ok=True) and not overwrite:
        raise ConfigError(f"out: {run_dir} already holds a run; pass --resume to continue it, --overwrite to "
                          "replace it, or choose another --out")
    return None, None


def seed_metrics(*metric_dicts) -> dict:
    """Per-seed metric arrays from the jitted functions as JSON lists (``finite`` excluded)."""
    return {k: _seed_list(v) for m in metric_dicts for k, v in m.items() if k != "finite"}


@contextlib.contextmanager
def run_guard(writer: runlog.RunWriter, progress: "_Progress", save_last_good: Callable[[], int]):
    """How a run ends, for every loop: Ctrl-C checkpoints the last good state and marks the run
    ``interrupted``; divergence has already been marked ``failed``; any other error checkpoints
    and marks ``failed`` with its reason.  Files and the progress bar are closed either way."""
    try:
        yield
    except KeyboardInterrupt:
        writer.mark("interrupted", iteration=save_last_good())
        raise
    except TrainingDiverged:
        raise
    except Exception as e:  # a callback, a device error: keep what we have, say why
        save_last_good()
        writer.mark("failed", reason=f"{type(e).__name__}: {e}")
        raise
    finally:
        writer.close()
        progress.close()


def _check_resume_config(run_dir: Path, cfg: TrainConfig) -> None:
    saved = runlog.read_config(run_dir)
    now = cfg.to_dict()
    diff = [k for k in now if k not in _RESUME_MAY_CHANGE and k in saved and saved[k] != now[k]]
    if diff:
        details = "; ".join(f"{k}: saved {saved[k]!r}, now {now[k]!r}" for k in diff)
        raise ConfigError(f"--resume: the config differs from the run in {run_dir} ({details}); "
                          "resume with the same settings or start a new --out")


def _seed_list(x) -> list:
    arr = np.asarray(x, dtype=np.float64).reshape(-1)
    return [None if not np.isfinite(v) else float(v) for v in arr]


class _Progress:
    """A progress bar in env steps (or wall seconds under PURM) with phase names."""

    def __init__(self, enabled: bool, total: float, initial: float, unit: str):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, unit=unit, unit_scale=True, dynamic_ncols=True,
                            desc="compile", smoothing=0.1, mininterval=0.5)

    def phase(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(text[:60])
            self.bar.refresh()

    def advance(self, n: float, postfix: dict) -> None:
        if self.bar is not None:
            self.bar.set_description_str("train")
            self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _finished_result(run_dir: Path) -> RunResult:
    status = runlog.read_status(run_dir)
    metrics = runlog.read_metrics(run_dir)
    return RunResult(run_dir, int(status.get("iterations", len(metrics))), float(status.get("compile_s", 0.0)),
                     float(status.get("wall_s", 0.0)), float(status.get("env_steps_per_s", 0.0)),
                     metrics[-1] if metrics else {})
