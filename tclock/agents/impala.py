"""IMPALA: a V-trace actor-critic (Espeholt et al. 2018) on PPO's networks, rollout and loop.

``IMPALA(cfg, env)`` is a :class:`~tclock.agents.ppo.PPO` that learns differently; networks,
``init``, observation normalisation and ``rollout`` are PPO's, unchanged.  The rollout already
stores the behaviour log-probabilities, which is what V-trace needs.

The learning phase (``update_one``, one seed, ``traj`` leaves ``[T, B, ...]``):

1. the observation normaliser sees the rollout (as in PPO);
2. diagnostics at the behaviour parameters, before any step: advantage statistics of the V-trace
   policy-gradient advantages, and (``with_gdc``) PPO's K-minibatch gradient diagnostics on
   random *transitions* whose ``adv`` / ``ret`` targets are the V-trace ``pg`` advantages and
   ``vs`` targets at the behaviour parameters;
3. ``num_epochs`` x ``num_minibatches`` SGD steps in ``lax.scan``.  A minibatch is a group of
   whole env *sequences* (the env axis B split into ``num_minibatches`` groups, reshuffled each
   epoch; V-trace needs time order), and every step recomputes the V-trace targets with the
   *current* parameters: target log-probs and values under the current parameters, behaviour
   log-probs from the rollout, ``next_values`` from the real next observations (a truncated
   step bootstraps, a terminated one does not; see :func:`tclock.advantages.vtrace`).

Loss per minibatch (:meth:`IMPALA.loss_terms`, also what the gradient diagnostics differentiate):
``-mean(pg * log pi(a|s)) + vf_coef * 0.5 * mean((V(s) - vs)^2) - ent_coef * entropy`` with
``pg`` and ``vs`` constants.  Optimizer, gradient clipping and the ``lr`` argument are PPO's.

Metrics are PPO's keys; ``clip_frac`` is the share of importance weights clipped by V-trace
(``pi/mu > vtrace_rho_bar``) at the parameters of each step, mean over the steps.

Because minibatches are groups of envs, ``num_envs`` (and every DRBS ladder size) must be a
multiple of ``num_minibatches``.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp

from tclock import diagnostics
from tclock.advantages import vtrace
from tclock.agents.ppo import PPO, PPOState, Trajectory
from tclock.networks import gaussian_entropy, gaussian_log_prob


class IMPALA(PPO):
    """V-trace actor-critic learner; see the module docstring.

    Minibatches are groups of whole env sequences, so ``num_envs`` (and every DRBS ladder size)
    must be divisible by ``num_minibatches``; ``tclock.config.validate`` checks this up front."""

    # ------------------------------------------------------------------ V-trace targets
    def targets(self, params, normalizer, traj: Trajectory):
        """V-trace ``(vs, pg_advantages)`` of ``traj`` (leaves ``[T, B, ...]``) under ``params``.

        Target log-probs and values come from ``params``; behaviour log-probs from
        ``traj.logp``; ``next_values`` are the values of the real next observations
        (``traj.final_obs``).  Rewards are multiplied by ``reward_scale`` as in PPO.  Both
        outputs are ``[T, B]`` and carry no gradient."""
        cfg = self.cfg
        mean, log_std = self.policy_dist(params, normalizer, traj.obs)
        target_logp = gaussian_log_prob(mean, log_std, traj.action)
        values = self.value_of(params, normalizer, traj.obs)
        next_values = self.value_of(params, normalizer, traj.final_obs)
        return vtrace(traj.logp, target_logp, traj.reward * cfg.reward_scale, values, next_values,
                      traj.termination, traj.truncation, gamma=cfg.gamma, lam=cfg.vtrace_lambda,
                      rho_bar=cfg.vtrace_rho_bar, c_bar=cfg.vtrace_c_bar)

    # ------------------------------------------------------------------ losses
    def loss_terms(self, params, normalizer, batch):
        """Per-minibatch IMPALA terms: (policy loss, value loss, entropy, aux).

        ``batch`` holds transitions with ``adv`` (V-trace policy-gradient advantages) and
        ``ret`` (V-trace value targets ``vs``), both treated as constants."""
        cfg = self.cfg
        mean, log_std = self.policy_dist(params, normalizer, batch["obs"])
        logp = gaussian_log_prob(mean, log_std, batch["action"])
        pg_loss = -jnp.mean(jax.lax.stop_gradient(batch["adv"]) * logp)
        value = self.value_of(params, normalizer, batch["obs"])
        v_loss = 0.5 * jnp.mean(jnp.square(value - jax.lax.stop_gradient(batch["ret"])))
        entropy = jnp.mean(gaussian_entropy(log_std))
        log_ratio = logp - batch["logp"]
        ratio = jnp.exp(log_ratio)
        aux = {"clip_frac": jnp.mean(ratio > cfg.vtrace_rho_bar),
               "approx_kl": jnp.mean(jnp.expm1(log_ratio) - log_ratio)}
        return pg_loss, v_loss, entropy, aux

    # ------------------------------------------------------------------ update
    def update_one(self, state: PPOState, traj: Trajectory, lr, with_gdc: bool):
        """One seed's learning phase. ``traj`` leaves are ``[T, B, ...]``."""
        cfg = self.cfg
        T, B = traj.reward.shape[:2]
        groups = cfg.num_minibatches
        if B % groups:  # validate() keeps configs (and DRBS ladders) from getting here
            raise ValueError(f"IMPALA: {B} env sequences cannot be split into {groups} minibatches")
        normalizer = self.observe(state.normalizer, traj)
        params = state.params
        vs, pg = self.targets(params, normalizer, traj)  # at the behaviour parameters
        metrics = dict(diagnostics.advantage_stats(pg))
        data = self.transitions(traj, pg, vs)
        key, k_diag, k_epochs = jax.random.split(state.key, 3)
        if with_gdc:
            metrics.update(self.gradient_diagnostics(params, normalizer, data, k_diag))

        def minibatches(k):  # [groups, T, B // groups, ...]: whole sequences, time order kept
            perm = jax.random.permutation(k, B)
            return jax.tree.map(
                lambda x: jnp.swapaxes(x[:, perm].reshape((T, groups, B // groups) + x.shape[2:]), 0, 1), traj)

        def step(carry, seq):
            seq_vs, seq_pg = self.targets(carry[0], normalizer, seq)  # under the current parameters
            return self.sgd_step(carry, normalizer, self.transitions(seq, seq_pg, seq_vs))

        params, opt_state, info = self.sgd_epochs(params, state.opt_state, lr, k_epochs, minibatches, step)
        return self.finish_update(state, params, opt_state, normalizer, key, data, lr, info, metrics)
