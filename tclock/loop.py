"""The one clocked host loop.

Per iteration it runs the jitted rollout, blocks on its outputs (RT), then runs the jitted
learning phase (its start-to-start interval is UT), logs one metrics line, lets the
controllers decide (DRBS: next batch size; PURM: when the next update may start; the
learning-rate clock), and now and then writes an atomic checkpoint.  It never touches
per-env data in Python.

Clock definitions (docs/metrics.md): ``rt_s`` = rollout wall seconds; ``learn_s`` = learning
phase wall seconds; ``ut_s`` = seconds between the starts of this and the previous learning
phase (None on the first iteration of a process); ``rt_ut_ratio = rt_s / ut_s``;
``rt_ut_ratio_w50`` its mean over the last 50 iterations.  Programs are compiled ahead of
time, outside the timed regions; when DRBS moves to a batch size not compiled yet, that
compile time is taken out of the next UT, so it never pollutes the ratio the controller reads.
``wall_s`` counts loop time only (compilation excluded).
"""
from __future__ import annotations

import contextlib
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from tclock import runlog
from tclock.agents import make_agent
from tclock.agents.ppo import PPO
from tclock.config import ConfigError, TrainConfig, make_drbs_controller, validate
from tclock.control import LRClock, RhythmGate, UpdateRhythm
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


