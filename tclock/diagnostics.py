"""Batch diagnostics: pure JAX array math, jit- and vmap-compatible, no host sync.

Everything here is a pure function of arrays that already live on the device (a rollout batch,
its advantages, K minibatch gradients).  Nothing calls ``float()``/``.item()`` or branches in
Python on array values, so each function can sit inside a jitted rollout/update step and be
vmapped over seeds.  Results are 0-d arrays (or dicts of them); the host loop decides when to
pull them.

Words follow docs/design.md §2:

* activation rate: fraction of transitions with reward > 0.
* GDC: mean pairwise cosine similarity of K minibatch gradients taken at the same parameters
  from one rollout buffer (K=5 gives 10 pairs).
* ``b_simple``: gradient noise scale ``tr(Sigma)/|G|^2`` (McCandlish et al. 2018) estimated
  from the same K gradients.  It is in **transitions** (the unit of the minibatch size ``b``);
  divide by ``unroll_length`` T to put it in envs next to ``B_crit``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "activation_rate",
    "finished_episode_success",
    "advantage_stats",
    "flatten_stacked",
    "gdc",
    "gdc_from_flat",
    "noise_scale",
    "noise_scale_from_flat",
]


def _as_float(x):
    """Cast to a floating dtype (keeps float64 when x64 is on and the input is float64)."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    return x


# --------------------------------------------------------------------------- rewards / episodes


def activation_rate(rewards):
    """Share of entries with ``reward > 0`` over an array of any shape (a 0-d float array).

    ``activation_rate = #{r > 0} / #{r}``.  With sparse verifiable rewards this is the fraction
    of transitions in a rollout that carry any learning signal at all.  Dimensionless, in [0, 1].
    An empty array gives NaN (0/0); rollouts are never empty.
    """
    rewards = jnp.asarray(rewards)
    return jnp.mean((rewards > 0).astype(jnp.result_type(float)))


def finished_episode_success(success_flags, dones):
    """Share of episodes that finished in this batch and succeeded, and how many finished.

    The rollout's logged ``success_rate`` is this rate, carried over from the previous rollout
    when no episode finished; the logged ``success_episode_rate`` is this rate, null then.

    Args:
      success_flags: ``[T, B]`` ``episode_success``: 1.0 at a step where the episode that ends
        at that step had succeeded at least once, 0.0 otherwise.  Values at steps that are not
        episode ends are ignored (they are masked by ``dones``).
      dones: ``[T, B]`` 1.0 (or True) where an episode ended at that step (termination or
        truncation).

    Any matching shapes work (the reductions are over all entries).

    Returns:
      ``(rate, count)`` as 0-d float arrays, with
      ``count = sum(done)`` (finished episodes) and
      ``rate = sum(done * (success > 0)) / count``.
      When no episode ended in the batch (``count == 0``) the rate is **0.0**, not NaN, so it can
      be logged and averaged; use ``count`` to tell "no episode finished" from "none succeeded".
    """
    ftype = jnp.result_type(float)
    done = (jnp.asarray(dones) > 0).astype(ftype)
    succ = (jnp.asarray(success_flags) > 0).astype(ftype)
    count = jnp.sum(done)
    n_succ = jnp.sum(done * succ)
    rate = jnp.where(count > 0, n_succ / jnp.maximum(count, 1.0), 0.0)
    return rate, count


# --------------------------------------------------------------------------- advantages

# Relative threshold under which the spread of the advantages is treated as zero (constant
# input).  Float32 rounding of the mean alone leaves a spread of ~1e-7 * max|A|; real
# advantages are many orders of magnitude above this.
_SKEW_REL_EPS = 1e-5
_TINY = 1e-30


