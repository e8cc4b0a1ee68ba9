"""Plain NumPy / Python-loop references for ``tclock.advantages`` (one loop per env column).

Written the obvious way, independently of the vectorised implementations, for tests and the
``benchmarks/hae_speed.py`` comparison.  Inputs are ``[T, ...]`` arrays; trailing axes are
flattened into columns and every column is processed by its own loop.
"""
from __future__ import annotations

import numpy as np


def _columns(*arrays):
    T = arrays[0].shape[0]
    return T, [np.asarray(a, dtype=np.float64).reshape(T, -1) for a in arrays]


def gae_column(r, v, nv, term, trunc, gamma, lam, last_bootstrap=True):
    """GAE on one column (1-D arrays).  ``last_bootstrap=False``: the last step bootstraps from 0."""
    n = len(r)
    adv = np.zeros(n)
    running = 0.0
    for t in reversed(range(n)):
        nxt = nv[t] if (t < n - 1 or last_bootstrap) else 0.0
        delta = r[t] + (0.0 if term[t] else gamma * nxt) - v[t]
        done = term[t] or trunc[t]
        if t == n - 1 or done:
            running = delta
        else:
            running = delta + gamma * lam * running
        adv[t] = running
    return adv


def gae_ref(rewards, values, next_values, terminations, truncations, gamma=0.99, lam=0.95):
    shape = np.shape(rewards)
    T, (r, v, nv, te, tr) = _columns(rewards, values, next_values, terminations, truncations)
    adv = np.zeros_like(r)
    for b in range(r.shape[1]):
        adv[:, b] = gae_column(r[:, b], v[:, b], nv[:, b], te[:, b] > 0, tr[:, b] > 0, gamma, lam)
    adv = adv.reshape(shape)
    return adv, adv + np.asarray(values, dtype=np.float64)


def hae_ref(rewards, values, next_values, terminations, truncations, gamma=0.99, lam=0.95, window=64,
            threshold=0.0, window_bootstrap="none", combine="sum", outside="zero", max_events=None):
    """The write-up's loop: for each event, GAE on the slice ``[max(0, i-L//2), min(T, i+L//2))``.

    Returns ``(advantages, returns, events_found, dropped)``; ``events_found`` and ``dropped`` are
    per column, shaped like the trailing axes.
    """
    shape = np.shape(rewards)
    T, (r, v, nv, te, tr) = _columns(rewards, values, next_values, terminations, truncations)
    half = window // 2
    B = r.shape[1]
    out = np.zeros_like(r)
    found = np.zeros(B, dtype=np.int64)
    dropped = np.zeros(B, dtype=np.int64)
    for b in range(B):
        events = [t for t in range(T) if r[t, b] > threshold]
        found[b] = len(events)
        if max_events and len(events) > max_events:  # None or 0: no cap
            dropped[b] = len(events) - max_events
            events = events[:max_events]  # first come, first served
        acc = np.zeros(T)
        wsum = np.zeros(T)
        hit = np.zeros(T, dtype=bool)
        for idx in events:
            start = max(0, idx - half)
            end = min(T, idx + half)
            if end <= start:
                continue
            local = gae_column(r[start:end, b], v[start:end, b], nv[start:end, b], te[start:end, b] > 0,
                               tr[start:end, b] > 0, gamma, lam, last_bootstrap=(window_bootstrap == "value"))
            w = 1.0 if combine == "sum" else abs(r[idx, b])
            acc[start:end] += w * local
            wsum[start:end] += w
            hit[start:end] = True
        if combine == "reward":
            acc = np.where(wsum > 0, acc / np.where(wsum > 0, wsum, 1.0), 0.0)
        if outside == "gae":
            full = gae_column(r[:, b], v[:, b], nv[:, b], te[:, b] > 0, tr[:, b] > 0, gamma, lam)
            acc = np.where(hit, acc, full)
        out[:, b] = acc
    out = out.reshape(shape)
    return out, out + np.asarray(values, dtype=np.float64), found.reshape(shape[1:]), dropped.reshape(shape[1:])


def vtrace_ref(behaviour_logp, target_logp, rewards, values, next_values, terminations, truncations,
               gamma=0.99, lam=1.0, rho_bar=1.0, c_bar=1.0):
    """V-trace (Espeholt et al. 2018) one column at a time.  Returns ``(vs, pg_advantages)``."""
    shape = np.shape(rewards)
    T, (mu, pi, r, v, nv, te, tr) = _columns(behaviour_logp, target_logp, rewards, values, next_values,
                                             terminations, truncations)
    vs = np.zeros_like(r)
    pg = np.zeros_like(r)
    for b in range(r.shape[1]):
        corr = 0.0  # vs_{t+1} - V_{t+1}
        for t in reversed(range(T)):
            ratio = np.exp(pi[t, b] - mu[t, b])
            rho = min(rho_bar, ratio)
            c = lam * min(c_bar, ratio)
            boot = 0.0 if te[t, b] else gamma * nv[t, b]
            delta = rho * (r[t, b] + boot - v[t, b])
            done = te[t, b] or tr[t, b]
            if t == T - 1 or done:
                corr = delta
            else:
                corr = delta + gamma * c * corr
            vs[t, b] = v[t, b] + corr
        for t in range(T):
            rho = min(rho_bar, np.exp(pi[t, b] - mu[t, b]))
            done = te[t, b] or tr[t, b]
            vs_next = vs[t + 1, b] if (t < T - 1 and not done) else nv[t, b]
            boot = 0.0 if te[t, b] else gamma * vs_next
            pg[t, b] = rho * (r[t, b] + boot - v[t, b])
    return vs.reshape(shape), pg.reshape(shape)


def discounted_returns_ref(rewards, next_values, terminations, truncations, gamma=0.99):
    """On-policy V-trace target with lam = 1: the n-step return to the episode's end within the
    rollout, bootstrapped from ``next_values`` at a truncation or at the rollout's last step."""
    shape = np.shape(rewards)
    T, (r, nv, te, tr) = _columns(rewards, next_values, terminations, truncations)
    out = np.zeros_like(r)
    for b in range(r.shape[1]):
        for t in range(T):
            total, disc, j = 0.0, 1.0, t
            while True:
                total += disc * r[j, b]
                disc *= gamma
                if te[j, b]:
                    break
                if tr[j, b] or j == T - 1:
                    total += disc * nv[j, b]
                    break
                j += 1
            out[t, b] = total
    return out.reshape(shape)
