"""Training on the asynchronous rollout pipeline (ARP): the two clocks, physically apart.

``train_async(cfg)`` runs ``cfg.arp_actors`` actor threads, each stepping its own
``num_envs`` envs (per seed) with the latest *published* parameters, and a learner (the
calling thread) that trains on the newest rollout younger than ``max_age_s`` and publishes
new parameters after every update (``tclock.pipeline.AsyncPipeline``).  Any learner works:
PPO uses its clipped importance ratio against the stored behaviour log-probabilities, IMPALA
its V-trace correction.

``max_age_s`` is ``cfg.arp_max_age_s`` or, when 0, calibrated as the write-up does: the
p95 of ``arp_calibration_rollouts`` timed rollouts, times 1.5.  It is logged either way.

Placement: with one device, actors and learner share it (they overlap only where XLA and
the host leave room: on a 2-core CPU they compete for the same cores).  With several
devices, the learner uses the first and actor i the device ``1 + i mod (n-1)``
(Sebulba-style); parameters are copied to the actor's device once per published version and
trajectories to the learner's device once per update.

Each update logs the sync loop's keys plus ``policy_lag`` (learner version − behaviour
version, per update; ``policy_lag_max`` so far), ``queue_depth``, ``dropped_age``,
``dropped_overflow``, ``produced``, ``data_age_s``, ``learner_wait_s``, ``actor_env_steps_per_s``,
``learner_env_steps_per_s`` and ``max_age_s``.  ``env_steps`` counts the env steps the
learner trained on (per seed); ``rt_ut_ratio`` may exceed 1 here and then approximates the
policy lag in updates.  Runs are not bit-reproducible (thread timing decides which rollout
the learner sees).  On ``--resume`` the learner state and actor 0's envs come back from the
checkpoint; other actors start fresh episodes.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from tclock import runlog
from tclock.config import TrainConfig
from tclock.runtime import (RATIO_WINDOW, RunResult, TrainingDiverged, _Progress, build_agent, compiled_for,
                            make_lr_clock, open_run, run_guard, seed_metrics)
from tclock.pipeline import AsyncPipeline, calibrate_max_age


def _placement(num_actors: int, device=None) -> tuple:
    if device is not None:
        return device, [device] * num_actors
    devices = jax.devices()
    if len(devices) == 1:
        return devices[0], [devices[0]] * num_actors
    return devices[0], [devices[1 + i % (len(devices) - 1)] for i in range(num_actors)]


def train_async(cfg: TrainConfig, resume: bool = False, overwrite: bool = False,
                clock: Callable[[], float] = time.perf_counter, device=None,
                on_iteration: Callable[[dict], None] | None = None) -> RunResult:
    run_dir = Path(cfg.out)
    finished, checkpoint = open_run(cfg, resume, overwrite)
    if finished is not None:
        return finished
    agent = build_agent(cfg)
    B, T = cfg.num_envs, cfg.unroll_length
    learner_device, actor_devices = _placement(cfg.arp_actors, device)
    if checkpoint is None:
        iteration, host = 0, {"wall_s": 0.0, "env_steps": 0, "ratios": []}
        state = agent.init(cfg.seed, cfg.seeds)
    else:
        iteration, saved = checkpoint
        host = saved["host"]
        state = jax.tree.map(jnp.asarray, saved["train"])
    state = jax.device_put(state, learner_device)
    with_gdc = cfg.gdc_every > 0
    progress = _Progress(cfg.progress, cfg.total_steps, host["env_steps"], "step")

    # Each actor: its own envs and key (actor 0 continues the checkpointed envs), its device's programs.
    learner_programs, fresh = compiled_for(agent, state, B, with_gdc, progress.phase, learner_device)
    compile_s = learner_programs.compile_s if fresh else 0.0
    actors = []
    for i, dev in enumerate(actor_devices):
        own = state if i == 0 else agent.init(cfg.seed + 7919 * i, cfg.seeds)
        own = jax.device_put(own, dev)
        programs, fresh = compiled_for(agent, own, B, with_gdc, progress.phase, dev)  # shared on one device
        compile_s += programs.compile_s if fresh else 0.0
        actors.append({"state": own, "device": dev, "rollout": programs.rollout, "version": -1})

    max_age = cfg.arp_max_age_s
    calibration = []
    if max_age <= 0:
        progress.phase("calibrating max data age")
        a = actors[0]
        for _ in range(cfg.arp_calibration_rollouts):
            t0 = clock()
            a["state"], traj, _ = a["rollout"](a["state"])
            jax.block_until_ready(traj)
            calibration.append(clock() - t0)
        max_age = calibrate_max_age(calibration)

    writer = runlog.RunWriter(run_dir, cfg.to_dict(), resume_iteration=iteration if checkpoint else None)
    lr_clock = make_lr_clock(cfg)
    env_steps = int(host["env_steps"])
    ratios = list(host["ratios"])[-RATIO_WINDOW:]
    wall_offset = host["wall_s"]
    learner = {"state": state, "last_good": (iteration, state, env_steps)}
    lock = threading.Lock()
    loop_start = clock()
    actor_steps = [0] * len(actors)

    def wall() -> float:
        return wall_offset + clock() - loop_start

    def actor_fn(published, version, index):
        a = actors[index]
        params, normalizer = published
        if a["version"] != version:  # copy the new parameters to this actor's device once
            a["params"] = jax.device_put((params, normalizer), a["device"])
            a["version"] = version
        s = a["state"].replace(params=a["params"][0], normalizer=a["params"][1])
        s, traj, roll_m = a["rollout"](s)
        jax.block_until_ready(traj)
        a["state"] = s
        actor_steps[index] += B * T * cfg.seeds
        return traj, jax.device_get(roll_m)

    def learner_fn(published, item):
        traj, roll_m = item.trajectory
        traj = jax.device_put(traj, learner_device)
        number = learner["last_good"][0] + 1
        update = learner_programs.update_gdc if (with_gdc and number % cfg.gdc_every == 0) \
            else learner_programs.update_plain
        new_state, upd_m = update(learner["state"], traj, jnp.float32(lr_clock.lr(env_steps, wall())))
        jax.block_until_ready(new_state)
        learner["state"] = new_state
        return (new_state.params, new_state.normalizer), {"roll": roll_m, "update": jax.device_get(upd_m)}

    lag_max = 0

    def save(iteration_done, good_state, good_env_steps):
        checkpoint_state = good_state.replace(env=jax.device_put(actors[0]["state"].env, learner_device))
        host_state = {"wall_s": wall(), "env_steps": good_env_steps, "ratios": ratios[-RATIO_WINDOW:]}
        writer.save_checkpoint(iteration_done, {"train": jax.device_get(checkpoint_state), "host": host_state})

    def on_update(rec):
        nonlocal env_steps, lag_max
        with lock:
            number = learner["last_good"][0] + 1
            env_steps += B * T
            ratio = rec["rt_ut_ratio"]
            if ratio is not None:
                ratios.append(ratio)
            lag_max = max(lag_max, rec["policy_lag"])
            elapsed = max(clock() - loop_start, 1e-9)
            record = {
                "iteration": number, "env_steps": env_steps, "wall_s": wall(), "rt_s": rec["rollout_s"],
                "learn_s": rec["update_s"], "ut_s": rec["ut_s"], "rt_ut_ratio": ratio,
                "rt_ut_ratio_w50": float(np.mean(ratios[-RATIO_WINDOW:])) if ratios else None,
                "num_envs": B, "compiles": learner_programs.programs,
                "policy_lag": rec["policy_lag"], "policy_lag_max": lag_max, "queue_depth": rec["queue_depth"],
                "dropped_age": rec["dropped_age"], "dropped_overflow": rec["dropped_overflow"],
                "produced": rec["produced"], "data_age_s": rec["data_age_s"],
                "learner_wait_s": rec["learner_wait_s"], "max_age_s": max_age,
                "actor_env_steps_per_s": sum(actor_steps) / elapsed,
                "learner_env_steps_per_s": (env_steps - host["env_steps"]) * cfg.seeds / elapsed,
            }
            if number == iteration + 1:
                record.update(compile_s=compile_s, arp_calibration_s=calibration)
            upd_m = rec["info"]["update"]
            record.update(seed_metrics(rec["info"]["roll"], upd_m))
            writer.log(record)
            if not np.asarray(upd_m["finite"]).all():
                save(*learner["last_good"])
                writer.mark("failed", reason="non-finite loss or parameters", iteration=number,
                            last_good_checkpoint=learner["last_good"][0])
                raise TrainingDiverged(f"loss or parameters became non-finite at iteration {number}; the last good "
                                       f"state (iteration {learner['last_good'][0]}) is checkpointed in "
                                       f"{run_dir / runlog.CHECKPOINT_DIR}. Lower lr or max_grad_norm.")
            learner["last_good"] = (number, learner["state"], env_steps)
            if number % cfg.checkpoint_every == 0:
                save(*learner["last_good"])
            progress.advance(B * T, {"lag": rec["policy_lag"], "rt/ut": f"{ratio or 0:.2f}",
                                     "queue": rec["queue_depth"], "success": f"{np.mean(record['success_rate']):.2f}"})
        if on_iteration is not None:
            on_iteration(record)

    remaining = max(0, (cfg.total_steps - env_steps) // (B * T))
    pipeline = AsyncPipeline(actor_fn, learner_fn, (state.params, state.normalizer), num_actors=len(actors),
                             capacity=cfg.arp_capacity, max_age_s=max_age, clock=clock)
    def save_last_good() -> int:
        save(*learner["last_good"])
        return learner["last_good"][0]

    with run_guard(writer, progress, save_last_good):
        stats = pipeline.run(num_updates=remaining, on_update=on_update)
        save(*learner["last_good"])
        loop_s = max(clock() - loop_start, 1e-9)
        sps_total = (env_steps - host["env_steps"]) * cfg.seeds / loop_s
        final = runlog.read_metrics(run_dir)[-1] if env_steps > host["env_steps"] else {}
        writer.mark("finished", iterations=learner["last_good"][0], env_steps=env_steps, compile_s=compile_s,
                    wall_s=wall(), env_steps_per_s=sps_total, device=str(learner_device), max_age_s=max_age,
                    pipeline={k: v for k, v in stats.items() if isinstance(v, (int, float, str))})
    return RunResult(run_dir, learner["last_good"][0], compile_s, wall(), sps_total, final)
