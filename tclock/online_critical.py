"""The online critical batch: a windowed ratio of the per-env noise estimates a run logs.

Each diagnostic iteration logs, per seed, unbiased estimates of ``tr(Sigma_env)``
(``noise_env_trace``) and of ``|G|^2`` (``noise_env_grad_sq``) from groups of whole env
trajectories (:func:`tclock.agents.actor_critic.env_group_noise`).  One estimate of ``|G|^2``
is very noisy (it can be negative), so, as McCandlish et al. (2018, appendix A) do, the two
are averaged separately over the last ``window`` estimates and only then divided:

    b_crit_online_envs = sum(noise_env_trace) / sum(noise_env_grad_sq)   (last ``window``)

in **envs**, the unit of ``B_crit`` (docs/design.md §2).  ``None`` while the summed ``|G|^2``
is not positive (the signal is not detectable yet).  Plain Python and NumPy.
"""
from __future__ import annotations

from collections import deque

import numpy as np

TRACE_KEY, GRAD_KEY, ONLINE_KEY = "noise_env_trace", "noise_env_grad_sq", "b_crit_online_envs"


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
    """Keeps the last ``window`` per-seed estimates and gives ``b_crit_online_envs``."""

    def __init__(self, window: int, history: dict | None = None):
        self.traces: deque = deque((history or {}).get("traces", []), maxlen=window)
        self.grad_sqs: deque = deque((history or {}).get("grad_sqs", []), maxlen=window)

    def add(self, metrics: dict) -> list | None:
        """Adds one iteration's update metrics (arrays per seed); returns the windowed
        estimate, or None when this iteration logged no per-env noise estimate."""
        if TRACE_KEY not in metrics or GRAD_KEY not in metrics:
            return None
        self.traces.append(np.asarray(metrics[TRACE_KEY], dtype=float).reshape(-1).tolist())
        self.grad_sqs.append(np.asarray(metrics[GRAD_KEY], dtype=float).reshape(-1).tolist())
        return windowed_ratio(list(self.traces), list(self.grad_sqs))

    def state_dict(self) -> dict:
        return {"traces": list(self.traces), "grad_sqs": list(self.grad_sqs)}
