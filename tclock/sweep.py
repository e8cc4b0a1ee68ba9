"""Batch-size sweeps: one run directory per ``num_envs`` (or, with ``axis="sac_batch_size"``, per
SAC gradient batch at a fixed ``num_envs``), S seeds vmapped in each.

``run_sweep(base, spec, out)`` trains ``base`` at every batch size of ``spec`` and then
summarises the sweep (``tclock.sweep_report``: steps-to-target, the critical batch size fit,
GDC cliff, wall-clock optimum, plots).

What stays fixed across batch sizes (the answer depends on it, so it is a choice):

* ``budget="steps"``: every batch size gets ``base.total_steps`` env steps per seed (fewer
  iterations at large B); ``budget="iterations"``: every batch size gets the same number of
  iterations, ``base.total_steps // (B_ref * T)`` with ``B_ref = base.num_envs``.
* ``minibatch="count"``: ``num_minibatches`` is fixed (minibatches grow with B);
  ``minibatch="size"``: the minibatch holds ``minibatch_size`` transitions at every B.
* the base config's ``lr_scaling`` (``none`` | ``sqrt`` | ``linear`` in ``B / lr_base_envs``)
  co-scales the learning rate with the batch.
* ``lrs``: empty (default) runs every B at the base ``lr``; a list of learning rates makes a
  B x lr grid (``tclock sweep --lrs 1e-4 3e-4 1e-3``), one run directory per pair
  (``B0064_lr3e-04``), and the report fits B_crit on the best lr at each B
  (:mod:`tclock.sweep_lr`) with each lr's own fit beside it.

Devices: batch-size configs are spread over the available JAX devices, one config per
device at a time (a worker thread per device, state committed to its device, programs
compiled for it).  Each config runs exactly the program it would run alone, so per-seed
results do not depend on how many devices there are.  On fake CPU devices the workers share
the same cores, so the clocks of concurrent runs are not comparable with a one-device sweep.

Interruption: finished runs are skipped, interrupted ones resume from their checkpoint.
Divergence: a batch size whose training diverges (non-finite loss or parameters) is recorded
as failed (its status.json says why) and the sweep carries on with the others; the summary
lists it under the incomplete runs.  Running the sweep again does not retrain it unless
``retry_failed`` (``tclock sweep --retry-failed``) asks for it.
"""
from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import jax
import yaml

from tclock import runlog
from tclock.config import SWEEP_MAY_CHANGE, ConfigError, TrainConfig, config_differences, validate
from tclock.sweep_axes import AXES
from tclock.sweep_lr import lr_key

DEFAULT_BATCH_SIZES = (32, 64, 128, 256, 512, 1024)


@dataclass
class SweepSpec:
    batch_sizes: tuple = DEFAULT_BATCH_SIZES
    budget: str = "steps"  # steps | iterations
    minibatch: str = "count"  # count | size
    minibatch_size: int = 0  # transitions, for minibatch="size"
    devices: int = 0  # 0: every available device
    lrs: tuple = ()  # learning rates of a B x lr grid; empty: the base config's lr only
    axis: str = "num_envs"  # the config field the batch sizes set: num_envs | sac_batch_size

    def validate(self) -> "SweepSpec":
        sizes = list(self.batch_sizes)
        if not sizes:
            raise ConfigError("batch_sizes: give at least one batch size, e.g. --batch-sizes 64 128 256")
        if any(int(b) <= 0 for b in sizes):
            raise ConfigError(f"batch_sizes: every batch size must be a positive integer, got {sizes}")
        if len(set(sizes)) != len(sizes):
            raise ConfigError(f"batch_sizes: {sizes} has duplicates; list each batch size once")
        for name, choices in (("budget", ("steps", "iterations")), ("minibatch", ("count", "size"))):
            if getattr(self, name) not in choices:
                raise ConfigError(f"{name}: {getattr(self, name)!r} is not one of {', '.join(choices)}")
        if self.minibatch == "size" and self.minibatch_size <= 0:
            raise ConfigError("minibatch_size: with --minibatch size give a positive --minibatch-size (transitions)")
        lrs = [float(x) for x in self.lrs]
        if any(not (x > 0 and math.isfinite(x)) for x in lrs):
            raise ConfigError(f"lrs: every learning rate must be a positive number, got {lrs}")
        if len(set(lrs)) != len(lrs):
            raise ConfigError(f"lrs: {lrs} has duplicates; list each learning rate once")
        self.lrs = tuple(sorted(lrs))
        if self.axis not in AXES:
            raise ConfigError(f"axis: {self.axis!r} is not one of {', '.join(AXES)} (--sweep-axis)")
        if self.axis != "num_envs" and (self.budget != "steps" or self.minibatch != "count"):
            raise ConfigError(f"axis: --sweep-axis {self.axis} holds num_envs and the env-step budget fixed; "
                              "drop --budget iterations and --minibatch size (they set the rollout batch)")
        if self.devices < 0:
            raise ConfigError(f"devices: must be >= 0 (0 = all), got {self.devices}")
        self.batch_sizes = tuple(sorted(int(b) for b in sizes))
        return self


