"""The run-directory format: the one reader and the one writer.

A run directory holds::

    config.yaml          the resolved configuration (every field, after defaults)
    metrics.jsonl        one JSON object per iteration (keys: docs/metrics.md)
    status.json          {"state": "running" | "finished" | "failed", ...}
    checkpoints/
      ckpt_000040.pkl    training state after iteration 40 (NumPy pytree, pickled)
      latest             name of the newest complete checkpoint file

Every file that matters is written atomically (write to a temporary file in the same
directory, fsync, ``os.replace``), so an interrupted run leaves either the old or the new
version, never half of one.  No other module opens these files by name.
"""
from __future__ import annotations

import json
import math
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import yaml

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
STATUS_FILE = "status.json"
CHECKPOINT_DIR = "checkpoints"
LATEST_POINTER = "latest"
KEEP_CHECKPOINTS = 2


class RunFormatError(ValueError):
    """A run directory (or one of its files) cannot be read."""


# --------------------------------------------------------------------------- helpers
def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _atomic_write_text(path: Path, text: str) -> None:
    _atomic_write_bytes(path, text.encode("utf-8"))


def to_jsonable(value: Any) -> Any:
    """NumPy/JAX scalars and arrays to plain JSON values; non-finite floats to None."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return to_jsonable(np.asarray(value).tolist())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    return str(value)


# --------------------------------------------------------------------------- writer
class RunWriter:
    """Appends metrics, writes checkpoints and status for one run directory."""

    def __init__(self, run_dir: str | os.PathLike, config: dict, resume_iteration: int | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _atomic_write_text(self.run_dir / CONFIG_FILE, yaml.safe_dump(to_jsonable(config), sort_keys=False))
        metrics = self.run_dir / METRICS_FILE
        if resume_iteration is None:
            _atomic_write_text(metrics, "")
        else:
            # Keep exactly the lines the checkpoint covers: nothing lost, nothing duplicated.
            kept = [r for r in read_metrics(self.run_dir, missing_ok=True) if r.get("iteration", -1) <= resume_iteration]
            _atomic_write_text(metrics, "".join(json.dumps(r) + "\n" for r in kept))
        self._metrics = open(metrics, "a", encoding="utf-8")
        self.mark("running")

    def log(self, record: dict) -> None:
        self._metrics.write(json.dumps(to_jsonable(record)) + "\n")
        self._metrics.flush()

    def save_checkpoint(self, iteration: int, state: Any) -> Path:
        """Atomically writes the state (a pytree, converted to NumPy) after ``iteration``."""
        self._metrics.flush()
        os.fsync(self._metrics.fileno())
        ckpt_dir = self.run_dir / CHECKPOINT_DIR
        name = f"ckpt_{iteration:06d}.pkl"
        payload = pickle.dumps({"iteration": int(iteration), "state": state}, protocol=pickle.HIGHEST_PROTOCOL)
        _atomic_write_bytes(ckpt_dir / name, payload)
        _atomic_write_text(ckpt_dir / LATEST_POINTER, name)
        old = sorted(p for p in ckpt_dir.glob("ckpt_*.pkl") if p.name != name)
        for p in old[: max(0, len(old) - (KEEP_CHECKPOINTS - 1))]:
            p.unlink(missing_ok=True)
        return ckpt_dir / name

    def mark(self, state: str, **info: Any) -> None:
        _atomic_write_text(self.run_dir / STATUS_FILE, json.dumps(to_jsonable({"state": state, **info}), indent=1))

    def close(self) -> None:
        if not self._metrics.closed:
            self._metrics.close()


# --------------------------------------------------------------------------- readers
def read_config(run_dir: str | os.PathLike) -> dict:
    path = Path(run_dir) / CONFIG_FILE
    if not path.exists():
        raise RunFormatError(f"{path} does not exist: is {run_dir} a tclock run directory?")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise RunFormatError(f"{path} is not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise RunFormatError(f"{path} must hold a mapping of config fields, got {type(data).__name__}")
    return data


def iter_metrics(path: Path) -> Iterable[dict]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise RunFormatError(f"{path}:{lineno} is not valid JSON ({e.msg}); the line starts {line[:60]!r}") from e
            if not isinstance(record, dict):
                raise RunFormatError(f"{path}:{lineno} must be a JSON object, got {type(record).__name__}")
            yield record


def read_metrics(run_dir: str | os.PathLike, missing_ok: bool = False) -> list[dict]:
    """All metric records of a run, in order. ``run_dir`` may also be a metrics.jsonl path."""
    path = Path(run_dir)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.exists():
        if missing_ok:
            return []
        raise RunFormatError(f"{path} does not exist: is {run_dir} a tclock run directory?")
    return list(iter_metrics(path))


def read_status(run_dir: str | os.PathLike) -> dict:
    path = Path(run_dir) / STATUS_FILE
    if not path.exists():
        return {"state": "missing"}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RunFormatError(f"{path} is not valid JSON: {e.msg}") from e


def load_checkpoint(run_dir: str | os.PathLike) -> tuple[int, Any] | None:
    """The newest complete checkpoint as ``(iteration, state)``, or None if there is none."""
    ckpt_dir = Path(run_dir) / CHECKPOINT_DIR
    pointer = ckpt_dir / LATEST_POINTER
    if not pointer.exists():
        return None
    path = ckpt_dir / pointer.read_text(encoding="utf-8").strip()
    try:
        with open(path, "rb") as f:
            payload = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError) as e:
        raise RunFormatError(f"checkpoint {path} cannot be read ({e}); delete {pointer} to start over") from e
    return int(payload["iteration"]), payload["state"]


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Atomic JSON for sweep-level files (summary.json, profile.json)."""
    _atomic_write_text(Path(path), json.dumps(to_jsonable(data), indent=1))


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise RunFormatError(f"{path} does not exist") from e
    except json.JSONDecodeError as e:
        raise RunFormatError(f"{path} is not valid JSON: {e.msg}") from e


