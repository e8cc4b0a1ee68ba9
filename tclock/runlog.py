"""The run-directory format: the one reader and the one writer.

A run directory holds::

    config.yaml          the resolved configuration (every field, after defaults)
    metrics.jsonl        one JSON object per iteration (keys: docs/metrics.md)
    status.json          {"state": "running" | "finished" | "interrupted" | "failed", ...}
                         ("running" also names its writer: read back as "failed" once that
                         process is gone without marking the run, e.g. killed or aborted)
    checkpoints/
      ckpt_000040.ckpt   training state after iteration 40 (data only: tclock/checkpoints.py)
      latest             name of the newest checkpoint file
    tensorboard/         event files mirroring metrics.jsonl (--tensorboard; tclock/tracking.py)

Every file that matters is written atomically (write to a temporary file in the same
directory, fsync, ``os.replace``), so an interrupted run leaves either the old or the new
version, never half of one; the last ``keep_checkpoints`` checkpoints are kept.  Reading
back, a damaged newest checkpoint is skipped for the previous good one (``load_checkpoint``
says which and why), a pickle checkpoint of an older tclock is refused unopened, and a
metrics line cut by a crash is dropped on ``--resume``.  No other module opens these files
by name; a write that fails raises :class:`RunWriteError` naming the file.

(About 480 lines: it is the one module that knows the file format, so the writer, the readers,
the checkpoint files' fallback and the metric matrices every reader builds from records live
together; the checkpoint encoding itself is ``tclock/checkpoints.py``.)
"""
from __future__ import annotations

import json
import math
import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import yaml

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
STATUS_FILE = "status.json"
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_SUFFIX = ".ckpt"
LATEST_POINTER = "latest"
TENSORBOARD_DIR = "tensorboard"
KEEP_CHECKPOINTS = 3  # TrainConfig.keep_checkpoints' default


class RunFormatError(ValueError):
    """A run directory (or one of its files) cannot be read."""


class RunWriteError(OSError):
    """A file of the run directory cannot be written (full disk, permissions); names the file."""


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
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    """Makes a rename in ``path`` durable (where the platform allows opening a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write_text(path: Path, text: str) -> None:
    _atomic_write_bytes(path, text.encode("utf-8"))


def _write_error(path: Path, error: OSError) -> RunWriteError:
    return RunWriteError(f"cannot write {path}: {error.strerror or error}")


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
    """Appends metrics (and mirrors them to the sinks), writes checkpoints and status.

    ``resume_iteration``: the iteration of the checkpoint a resumed run continues from; the
    metrics it covers are kept (a cut last line is dropped), later lines removed.
    ``status_info``: keys added to every ``status.json`` this writer writes."""

    def __init__(self, run_dir: str | os.PathLike, config: dict, resume_iteration: int | None = None,
                 keep_checkpoints: int = KEEP_CHECKPOINTS, status_info: dict | None = None):
        self.run_dir = Path(run_dir)
        self.keep = max(1, int(keep_checkpoints))
        self.status_info = dict(status_info or {})
        self.sinks: list = []
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            _atomic_write_text(self.run_dir / CONFIG_FILE, yaml.safe_dump(to_jsonable(config), sort_keys=False))
            self._start_metrics(resume_iteration)
            self._clear_stale(new_run=resume_iteration is None)
            self._metrics = open(self.run_dir / METRICS_FILE, "a", encoding="utf-8")
        except OSError as e:
            raise _write_error(self.run_dir, e) from e
        self.mark("running", writer=writer_identity())

    def _start_metrics(self, resume_iteration: int | None) -> None:
        metrics = self.run_dir / METRICS_FILE
        if resume_iteration is None:
            _atomic_write_text(metrics, "")
            return
        # Keep exactly the lines the checkpoint covers: nothing lost, nothing duplicated.
        records, cut = read_intact_metrics(self.run_dir)
        kept = [r for r in records if r.get("iteration", -1) <= resume_iteration]
        if cut:
            self.status_info["metrics_repaired"] = {"dropped_partial_line": True, "kept_lines": len(kept)}
        _atomic_write_text(metrics, "".join(json.dumps(r) + "\n" for r in kept))

    def _clear_stale(self, new_run: bool) -> None:
        """Temporary files a killed writer left; for a new run (``--overwrite``) also the old
        run's checkpoints and TensorBoard events, which a later ``--resume`` must not see."""
        ckpt_dir = self.run_dir / CHECKPOINT_DIR
        old = list(ckpt_dir.glob(".*.tmp"))
        if new_run:
            old += [*ckpt_dir.glob("ckpt_*"), ckpt_dir / LATEST_POINTER,
                    *(self.run_dir / TENSORBOARD_DIR).glob("events.out.tfevents.*")]
        for path in old:
            path.unlink(missing_ok=True)

    def add_sink(self, sink) -> None:
        """A mirror of the metrics (``sink.log(record, step)``, ``sink.close()``; tclock/tracking.py)."""
        self.sinks.append(sink)

    def log(self, record: dict) -> None:
        record = to_jsonable(record)
        try:
            self._metrics.write(json.dumps(record) + "\n")
            self._metrics.flush()
        except OSError as e:
            raise _write_error(self.run_dir / METRICS_FILE, e) from e
        step = record.get("env_steps", record.get("iteration", 0))
        for sink in self.sinks:
            sink.log(record, step)

    def save_checkpoint(self, iteration: int, state: Any, host: dict) -> Path:
        """Atomically writes the training state (a pytree of arrays) and the host state after
        ``iteration``, then removes all but the newest ``keep_checkpoints``."""
        from tclock import checkpoints  # JAX and flax: readers of run directories stay without them

        ckpt_dir = self.run_dir / CHECKPOINT_DIR
        path = ckpt_dir / f"ckpt_{iteration:06d}{CHECKPOINT_SUFFIX}"
        try:
            self._metrics.flush()
            os.fsync(self._metrics.fileno())
            _atomic_write_bytes(path, checkpoints.encode(iteration, state, host))
            _atomic_write_text(ckpt_dir / LATEST_POINTER, path.name)
        except OSError as e:
            raise _write_error(path, e) from e
        for old in _checkpoint_files(ckpt_dir)[self.keep:]:
            old.unlink(missing_ok=True)
        return path

    def mark(self, state: str, **info: Any) -> None:
        status = {"state": state, **info, **self.status_info}
        try:
            _atomic_write_text(self.run_dir / STATUS_FILE, json.dumps(to_jsonable(status), indent=1))
        except OSError as e:
            raise _write_error(self.run_dir / STATUS_FILE, e) from e

    def close(self) -> None:
        if not self._metrics.closed:
            self._metrics.close()
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close()


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