def run_name(batch_size: int, lr: float | None = None) -> str:
    """``B0064``, or in a B x lr grid ``B0064_lr3e-04``."""
    return f"B{batch_size:04d}" + ("" if lr is None else f"_lr{lr_key(lr)}")


def _grid(spec: SweepSpec) -> list[tuple[int, float | None]]:
    return [(b, lr) for b in spec.batch_sizes for lr in (spec.lrs or (None,))]


def sweep_configs(base: TrainConfig, spec: SweepSpec, out: str | Path) -> list[TrainConfig]:
    """One validated config per batch size; every size is checked before anything compiles."""
    spec.validate()
    if spec.axis == "sac_batch_size" and base.algo != "sac":
        raise ConfigError(f"axis: --sweep-axis sac_batch_size sweeps SAC's gradient batch; add --algo sac "
                          f"(got algo {base.algo!r}) or sweep num_envs")
    configs = []
    for b, lr in _grid(spec):
        changes = {spec.axis: b, "out": str(Path(out) / run_name(b, lr)), "progress": False}
        if lr is not None:
            changes["lr"] = lr
        if spec.budget == "iterations":
            iterations = max(1, base.total_steps // (base.num_envs * base.unroll_length))
            changes["total_steps"] = iterations * b * base.unroll_length
        if spec.minibatch == "size":
            n = b * base.unroll_length
            if n % spec.minibatch_size:
                raise ConfigError(f"batch_sizes: B={b} gives {n} transitions per rollout, not a multiple of "
                                  f"minibatch_size={spec.minibatch_size}; drop B={b} or pick a minibatch size "
                                  f"that divides {n}")
            changes["num_minibatches"] = n // spec.minibatch_size
        cfg = base.replace(**changes)
        try:
            validate(cfg)
        except ConfigError as e:
            where = f"batch size {b}" if spec.axis == "num_envs" else f"{spec.axis} {b}"
            raise ConfigError(where + ("" if lr is None else f", lr {lr:g}") + f": {e}") from None
        configs.append(cfg)
    return configs


def _devices(spec: SweepSpec) -> list:
    devices = jax.local_devices()  # with several processes, each spreads its own share over its own devices
    return devices[: spec.devices] if spec.devices else devices


def _runs_on_mesh(base: TrainConfig) -> bool:
    """Whether each batch size trains on the run's whole ``--mesh`` (one after another), rather than
    batch sizes side by side, one per device."""
    from tclock.mesh import parse_mesh

    shape = parse_mesh(base.mesh)
    return shape is not None and shape.size > 1


class _SweepProgress:
    """One bar across the whole sweep, in env steps (all seeds)."""

    def __init__(self, configs: list[TrainConfig], enabled: bool, axis: str = "num_envs"):
        self.lock = threading.Lock()
        self.axis = axis
        self.grid = len({c.lr for c in configs}) > 1
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            total = sum(c.num_iterations * c.transitions_per_rollout * c.seeds for c in configs)
            self.bar = tqdm(total=total, unit="step", unit_scale=True, dynamic_ncols=True, desc="sweep",
                            mininterval=1.0)

    def callback(self, cfg: TrainConfig) -> Callable[[dict], None]:
        step = cfg.transitions_per_rollout * cfg.seeds
        grid = self.grid
        label = f"B={getattr(cfg, self.axis)}" if self.axis == "num_envs" else f"{self.axis}={getattr(cfg, self.axis)}"

        def on_iteration(record: dict) -> None:
            if self.bar is not None:
                with self.lock:
                    self.bar.set_description_str(f"sweep {label}" + (f" lr={cfg.lr:g}" if grid else ""))
                    self.bar.update(step)

        return on_iteration

    def skip(self, cfg: TrainConfig, iterations: int) -> None:
        if self.bar is not None:
            with self.lock:
                self.bar.update(iterations * cfg.transitions_per_rollout * cfg.seeds)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _check_same_config(cfg: TrainConfig) -> None:
    """A finished run is reused only if it was trained with exactly this config."""
    details = config_differences(runlog.read_config(cfg.out), cfg, may_differ=SWEEP_MAY_CHANGE, limit=5)
    if details:
        raise ConfigError(f"out: {cfg.out} holds a finished run with a different config ({details}); "
                          "use another --out for this sweep or delete that run directory")


def diverged(status: dict) -> bool:
    """Whether a run's status says its training diverged."""
    return status.get("state") == "failed" and (bool(status.get("diverged"))
                                                or str(status.get("reason", "")).startswith("non-finite"))


def _run_one(cfg: TrainConfig, device, progress: _SweepProgress, stop: threading.Event,
             retry_failed: bool = False) -> str:
    from tclock.loop import TrainingDiverged, train

    saved = runlog.read_status(cfg.out)
    status = saved.get("state")
    if status == "finished":
        _check_same_config(cfg)
        progress.skip(cfg, cfg.num_iterations)
        return "skipped"
    if diverged(saved) and not retry_failed:
        progress.skip(cfg, cfg.num_iterations)
        return "kept failed"
    resume = (status in ("running", "interrupted", "failed") and not diverged(saved)
              and runlog.checkpoint_iteration(cfg.out) is not None)
    report = progress.callback(cfg)

    def on_iteration(record):
        report(record)
        if stop.is_set():
            raise KeyboardInterrupt("sweep stopped")

    progress.skip(cfg, runlog.checkpoint_iteration(cfg.out) if resume else 0)
    try:
        train(cfg, resume=resume, overwrite=not resume, device=device, on_iteration=on_iteration)
    except TrainingDiverged:
        return "diverged"
    return "resumed" if resume else "trained"


def run_sweep(base: TrainConfig, spec: SweepSpec, out: str | Path, progress: bool = True,
              announce: Callable[[str], None] = print, retry_failed: bool = False) -> dict:
    """Trains every batch size (skipping finished runs, and diverged ones unless
    ``retry_failed``), then writes and returns the summary.

    Several processes (``tclock.distributed``): each trains its share of the batch sizes
    (:func:`tclock.distributed.partition`, config ``i`` on process ``i mod N``) on its own devices,
    so no two write the same run directory; process 0 writes ``sweep.yaml`` and, once every process
    is done (a barrier), the summary.  With a ``--mesh`` of several devices every batch size trains
    on that whole mesh instead, one after another, on every process together."""
    from tclock import distributed

    out = Path(out)
    configs = sweep_configs(base, spec, out)
    on_mesh = _runs_on_mesh(base)
    lead = distributed.is_lead()
    mine = configs if on_mesh else distributed.partition(configs)
    devices = [None] if on_mesh else _devices(spec)
    say = announce if lead else (lambda text: None)
    if lead:
        out.mkdir(parents=True, exist_ok=True)
        record = {"spec": dataclasses.asdict(spec), "base": base.to_dict(), "processes": jax.process_count(),
                  "devices": [str(d) for d in (jax.devices() if on_mesh else devices)]}
        record["spec"]["batch_sizes"] = list(spec.batch_sizes)
        record["spec"]["lrs"] = list(spec.lrs)
        runlog.write_text(out / "sweep.yaml", yaml.safe_dump(runlog.to_jsonable(record), sort_keys=False))
    grid = f" x {len(spec.lrs)} learning rates {[lr_key(x) for x in spec.lrs]}" if spec.lrs else ""
    where = (f"the mesh {base.mesh}" if on_mesh else f"{len(devices)} device(s)"
             + (f" per process x {jax.process_count()} processes" if jax.process_count() > 1 else ""))
    say(f"sweep: {len(spec.batch_sizes)} batch sizes ({spec.axis}) {list(spec.batch_sizes)}{grid} x "
        f"{base.seeds} seeds on {where} -> {out}")

    bar = _SweepProgress(mine, progress and lead, spec.axis)
    stop = threading.Event()
    outcomes: dict = {}  # B, or (B, lr) in a grid -> what happened
    try:
        if len(devices) == 1:
            for cfg in mine:
                outcomes[_label(cfg, spec)] = _run_one(cfg, devices[0], bar, stop, retry_failed)
        else:
            _run_on_devices(mine, devices, bar, stop, outcomes, spec, retry_failed)
    finally:
        bar.close()
    distributed.barrier("tclock sweep: every batch size trained")
    for outcome, message in (("skipped", "skipped finished runs"),
                             ("diverged", "diverged (recorded as failed; the sweep went on)"),
                             ("kept failed", "not retrained, diverged before (--retry-failed trains them again)")):
        sizes = sorted(b for b, o in outcomes.items() if o == outcome)
        if sizes:
            announce(f"{message}: " + ("(B, lr)=" if spec.lrs else "B=") + f"{sizes}")
    from tclock.sweep_report import format_summary, summarize_sweep

    summary = summarize_sweep(out, write=lead)
    say(format_summary(summary))
    return summary


def _label(cfg: TrainConfig, spec: SweepSpec):
    b = getattr(cfg, spec.axis)
    return (b, cfg.lr) if spec.lrs else b


def _run_on_devices(configs, devices, bar, stop, outcomes, spec: SweepSpec, retry_failed: bool = False) -> None:
    """Config i runs on device i mod n (a deterministic placement), one at a time per device."""
    errors: list[BaseException] = []

    def worker(device, assigned):
        for cfg in assigned:
            if stop.is_set():
                return
            try:
                outcomes[_label(cfg, spec)] = _run_one(cfg, device, bar, stop, retry_failed)
            except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
                errors.append(e)
                stop.set()
                return

    n = min(len(devices), len(configs))
    threads = [threading.Thread(target=worker, args=(devices[i], configs[i::n]), name=f"sweep-{devices[i]}",
                                daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.2)
    except KeyboardInterrupt:
        stop.set()
        for t in threads:
            t.join()
        raise
    first = next((e for e in errors if not isinstance(e, KeyboardInterrupt)), errors[0] if errors else None)
    if first is not None:
        raise first