def train(cfg: TrainConfig, resume: bool = False, overwrite: bool = False,
          clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
          device=None, on_iteration: Callable[[dict], None] | None = None) -> RunResult:
    """Trains ``cfg`` and writes its run directory. Returns a summary of the run.

    ``device``: run on this JAX device (state committed there; programs compiled for it).
    ``on_iteration(record)``: called after each logged iteration (progress of a sweep); an
    exception it raises stops the run like Ctrl-C does (checkpoint, status ``interrupted``).
    ``clock``/``sleep``: injectable for deterministic tests of the wall-clock features.
    """
    validate(cfg)
    if cfg.arp:
        from tclock.arp import train_async

        return train_async(cfg, resume=resume, overwrite=overwrite, clock=clock, device=device,
                           on_iteration=on_iteration)
    run_dir = Path(cfg.out)
    finished, checkpoint = open_run(cfg, resume, overwrite)
    if finished is not None:
        return finished

    agent = build_agent(cfg)
    controller = make_drbs_controller(cfg) if cfg.drbs else None
    if checkpoint is None:
        iteration, host = 0, {"wall_s": 0.0, "ratios": [], "env_steps": 0, "drbs": None}
        state = agent.init(cfg.seed, cfg.seeds)
    else:
        iteration, saved = checkpoint
        host = saved["host"]
        state = jax.tree.map(jnp.asarray, saved["train"])
        if controller is not None and host.get("drbs"):
            controller.load_state_dict(host["drbs"])
    if device is not None:
        state = jax.device_put(state, device)

    T = cfg.unroll_length
    with_gdc = cfg.gdc_every > 0
    if cfg.purm:
        progress = _Progress(cfg.progress, cfg.total_seconds, host["wall_s"], "s")
    else:
        progress = _Progress(cfg.progress, cfg.total_steps, host["env_steps"], "step")
    programs: dict[int, CompiledAgent] = {}

    def programs_for(batch: int) -> tuple[CompiledAgent, float]:
        """Programs for ``batch`` and the seconds spent compiling them now (0 if cached)."""
        if batch not in programs:
            programs[batch], fresh = compiled_for(agent, state, batch, with_gdc, progress.phase, device)
            return programs[batch], programs[batch].compile_s if fresh else 0.0
        return programs[batch], 0.0

    sizes = controller.ladder if (controller is not None and cfg.drbs_precompile) else ()
    compile_s = sum(programs_for(b)[1] for b in sizes)
    compile_s += programs_for(controller.batch_size if controller else cfg.num_envs)[1]
    writer = runlog.RunWriter(run_dir, cfg.to_dict(), resume_iteration=iteration if checkpoint else None)
    ratios = deque(host["ratios"], maxlen=RATIO_WINDOW)
    env_steps = int(host["env_steps"])
    lr_clock = make_lr_clock(cfg)
    gate = RhythmGate(UpdateRhythm(cfg.purm_t_base, cfg.purm_alpha, cfg.purm_t_cycle), clock=clock,
                      sleep=sleep) if cfg.purm else None
    wall_offset = host["wall_s"]
    last_good = (iteration, state, env_steps)
    prev_learn_start = None
    loop_start = clock()
    if gate is not None:
        gate.start()
    record: dict = {}
    first = True

    def wall() -> float:
        return wall_offset + clock() - loop_start

    def save(iteration_done, good_state, good_env_steps):
        host_state = {"wall_s": wall(), "ratios": list(ratios), "env_steps": good_env_steps,
                      "drbs": controller.state_dict() if controller is not None else None}
        writer.save_checkpoint(iteration_done, {"train": jax.device_get(good_state), "host": host_state})

    first_iteration = iteration

    def keep_going() -> bool:
        if gate is not None:  # the rhythm restarts with the process; count this process's updates
            return gate.wait_for_slot(iteration - first_iteration, deadline_s=cfg.total_seconds - wall_offset)
        next_batch = controller.batch_size if controller is not None else cfg.num_envs
        return env_steps + next_batch * T <= cfg.total_steps  # only whole rollouts inside the budget

    def save_last_good() -> int:
        save(*last_good)
        return last_good[0]

    with run_guard(writer, progress, save_last_good):
        while keep_going():
            number = iteration + 1
            batch = controller.batch_size if controller is not None else cfg.num_envs
            compiled, fresh_compile_s = programs_for(batch)
            compile_s += fresh_compile_s
            if prev_learn_start is not None:
                prev_learn_start += fresh_compile_s  # a compile is not part of the update interval
            gdc_now = with_gdc and number % cfg.gdc_every == 0
            lr = lr_clock.lr(env_steps, wall())
            t0 = clock()
            state, traj, roll_m = compiled.rollout(state)
            jax.block_until_ready(traj)
            rt = clock() - t0
            learn_start = clock()
            ut = None if prev_learn_start is None else learn_start - prev_learn_start
            prev_learn_start = learn_start
            update = compiled.update_gdc if gdc_now else compiled.update_plain
            state, upd_m = update(state, traj, jnp.float32(lr))
            jax.block_until_ready(state)
            learn = clock() - learn_start
            roll_m, upd_m = jax.device_get((roll_m, upd_m))
            env_steps += batch * T
            iteration = number
            ratio = rt / ut if ut else None
            if ratio is not None:
                ratios.append(ratio)
            record = {
                "iteration": number,
                "env_steps": env_steps,
                "wall_s": wall(),
                "rt_s": rt,
                "learn_s": learn,
                "ut_s": ut,
                "rt_ut_ratio": ratio,
                "rt_ut_ratio_w50": float(np.mean(ratios)) if ratios else None,
                "num_envs": batch,
                "compiles": sum(p.programs for p in programs.values()),
            }
            if first:
                record["compile_s"] = compile_s
                first = False
            finite = np.asarray(upd_m["finite"])
            record.update(seed_metrics(roll_m, upd_m))
            if controller is not None:
                controller.update(ratio)
                record["drbs_ratio_mean"] = controller.ratio_mean()
                record["drbs_next_num_envs"] = controller.batch_size
                record["compiled_sizes"] = len(programs)
            if gate is not None:
                record["purm_allowed_updates"] = gate.rhythm.allowed_updates(gate.elapsed())
                record["purm_waited_s"] = gate.waited_s
            writer.log(record)
            if not finite.all():
                bad = [i for i, ok in enumerate(finite) if not ok]
                save(*last_good)
                writer.mark("failed", reason="non-finite loss or parameters", iteration=number, seeds=bad,
                            last_good_checkpoint=last_good[0])
                raise TrainingDiverged(
                    f"loss or parameters became non-finite at iteration {number} (seed index {bad}); the last good "
                    f"state (iteration {last_good[0]}) is checkpointed in {run_dir / runlog.CHECKPOINT_DIR}. Lower "
                    f"lr (now {cfg.lr}) or max_grad_norm, or check the env's observations for NaN.")
            last_good = (number, state, env_steps)
            if number % cfg.checkpoint_every == 0:
                save(*last_good)
            sps = batch * T * cfg.seeds / max(rt + learn, 1e-9)
            postfix = {"B": batch, "sps": f"{sps:,.0f}", "rt/ut": f"{ratio or 0:.2f}",
                       "success": f"{np.mean(record['success_rate']):.2f}"}
            progress.advance((rt + learn) if gate is not None else batch * T, postfix)
            if on_iteration is not None:
                on_iteration(record)
        save(*last_good)
        loop_s = max(clock() - loop_start, 1e-9)
        sps_total = (env_steps - host["env_steps"]) * cfg.seeds / loop_s
        writer.mark("finished", iterations=iteration, env_steps=env_steps, compile_s=compile_s, wall_s=wall(),
                    env_steps_per_s=sps_total, device=str(device or jax.devices()[0]))
    return RunResult(run_dir, iteration, compile_s, wall(), sps_total, record)


def _finished_result(run_dir: Path) -> RunResult:
    status = runlog.read_status(run_dir)
    metrics = runlog.read_metrics(run_dir)
    return RunResult(run_dir, int(status.get("iterations", len(metrics))), float(status.get("compile_s", 0.0)),
                     float(status.get("wall_s", 0.0)), float(status.get("env_steps_per_s", 0.0)),
                     metrics[-1] if metrics else {})