def _parse_line(path: Path, lineno: int, line: str) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise RunFormatError(f"{path}:{lineno} is not valid JSON ({e.msg}); the line starts {line[:60]!r}") from e
    if not isinstance(record, dict):
        raise RunFormatError(f"{path}:{lineno} must be a JSON object, got {type(record).__name__}")
    return record


def iter_metrics(path: Path) -> Iterable[dict]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                yield _parse_line(path, lineno, line)


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


def read_intact_metrics(run_dir: str | os.PathLike) -> tuple[list[dict], bool]:
    """``(records, cut)``: the records of the complete lines, and whether the last line was cut
    (no final newline and not a JSON object: a crash mid-write).  Other bad lines still raise."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return [], False
    complete, _, tail = path.read_bytes().rpartition(b"\n")
    lines = complete.decode("utf-8", errors="replace").split("\n") if complete else []
    records = [_parse_line(path, i, line) for i, line in enumerate(lines, 1) if line.strip()]
    if not tail.strip():
        return records, False
    try:
        records.append(_parse_line(path, len(lines) + 1, tail.decode("utf-8")))
        return records, False
    except (RunFormatError, UnicodeDecodeError):
        return records, True


def metrics_coverage(run_dir: str | os.PathLike) -> int | None:
    """The last iteration metrics.jsonl holds intact (0 if none; None without the file)."""
    if not (Path(run_dir) / METRICS_FILE).exists():
        return None
    records, _ = read_intact_metrics(run_dir)
    return max((int(r["iteration"]) for r in records if isinstance(r.get("iteration"), int)), default=0)


def _process_start(pid: int) -> str | None:
    """The kernel's start time of process ``pid`` (Linux ``/proc``; None elsewhere or when it is gone):
    with the pid it names one process, even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]  # field 22, counted after the command name


def writer_identity(pid: int | None = None) -> dict:
    """Who writes a running run: host, pid and the process's start time."""
    pid = os.getpid() if pid is None else pid
    return {"host": socket.gethostname(), "pid": pid, "started": _process_start(pid)}


def _writer_gone(writer: Any) -> bool:
    """Whether the process named by a ``running`` status has ended (only decidable on its own host)."""
    if not isinstance(writer, dict) or writer.get("host") != socket.gethostname():
        return False
    pid = writer.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    started = _process_start(pid)
    return writer.get("started") is not None and started is not None and started != writer["started"]


def read_status(run_dir: str | os.PathLike) -> dict:
    """``status.json``; a ``running`` run whose writer is gone (killed, or aborted by JAX's
    distributed runtime, before it could mark the run) reads as ``failed`` with the newest
    checkpoint as ``last_good_checkpoint`` and ``inferred: true``; the file itself is left as it is."""
    path = Path(run_dir) / STATUS_FILE
    if not path.exists():
        return {"state": "missing"}
    try:
        status = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RunFormatError(f"{path} is not valid JSON: {e.msg}") from e
    if isinstance(status, dict) and status.get("state") == "running" and _writer_gone(status.get("writer")):
        writer = status["writer"]
        status = {**status, "state": "failed", "inferred": True,
                  "reason": f"the process that was writing this run (pid {writer['pid']} on {writer['host']}) ended "
                            "without marking it: killed, or aborted by the runtime",
                  "last_good_checkpoint": checkpoint_iteration(run_dir)}
    return status


