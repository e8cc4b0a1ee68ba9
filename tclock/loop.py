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

import time
from collections import deque
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from tclock import runlog
from tclock.config import TrainConfig, make_drbs_controller, validate
from tclock.control import RhythmGate, UpdateRhythm
from tclock.runtime import (RATIO_WINDOW, CompiledAgent, RunResult, TrainingDiverged, _Progress, build_agent,
                            compiled_for, make_lr_clock, open_run, run_guard, seed_metrics)

__all__ = ["train", "TrainingDiverged", "RunResult", "build_agent", "compiled_for"]


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
