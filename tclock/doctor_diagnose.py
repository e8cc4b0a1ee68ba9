"""``diagnose(run_dir) -> Report``: apply every doctor rule and the checklist to one run directory.

Reads ``config.yaml``, ``metrics.jsonl`` and ``status.json`` through ``tclock.runlog`` (never the
files directly); the checklist (``tclock.doctor_checklist``) also reads ``profile.json`` (run
directory or its parent) and the sweep's ``summary.json`` (parent).  The signal rules are
``tclock.doctor_rules`` and ``tclock.doctor_gradients``; rendering is ``tclock.doctor``.  Nothing
here imports JAX, the loop or an agent.

Overall verdict: the worst signal verdict (healthy < watch < risk < two-clocks; not-checkable when
no signal could be judged).  ``Report.exit_code`` is 1 when it is two-clocks, else 0; the
checklist is advice and changes neither.  Unreadable input (missing directory, malformed
``config.yaml`` / metrics JSON line, a record without ``iteration`` or ``rt_ut_ratio``, a
non-numeric metric, no records at all) raises ``RunFormatError``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from tclock import runlog
from tclock.doctor_checklist import checklist
from tclock.doctor_gradients import b_simple_row, downgrade_if_solved, gdc_row, solved_success
from tclock.doctor_rules import RANK, Row, activation_row, rt_ut_rows, seed_series, skew_row
from tclock.runlog import RunFormatError, load_config_or_empty, seed_matrix

REQUIRED_KEYS = ("iteration", "rt_ut_ratio")


@dataclass
class Report:
    """The doctor's findings on one run: signal rows, then checklist rows (``Row.kind``)."""
    run_dir: str
    rows: list[Row]
    verdict: str
    exit_code: int
    run: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def signals(self) -> list[Row]:
        return [r for r in self.rows if r.kind == "signal"]

    @property
    def checklist(self) -> list[Row]:
        return [r for r in self.rows if r.kind == "checklist"]

    def row(self, signal: str) -> Row:
        for r in self.rows:
            if r.signal == signal:
                return r
        raise KeyError(signal)


def validate_records(records: list[dict], path: Path) -> np.ndarray:
    """The records' iterations; raises ``RunFormatError`` on no records or a missing required key."""
    if not records:
        raise RunFormatError(f"{path} holds no records: the run has not finished an iteration yet")
    iters = []
    for i, r in enumerate(records, 1):
        for key in REQUIRED_KEYS:
            if key not in r:
                where = f"iteration {r['iteration']}" if "iteration" in r else f"record {i}"
                raise RunFormatError(f"{path}: {where} lacks the required key {key!r} "
                                     f"(keys present: {', '.join(sorted(r)) or 'none'})")
        it = r["iteration"]
        if isinstance(it, bool) or not isinstance(it, int):
            raise RunFormatError(f"{path}: record {i} has iteration {it!r}; expected an integer")
        iters.append(it)
    return np.asarray(iters, dtype=int)


def _last_finite(records: Sequence[dict], key: str) -> float | None:
    _, mean = seed_series(records, key)
    mean = mean[np.isfinite(mean)]
    return float(mean[-1]) if mean.size else None


def _run_state(run_dir: Path, notes: list[str]) -> str:
    try:
        state = runlog.read_status(run_dir).get("state", "?")
    except (RunFormatError, AttributeError) as e:
        notes.append(f"status unreadable: {e}")
        return "unreadable"
    return state


def run_info(run_dir: Path, records: Sequence[dict], iters: np.ndarray, config: dict, notes: list[str]) -> dict:
    """The report header: config fields, progress and state (``num_envs``: config first, else logged)."""
    state = _run_state(run_dir, notes)
    _, ne = seed_series(records, "num_envs")
    ne = ne[np.isfinite(ne)]
    cfg_ne = config.get("num_envs")
    num_envs = cfg_ne if isinstance(cfg_ne, (int, float)) and not isinstance(cfg_ne, bool) else (
        float(ne[0]) if ne.size else None)
    if ne.size and ne.min() != ne.max():
        notes.append(f"num_envs changed during the run: {int(ne.min())}–{int(ne.max())} (latest {int(ne[-1])})")
    seeds = max((seed_matrix(records, k)[1].shape[1] for k in ("episode_return", "activation_rate", "adv_skew")),
                default=0)
    if state == "failed":
        notes.append("status.json says the run failed")
    return {
        "env": config.get("env"), "algo": config.get("algo"), "num_envs": num_envs,
        "num_envs_latest": float(ne[-1]) if ne.size else None,
        "unroll_length": config.get("unroll_length"), "seeds": config.get("seeds", seeds or None),
        "iterations": int(iters[-1]), "records": len(records),
        "env_steps": _last_finite(records, "env_steps"), "wall_s": _last_finite(records, "wall_s"),
        "compiles": _last_finite(records, "compiles"), "state": state,
    }


def signal_rows(records: Sequence[dict], iters: np.ndarray, config: dict, num_envs) -> list[Row]:
    """Every signal row, in report order, with the solved-task downgrade applied."""
    solved = solved_success(records)
    rows = rt_ut_rows(records, iters)
    rows.append(activation_row(records, iters))
    rows.append(downgrade_if_solved(skew_row(records, iters), solved))
    rows.append(downgrade_if_solved(gdc_row(records), solved))
    rows.append(b_simple_row(records, config, num_envs))
    return rows


def checklist_rows(run_dir: Path, records: Sequence[dict], config: dict, has_config: bool, num_envs,
                   notes: list[str]) -> list[Row]:
    return [Row(c.item, c.evidence, c.wants, c.status, kind="checklist", data=c.data)
            for c in checklist(run_dir, records, config, has_config, num_envs, notes)]


def overall(rows: Sequence[Row]) -> str:
    """The worst judged signal verdict; not-checkable when none was judged."""
    judged = [r.verdict for r in rows if r.kind == "signal" and r.verdict in RANK]
    return max(judged, key=RANK.__getitem__) if judged else "not-checkable"


def diagnose(run_dir: str | os.PathLike) -> Report:
    """Reads a run directory and builds the report. Raises ``RunFormatError`` on unreadable input."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise RunFormatError(f"{run_dir} does not exist: pass a tclock run directory")
    if not run_dir.is_dir():
        raise RunFormatError(f"{run_dir} is not a directory: pass a tclock run directory")
    notes: list[str] = []
    records = runlog.read_metrics(run_dir)
    iters = validate_records(records, run_dir / runlog.METRICS_FILE)
    has_config = (run_dir / runlog.CONFIG_FILE).exists()
    config = load_config_or_empty(run_dir)
    if not has_config:
        notes.append("no config.yaml: config-based checks are not checkable")
    run = run_info(run_dir, records, iters, config, notes)
    rows = signal_rows(records, iters, config, run["num_envs"])
    rows += checklist_rows(run_dir, records, config, has_config, run["num_envs"], notes)
    verdict = overall(rows)
    return Report(run_dir=str(run_dir), rows=rows, verdict=verdict, exit_code=1 if verdict == "two-clocks" else 0,
                  run=run, notes=notes)
