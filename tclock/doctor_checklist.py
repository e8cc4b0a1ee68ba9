"""The doctor's checklist: section 6 of the user's write-up (stated in ``docs/design.md``) as advice.

Each item is ok | missing | not-checkable.  The checklist is advice only: it never changes the
doctor's verdict or exit code.  Items, in order (numbers are the defaults in ``tclock.thresholds``):

``diagnostics logged``         the ``rt_ut_ratio``, ``adv_skew`` and ``gdc`` keys are present in the metrics.
``latency baseline``           a readable ``profile.json`` in the run directory or its parent
                               (``tclock profile`` writes it).
``batch <= 0.7 x critical``    the initial ``num_envs`` <= ``CRIT_FRACTION`` (0.7) x ``b_crit``, when the
                               parent's ``summary.json`` (a sweep) holds a positive number for ``b_crit``.
``DRBS on``                    config ``drbs`` true (a bool or ``{enabled: ...}``).
``reward-event unit test``     not checkable from a run (a property of the code).
``HAE window calibrated``      ``advantage: hae``, ``hae_window`` set, and, when the run logs a non-zero
                               activation rate, the window inside ``HAE_LOW``-``HAE_HIGH`` (0.5-0.8) x the
                               mean distance between reward events, estimated as 1 / the mean activation
                               rate of the last ``RECENT`` (20) rollouts and capped at ``unroll_length``.
``GPU memory < 85%``           not checkable from a run.
``LR schedule on wall time``   ``lr_clock`` wall or hybrid.

A config field that is absent makes its item not-checkable; without ``config.yaml`` those items
say so.  Files are read through ``tclock.runlog`` only; no JAX, loop or agent code is imported.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from tclock import runlog
from tclock.runlog import RunFormatError, nanmean_rows, seed_matrix
from tclock.textfmt import fmt
from tclock.thresholds import ACT_ZERO, CRIT_FRACTION, HAE_HIGH, HAE_LOW, RECENT

CHECK_STATES = ("ok", "missing", "not-checkable")
PROFILE_FILE = "profile.json"
SUMMARY_FILE = "summary.json"
DIAGNOSTIC_KEYS = ("rt_ut_ratio", "adv_skew", "gdc")

CRIT_ITEM = f"batch <= {CRIT_FRACTION:g} x critical"
DRBS_ITEM, HAE_ITEM, LR_ITEM = "DRBS on", "HAE window calibrated", "LR schedule on wall time"
CONFIG_ITEMS = (DRBS_ITEM, HAE_ITEM, LR_ITEM)  # read from config.yaml alone


@dataclass
class Check:
    """One checklist item: ``status`` is one of ``CHECK_STATES``; ``wants`` says what ok means."""
    item: str
    status: str
    evidence: str
    wants: str
    data: dict = field(default_factory=dict)


def _num(value) -> str:
    return fmt(value, missing="n/a")


def _positive(value) -> float | None:
    """``value`` as a float when it is a finite number > 0 (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


# --------------------------------------------------------------------------- items from files
def _diagnostics_item(records: Sequence[dict]) -> Check:
    absent = [k for k in DIAGNOSTIC_KEYS if not any(k in r for r in records)]
    listed = f"{', '.join(DIAGNOSTIC_KEYS[:-1])} and {DIAGNOSTIC_KEYS[-1]}"
    evidence = f"not logged: {', '.join(absent)}" if absent else f"{listed} present"
    return Check("diagnostics logged", "missing" if absent else "ok", evidence,
                 f"{', '.join(DIAGNOSTIC_KEYS)} keys in metrics", {"absent": absent})


def _profile_item(run_dir: Path) -> Check:
    wants = f"{PROFILE_FILE} in run or parent dir"
    found = [p for p in (run_dir / PROFILE_FILE, run_dir.parent / PROFILE_FILE) if p.exists()]
    if not found:
        return Check("latency baseline", "missing",
                     f"no {PROFILE_FILE} here or in the parent (run `tclock profile`)", wants)
    try:
        runlog.read_json(found[0])
    except RunFormatError as e:
        return Check("latency baseline", "missing", f"unreadable: {e}", wants)
    return Check("latency baseline", "ok", f"{found[0]}", wants, {"path": str(found[0])})


def _read_b_crit(summary_path: Path, notes: list[str]):
    """``(summary_readable, b_crit)`` from the sweep's summary; an unreadable file adds a note."""
    try:
        summary = runlog.read_json(summary_path)
    except RunFormatError as e:
        notes.append(f"{SUMMARY_FILE} unreadable: {e}")
        return False, None
    if not isinstance(summary, dict) or summary.get("sweep_axis", "num_envs") != "num_envs":
        return True, None  # no summary, or a sweep of SAC's gradient batch (B_crit in transitions, not envs)
    return True, summary.get("b_crit")


def _critical_item(run_dir: Path, num_envs, notes: list[str]) -> Check:
    wants = f"initial num_envs <= {CRIT_FRACTION} x b_crit ({SUMMARY_FILE})"
    summary_path = run_dir.parent / SUMMARY_FILE
    if not summary_path.exists():
        return Check(CRIT_ITEM, "not-checkable", f"no {SUMMARY_FILE} in the parent (no sweep)", wants)
    readable, b_crit = _read_b_crit(summary_path, notes)
    if not readable:
        return Check(CRIT_ITEM, "not-checkable", f"{SUMMARY_FILE} unreadable", wants)
    if _positive(b_crit) is None:
        return Check(CRIT_ITEM, "not-checkable", f"{SUMMARY_FILE} has no usable b_crit ({b_crit!r})", wants)
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, float)):
        return Check(CRIT_ITEM, "not-checkable", f"b_crit {_num(b_crit)} but num_envs unknown", wants,
                     {"b_crit": b_crit})
    limit = CRIT_FRACTION * b_crit
    good = num_envs <= limit
    evidence = (f"num_envs {int(num_envs)} {'<=' if good else '>'} {CRIT_FRACTION} x b_crit "
                f"{_num(b_crit)} = {_num(limit)} envs")
    return Check(CRIT_ITEM, "ok" if good else "missing", evidence, wants,
                 {"b_crit": b_crit, "limit": limit, "num_envs": num_envs})


