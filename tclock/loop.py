"""The one clocked host loop.

Per iteration it runs the jitted rollout, blocks on its outputs (RT), then runs the jitted
learning phase (its start-to-start interval is UT), logs one metrics line, and now and then
writes an atomic checkpoint.  It never touches per-env data in Python.

Clock definitions (docs/metrics.md): ``rt_s`` = rollout wall seconds; ``learn_s`` = learning
phase wall seconds; ``ut_s`` = seconds between the starts of this and the previous learning
phase (None on the first iteration of a process); ``rt_ut_ratio = rt_s / ut_s``;
``rt_ut_ratio_w50`` its mean over the last 50 iterations.  Compilation happens before the
loop (ahead-of-time) and is reported as ``compile_s``, so it never pollutes the clocks;
``wall_s`` counts loop time only.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from tclock import runlog
from tclock.agents.ppo import PPO
from tclock.config import ConfigError, TrainConfig, validate
from tclock.envs import make_training_env

RATIO_WINDOW = 50
_RESUME_MAY_CHANGE = {"total_steps", "out", "progress", "checkpoint_every"}


class TrainingDiverged(RuntimeError):
    """Loss or parameters became non-finite; the last good checkpoint is kept."""


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


def build_agent(cfg: TrainConfig, num_envs: int | None = None) -> PPO:
    env = make_training_env(cfg.env, num_envs or cfg.num_envs, cfg.episode_length or None, **_env_kwargs(cfg))
    return PPO(cfg, env)


@dataclass
class CompiledAgent:
    """Ahead-of-time compiled rollout and update programs for one (config, num_envs)."""

    agent: PPO
    rollout: Callable
    update_plain: Callable
    update_gdc: Callable | None
    compile_s: float
    compiles: int


# Fields that do not change the compiled programs (they live on the host or are arguments).
_HOST_ONLY_FIELDS = {"out", "total_steps", "progress", "checkpoint_every", "seed", "target_success", "lr",
                     "lr_schedule", "lr_warmup", "lr_scaling", "lr_base_envs", "gdc_every"}
_COMPILED: dict = {}


def program_key(cfg: TrainConfig, num_envs: int, with_gdc: bool, device=None) -> str:
    fields = {k: v for k, v in cfg.to_dict().items() if k not in _HOST_ONLY_FIELDS}
    return repr((sorted(fields.items()), num_envs, with_gdc, jax.default_backend(), str(device)))


def compiled_for(cfg: TrainConfig, num_envs: int, state, with_gdc: bool,
                 announce: Callable[[str], None] = lambda s: None, device=None) -> CompiledAgent:
    """Compiled programs for this config, size and device, reused within the process."""
    key = program_key(cfg, num_envs, with_gdc, device)
    if key not in _COMPILED:
        _COMPILED[key] = compile_agent(build_agent(cfg, num_envs), state, with_gdc, announce)
    return _COMPILED[key]


def compile_agent(agent: PPO, state, with_gdc: bool, announce: Callable[[str], None] = lambda s: None) -> CompiledAgent:
    t0 = time.perf_counter()
    announce(f"compiling rollout (num_envs={agent.env.num_envs}, unroll_length={agent.cfg.unroll_length})")
    rollout = jax.jit(agent.rollout).lower(state).compile()
    traj_shape = jax.eval_shape(agent.rollout, state)[1]
    lr = jnp.float32(0.0)
    announce("compiling update")
    update_plain = jax.jit(lambda s, t, l: agent.update(s, t, l, False)).lower(state, traj_shape, lr).compile()
    update_gdc = None
    if with_gdc:
        announce("compiling update with gradient diagnostics")
        update_gdc = jax.jit(lambda s, t, l: agent.update(s, t, l, True)).lower(state, traj_shape, lr).compile()
    return CompiledAgent(agent, rollout, update_plain, update_gdc, time.perf_counter() - t0, 3 if with_gdc else 2)


def lr_at(cfg: TrainConfig, iteration: int) -> float:
    """Step-clock learning rate for (0-based) ``iteration``."""
    base = cfg.scaled_lr()
    if cfg.lr_warmup and iteration < cfg.lr_warmup:
        return base * (iteration + 1) / cfg.lr_warmup
    frac = min(1.0, iteration / max(1, cfg.num_iterations))
    if cfg.lr_schedule == "linear":
        return base * (1.0 - frac)
    if cfg.lr_schedule == "cosine":
        return base * 0.5 * (1.0 + math.cos(math.pi * frac))
    return base


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
    return [None if not math.isfinite(v) else float(v) for v in arr]


class _Progress:
    def __init__(self, enabled: bool, total: int, initial: int):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", unit_scale=True, dynamic_ncols=True,
                            desc="compile", smoothing=0.1)

    def phase(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(text[:60])

    def advance(self, n: int, postfix: dict) -> None:
        if self.bar is not None:
            self.bar.set_description_str("train")
            self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def train(cfg: TrainConfig, resume: bool = False, overwrite: bool = False,
          clock: Callable[[], float] = time.perf_counter, device=None,
          on_iteration: Callable[[dict], None] | None = None) -> RunResult:
    """Trains ``cfg`` and writes its run directory. Returns a summary of the run.

    ``device``: run on this JAX device (state committed there; programs compiled for it).
    ``on_iteration(record)``: called after each logged iteration (progress of a sweep); an
    exception it raises stops the run like Ctrl-C does (checkpoint, status ``interrupted``).
    """
    validate(cfg)
    run_dir = Path(cfg.out)
    checkpoint = None
    if resume:
        if runlog.read_status(run_dir).get("state") == "finished":
            _check_resume_config(run_dir, cfg)
            return _finished_result(run_dir)
        if (run_dir / runlog.CONFIG_FILE).exists():
            _check_resume_config(run_dir, cfg)
        checkpoint = runlog.load_checkpoint(run_dir)
    elif runlog.read_metrics(run_dir, missing_ok=True) and not overwrite:
        raise ConfigError(f"out: {run_dir} already holds a run; pass --resume to continue it, --overwrite to "
                          "replace it, or choose another --out")

    agent = build_agent(cfg)
    if checkpoint is None:
        start_iteration, host = 0, {"wall_s": 0.0, "ratios": []}
        state = agent.init(cfg.seed, cfg.seeds)
    else:
        start_iteration, saved = checkpoint
        host = saved["host"]
        state = jax.tree.map(jnp.asarray, saved["train"])
    if device is not None:
        state = jax.device_put(state, device)

    steps_per_iter = cfg.transitions_per_rollout
    progress = _Progress(cfg.progress, cfg.num_iterations * steps_per_iter, start_iteration * steps_per_iter)
    compiled = compiled_for(cfg, cfg.num_envs, state, with_gdc=cfg.gdc_every > 0, announce=progress.phase,
                            device=device)
    writer = runlog.RunWriter(run_dir, cfg.to_dict(), resume_iteration=start_iteration if checkpoint else None)
    ratios = deque(host["ratios"], maxlen=RATIO_WINDOW)
    wall_offset = host["wall_s"]
    last_good = (start_iteration, state)
    prev_learn_start = None
    loop_start = clock()
    record: dict = {}
    iteration = start_iteration

    def save(iteration_done, good_state):
        wall = wall_offset + clock() - loop_start
        host_state = {"wall_s": wall, "ratios": list(ratios)}
        writer.save_checkpoint(iteration_done, {"train": jax.device_get(good_state), "host": host_state})

    try:
        for iteration in range(start_iteration, cfg.num_iterations):
            number = iteration + 1
            with_gdc = cfg.gdc_every > 0 and number % cfg.gdc_every == 0
            t0 = clock()
            state, traj, roll_m = compiled.rollout(state)
            jax.block_until_ready(traj)
            rt = clock() - t0
            learn_start = clock()
            ut = None if prev_learn_start is None else learn_start - prev_learn_start
            prev_learn_start = learn_start
            update = compiled.update_gdc if with_gdc else compiled.update_plain
            state, upd_m = update(state, traj, jnp.float32(lr_at(cfg, iteration)))
            jax.block_until_ready(state)
            learn = clock() - learn_start
            roll_m, upd_m = jax.device_get((roll_m, upd_m))
            ratio = None if not ut else rt / ut
            if ratio is not None:
                ratios.append(ratio)
            record = {
                "iteration": number,
                "env_steps": number * steps_per_iter,
                "wall_s": wall_offset + clock() - loop_start,
                "rt_s": rt,
                "learn_s": learn,
                "ut_s": ut,
                "rt_ut_ratio": ratio,
                "rt_ut_ratio_w50": float(np.mean(ratios)) if ratios else None,
                "num_envs": cfg.num_envs,
                "compiles": compiled.compiles,
            }
            if iteration == start_iteration:
                record["compile_s"] = compiled.compile_s
            finite = np.asarray(upd_m.pop("finite"))
            record.update({k: _seed_list(v) for k, v in roll_m.items()})
            record.update({k: _seed_list(v) for k, v in upd_m.items()})
            writer.log(record)
            if not finite.all():
                bad = [i for i, ok in enumerate(finite) if not ok]
                good_it = last_good[0]
                save(*last_good)
                writer.mark("failed", reason="non-finite loss or parameters", iteration=number, seeds=bad,
                            last_good_checkpoint=good_it)
                raise TrainingDiverged(
                    f"loss or parameters became non-finite at iteration {number} (seed index {bad}); the last good "
                    f"checkpoint (iteration {good_it}) is kept in {run_dir / runlog.CHECKPOINT_DIR}. Lower lr "
                    f"(now {cfg.lr}) or max_grad_norm, or check the env's observations for NaN.")
            last_good = (number, state)
            if number % cfg.checkpoint_every == 0 or number == cfg.num_iterations:
                save(number, state)
            sps = steps_per_iter * cfg.seeds / max(rt + learn, 1e-9)
            progress.advance(steps_per_iter, {"sps": f"{sps:,.0f}", "rt/ut": f"{ratio or 0:.2f}",
                                              "success": f"{np.mean(record['success_rate']):.2f}"})
            if on_iteration is not None:
                on_iteration(record)
    except KeyboardInterrupt:
        save(*last_good)
        writer.mark("interrupted", iteration=last_good[0])
        writer.close()
        progress.close()
        raise
    except TrainingDiverged:
        writer.close()
        progress.close()
        raise
    progress.close()
    wall = wall_offset + clock() - loop_start
    done_iters = cfg.num_iterations - start_iteration
    sps_total = done_iters * steps_per_iter * cfg.seeds / max(clock() - loop_start, 1e-9)
    writer.mark("finished", iterations=cfg.num_iterations, compile_s=compiled.compile_s, wall_s=wall,
                env_steps_per_s=sps_total, device=str(device or jax.devices()[0]))
    writer.close()
    return RunResult(run_dir, cfg.num_iterations, compiled.compile_s, wall, sps_total, record)


def _finished_result(run_dir: Path) -> RunResult:
    status = runlog.read_status(run_dir)
    metrics = runlog.read_metrics(run_dir)
    return RunResult(run_dir, int(status.get("iterations", len(metrics))), float(status.get("compile_s", 0.0)),
                     float(status.get("wall_s", 0.0)), float(status.get("env_steps_per_s", 0.0)),
                     metrics[-1] if metrics else {})
