"""Mirrors of metrics.jsonl where researchers look: TensorBoard (``--tensorboard``) and
Weights & Biases (``--wandb PROJECT``).

``metrics.jsonl`` stays the source of truth (``tclock plot`` and the doctor read only it);
a sink receives every record ``RunWriter.log`` writes and mirrors each numeric scalar:

* a number ``key`` -> the scalar ``key``;
* a per-seed list ``key: [v0, v1, ...]`` -> one scalar per seed, ``key/seed0``, ``key/seed1``
  (None entries, i.e. non-finite values, are skipped);
* strings, nested values and booleans are not mirrored.

The step of every scalar is the record's ``env_steps`` (env steps per seed, the x-axis of
Brax's and CleanRL's curves); the iteration is mirrored as the scalar ``iteration``.

TensorBoard event files go to ``<run_dir>/tensorboard/`` (tensorboardX's writer); a resumed
run purges the events past its checkpoint, so TensorBoard shows each step once.  W&B honours
``WANDB_MODE`` (``offline`` writes under ``<run_dir>/wandb/``); a resumed run is a new W&B run
in the same group.  Only process 0 (``jax.process_index() == 0``) mirrors.  Both packages
are optional (``pip install 'tclock[tracking]'``) and imported only when asked for;
``check_available`` turns a missing one into a ``ConfigError`` before anything compiles.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
from pathlib import Path
from typing import Iterator

from tclock.runlog import TENSORBOARD_DIR

EXTRA = "pip install 'tclock[tracking]'"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: sys.modules holds None for it
        return False


def check_available(cfg) -> None:
    """Raises ``ConfigError`` naming the field and the extra when a requested package is missing."""
    from tclock.errors import ConfigError

    if cfg.tensorboard and not _installed("tensorboardX"):
        raise ConfigError(f"tensorboard: --tensorboard writes event files with tensorboardX, which is not "
                          f"installed; {EXTRA} (or pip install tensorboardX), or drop --tensorboard")
    if cfg.wandb and not _installed("wandb"):
        raise ConfigError(f"wandb: --wandb {cfg.wandb} needs the wandb package, which is not installed; {EXTRA} "
                          "(or pip install wandb), or drop --wandb")


def scalars(record: dict) -> Iterator[tuple[str, float]]:
    """``(tag, value)`` for every numeric scalar of a metrics record (see the module docstring)."""
    for key, value in record.items():
        if isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                if _number(v):
                    yield f"{key}/seed{i}", float(v)
        elif _number(value):
            yield key, float(value)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class TensorBoardSink:
    def __init__(self, run_dir: Path, purge_after: int | None):
        from tensorboardX import SummaryWriter

        # purge_step: events at steps >= it, left by a process that died past the checkpoint, are hidden.
        self.writer = SummaryWriter(logdir=str(run_dir / TENSORBOARD_DIR), flush_secs=10,
                                    purge_step=None if purge_after is None else purge_after + 1)

    def log(self, record: dict, step: int) -> None:
        for tag, value in scalars(record):
            self.writer.add_scalar(tag, value, global_step=step)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, run_dir: Path, project: str, config: dict):
        self.wandb = importlib.import_module("wandb")
        self.run = self.wandb.init(project=project, name=run_dir.name, group=run_dir.name, dir=str(run_dir),
                                   config=config)

    def log(self, record: dict, step: int) -> None:
        self.run.log(dict(scalars(record)), step=step)

    def close(self) -> None:
        self.run.finish()


def make_sinks(cfg, run_dir: Path, purge_after: int | None = None) -> list:
    """The sinks ``cfg`` asks for (none on processes other than 0).  ``purge_after``: the env
    steps of the checkpoint a resumed run continues from (None for a new run)."""
    if not (cfg.tensorboard or cfg.wandb):
        return []
    import jax

    if jax.process_index() != 0:
        return []
    check_available(cfg)
    sinks: list = []
    if cfg.tensorboard:
        sinks.append(TensorBoardSink(Path(run_dir), purge_after))
    if cfg.wandb:
        sinks.append(WandbSink(Path(run_dir), cfg.wandb, cfg.to_dict()))
    return sinks