def write_text(path: str | os.PathLike, text: str) -> None:
    _atomic_write_text(Path(path), text)


# --------------------------------------------------------------------------- metric matrices
def _metric_float(value: Any, key: str, record: dict) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RunFormatError(
            f"metrics.jsonl: iteration {record.get('iteration', '?')}: {key!r} holds "
            f"{value!r} ({type(value).__name__}); expected a number, null or a list of them")
    return float(value)


def seed_matrix(records: Sequence[dict], key: str, keep_missing: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(iterations, values)`` of one metric across records.

    ``values`` is a float array ``[n_iter, n_seeds]`` with NaN for null or missing entries.
    A scalar metric is one column; ragged per-seed lists are padded with NaN.  Records that
    lack ``key`` are dropped, unless ``keep_missing`` is true (then every record gives a row,
    all NaN where the key is absent, so rows line up with ``records``).  ``iterations`` is an
    int array (``-1`` where a record has no ``iteration``).  A key found nowhere gives shapes
    ``(0,)`` and ``(0, 0)`` (or ``(n, 0)`` with ``keep_missing``).  A non-numeric value raises
    ``RunFormatError`` naming the key and iteration.
    """
    rows: list[list[float]] = []
    iters: list[int] = []
    for record in records:
        if key not in record and not keep_missing:
            continue
        raw = record.get(key)
        if isinstance(raw, (list, tuple)):
            row = [_metric_float(v, key, record) for v in raw]
        elif key in record:
            row = [_metric_float(raw, key, record)]
        else:
            row = []
        rows.append(row)
        it = record.get("iteration")
        iters.append(int(it) if isinstance(it, (int, float)) and not isinstance(it, bool) else -1)
    n_seeds = max((len(r) for r in rows), default=0)
    if not any(key in r for r in records):
        n_seeds = 0
    out = np.full((len(rows), n_seeds), np.nan, dtype=float)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return np.asarray(iters, dtype=int), out


def nanmean_rows(values: np.ndarray) -> np.ndarray:
    """Mean over seeds (axis 1) ignoring NaN; NaN where a row has no finite value."""
    if values.ndim != 2 or values.shape[1] == 0:
        return np.full(values.shape[0] if values.ndim else 0, np.nan)
    finite = np.isfinite(values)
    count = finite.sum(axis=1)
    total = np.where(finite, values, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def has_values(records: Sequence[dict], key: str) -> bool:
    """True when at least one record carries a finite value for ``key``."""
    _, m = seed_matrix(records, key)
    return bool(m.size and np.isfinite(m).any())


def trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last <= ``window`` finite values up to each index (NaN before the first)."""
    out = np.full(values.shape, np.nan)
    seen: list[float] = []
    for i, v in enumerate(values):
        if np.isfinite(v):
            seen.append(float(v))
        if seen:
            out[i] = float(np.mean(seen[-window:]))
    return out


def load_config_or_empty(run_dir: str | os.PathLike) -> dict:
    """The run's config, or {} when the run has no config file (a malformed one still raises)."""
    if not (Path(run_dir) / CONFIG_FILE).exists():
        return {}
    return read_config(run_dir)