# --------------------------------------------------------------------------- checkpoints
@dataclass
class Checkpoint:
    """A checkpoint read back: ``train`` is the training state restored against the template
    (or ``{path: array}`` without one), ``host`` the host loop's state, ``skipped`` the newer
    checkpoints that could not be used, each ``{"file", "reason"}``."""

    iteration: int
    train: Any
    host: dict
    path: Path
    skipped: list = field(default_factory=list)


def _checkpoint_iteration(path: Path) -> int:
    try:
        return int(path.name[len("ckpt_"):-len(CHECKPOINT_SUFFIX)])
    except ValueError:
        return -1


def _checkpoint_files(ckpt_dir: Path) -> list[Path]:
    """Checkpoint files, newest first."""
    files = [p for p in ckpt_dir.glob(f"ckpt_*{CHECKPOINT_SUFFIX}") if _checkpoint_iteration(p) >= 0]
    return sorted(files, key=_checkpoint_iteration, reverse=True)


def checkpoint_iteration(run_dir: str | os.PathLike) -> int | None:
    """The iteration of the newest checkpoint file (not read; None when there is none)."""
    files = _checkpoint_files(Path(run_dir) / CHECKPOINT_DIR)
    return _checkpoint_iteration(files[0]) if files else None


def _latest_name(ckpt_dir: Path) -> str:
    try:
        return (ckpt_dir / LATEST_POINTER).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def _refuse_pickles(ckpt_dir: Path, have_checkpoints: bool) -> None:
    named = _latest_name(ckpt_dir)
    pickles = sorted(p.name for p in ckpt_dir.glob("ckpt_*.pkl"))
    if named.endswith(".pkl") or (pickles and not have_checkpoints):
        raise RunFormatError(
            f"{ckpt_dir} holds pickle checkpoints of an older tclock ({named or pickles[-1]}); a pickle can run "
            "any code when it is loaded, so tclock never loads one. Start the run again (--overwrite, or another "
            "--out); its metrics.jsonl stays readable by tclock doctor and tclock plot")


def load_checkpoint(run_dir: str | os.PathLike, template: Any = None,
                    max_iteration: int | None = None) -> Checkpoint | None:
    """The newest checkpoint that reads back intact, restored against ``template`` (the state
    a new run of the same config starts from; arrays or ``jax.ShapeDtypeStruct`` leaves).

    Newer files that are truncated or corrupt, or later than ``max_iteration``, are skipped and
    listed in ``Checkpoint.skipped``.  None when there is no checkpoint at all; RunFormatError
    when none is loadable, for a pickle checkpoint (never opened), or when the state's
    structure or shapes differ from the template's (naming the first differing paths)."""
    from tclock import checkpoints  # JAX and flax: readers of run directories stay without them

    ckpt_dir = Path(run_dir) / CHECKPOINT_DIR
    files = _checkpoint_files(ckpt_dir)
    _refuse_pickles(ckpt_dir, bool(files))
    skipped = _missing_latest(ckpt_dir, files)
    for path in files:
        if max_iteration is not None and _checkpoint_iteration(path) > max_iteration:
            skipped.append({"file": path.name, "reason": f"after iteration {max_iteration}, where the intact "
                                                         f"lines of {METRICS_FILE} end"})
            continue
        try:
            content = checkpoints.decode(path.read_bytes())
        except (OSError, checkpoints.CorruptCheckpoint) as e:
            skipped.append({"file": path.name, "reason": str(e)})
            continue
        train = content["leaves"]
        if template is not None:
            try:
                train = checkpoints.restore(train, template)
            except checkpoints.TemplateMismatch as e:
                raise RunFormatError(f"checkpoint {path} does not match this config's training state ({e}); "
                                     "resume with the config and tclock version that wrote it, or start a new "
                                     "--out") from None
        return Checkpoint(content["iteration"], train, content["host"], path, skipped)
    if skipped:
        reasons = "; ".join(f"{s['file']}: {s['reason']}" for s in skipped)
        raise RunFormatError(f"no loadable checkpoint in {ckpt_dir} ({reasons}); start the run again with "
                             "--overwrite or another --out")
    return None


def _missing_latest(ckpt_dir: Path, files: list[Path]) -> list[dict]:
    """The file ``latest`` names, when it is gone (deleted by hand, lost with a disk)."""
    named = _latest_name(ckpt_dir)
    if named and named not in {p.name for p in files}:
        return [{"file": named, "reason": f"named by {CHECKPOINT_DIR}/{LATEST_POINTER} but missing"}]
    return []


# --------------------------------------------------------------------------- sweep-level files
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


def seed_median(values) -> float | None:
    """Median over seeds of one logged per-seed value (a list with ``null`` for non-finite
    seeds, or a scalar); None when no seed is finite."""
    if values is None:
        return None
    v = np.asarray([x for x in np.ravel(values) if x is not None], dtype=float)
    v = v[np.isfinite(v)]
    return float(np.median(v)) if v.size else None


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
