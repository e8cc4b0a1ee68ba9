"""``diagnose(run_dir) -> Report``: apply every doctor rule and the checklist to one run directory.

Reads ``config.yaml``, ``metrics.jsonl`` and ``status.json`` through ``tclock.runlog`` (never the
files directly); the checklist (``tclock.doctor_checklist``) also reads ``profile.json`` (run
directory or its parent) and the sweep's ``summary.json`` (parent).  The signal rules are
``tclock.doctor_rules`` and ``tclock.doctor_gradients``; rendering is ``tclock.doctor``.  Nothing
here imports JAX, the loop or an agent.

Verdicts rest on calibrated quantities: ``critical_batch`` (B against the critical batch measured
by a sweep; the online estimate is reported beside it) and, in the asynchronous pipeline only, the RT/UT rows and
``staleness``.  The write-up's other thresholds stay visible: GDC and a synchronous run's RT/UT as
``info`` rows (their write-up verdict in the text and ``data["writeup_verdict"]``), the activation
rate capped at risk and the advantage skew at watch (neither is validated as a verdict).

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

from tclock import critical, runlog
from tclock.doctor_batch import critical_batch_row, staleness_row, step_size_row
from tclock.doctor_checklist import checklist
from tclock.doctor_gradients import b_simple_row, downgrade_if_solved, gdc_row, solved_success
from tclock.doctor_rules import RANK, Row, activation_row, key_present, rt_ut_rows, seed_series, skew_row
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
    batch_and_step: dict = field(default_factory=dict)  # batch_and_step(): the three-way outcome

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


def is_asynchronous(records: Sequence[dict], config: dict) -> bool:
    """An ARP run (config ``arp``, or ``policy_lag`` logged, or a ratio a synchronous loop cannot
    produce): there RT/UT approximates the policy lag and is judged."""
    if config.get("arp") is True or key_present(records, "policy_lag"):
        return True
    _, raw = seed_series(records, "rt_ut_ratio")
    return bool(np.any(raw[np.isfinite(raw)] > 1.0))


def reported(row: Row, why: str) -> Row:
    """A write-up signal kept as a reported number: verdict ``info``, its write-up verdict in the data."""
    if row.verdict not in RANK:
        return row
    return Row(row.signal, f"{row.value} — write-up: {row.verdict}; {why}", row.threshold, "info",
               data={**row.data, "writeup_verdict": row.verdict})


def capped(row: Row, worst: str) -> Row:
    """``row`` with its verdict no worse than ``worst`` (a signal not validated as a verdict)."""
    if row.verdict not in RANK or RANK[row.verdict] <= RANK[worst]:
        return row
    return Row(row.signal, f"{row.value} (write-up: {row.verdict}; capped at {worst}: not validated as a verdict)",
               row.threshold, worst, data={**row.data, "writeup_verdict": row.verdict})


SYNC_RATIO = "a synchronous loop's RT/UT is the rollout's share of an iteration (≤ 1), not staleness"
GDC_REPORTED = ("GDC on small minibatches falls with the gradient noise scale whatever B is; the batch verdict is "
                "critical_batch")


def signal_rows(records: Sequence[dict], iters: np.ndarray, config: dict, num_envs,
                time_fit: dict | None = None, sweep: dict | None = None) -> list[Row]:
    """Every signal row, in report order.  Verdicts rest on calibrated quantities
    (``critical_batch``; in the asynchronous pipeline RT/UT and ``staleness``); the write-up's
    other thresholds stay as reported signals (``info``) or capped verdicts."""
    solved = solved_success(records)
    asynchronous = is_asynchronous(records, config)
    rows = [r if asynchronous else reported(r, SYNC_RATIO) for r in rt_ut_rows(records, iters)]
    rows.append(critical_batch_row(records, config, num_envs, time_fit, sweep))
    rows.append(step_size_row(records, config, num_envs))
    rows.append(staleness_row(records))
    rows.append(capped(activation_row(records, iters), "risk"))
    rows.append(capped(downgrade_if_solved(skew_row(records, iters), solved), "watch"))
    rows.append(reported(downgrade_if_solved(gdc_row(records), solved), GDC_REPORTED))
    rows.append(b_simple_row(records, config, num_envs))
    return rows


def sweep_summary(run_dir: Path) -> dict | None:
    """The parent sweep's ``summary.json`` (None when absent or unreadable)."""
    path = run_dir.parent / "summary.json"
    if not path.exists():
        return None
    try:
        data = runlog.read_json(path)
    except RunFormatError:
        return None
    return data if isinstance(data, dict) else None


def latency_fit(run_dir: Path) -> dict | None:
    """``{a, k}`` of the iteration time ``t(B) = a + k·B``: the parent sweep's ``summary.json``
    time fit, else a fit of ``rollout_s + update_s`` in a ``profile.json`` (run dir or parent)."""
    for path in (run_dir.parent / "summary.json",):
        if path.exists():
            try:
                fit = runlog.read_json(path).get("time_fit")
            except (RunFormatError, AttributeError):
                fit = None
            if fit and "a" in fit and "k" in fit:
                return {"a": fit["a"], "k": fit["k"]}
    for path in (run_dir / "profile.json", run_dir.parent / "profile.json"):
        if path.exists():
            try:
                rows = [r for r in runlog.read_json(path).get("rows", []) if r.get("update_s") is not None]
            except (RunFormatError, AttributeError):
                continue
            if len(rows) >= 2:
                f = critical.fit_linear_time([r["batch_size"] for r in rows],
                                             [r["rollout_s"] + r["update_s"] for r in rows])
                return {"a": f.a, "k": f.k}
    return None


def checklist_rows(run_dir: Path, records: Sequence[dict], config: dict, has_config: bool, num_envs,
                   notes: list[str]) -> list[Row]:
    return [Row(c.item, c.evidence, c.wants, c.status, kind="checklist", data=c.data)
            for c in checklist(run_dir, records, config, has_config, num_envs, notes)]


OUTCOMES = ("lr too large", "batch above", "neither")


def batch_and_step(rows: Sequence[Row]) -> dict:
    """The three outcomes a user acts on, from the ``step_size`` and ``critical_batch`` rows:
    ``lr too large`` (the step-size row's risk, once that rule is validated) first, since a step-size-limited run measures the
    step rather than the batch (the critical batch assumes the lr tuned at each B); else ``batch
    above`` (the critical-batch row's two-clocks, which rests on a trusted sweep B_crit); else
    ``neither``.  ``{"outcome", "because"}`` (the deciding row's evidence)."""
    by = {r.signal: r for r in rows}
    step, batch = by.get("step_size"), by.get("critical_batch")
    if step is not None and step.verdict == "risk":  # a validated step-size verdict (doctor_batch)
        return {"outcome": "lr too large", "because": step.value}
    if batch is not None and batch.verdict == "two-clocks":
        return {"outcome": "batch above", "because": batch.value}
    checked = [r.signal for r in (step, batch) if r is not None and r.verdict not in ("not-checkable", "info")]
    why = f"judged by {', '.join(checked)}" if checked else "neither judged (no sweep B_crit, no step ratio)"
    return {"outcome": "neither", "because": why}


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
    rows = signal_rows(records, iters, config, run["num_envs"], latency_fit(run_dir), sweep_summary(run_dir))
    rows += checklist_rows(run_dir, records, config, has_config, run["num_envs"], notes)
    verdict = overall(rows)
    return Report(run_dir=str(run_dir), rows=rows, verdict=verdict, exit_code=1 if verdict == "two-clocks" else 0,
                  run=run, notes=notes, batch_and_step=batch_and_step(rows))
