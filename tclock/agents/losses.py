"""Loss terms as pure functions of network outputs and a minibatch (the way Brax keeps
``compute_ppo_loss`` apart from its trainer).  Each returns :class:`LossTerms`."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from tclock.agents.base import LossTerms
from tclock.networks import gaussian_entropy, gaussian_log_prob


def ppo_terms(mean, log_std, value, batch: dict, clip_eps: float) -> LossTerms:
    """Clipped surrogate on per-minibatch normalised advantages, squared-error value loss,
    Gaussian entropy.  ``aux``: ``clip_frac`` (ratio outside ``1 ± clip_eps``) and
    ``approx_kl`` (``mean((r - 1) - log r)``, r the probability ratio)."""
    logp = gaussian_log_prob(mean, log_std, batch["action"])
    log_ratio = logp - batch["logp"]
    ratio = jnp.exp(log_ratio)
    adv = batch["adv"]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg_loss = -jnp.mean(jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv))
    v_loss = 0.5 * jnp.mean(jnp.square(value - batch["ret"]))
    entropy = jnp.mean(gaussian_entropy(log_std))
    aux = {"clip_frac": jnp.mean(jnp.abs(ratio - 1.0) > clip_eps),
           "approx_kl": jnp.mean((ratio - 1.0) - log_ratio)}
    return LossTerms(pg_loss, v_loss, entropy, aux)


def vtrace_terms(mean, log_std, value, batch: dict, rho_bar: float) -> LossTerms:
    """IMPALA: policy gradient on V-trace advantages ``adv`` and value regression to V-trace
    targets ``ret`` (both constants).  ``aux``: ``clip_frac`` (importance weights above
    ``rho_bar``) and ``approx_kl`` (``mean(expm1(log r) - log r)``)."""
    logp = gaussian_log_prob(mean, log_std, batch["action"])
    pg_loss = -jnp.mean(jax.lax.stop_gradient(batch["adv"]) * logp)
    v_loss = 0.5 * jnp.mean(jnp.square(value - jax.lax.stop_gradient(batch["ret"])))
    entropy = jnp.mean(gaussian_entropy(log_std))
    log_ratio = logp - batch["logp"]
    ratio = jnp.exp(log_ratio)
    aux = {"clip_frac": jnp.mean(ratio > rho_bar),
           "approx_kl": jnp.mean(jnp.expm1(log_ratio) - log_ratio)}
    return LossTerms(pg_loss, v_loss, entropy, aux)


def combine(terms: LossTerms, vf_coef: float, ent_coef: float):
    """``(total, info)``: the scalar the optimizer minimises and the per-step metrics."""
    total = terms.policy + vf_coef * terms.value - ent_coef * terms.entropy
    return total, {"policy_loss": terms.policy, "value_loss": terms.value, "entropy": terms.entropy, **terms.aux}


def behaviour_kl(mean, log_std, action, behaviour_logp):
    """KL(behaviour ‖ current) on the rollout, estimated as ``mean(r - 1 - log r)``."""
    log_ratio = gaussian_log_prob(mean, log_std, action) - behaviour_logp
    return jnp.mean(jnp.expm1(log_ratio) - log_ratio)