def advantage_stats(adv):
    """Summary statistics of raw (unnormalised) advantages, flattened over all axes.

    Returns a dict of 0-d arrays:

    * ``adv_mean``  = mu = mean(A)
    * ``adv_std``   = sigma = sqrt(mean((A - mu)^2))  (population std, ddof=0)
    * ``adv_skew``  = mean((A - mu)^3) / sigma^3  (population / biased skewness, as
      ``scipy.stats.skew(..., bias=True)``).  Guard: when
      ``sigma <= 1e-5 * max|A| + 1e-30`` the input is treated as constant and the skew is 0
      (not NaN); this epsilon sits above float32 rounding noise of the mean and far below any
      meaningful spread.
    * ``adv_top1_share`` = (sum of the k largest |A|) / sum |A| with
      ``k = max(1, ceil(0.01 * n))`` (static, from the shape): the share of the total advantage
      magnitude held by the largest 1% of samples.  In [k/n, 1]; 0.0 when every A is 0.

    All in the units of the advantages (mean, std) or dimensionless (skew, share).
    """
    a = _as_float(adv).reshape(-1)
    n = a.shape[0]
    if n == 0:
        raise ValueError("advantage_stats needs at least one advantage")
    mu = jnp.mean(a)
    d = a - mu
    var = jnp.mean(d * d)
    sigma = jnp.sqrt(var)
    m3 = jnp.mean(d * d * d)
    absa = jnp.abs(a)
    amax = jnp.max(absa)
    degenerate = sigma <= _SKEW_REL_EPS * amax + _TINY
    safe_sigma = jnp.where(degenerate, 1.0, sigma)
    skew = jnp.where(degenerate, 0.0, m3 / safe_sigma**3)

    k = max(1, -(-n // 100))  # ceil(0.01 * n) in exact integer arithmetic
    top = jax.lax.top_k(absa, k)[0]
    total = jnp.sum(absa)
    top1 = jnp.where(total > 0, jnp.sum(top) / jnp.where(total > 0, total, 1.0), 0.0)
    return {"adv_mean": mu, "adv_std": sigma, "adv_skew": skew, "adv_top1_share": top1}


# --------------------------------------------------------------------------- gradients


def flatten_stacked(tree):
    """Flatten a pytree of K stacked gradients into one ``[K, D]`` array.

    Every leaf must have the same leading size K (the gradient index); each leaf is reshaped to
    ``[K, -1]`` and the leaves are concatenated along axis 1 in ``jax.tree_util`` leaf order, so
    row i is gradient i as one vector of all D parameters.
    """
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        raise ValueError("flatten_stacked: the gradient pytree has no leaves")
    ks = {jnp.shape(leaf)[0] if jnp.ndim(leaf) > 0 else None for leaf in leaves}
    if len(ks) != 1 or None in ks:
        raise ValueError(
            f"flatten_stacked: every leaf needs the same leading axis K (got leading sizes {ks})"
        )
    k = ks.pop()
    parts = [_as_float(leaf).reshape(k, -1) for leaf in leaves]
    dtype = jnp.result_type(*parts)
    return jnp.concatenate([p.astype(dtype) for p in parts], axis=1)


def _cross_sum(flat):
    """``sum_{i != j} x_i . x_j = |sum_i x_i|^2 - sum_i |x_i|^2`` for rows of ``flat``.

    Computed as ``sum_i x_i . (S - x_i)`` with ``S = sum_i x_i``: the same O(K D) work, but the
    large ``|x_i|^2`` terms never get subtracted from each other, so little precision is lost
    when the cross terms are small compared with the norms (noisy gradients).
    """
    s = jnp.sum(flat, axis=0)
    return jnp.sum(flat * (s[None, :] - flat))


def _stacked(flat, who: str, what: str):
    """``flat`` as a float ``[K, D]`` array with K >= 2 (static), and K."""
    flat = _as_float(flat)
    if flat.ndim != 2:
        raise ValueError(f"{who} expects a [K, D] array, got shape {flat.shape}")
    k = flat.shape[0]
    if k < 2:
        raise ValueError(f"{what} needs at least K=2 gradients, got K={k}")
    return flat, k


def gdc_from_flat(flat):
    """GDC (gradient direction consistency) of K gradients given as a ``[K, D]`` array.

    ``u_i = g_i / |g_i|`` and
    ``GDC = 2/(K(K-1)) * sum_{i<j} u_i . u_j = (|sum_i u_i|^2 - sum_i |u_i|^2) / (K(K-1))``,
    which for non-zero gradients equals ``(|sum_i u_i|^2 - K) / (K(K-1))``: the mean pairwise
    cosine similarity over the K(K-1)/2 pairs, in O(K D) work.  A zero-norm gradient gets
    ``u_i = 0`` (no NaN): it contributes cosine 0 to each of its pairs.  Dimensionless, in
    [-1, 1].  Needs K >= 2 (static).
    """
    flat, k = _stacked(flat, "gdc_from_flat", "GDC")
    norms = jnp.sqrt(jnp.sum(flat * flat, axis=1, keepdims=True))
    nonzero = norms > 0
    u = jnp.where(nonzero, flat / jnp.where(nonzero, norms, 1.0), 0.0)
    return _cross_sum(u) / (k * (k - 1))


def gdc(grads):
    """Mean pairwise cosine similarity of K gradients stacked on each leaf's leading axis.

    ``grads`` is a pytree (e.g. flax params) whose leaves have shape ``[K, ...]``; see
    :func:`flatten_stacked` and :func:`gdc_from_flat` for the formula.  K=5 gives 10 pairs.
    """
    return gdc_from_flat(flatten_stacked(grads))


def noise_scale_from_flat(flat, minibatch_size):
    """Gradient noise scale from K minibatch gradients given as a ``[K, D]`` array.

    With K gradients ``g_i`` each averaged over a minibatch of ``b = minibatch_size``
    transitions, ``E g_i = G`` and ``Cov g_i = Sigma / b`` (Sigma: per-transition gradient
    covariance), and for independent minibatches:

    * ``grad_norm_sq`` = p = ``(|sum_i g_i|^2 - sum_i |g_i|^2) / (K(K-1))``
      = mean over i != j of ``g_i . g_j``, an unbiased estimate of ``|G|^2``.  It can be <= 0
      when the noise swamps the signal.
    * ``mean_grad_sq_norm`` = m2 = ``mean_i |g_i|^2``, unbiased for ``|G|^2 + tr(Sigma)/b``.
    * ``trace_sigma`` = ``b * (m2 - p)``, unbiased for ``tr(Sigma)`` (per-transition units).
    * ``b_simple`` = ``trace_sigma / p`` when ``p > 0``, else **NaN** ("gradient signal not
      detectable at this K": the estimate of |G|^2 is not positive).  Unit: **transitions**;
      divide by ``unroll_length`` T for envs (``critical.b_simple_to_envs``).  As a ratio of
      two unbiased estimates it is itself biased for small K; read it as an order of magnitude.
    * ``b_simple_valid`` = ``p > 0`` (bool).

    Caveat: the minibatches come from one rollout buffer of correlated transitions (tclock
    samples them with replacement), so they are not truly independent; the estimates describe the
    gradient noise *within that buffer*.  Needs K >= 2 (static).
    """
    flat, k = _stacked(flat, "noise_scale_from_flat", "the noise scale")
    b = jnp.asarray(minibatch_size, dtype=flat.dtype)
    p = _cross_sum(flat) / (k * (k - 1))
    m2 = jnp.mean(jnp.sum(flat * flat, axis=1))
    trace_sigma = b * (m2 - p)
    valid = p > 0
    b_simple = jnp.where(valid, trace_sigma / jnp.where(valid, p, 1.0), jnp.nan)
    return {
        "grad_norm_sq": p,
        "mean_grad_sq_norm": m2,
        "trace_sigma": trace_sigma,
        "b_simple": b_simple,
        "b_simple_valid": valid,
    }


def noise_scale(grads, minibatch_size):
    """Gradient noise scale ``b_simple = tr(Sigma)/|G|^2`` from K stacked minibatch gradients.

    ``grads`` is a pytree whose leaves have shape ``[K, ...]`` (one gradient per minibatch of
    ``minibatch_size`` transitions, all at the same parameters).  Returns the dict described in
    :func:`noise_scale_from_flat`: ``grad_norm_sq``, ``mean_grad_sq_norm``, ``trace_sigma``,
    ``b_simple`` (transitions; NaN when ``grad_norm_sq <= 0``) and ``b_simple_valid``.
    """
    return noise_scale_from_flat(flatten_stacked(grads), minibatch_size)
