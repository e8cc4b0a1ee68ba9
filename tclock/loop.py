"""The one clocked host loop.

Per iteration it runs the jitted rollout, blocks on its outputs (RT), then runs the jitted
learning phase (its start-to-start interval is UT), logs one metrics line, lets the
controllers decide (DRBS: next batch size; PURM: when the next update may start; the
learning-rate clock), and now and then writes an atomic checkpoint.  It never touches
per-env data in Python; the run directory's bookkeeping is :class:`tclock.runbook.RunBook`'s.

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
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from tclock.config import ConfigError, TrainConfig, make_drbs_controller, validate
from tclock.control.coscale import lr_multiplier
from tclock.online_critical import ONLINE_KEY
from tclock.control import RhythmGate, UpdateRhythm
from tclock.runbook import RunBook, RunResult, TrainingDiverged
from tclock.runlog import seed_median
from tclock.mesh import RunMesh, resolve, single_device, to_host
from tclock.runtime import CompiledAgent, build_agent, compiled_for, make_lr_clock, pool_size

__all__ = ["train", "TrainingDiverged", "RunResult", "build_agent", "compiled_for"]


@dataclass
class Clocks:
    """The timings of one iteration."""

    rt: float
    learn: float
    ut: float | None

    @property
    def ratio(self) -> float | None:
        return self.rt / self.ut if self.ut else None


class ProgramCache:
    """Compiled programs per batch size, and the compile seconds spent on them."""

    def __init__(self, agent, state, with_gdc: bool, announce: Callable[[str], None], mesh: RunMesh | None = None):
        self.agent, self.state, self.with_gdc, self.announce, self.mesh = agent, state, with_gdc, announce, mesh
        self.programs: dict[int, CompiledAgent] = {}
        self.compile_s = 0.0

    def get(self, batch: int) -> tuple[CompiledAgent, float]:
        """Programs for ``batch`` and the seconds spent compiling them now (0 if cached)."""
        if batch in self.programs:
            return self.programs[batch], 0.0
        self.programs[batch], fresh = compiled_for(self.agent, self.state, batch, self.with_gdc, self.announce,
                                                   mesh=self.mesh)
        spent = self.programs[batch].compile_s if fresh else 0.0
        self.compile_s += spent
        return self.programs[batch], spent

    def count(self) -> int:
        return sum(p.programs for p in self.programs.values())


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

        if jax.process_count() > 1:
            raise ConfigError("arp: the asynchronous pipeline places its learner and actors on one process's "
                              "devices; drop --arp, or --coordinator/--distributed")

        return train_async(cfg, resume=resume, overwrite=overwrite, clock=clock, device=device,
                           on_iteration=on_iteration)
    mesh = run_mesh(cfg, device)  # before anything compiles: a mesh the devices cannot hold is a ConfigError
    book = RunBook(cfg, clock, lead=not mesh.spans_processes or jax.process_index() == 0,
                   collective=mesh.spans_processes)
    finished = book.open(resume, overwrite)
    if finished is not None:
        return finished
    with book.guard():  # from here on, any error ends the run as failed, with its reason
        return _run(book, cfg, clock, sleep, mesh, on_iteration)


DRBS_KEY = {"rt_ut": "drbs_ratio_mean", "critical": "drbs_target_envs"}  # what each DRBS signal logs


def run_mesh(cfg: TrainConfig, device=None) -> RunMesh:
    """The mesh a run trains on: ``device`` alone (a sweep's placement), else ``--mesh`` over
    ``jax.devices()`` (:func:`tclock.mesh.resolve`), checked against every batch size it runs."""
    if device is not None:
        return single_device(device)
    sizes = [pool_size(cfg)] + (list(make_drbs_controller(cfg).ladder) if cfg.drbs else [cfg.num_envs])
    mesh = resolve(cfg.mesh, cfg.seeds, sizes)
    if mesh.spans_processes:
        host_clocked = [flag for flag, on in (("--drbs", cfg.drbs), ("--purm", cfg.purm),
                                              (f"--lr-clock {cfg.lr_clock}", cfg.lr_clock != "steps")) if on]
        if host_clocked:
            raise ConfigError(f"mesh: a run across {jax.process_count()} processes needs every process to take the "
                              f"same decisions, but {', '.join(host_clocked)} decide on each host's own clock; turn "
                              "them off or train on one host")
    return mesh


def _prepare(book: RunBook, cfg: TrainConfig, mesh: RunMesh):
    """``(controller, iteration, state, programs)``: the DRBS controller (or None), the state to
    start from (restored or new, laid out on ``mesh``) and the compiled programs of the first
    batch size."""
    agent = build_agent(cfg)
    agent.env_blocks = mesh.blocks
    controller = make_drbs_controller(cfg) if cfg.drbs else None
    iteration, state = book.initial_state(agent)
    if controller is not None:
        if book.host.drbs:
            controller.load_state_dict(book.host.drbs)
        book.drbs_state = controller.state_dict
    state = mesh.place(state, getattr(agent, "env_sharded_fields", ("env",)))
    progress = book.start_progress(by_wall=cfg.purm)
    if mesh.note:
        progress.phase(mesh.note)
    cache = ProgramCache(agent, state, cfg.gdc_every > 0, progress.phase, mesh)
    for b in (controller.ladder if (controller is not None and cfg.drbs_precompile) else ()):
        cache.get(b)
    cache.get(controller.batch_size if controller else cfg.num_envs)
    return controller, iteration, state, cache


def _lr_noise_scale(controller, logged, previous: float | None) -> float | None:
    """The online noise scale (envs) that ``lr_scaling noise`` follows: a DRBS controller's estimate
    at the current size when it has one (the logged window still holds the sizes the run left),
    else the latest logged ``b_crit_online_envs`` (per seed), else ``previous``."""
    own = controller.noise_scale if controller is not None else None
    return own or seed_median(logged) or previous


def _run(book: RunBook, cfg: TrainConfig, clock, sleep, mesh: RunMesh, on_iteration) -> RunResult:
    controller, iteration, state, cache = _prepare(book, cfg, mesh)
    progress = book.progress
    book.first_record_extra = {"compile_s": cache.compile_s}
    book.start()
    gate = RhythmGate(UpdateRhythm(cfg.purm_t_base, cfg.purm_alpha, cfg.purm_t_cycle), clock=clock,
                      sleep=sleep) if cfg.purm else None
    if gate is not None:
        gate.start()
    lr_clock = make_lr_clock(cfg)
    env_steps = book.host.env_steps
    prev_learn_start = None
    # a resumed run starts from its restored window and controller, as the uninterrupted run would have
    b_noise = _lr_noise_scale(controller, book.online.ratio(), None)

    def batch_size() -> int:
        return controller.batch_size if controller is not None else cfg.num_envs

    def keep_going() -> bool:
        if gate is not None:  # the rhythm restarts with the process; count this process's updates
            return gate.wait_for_slot(iteration - book.first_iteration, deadline_s=cfg.total_seconds - book.host.wall_s)
        return env_steps + batch_size() * cfg.unroll_length <= cfg.total_steps  # only whole rollouts in budget

    while keep_going():
        number, batch = iteration + 1, batch_size()
        compiled, fresh_compile_s = cache.get(batch)
        if prev_learn_start is not None:
            prev_learn_start += fresh_compile_s  # a compile is not part of the update interval
        measure = cfg.gdc_every > 0 and (number % cfg.gdc_every == 0
                                         or (controller is not None and controller.wants_estimate))
        update = compiled.update_gdc if measure else compiled.update_plain
        lr = jnp.float32(lr_clock.lr(env_steps, book.wall())
                         * lr_multiplier(cfg.lr_scaling, batch, cfg.lr_base_envs, b_noise))
        state, roll_m, upd_m, clocks, prev_learn_start = timed_iteration(compiled.rollout, update, state, lr,
                                                                         clock, prev_learn_start)
        env_steps += batch * cfg.unroll_length
        iteration = number
        extra = {}
        if gate is not None:
            extra.update(purm_allowed_updates=gate.rhythm.allowed_updates(gate.elapsed()),
                         purm_waited_s=gate.waited_s)
        record = book.record(number, env_steps, clocks.rt, clocks.learn, clocks.ut, clocks.ratio, batch,
                             cache.count(), (roll_m, upd_m), extra)
        if controller is not None:
            controller.observe(record)
            record.update({DRBS_KEY[cfg.drbs_signal]: controller.ratio_mean(),
                           "drbs_next_num_envs": controller.batch_size, "compiled_sizes": len(cache.programs)})
        b_noise = _lr_noise_scale(controller, record.get(ONLINE_KEY), b_noise)
        book.commit(record, state, upd_m["finite"])
        _report(progress, record, clocks, batch, cfg, gate is not None)
        if on_iteration is not None:
            on_iteration(record)
    return book.finish(cache.compile_s, mesh.devices[0] if mesh.shape.size == 1 else f"mesh {mesh.shape.text()}",
                       mesh=mesh.shape.text())


def timed_iteration(rollout, update, state, lr, clock, prev_learn_start: float | None):
    """One rollout then one learning phase, each blocked on, timed on ``clock``: returns
    ``(state, rollout metrics, update metrics, Clocks, this learning phase's start)``."""
    t0 = clock()
    state, traj, roll_m = rollout(state)
    jax.block_until_ready(traj)
    rt = clock() - t0
    learn_start = clock()
    state, upd_m = update(state, traj, lr)
    jax.block_until_ready(state)
    ut = None if prev_learn_start is None else learn_start - prev_learn_start
    clocks = Clocks(rt, clock() - learn_start, ut)
    roll_m, upd_m = to_host((roll_m, upd_m))
    return state, roll_m, upd_m, clocks, learn_start


def _report(progress, record: dict, clocks: Clocks, batch: int, cfg: TrainConfig, by_wall: bool) -> None:
    sps = batch * cfg.unroll_length * cfg.seeds / max(clocks.rt + clocks.learn, 1e-9)
    postfix = {"B": batch, "sps": f"{sps:,.0f}", "rt/ut": f"{clocks.ratio or 0:.2f}",
               "success": f"{np.mean(record['success_rate']):.2f}"}
    progress.advance((clocks.rt + clocks.learn) if by_wall else batch * cfg.unroll_length, postfix)