# --------------------------------------------------------------------------- items from the config
def _drbs_item(config: dict) -> Check:
    wants = "config drbs: true (--drbs)"
    drbs = config.get("drbs")
    if drbs is None:
        return Check(DRBS_ITEM, "not-checkable", "no drbs field in config", wants)
    on = bool(drbs.get("enabled")) if isinstance(drbs, dict) else bool(drbs)
    return Check(DRBS_ITEM, "ok" if on else "missing", f"drbs = {on}", wants)


def _suggested_window(records: Sequence[dict], unroll_length: float):
    """``(gap, rollouts, (low, high))``: the HAE window the recent reward events suggest, or None."""
    if not any("activation_rate" in r for r in records):
        return None
    _, m = seed_matrix(records, "activation_rate", keep_missing=True)
    act = nanmean_rows(m)
    act = act[np.isfinite(act)][-RECENT:]
    if not act.size or float(act.mean()) <= ACT_ZERO:
        return None
    gap = 1.0 / float(act.mean())
    return gap, act.size, (min(HAE_LOW * gap, unroll_length), min(HAE_HIGH * gap, unroll_length))


def _hae_item(records: Sequence[dict], config: dict) -> Check:
    wants = f"advantage: hae, hae_window within {HAE_LOW}–{HAE_HIGH} x mean gap between reward events"
    adv, window = config.get("advantage"), config.get("hae_window")
    T = _positive(config.get("unroll_length")) or math.inf
    suggestion = _suggested_window(records, T)
    hint = ""
    if suggestion:
        gap, n, (lo, hi) = suggestion
        hint = (f"; reward events every ~{_num(gap)} steps (1/activation, last {n} rollouts) "
                f"→ window {_num(lo)}–{_num(hi)}")
    if adv is None:
        return Check(HAE_ITEM, "not-checkable", "no advantage field in config" + hint, wants)
    if str(adv).lower() != "hae":
        return Check(HAE_ITEM, "missing", f"advantage = {adv}: HAE not in use" + hint, wants)
    if _positive(window) is None:
        return Check(HAE_ITEM, "missing", f"advantage = hae but hae_window = {window!r}" + hint, wants)
    if suggestion is None:
        return Check(HAE_ITEM, "ok", f"hae_window = {window} (no reward events logged to calibrate against)",
                     wants, {"hae_window": window})
    lo, hi = suggestion[2]
    inside = lo * (1 - 1e-9) <= window <= hi * (1 + 1e-9) or (hi == T and window >= T)
    return Check(HAE_ITEM, "ok" if inside else "missing",
                 f"hae_window = {window} {'within' if inside else 'outside'} the suggested range" + hint,
                 wants, {"hae_window": window, "suggested": [lo, hi]})


def _lr_item(config: dict) -> Check:
    wants = "lr_clock: wall or hybrid"
    clock = config.get("lr_clock")
    if clock is None:
        return Check(LR_ITEM, "not-checkable", "no lr_clock field in config", wants)
    good = str(clock).lower() in ("wall", "hybrid")
    return Check(LR_ITEM, "ok" if good else "missing", f"lr_clock = {clock}", wants)


# --------------------------------------------------------------------------- the list
def checklist(run_dir: Path, records: Sequence[dict], config: dict, has_config: bool, num_envs,
              notes: list[str]) -> list[Check]:
    """Every item, in the order of the module docstring; unreadable side files add to ``notes``."""
    checks = [
        _diagnostics_item(records),
        _profile_item(run_dir),
        _critical_item(run_dir, num_envs, notes),
        _drbs_item(config),
        Check("reward-event unit test", "not-checkable", "a property of the code, not of this run",
              "(rewards > 0) detection tested"),
        _hae_item(records, config),
        Check("GPU memory < 85%", "not-checkable", "not recorded in a run directory", "< 85% of device memory"),
        _lr_item(config),
    ]
    if has_config:
        return checks
    return [dataclasses.replace(c, evidence="no config.yaml in the run directory")
            if c.item in CONFIG_ITEMS and c.status == "not-checkable" else c for c in checks]
