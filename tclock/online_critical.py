"""The online critical batch: a windowed ratio of the per-env noise estimates a run logs.

Each diagnostic iteration logs, per seed, estimates of a noise trace and a squared signal in
per-env units: of the whole learning phase (``update_noise_trace``, ``update_signal_sq``:
:func:`tclock.agents.actor_critic.split_update_noise`), preferred when logged, and of the
gradient at the behaviour parameters (``noise_env_trace``, ``noise_env_grad_sq``: groups of
whole env trajectories, :func:`tclock.agents.actor_critic.env_group_noise`).  One estimate of the signal
is very noisy (it can be negative), so, as McCandlish et al. (2018, appendix A) do, the two
are averaged separately over the last ``window`` estimates and only then divided:

    b_crit_online_envs = sum(trace) / sum(signal)   (last ``window`` estimates)

in **envs**, the unit of ``B_crit`` (docs/design.md §2).  ``None`` while the summed ``|G|^2``
is not positive (the signal is not detectable yet).  Plain Python and NumPy.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from tclock.runlog import seed_matrix

ONLINE_KEY = "b_crit_online_envs"
# (trace key, signal key) per source, in order of preference: the noise of a whole learning phase
# (tclock.agents.actor_critic.split_update_noise), then the gradient noise per env (env_group_noise).
SOURCES = {"update": ("update_noise_trace", "update_signal_sq"), "gradient": ("noise_env_trace", "noise_env_grad_sq")}
TRACE_KEY, GRAD_KEY = SOURCES["gradient"]


def source_of(keys) -> str | None:
    """The preferred estimate present among ``keys`` (None when neither is)."""
    for name, (trace, signal) in SOURCES.items():
        if trace in keys and signal in keys:
            return name
    return None


def windowed_ratio(traces, grad_sqs) -> list:
    """Per seed ``sum(trace) / sum(grad_sq)`` over rows (``None`` where the sum of ``grad_sq``
    is not positive or nothing finite was logged)."""
    t = np.asarray(traces, dtype=float)
    g = np.asarray(grad_sqs, dtype=float)
    if t.size == 0:
        return []
    ok = np.isfinite(t) & np.isfinite(g)
    t_sum = np.where(ok, t, 0.0).sum(axis=0)
    g_sum = np.where(ok, g, 0.0).sum(axis=0)
    return [float(a / b) if b > 0 and n > 0 else None for a, b, n in zip(t_sum, g_sum, ok.sum(axis=0))]


class OnlineCriticalBatch:
    """Keeps the last ``window`` per-seed estimates and gives ``b_crit_online_envs``
    (``sum(trace) / sum(signal)``).  ``sources`` (default :data:`SOURCES`) names the
    (numerator, denominator) keys by preference; :mod:`tclock.step_size` windows its gains
    the same way."""

    def __init__(self, window: int, history: dict | None = None, sources: dict | None = None):
        self.sources = sources or SOURCES
        self.traces: deque = deque((history or {}).get("traces", []), maxlen=window)
        self.grad_sqs: deque = deque((history or {}).get("grad_sqs", []), maxlen=window)

    def add(self, metrics: dict) -> list | None:
        """Adds one iteration's update metrics (arrays per seed); returns the windowed
        ratio, or None when this iteration logged none of the sources."""
        source = next((n for n, (a, b) in self.sources.items() if a in metrics and b in metrics), None)
        if source is None:
            return None
        trace, signal = self.sources[source]
        self.traces.append(np.asarray(metrics[trace], dtype=float).reshape(-1).tolist())
        self.grad_sqs.append(np.asarray(metrics[signal], dtype=float).reshape(-1).tolist())
        return self.ratio()

    def ratio(self) -> list | None:
        """The windowed ratio of the estimates kept so far (per seed), None when there are none:
        what the last :meth:`add` that logged one returned (a resumed run reads it again here)."""
        return windowed_ratio(list(self.traces), list(self.grad_sqs)) if self.traces else None

    def state_dict(self) -> dict:
        return {"traces": list(self.traces), "grad_sqs": list(self.grad_sqs)}


def run_estimate(records: list[dict], source: str | None = None, until_iteration: float | None = None) -> float:
    """One run's estimate in envs: the seed median of ``sum(trace) / sum(signal)`` over every
    estimate of ``source`` (default: the preferred one logged) up to ``until_iteration``
    (all when None); NaN when nothing usable was logged."""
    keys = set().union(*(r.keys() for r in records)) if records else set()
    source = source or source_of(keys)
    if source is None or SOURCES[source][0] not in keys:
        return float("nan")
    trace_key, signal_key = SOURCES[source]
    its, trace = seed_matrix(records, trace_key)
    _, signal = seed_matrix(records, signal_key)
    if until_iteration is not None and np.isfinite(until_iteration):
        keep = its <= until_iteration
        trace, signal = trace[keep], signal[keep]
    values = [v for v in windowed_ratio(trace, signal) if v is not None] if trace.size else []
    return float(np.median(values)) if values else float("nan")
