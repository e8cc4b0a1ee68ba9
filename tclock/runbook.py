"""The run bookkeeper: what every training loop (synchronous ``loop.py``, asynchronous
``arp.py``) does with a run directory, written once.

:class:`RunBook` opens the run (``--resume`` / ``--overwrite`` checks), restores the training
state and the typed :class:`HostState` from the newest checkpoint (or initialises both),
builds each iteration's metrics record with the shared keys (clocks, counters, the windowed
RT/UT ratio, per-seed metrics), stops the run on a non-finite loss or parameter (checkpointing
the last good state), checkpoints every ``checkpoint_every`` iterations, and ends the run
(``finished`` / ``interrupted`` / ``failed`` in ``status.json``).  A loop keeps only what is
its own: who produces rollouts, when the learner runs, and the keys only it logs.

Shared record keys (docs/metrics.md): ``iteration``, ``env_steps``, ``wall_s``, ``rt_s``,
``learn_s``, ``ut_s``, ``rt_ut_ratio``, ``rt_ut_ratio_w50`` (mean of the last
``thresholds.RATIO_WINDOW`` ratios), ``num_envs``, ``compiles``, ``compile_s`` (first record of
a process), then the learner's per-seed metrics and the loop's own keys.
"""
from __future__ import annotations

import contextlib
import math
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from tclock import runlog, step_size, tracking
from tclock.config import (
    RESUME_MAY_CHANGE,
    ConfigError,
    TrainConfig,
    config_differences,
)
from tclock.mesh import to_host
from tclock.online_critical import ONLINE_KEY, OnlineCriticalBatch
from tclock.progress import Progress
from tclock.thresholds import RATIO_WINDOW


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


@dataclass
class HostState:
    """What the host loop carries across a checkpoint besides the training state."""

    wall_s: float = 0.0  # loop seconds so far
    env_steps: int = 0  # per seed
    ratios: list = field(default_factory=list)  # the last RATIO_WINDOW rt_ut_ratio values
    drbs: dict | None = None  # the DRBS controller's state
    noise: dict | None = None  # the online critical batch's window (OnlineCriticalBatch.state_dict)
    step: dict | None = None  # the step-size signal's window (same class, tclock.step_size.SOURCE)

    @classmethod
    def from_dict(cls, data: dict) -> "HostState":
        return cls(wall_s=float(data.get("wall_s", 0.0)), env_steps=int(data.get("env_steps", 0)),
                   ratios=list(data.get("ratios", [])), drbs=data.get("drbs"), noise=data.get("noise"),
                   step=data.get("step"))


class _NoFiles:
    """The writer of a process that does not write the run directory (not process 0 of a run
    across processes): every call does nothing."""

    def add_sink(self, sink) -> None:
        pass

    def log(self, record: dict) -> None:
        pass

    def save_checkpoint(self, iteration: int, state: Any, host: dict) -> None:
        return None

    def mark(self, state: str, **info: Any) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class LastGood:
    """The newest state whose metrics were all finite: what a checkpoint saves."""

    iteration: int
    state: Any
    env_steps: int


def state_template(agent, cfg: TrainConfig) -> Any:
    """The shapes and dtypes of the state a new run of ``cfg`` starts from, which a checkpoint
    is restored against: ``jax.eval_shape`` of ``agent.init`` (nothing is computed), or the
    real ``init`` for a learner whose ``init`` cannot be traced."""
    try:
        return jax.eval_shape(lambda: agent.init(cfg.seed, cfg.seeds))
    except jax.errors.JAXTypeError:
        return agent.init(cfg.seed, cfg.seeds)


def seed_list(x) -> list:
    """A per-seed metric array as a JSON list (non-finite values as None)."""
    arr = np.asarray(x, dtype=np.float64).reshape(-1)
    return [None if not np.isfinite(v) else float(v) for v in arr]


def seed_metrics(*metric_dicts) -> dict:
    """Per-seed metric arrays from the jitted functions as JSON lists (``finite`` excluded)."""
    return {k: seed_list(v) for m in metric_dicts for k, v in m.items() if k != "finite"}


