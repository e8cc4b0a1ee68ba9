"""Advantage estimators: pure array math, time-major ``[T, ...]`` layout.

Every estimator takes the same episode-boundary convention:

* ``rewards[t]``      reward received after acting at step t.
* ``values[t]``       V(s_t).
* ``next_values[t]``  V(s_{t+1}) of the *real* next state.  For a step that ended by a time
  limit this is the value of the final observation before the auto-reset, so truncation
  bootstraps; for a step that ended by termination it is ignored.
* ``terminations[t]`` 1.0 if the episode truly ended at t (no bootstrap).
* ``truncations[t]``  1.0 if the episode was cut at t by a time limit (bootstrap from
  ``next_values[t]``, but the trace does not continue into the next episode).

Trailing axes (envs, seeds) are carried along untouched, so the functions jit and vmap.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def gae(rewards, values, next_values, terminations, truncations, gamma: float = 0.99, lam: float = 0.95):
    """Generalized advantage estimation (Schulman et al. 2016) as a reverse ``lax.scan``.

    ``delta_t = r_t + gamma * (1 - term_t) * next_values_t - values_t``
    ``A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}`` with ``done = term | trunc``
    and ``A_T = 0`` past the rollout's end (its last step bootstraps through next_values).

    Returns ``(advantages, returns)`` with ``returns = advantages + values`` (value targets).
    """
    terminations = terminations.astype(values.dtype)
    dones = jnp.maximum(terminations, truncations.astype(values.dtype))
    deltas = rewards + gamma * (1.0 - terminations) * next_values - values
    decay = gamma * lam * (1.0 - dones)

    def step(carry, xs):
        delta, d = xs
        adv = delta + d * carry
        return adv, adv

    _, advantages = jax.lax.scan(step, jnp.zeros_like(values[0]), (deltas, decay), reverse=True)
    return advantages, advantages + values


# ---------------------------------------------------------------------------------------------
# HAE: hierarchical advantage estimation
# ---------------------------------------------------------------------------------------------

_WINDOW_BOOTSTRAPS = ("none", "value")
_COMBINES = ("sum", "reward")
_OUTSIDES = ("zero", "gae")


def _linear_scans(pairs, reverse: bool = True):
    """Several first-order linear recurrences along axis 0 in ONE ``lax.scan``.

    For every ``(x, d)`` in ``pairs``: ``y_t = x_t + d_t * y_{t+1}`` (``reverse=True``, ``y_T = 0``)
    or ``y_t = x_t + d_t * y_{t-1}`` (``reverse=False``, ``y_{-1} = 0``).
    """
    xs = tuple(x for x, _ in pairs)
    ds = tuple(d for _, d in pairs)

    def step(carry, inp):
        x, d = inp
        y = tuple(xi + di * ci for xi, di, ci in zip(x, d, carry))
        return y, y

    init = tuple(jnp.zeros_like(x[0]) for x in xs)
    _, ys = jax.lax.scan(step, init, (xs, ds), reverse=reverse)
    return ys


def _shift(x, k: int, fill: str = "zero"):
    """``y[t] = x[t + k]`` along axis 0 (k static).  Outside ``[0, T)``: 0 (``fill="zero"``) or the
    nearest edge element (``fill="edge"``)."""
    T = x.shape[0]
    if k == 0:
        return x
    k = max(-T, min(T, k))
    if fill == "zero":
        padding = jnp.zeros((abs(k),) + x.shape[1:], x.dtype)
    else:
        edge = x[-1:] if k > 0 else x[:1]
        padding = jnp.broadcast_to(edge, (abs(k),) + x.shape[1:])
    if k > 0:
        return jnp.concatenate([x[k:], padding], axis=0)
    return jnp.concatenate([padding, x[:T + k]], axis=0)


def _powers(base, exponents, dtype):
    """``base ** exponents`` for a static integer array; computed in NumPy when ``base`` is a
    Python number (a constant in the compiled program), with ``jnp.power`` when it is traced."""
    if isinstance(base, (int, float)):
        return jnp.asarray(np.power(float(base), exponents.astype(np.float64)), dtype)
    return jnp.power(base, jnp.asarray(exponents, dtype))


def hae(
    rewards,
    values,
    next_values,
    terminations,
    truncations,
    gamma: float = 0.99,
    lam: float = 0.95,
    *,
    window: int = 64,
    threshold: float = 0.0,
    window_bootstrap: str = "none",
    combine: str = "sum",
    outside: str = "zero",
    max_events: int | None = None,
    return_info: bool = False,
):
    """Hierarchical advantage estimation (HAE): GAE run locally around reward events.

    The algorithm, per env column (every trailing index is an independent column):

    1. a *reward event* is a step with ``rewards[t] > threshold``;
    2. each event at index ``idx`` owns the window ``[max(0, idx - h), min(T, idx + h))`` with
       ``h = window // 2`` (so a window holds at most ``2 * h`` steps: ``h`` before the event,
       the event, ``h - 1`` after; a window at the rollout's edge is clipped; ``window > T`` is
       allowed and just clips more);
    3. GAE is run independently inside every window (its trace never leaves the window);
    4. the windows' local advantages are combined (``combine``); steps covered by no window
       get ``outside``.

    Same layout and episode-boundary convention as :func:`gae`.  Inside a window, episode
    boundaries always cut the trace exactly as in ``gae``: a termination does not bootstrap, a
    truncation bootstraps from ``next_values[t]``, and neither lets the trace continue past t.

    Options (defaults follow the write-up's code sketch):

    * ``window_bootstrap`` -- what the *last step of a window* bootstraps from.
      ``"none"`` (default): from 0, i.e. ``delta = r - V`` there, as if the window's end were a
      termination.  The sketch calls ``compute_gae(local_r, local_d, local_v)`` on the slice
      with the slice's values only, so there is no value past the slice to bootstrap from; a
      ``compute_gae`` of that shape uses ``values[t + 1]`` inside the slice and 0 at its end.
      ``"value"``: bootstrap from ``next_values`` (times ``1 - term``) as ``gae`` does at the
      rollout's end, i.e. each window is exactly ``gae`` run on the slice.  A window that ends
      at the rollout's end follows the same option.
    * ``combine`` -- ``"sum"`` (default, the sketch's ``advs[start:end] += local_advs``):
      ``A_t = sum_k A^k_t`` over the windows k covering t.  ``"reward"`` (the prose's "weighted
      by reward magnitude"): ``A_t = sum_k w_k A^k_t / sum_k w_k`` over the windows covering t,
      with ``w_k = |rewards[idx_k]|``; a step whose covering weights are all 0 (possible only
      with ``threshold < 0``) gets 0.
    * ``outside`` -- ``"zero"`` (default, the sketch's zero-initialised ``advs``): steps in no
      window get advantage 0 (so their return target is their own value).  ``"gae"``: they get
      the ordinary full-rollout ``gae`` advantage.
    * ``max_events`` -- cap on events per column.  ``None`` (default) or ``0``: no cap, every
      event gets its window, as in the sketch (0 means the same as ``hae_max_events: 0`` in
      the config).  The formulation below keeps no per-event state, so it needs
      no cap and its cost does not depend on the number of events.  With a positive int, only the first
      ``max_events`` events of each column in time order are used (first come, first served);
      later ones are ignored and counted in ``info["dropped_events"]``.

    Vectorised formulation (no loop over events, static shapes; jits and vmaps): a window
    ending at ``e`` gives ``A^e_t = A_t - c(t, e) A_e`` (minus ``c(t, e-1) b_{e-1}`` under
    ``window_bootstrap="none"``, ``b = gamma (1 - term) next_values``), where ``A`` is full
    ``gae``, ``A_T = 0`` and ``c(t, e) = prod_{t<=i<e} gamma lam (1 - done_i)``.  Summed over the
    covering windows this is ``n_t A_t - Q_t``, with ``n_t`` the (weighted) number of windows
    covering t and ``Q`` a reverse linear recurrence that adds a window's term at the window's
    last step and removes it before the window's first.  Window starts and ends are fixed
    offsets of their event, so all the bookkeeping is shifts of the event indicator, and the
    whole estimator is two reverse scans over T plus elementwise work.  It is exact: in float64
    it matches the per-window loop to ~1e-12; in float32 to ~1e-7 of the advantages' scale
    (the sum over overlapping windows is formed as ``n_t A_t - Q_t``).

    Returns ``(advantages, returns)`` with ``returns = advantages + values``; with
    ``return_info=True`` returns ``(advantages, returns, info)``, ``info`` holding per column
    ``events`` (events found) and ``dropped_events`` (events over ``max_events``; 0 without a
    cap), and per step ``window_count`` (number of windows covering the step).
    """
    if window_bootstrap not in _WINDOW_BOOTSTRAPS:
        raise ValueError(f"hae: window_bootstrap={window_bootstrap!r}; use one of {_WINDOW_BOOTSTRAPS}")
    if combine not in _COMBINES:
        raise ValueError(f"hae: combine={combine!r}; use one of {_COMBINES}")
    if outside not in _OUTSIDES:
        raise ValueError(f"hae: outside={outside!r}; use one of {_OUTSIDES}")
    if isinstance(window, bool) or int(window) != window or window < 2:
        raise ValueError(f"hae: window={window!r}; use an int >= 2 (a window spans window//2 steps each side)")
    if max_events is not None and (isinstance(max_events, bool) or int(max_events) != max_events
                                   or max_events < 0):
        raise ValueError(f"hae: max_events={max_events!r}; use None or 0 (no cap) or a positive int")

    T = rewards.shape[0]
    h = int(window) // 2
    dtype = values.dtype
    gl = gamma * lam
    none = 1.0 if window_bootstrap == "none" else 0.0

    terminations = terminations.astype(dtype)
    not_done = 1.0 - jnp.maximum(terminations, truncations.astype(dtype))
    boot = gamma * (1.0 - terminations) * next_values          # b_t, the bootstrap term of delta_t
    deltas = rewards + boot - values
    decay = gl * not_done

    # ---- events (optionally capped, first come first served) ----------------------------------
    is_event = rewards > threshold
    events_found = jnp.sum(is_event, axis=0, dtype=jnp.int32)
    ev = is_event.astype(dtype)
    if max_events:  # None or 0: no cap
        (rank,) = _linear_scans([(ev, jnp.ones_like(ev))], reverse=False)   # 1-based event rank
        ev = jnp.where(rank <= max_events, ev, 0.0)
    events_kept = jnp.sum(ev, axis=0).astype(jnp.int32)

    def last_steps(w):
        """Weight of the windows whose last step is t: the event at t+1-h for t < T-1; all the
        events in [T-h, T) for t = T-1 (their windows are clipped at the rollout's end)."""
        tail = jnp.sum(w[max(0, T - h):], axis=0, keepdims=True)
        return jnp.concatenate([_shift(w, 1 - h)[:T - 1], tail], axis=0)

    # Windows starting at t+1 >= 1 belong to the event at t+1+h; their end is min(T, t+1+2h).
    ones = jnp.ones_like(ev)
    weights = ev if combine == "sum" else ev * jnp.abs(rewards).astype(dtype)
    scans = [
        (deltas, decay),                                   # A_t: ordinary GAE
        (not_done, not_done),                              # run_t: steps from t to the next done
        (last_steps(ev) - _shift(ev, 1 + h), ones),        # n_t: windows covering t
    ]
    if combine == "reward":                                # windows of nonzero weight covering t
        ev_pos = (weights > 0).astype(dtype)
        scans.append((last_steps(ev_pos) - _shift(ev_pos, 1 + h), ones))
    adv_full, run, count, *count_pos = _linear_scans(scans)

    t_np = np.arange(T)
    to_end = np.minimum(T - t_np, 1 + 2 * h)                   # e - t for the window starting at t+1
    shape = (T,) + (1,) * (values.ndim - 1)
    c_e = jnp.where(run >= to_end.reshape(shape), _powers(gl, to_end, dtype).reshape(shape), 0.0)
    c_e1 = jnp.where(run >= (to_end - 1).reshape(shape), _powers(gl, to_end - 1, dtype).reshape(shape), 0.0)
    leave = c_e * _shift(adv_full, 1 + 2 * h) + none * c_e1 * _shift(boot, 2 * h, fill="edge")

    w_last = last_steps(weights)
    w_first_next = _shift(weights, 1 + h)
    add = w_last * (decay * _shift(adv_full, 1) + none * boot)
    remove = jnp.where(w_first_next != 0, w_first_next * leave, 0.0)
    # Where no window covers t+1, Q_{t+1} (and W_{t+1}) is exactly 0: cut the carry there so
    # rounding left by additions and removals does not travel between separate window groups.
    live_next = (_shift(count, 1) > 0).astype(dtype)
    if combine == "sum":
        (q,) = _linear_scans([(add - remove, decay * live_next)])
        weight_cover = count
    else:
        # Integer counts are exact; the float weight sum is reset wherever no window of nonzero
        # weight covers t+1, and a step is normalised only if such a window covers it.
        positive = count_pos[0] > 0
        live_pos_next = (_shift(count_pos[0], 1) > 0).astype(dtype)
        q, weight_cover = _linear_scans([(add - remove, decay * live_next),
                                         (w_last - w_first_next, live_pos_next)])

    inside = weight_cover * adv_full - q
    if combine == "reward":
        inside = jnp.where(positive, inside / jnp.where(positive, weight_cover, 1.0), 0.0)
    fallback = adv_full if outside == "gae" else jnp.zeros_like(adv_full)
    advantages = jnp.where(count > 0, inside, fallback)
    returns = advantages + values
    if not return_info:
        return advantages, returns
    info = {
        "events": events_found,
        "dropped_events": events_found - events_kept,
        "window_count": jnp.round(count).astype(jnp.int32),
    }
    return advantages, returns, info


# ---------------------------------------------------------------------------------------------
# V-trace
# ---------------------------------------------------------------------------------------------


def vtrace(
    behaviour_logp,
    target_logp,
    rewards,
    values,
    next_values,
    terminations,
    truncations,
    gamma: float = 0.99,
    lam: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
):
    """V-trace targets (Espeholt et al. 2018) as a reverse ``lax.scan``; same layout as :func:`gae`.

    ``ratio_t = exp(target_logp_t - behaviour_logp_t)``, ``rho_t = min(rho_bar, ratio_t)``,
    ``c_t = lam * min(c_bar, ratio_t)``,
    ``delta_t = rho_t * (r_t + gamma * (1 - term_t) * next_values_t - values_t)``,
    ``vs_t - V_t = delta_t + gamma * (1 - done_t) * c_t * (vs_{t+1} - V_{t+1})`` with
    ``done = term | trunc`` and the correction 0 past the rollout's end.

    Policy-gradient advantage: ``pg_t = rho_t * (r_t + gamma * (1 - term_t) * vs_next_t - V_t)``
    where ``vs_next_t = vs_{t+1}`` if not ``done_t`` and ``t < T - 1``, else ``next_values_t``
    (a truncated step bootstraps from the real next state's value).

    Returns ``(vs, pg_advantages)``, both wrapped in ``stop_gradient`` (they are targets).
    """
    dtype = values.dtype
    terminations = terminations.astype(dtype)
    dones = jnp.maximum(terminations, truncations.astype(dtype))
    ratio = jnp.exp(target_logp - behaviour_logp).astype(dtype)
    rho = jnp.minimum(rho_bar, ratio)
    c = lam * jnp.minimum(c_bar, ratio)
    not_term = 1.0 - terminations
    deltas = rho * (rewards + gamma * not_term * next_values - values)
    (corrections,) = _linear_scans([(deltas, gamma * (1.0 - dones) * c)])
    vs = values + corrections
    vs_following = jnp.concatenate([vs[1:], next_values[-1:]], axis=0)
    vs_next = jnp.where(dones > 0, next_values, vs_following)
    pg_advantages = rho * (rewards + gamma * not_term * vs_next - values)
    return jax.lax.stop_gradient(vs), jax.lax.stop_gradient(pg_advantages)
