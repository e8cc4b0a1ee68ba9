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


# ---------------------------------------------------------------------------- SAC
def sac_critic_target(reward, termination, next_q, next_logp, alpha, gamma: float):
    """Soft TD target ``r + gamma (1 - termination) (min_i Q'_i(s', a') - alpha log pi(a'|s'))``.

    ``next_q`` ``[..., 2]``: the target critics at the real next state (the final observation
    of a truncated episode, so truncation bootstraps; a termination does not)."""
    soft = jnp.min(next_q, axis=-1) - alpha * next_logp
    return reward + gamma * (1.0 - termination) * soft


def sac_critic_loss(q, target):
    """``0.5 * mean((Q_i - y)^2)`` summed over the two critics (``q`` ``[n, 2]``, ``y`` constant)."""
    return 0.5 * jnp.sum(jnp.mean(jnp.square(q - jax.lax.stop_gradient(target)[..., None]), axis=0))


def sac_actor_loss(q, logp, alpha):
    """``mean(alpha log pi(a|s) - min_i Q_i(s, a))`` for reparameterised ``a ~ pi(s)``."""
    return jnp.mean(alpha * logp - jnp.min(q, axis=-1))


def sac_alpha_loss(log_alpha, logp, target_entropy: float):
    """``mean(alpha * (-log pi - target_entropy))`` with the log-probabilities held constant:
    lowers alpha when the policy's entropy is above the target, raises it below."""
    return jnp.mean(jnp.exp(log_alpha) * jax.lax.stop_gradient(-logp - target_entropy))