class RunBook:
    """One run directory's bookkeeping; see the module docstring.

    ``checkpoint_state(state)``: what a checkpoint stores for a training state (the
    asynchronous loop swaps in actor 0's envs); ``drbs_state()``: the DRBS controller's state
    to save with the host state (None without DRBS).  ``lead``: this process writes the run
    directory (a run across processes is written by process 0 alone; the others keep the same
    books without files); ``collective``: the state spans processes, so gathering it for a
    checkpoint needs all of them (an error path then points at the newest checkpoint on disk
    instead of gathering with processes that may be gone)."""

    def __init__(self, cfg: TrainConfig, clock: Callable[[], float] = time.perf_counter, lead: bool = True,
                 collective: bool = False):
        self.cfg = cfg
        self.lead, self.collective = lead, collective
        self.run_dir = Path(cfg.out)
        self.clock = clock
        self.resume = False
        self.checkpoint: runlog.Checkpoint | None = None
        self.status_info: dict = {}  # kept in every status.json of this process (checkpoint_fallback)
        self.host = HostState()
        self.first_iteration = 0
        self.last_good: LastGood | None = None
        self.last_record: dict = {}
        self.ratios: deque = deque(maxlen=RATIO_WINDOW)
        self.online = OnlineCriticalBatch(cfg.noise_window)
        self.step = OnlineCriticalBatch(cfg.noise_window, sources=step_size.SOURCE)
        self.writer: runlog.RunWriter | None = None
        self.progress = Progress(False, 0, 0, "step")
        self.first_record_extra: dict = {}
        self.checkpoint_state: Callable[[Any], Any] = lambda state: state
        self.drbs_state: Callable[[], dict | None] = lambda: None
        self._loop_start = 0.0

    # ------------------------------------------------------------------ opening
    def open(self, resume: bool, overwrite: bool) -> RunResult | None:
        """Checks ``--resume``/``--overwrite`` against the run directory; returns the result of
        a finished run being resumed (nothing to do), else None (and keeps the checkpoint)."""
        run_dir = self.run_dir
        if resume:
            if (run_dir / runlog.CONFIG_FILE).exists():
                self._check_resume_config()
            if runlog.read_status(run_dir).get("state") == "finished":
                return self._finished_result()
            self.resume = True  # the checkpoint is read in initial_state, against the learner's state
            return None
        if runlog.read_metrics(run_dir, missing_ok=True) and not overwrite:
            raise ConfigError(f"out: {run_dir} already holds a run; pass --resume to continue it, --overwrite to "
                              "replace it, or choose another --out")
        return None

    def initial_state(self, agent) -> tuple[int, Any]:
        """``(iteration, state)``: from the newest loadable checkpoint (``--resume``), restored
        against the state a new run starts from, or ``agent.init`` for a new run."""
        if self.resume:
            self.checkpoint = self._load_checkpoint(agent)
        if self.checkpoint is None:
            iteration, state, self.host = 0, agent.init(self.cfg.seed, self.cfg.seeds), HostState()
        else:
            iteration, self.host = self.checkpoint.iteration, HostState.from_dict(self.checkpoint.host)
            state = jax.tree.map(jnp.asarray, self.checkpoint.train)
        self.first_iteration = iteration
        self.ratios = deque(self.host.ratios, maxlen=RATIO_WINDOW)
        self.online = OnlineCriticalBatch(self.cfg.noise_window, self.host.noise)
        self.step = OnlineCriticalBatch(self.cfg.noise_window, self.host.step, sources=step_size.SOURCE)
        self.last_good = LastGood(iteration, state, self.host.env_steps)
        return iteration, state

    def _load_checkpoint(self, agent) -> runlog.Checkpoint | None:
        """The checkpoint to resume from; newer ones that are damaged (or that the intact
        metrics lines do not cover) are skipped with a warning, and status.json says so."""
        ckpt = runlog.load_checkpoint(self.run_dir, state_template(agent, self.cfg),
                                      max_iteration=runlog.metrics_coverage(self.run_dir))
        if ckpt is not None and ckpt.skipped:
            self.status_info["checkpoint_fallback"] = {"resumed_from": ckpt.iteration, "skipped": ckpt.skipped}
            reasons = "; ".join(f"{s['file']}: {s['reason']}" for s in ckpt.skipped)
            print(f"warning: {self.run_dir}: resuming from {ckpt.path.name} (iteration {ckpt.iteration}); "
                  f"skipped {reasons}", file=sys.stderr)
        return ckpt

    def start_progress(self, by_wall: bool = False) -> Progress:
        cfg = self.cfg
        shown = cfg.progress and self.lead
        if by_wall:
            self.progress = Progress(shown, cfg.total_seconds, self.host.wall_s, "s")
        else:
            self.progress = Progress(shown, cfg.total_steps, self.host.env_steps, "step")
        return self.progress

    def start(self) -> None:
        """Opens the run's files (after compiling) and starts the loop clock."""
        resumed = self.first_iteration if self.checkpoint is not None else None
        if not self.lead:
            self.writer = _NoFiles()
            self._loop_start = self.clock()
            return
        self.writer = runlog.RunWriter(self.run_dir, self.cfg.to_dict(), resume_iteration=resumed,
                                       keep_checkpoints=self.cfg.keep_checkpoints, status_info=self.status_info)
        for sink in tracking.make_sinks(self.cfg, self.run_dir, self.host.env_steps if resumed is not None else None):
            self.writer.add_sink(sink)
        self._loop_start = self.clock()

    def wall(self) -> float:
        """Loop seconds of the whole run (earlier processes included)."""
        return self.host.wall_s + self.clock() - self._loop_start

    def loop_seconds(self) -> float:
        """Loop seconds of this process."""
        return max(self.clock() - self._loop_start, 1e-9)

    # ------------------------------------------------------------------ each iteration
    def record(self, number: int, env_steps: int, rt: float, learn: float, ut: float | None,
               ratio: float | None, num_envs: int, compiles: int, metrics: tuple = (), extra: dict | None = None) -> dict:
        """The iteration's metrics record: the shared keys, ``extra`` (the loop's own keys, in
        the order given), then the learner's per-seed ``metrics``."""
        if ratio is not None:
            self.ratios.append(ratio)
        record = {"iteration": number, "env_steps": env_steps, "wall_s": self.wall(), "rt_s": rt, "learn_s": learn,
                  "ut_s": ut, "rt_ut_ratio": ratio,
                  "rt_ut_ratio_w50": float(np.mean(self.ratios)) if self.ratios else None,
                  "num_envs": num_envs, "compiles": compiles}
        if self.first_record_extra:
            record.update(self.first_record_extra)
            self.first_record_extra = {}
        record.update(extra or {})
        record.update(seed_metrics(*metrics))
        for m in metrics:
            online = self.online.add(m)
            if online is not None:
                record[ONLINE_KEY] = online
            gains = self.step.add(m)
            if gains is not None:
                b = record.get(ONLINE_KEY) or [None] * len(gains)
                ratios = [step_size.full_batch_ratio(step_size.ratio_from_gains(g), bi, int(record["num_envs"]))
                          for g, bi in zip(gains, b)]
                record[step_size.STEP_KEY] = [r if math.isfinite(r) else None for r in ratios]
        return record

    def commit(self, record: dict, state, finite) -> None:
        """Logs ``record``; stops the run if ``finite`` (per seed) is false anywhere; otherwise
        ``state`` becomes the last good state, checkpointed every ``checkpoint_every``."""
        self.writer.log(record)
        self.last_record = record
        number = record["iteration"]
        finite = np.asarray(finite).reshape(-1)
        if not finite.all():
            bad = [i for i, ok in enumerate(finite) if not ok]
            good = self.last_good.iteration
            self.save()
            self.writer.mark("failed", reason="non-finite loss or parameters", diverged=True, iteration=number,
                             seeds=bad, last_good_checkpoint=good)
            raise TrainingDiverged(
                f"loss or parameters became non-finite at iteration {number} (seed index {bad}); the last good "
                f"state (iteration {good}) is checkpointed in {self.run_dir / runlog.CHECKPOINT_DIR}. Lower "
                f"lr (now {self.cfg.lr}) or max_grad_norm, or check the env's observations for NaN.")
        self.last_good = LastGood(number, state, record["env_steps"])
        if number % self.cfg.checkpoint_every == 0:
            self.save()

    def save(self) -> int:
        """Checkpoints the last good state with the host state; returns its iteration."""
        good = self.last_good
        host = HostState(wall_s=self.wall(), env_steps=good.env_steps, ratios=list(self.ratios),
                         drbs=self.drbs_state(), noise=self.online.state_dict(), step=self.step.state_dict())
        self.writer.save_checkpoint(good.iteration, to_host(self.checkpoint_state(good.state)), asdict(host))
        return good.iteration

    # ------------------------------------------------------------------ ending
    @contextlib.contextmanager
    def guard(self):
        """How a run ends, for every loop, wrapped around everything after ``open``: Ctrl-C
        checkpoints the last good state and marks the run ``interrupted``; divergence has
        already been marked ``failed``; any other error checkpoints (when it still can) and
        marks ``failed`` with its reason; a write error also names the last good checkpoint
        on disk.  Before ``start`` opens the run's files (building, restoring, compiling) an
        error leaves the directory as it was.  Files and the progress bar are closed either way."""
        try:
            yield
        except KeyboardInterrupt:
            self._end("interrupted", None)
            raise
        except TrainingDiverged:
            raise
        except runlog.RunWriteError as e:  # a full disk, lost permissions
            good = self._end("failed", e)
            kept = (f"the last good checkpoint (iteration {good}) in {self.run_dir / runlog.CHECKPOINT_DIR} is intact"
                    if good is not None else "no checkpoint was written")
            raise runlog.RunWriteError(f"{e}; {kept}. Free space or fix permissions, then continue with --resume") \
                from e
        except Exception as e:  # a callback, a device error: keep what we have, say why
            self._end("failed", e)
            raise
        finally:
            if self.writer is not None:
                self.writer.close()
            self.progress.close()

    def _end(self, state: str, error: BaseException | None) -> int | None:
        """Checkpoints the last good state if it can, marks the run ``state`` (with the error as
        its reason); returns the iteration of the newest checkpoint on disk (None: no files yet)."""
        if self.writer is None:
            return None
        info = {} if error is None else {"reason": f"{type(error).__name__}: {error}"}
        try:
            if self.collective:  # the other processes may be gone: no gathering, the last periodic checkpoint stands
                good = runlog.checkpoint_iteration(self.run_dir)
            else:
                good = self.save() if self.last_good is not None else None
        except OSError as save_error:
            info["checkpoint_error"] = str(save_error)
            good = runlog.checkpoint_iteration(self.run_dir)
        info["iteration" if error is None else "last_good_checkpoint"] = good
        try:
            self.writer.mark(state, **info)
        except OSError:
            pass  # the run directory cannot be written at all: the error being raised says so
        return good

    def finish(self, compile_s: float, device, **info) -> RunResult:
        """Saves the last good state, marks the run finished and returns its summary."""
        self.save()
        good = self.last_good
        sps = (good.env_steps - self.host.env_steps) * self.cfg.seeds / self.loop_seconds()
        wall = self.wall()
        self.writer.mark("finished", iterations=good.iteration, env_steps=good.env_steps, compile_s=compile_s,
                         wall_s=wall, env_steps_per_s=sps, device=str(device), **info)
        return RunResult(self.run_dir, good.iteration, compile_s, wall, sps, self.last_record)

    def _check_resume_config(self) -> None:
        saved = runlog.read_config(self.run_dir)
        details = config_differences(saved, self.cfg, may_differ=RESUME_MAY_CHANGE)
        if details:
            raise ConfigError(f"--resume: the config differs from the run in {self.run_dir} ({details}); "
                              "resume with the same settings or start a new --out")

    def _finished_result(self) -> RunResult:
        status = runlog.read_status(self.run_dir)
        metrics = runlog.read_metrics(self.run_dir)
        return RunResult(self.run_dir, int(status.get("iterations", len(metrics))), float(status.get("compile_s", 0.0)),
                         float(status.get("wall_s", 0.0)), float(status.get("env_steps_per_s", 0.0)),
                         metrics[-1] if metrics else {})
