"""What a sweep varies: its axis (the config field the batch sizes set) and the units of B, S and E
that follow from it.  Plain data and a reader of ``sweep.yaml``; no NumPy, no JAX.

* ``num_envs`` (the default): B is the rollout batch in envs, S counts iterations, E = S*B*T env
  steps per seed.
* ``sac_batch_size`` (SAC only, at fixed num_envs and replay ratio): B is the gradient batch in
  transitions, S counts gradient steps, E = S*B replay samples (docs/design.md §2, "The
  gradient-batch axis").
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import yaml

from tclock.runlog import RunFormatError

__all__ = ["UNITS", "Axis", "AXES", "axis_of", "units", "SWEEP_FILE", "sweep_axis"]

UNITS = {
    "B": "envs (num_envs)",
    "T": "env steps per env per rollout (unroll_length)",
    "S": "iterations (updates) to target",
    "E": "env steps per seed to target (S*B*T)",
    "wall": "seconds of loop time to target (wall_s; compilation excluded)",
    "b_crit": "envs",
    "b_crit_transitions": "transitions per rollout (b_crit*T)",
    "b_simple_envs": "envs (b_simple / T)",
    "b_simple_transitions": "transitions",
    "iteration_s": "seconds per iteration (rt_s + learn_s)",
    "time_fit": "t(B) = a + k*B; a in seconds, k in seconds per env",
    "b_star": "envs",
}


class Axis(NamedTuple):
    """What a sweep varies (``field`` of the config, the B of every fit) and the units that follow."""

    field: str
    unit: str  # of B
    steps: str  # of S, the optimisation steps to target
    samples: str  # of E = S * (transitions per step)
    label: str  # what B is, for axis labels and reports


AXES = {
    # the rollout batch: S counts iterations (one update phase per rollout of B*T env steps)
    "num_envs": Axis("num_envs", "envs", "iterations", "env steps per seed", "rollout batch size"),
    # SAC's gradient batch at fixed num_envs and replay ratio: S counts gradient steps, E replay samples
    "sac_batch_size": Axis("sac_batch_size", "transitions", "gradient steps", "replay samples per seed",
                           "gradient batch size"),
}


def axis_of(summary: dict) -> Axis:
    """The :class:`Axis` a summary (or an older one without ``sweep_axis``) was swept along."""
    return AXES[summary.get("sweep_axis") or "num_envs"]


def units(axis: str) -> dict:
    """:data:`UNITS` for a sweep along ``axis``: B, S, E and the fitted B_crit in its units."""
    if axis == "num_envs":
        return dict(UNITS)
    ax = AXES[axis]
    return {**UNITS, "B": f"{ax.unit} ({ax.field})", "S": f"{ax.steps} to target",
            "E": f"{ax.samples} to target (S*B)", "b_crit": ax.unit, "b_crit_transitions": "transitions (b_crit)",
            "time_fit": f"t(B) = a + k*B; a in seconds, k in seconds per {ax.unit[:-1]}", "b_star": ax.unit}


SWEEP_FILE = "sweep.yaml"  # written by tclock.sweep.run_sweep; its spec names the axis


def sweep_axis(sweep_dir: Path) -> str:
    """The axis named in the sweep's ``sweep.yaml`` (``spec.axis``); ``num_envs`` without one."""
    path = Path(sweep_dir) / SWEEP_FILE
    if not path.exists():
        return "num_envs"
    try:
        record = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise RunFormatError(f"{path}: not valid YAML ({e}); delete it to summarise the runs as a num_envs sweep")
    axis = (record.get("spec") or {}).get("axis", "num_envs") if isinstance(record, dict) else "num_envs"
    if axis not in AXES:
        raise RunFormatError(f"{path}: spec.axis {axis!r} is not one of {', '.join(AXES)}")
    return axis
