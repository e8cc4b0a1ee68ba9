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
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp

from tclock.config import TrainConfig
from tclock.pipeline import AsyncPipeline, calibrate_max_age
from tclock.runbook import RunBook, RunResult
from tclock.control.coscale import lr_multiplier
from tclock.runtime import build_agent, compiled_for, make_lr_clock

# The keys of a pipeline update record that the run logs as they are.
PIPELINE_KEYS = ("policy_lag", "queue_depth", "dropped_age", "dropped_overflow", "produced", "data_age_s",
                 "learner_wait_s")


@dataclass
class Actor:
    """One actor thread's own envs (inside ``state``), device and compiled rollout, and the
    parameter version it last copied to its device."""

    state: Any
    device: Any
    rollout: Callable
    version: int = -1
    behaviour: Any = None
    env_steps: int = 0  # all seeds, this process


def _placement(num_actors: int, device=None) -> tuple:
    if device is not None:
        return device, [device] * num_actors
    devices = jax.devices()
    if len(devices) == 1:
        return devices[0], [devices[0]] * num_actors
    return devices[0], [devices[1 + i % (len(devices) - 1)] for i in range(num_actors)]


def _make_actors(agent, cfg: TrainConfig, state, devices, announce) -> tuple[list[Actor], float]:
    """Actor 0 continues the (checkpointed) envs of ``state``; actor i > 0 starts its own."""
    actors, compile_s = [], 0.0
    for i, dev in enumerate(devices):
        own = jax.device_put(state if i == 0 else agent.init(cfg.seed + 7919 * i, cfg.seeds), dev)
        programs, fresh = compiled_for(agent, own, cfg.num_envs, cfg.gdc_every > 0, announce, dev)  # shared on one device
        compile_s += programs.compile_s if fresh else 0.0
        actors.append(Actor(own, dev, programs.rollout))
    return actors, compile_s


def _calibrate(actor: Actor, cfg: TrainConfig, clock, announce) -> tuple[float, list]:
    """``(max_age_s, calibration rollout seconds)``: the configured age, or p95 x 1.5 of timed rollouts."""
    if cfg.arp_max_age_s > 0:
        return cfg.arp_max_age_s, []
    announce("calibrating max data age")
    times = []
    for _ in range(cfg.arp_calibration_rollouts):
        t0 = clock()
        actor.state, traj, _ = actor.rollout(actor.state)
        jax.block_until_ready(traj)
        times.append(clock() - t0)
    return calibrate_max_age(times), times


def train_async(cfg: TrainConfig, resume: bool = False, overwrite: bool = False,
                clock: Callable[[], float] = time.perf_counter, device=None,
                on_iteration: Callable[[dict], None] | None = None) -> RunResult:
    book = RunBook(cfg, clock)
    finished = book.open(resume, overwrite)
    if finished is not None:
        return finished
    with book.guard():  # from here on, any error ends the run as failed, with its reason
        return _run_async(book, cfg, clock, device, on_iteration)


def _run_async(book: RunBook, cfg: TrainConfig, clock, device, on_iteration) -> RunResult:
    agent = build_agent(cfg)
    B, T = cfg.num_envs, cfg.unroll_length
    learner_device, actor_devices = _placement(cfg.arp_actors, device)
    _, state = book.initial_state(agent)
    state = jax.device_put(state, learner_device)
    progress = book.start_progress()
    learner_programs, fresh = compiled_for(agent, state, B, cfg.gdc_every > 0, progress.phase, learner_device)
    actors, actor_compile_s = _make_actors(agent, cfg, state, actor_devices, progress.phase)
    compile_s = (learner_programs.compile_s if fresh else 0.0) + actor_compile_s
    max_age, calibration = _calibrate(actors[0], cfg, clock, progress.phase)
    book.first_record_extra = {"compile_s": compile_s, "arp_calibration_s": calibration}
    book.checkpoint_state = lambda s: s.replace(env=jax.device_put(actors[0].state.env, learner_device))
    book.start()
    lr_clock = make_lr_clock(cfg)
    counters = {"env_steps": book.host.env_steps, "lag_max": 0}
    learner_state = [state]
    lock = threading.Lock()

    def actor_fn(published, version, index):
        a = actors[index]
        if a.version != version:  # copy the new parameters to this actor's device once
            a.behaviour, a.version = jax.device_put(published, a.device), version
        a.state, traj, roll_m = a.rollout(agent.with_behaviour(a.state, a.behaviour))
        jax.block_until_ready(traj)
        a.env_steps += B * T * cfg.seeds
        return traj, jax.device_get(roll_m)

    def learner_fn(published, item):
        traj, roll_m = item.trajectory
        number = book.last_good.iteration + 1
        update = learner_programs.update_gdc if (cfg.gdc_every > 0 and number % cfg.gdc_every == 0) \
            else learner_programs.update_plain
        lr = jnp.float32(lr_clock.lr(counters["env_steps"], book.wall())
                         * lr_multiplier(cfg.lr_scaling, cfg.num_envs, cfg.lr_base_envs))
        new_state, upd_m = update(learner_state[0], jax.device_put(traj, learner_device), lr)
        jax.block_until_ready(new_state)
        learner_state[0] = new_state
        return agent.behaviour(new_state), {"roll": roll_m, "update": jax.device_get(upd_m)}

    def on_update(rec):
        with lock:
            counters["env_steps"] += B * T
            counters["lag_max"] = max(counters["lag_max"], rec["policy_lag"])
            elapsed = book.loop_seconds()
            extra = {k: rec[k] for k in PIPELINE_KEYS}
            extra.update(policy_lag_max=counters["lag_max"], max_age_s=max_age,
                         actor_env_steps_per_s=sum(a.env_steps for a in actors) / elapsed,
                         learner_env_steps_per_s=(counters["env_steps"] - book.host.env_steps) * cfg.seeds / elapsed)
            upd_m = rec["info"]["update"]
            record = book.record(book.last_good.iteration + 1, counters["env_steps"], rec["rollout_s"],
                                 rec["update_s"], rec["ut_s"], rec["rt_ut_ratio"], B, learner_programs.programs,
                                 (rec["info"]["roll"], upd_m), extra)
            book.commit(record, learner_state[0], upd_m["finite"])
            progress.advance(B * T, {"lag": rec["policy_lag"], "rt/ut": f"{record['rt_ut_ratio'] or 0:.2f}",
                                     "queue": rec["queue_depth"], "success": f"{_mean(record['success_rate']):.2f}"})
        if on_iteration is not None:
            on_iteration(record)

    remaining = max(0, (cfg.total_steps - counters["env_steps"]) // (B * T))
    pipeline = AsyncPipeline(actor_fn, learner_fn, agent.behaviour(state), num_actors=len(actors),
                             capacity=cfg.arp_capacity, max_age_s=max_age, clock=clock)
    stats = pipeline.run(num_updates=remaining, on_update=on_update)
    return book.finish(compile_s, learner_device, max_age_s=max_age,
                       pipeline={k: v for k, v in stats.items() if isinstance(v, (int, float, str))})


def _mean(values) -> float:
    finite = [v for v in values if v is not None]
    return sum(finite) / len(finite) if finite else 0.0
