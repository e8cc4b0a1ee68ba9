"""IMPALA: a V-trace actor-critic (Espeholt et al. 2018), PPO's sibling on the shared
actor-critic networks, rollout and SGD machinery (:mod:`tclock.agents.actor_critic`).  The
rollout already stores the behaviour log-probabilities, which is what V-trace needs.

The learning phase (``update_one``, one seed, ``traj`` leaves ``[T, B, ...]``):

1. the observation normaliser sees the rollout (as in PPO);
2. diagnostics at the behaviour parameters, before any step: advantage statistics of the V-trace
   policy-gradient advantages, and (``with_gdc``) the K-minibatch gradient diagnostics on
   random *transitions* whose ``adv`` / ``ret`` targets are the V-trace ``pg`` advantages and
   ``vs`` targets at the behaviour parameters;
3. ``num_epochs`` x ``num_minibatches`` SGD steps in ``lax.scan``.  A minibatch is a group of
   whole env *sequences* (the env axis B split into ``num_minibatches`` groups, reshuffled each
   epoch; V-trace needs time order), and every step recomputes the V-trace targets with the
   *current* parameters: target log-probs and values under the current parameters, behaviour
   log-probs from the rollout, ``next_values`` from the real next observations (a truncated
   step bootstraps, a terminated one does not; see :func:`tclock.advantages.vtrace`).

Loss per minibatch (:func:`tclock.agents.losses.vtrace_terms`, also what the gradient
diagnostics differentiate): ``-mean(pg * log pi(a|s)) + vf_coef * 0.5 * mean((V(s) - vs)^2) -
ent_coef * entropy`` with ``pg`` and ``vs`` constants.  Optimizer, gradient clipping and the
``lr`` argument are the shared ones.

Metrics are PPO's keys; ``clip_frac`` is the share of importance weights clipped by V-trace
(``pi/mu > vtrace_rho_bar``) at the parameters of each step, mean over the steps.

Because minibatches are groups of envs, ``num_envs`` (and every DRBS ladder size) must be a
multiple of ``num_minibatches`` (checked by the registry entry's ``validate``).

Its defaults differ from PPO's: one pass over each rollout (``num_epochs=1``, as in Espeholt et
al.) at ``lr=5e-4``.  Measured on ``pointmass_reach`` (256 envs, 1M env steps): with PPO's
4 epochs at lr 1e-3 IMPALA reached success 0.06; 4 epochs at 3e-4 left 1 of 3 seeds near 0.3;
2 epochs x 8 minibatches at 3e-4 left 2 of 5 near 0.4, 2 epochs at 5e-4 1 of 3; one epoch at
1e-3 reached 1.0 on 5 of 5 synchronous seeds but missed 0.9 on a seed of an asynchronous run
once; one epoch at 5e-4 reached >= 0.9 on 3 of 3 seeds both synchronously (by iteration 63-86 of
122) and with ``--arp`` (64-71).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from tclock import diagnostics
from tclock.advantages import vtrace
from tclock.agents import losses
from tclock.agents.acting import Trajectory
from tclock.agents.actor_critic import ActorCritic, ActorCriticState
from tclock.agents.base import LearnerSpec, LossTerms
from tclock.networks import gaussian_log_prob


class IMPALA(ActorCritic):
    """V-trace actor-critic learner; see the module docstring."""

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

    def loss_terms(self, params, normalizer, batch) -> LossTerms:
        """Per-minibatch IMPALA terms; ``batch`` holds transitions with ``adv`` (V-trace
        policy-gradient advantages) and ``ret`` (V-trace value targets ``vs``)."""
        mean, log_std = self.policy_dist(params, normalizer, batch["obs"])
        value = self.value_of(params, normalizer, batch["obs"])
        return losses.vtrace_terms(mean, log_std, value, batch, self.cfg.vtrace_rho_bar)

    def phase_data(self, state: ActorCriticState, traj: Trajectory):
        """``(normalizer, transitions with V-trace targets at the behaviour parameters, pg)``."""
        normalizer = self.observe(state.normalizer, traj)
        vs, pg = self.targets(state.params, normalizer, traj)
        return normalizer, self.transitions(traj, pg, vs), pg

    def can_split(self, num_envs: int) -> bool:
        half = num_envs // 2
        return half > 0 and half % self.cfg.num_minibatches == 0

    def update_one(self, state: ActorCriticState, traj: Trajectory, lr, with_gdc: bool):
        """One seed's learning phase. ``traj`` leaves are ``[T, B, ...]``."""
        cfg = self.cfg
        T, B = traj.reward.shape[:2]
        groups = cfg.num_minibatches
        if B % groups:  # the registry entry's validate keeps configs (and DRBS ladders) from getting here
            raise ValueError(f"IMPALA: {B} env sequences cannot be split into {groups} minibatches")
        normalizer, data, pg = self.phase_data(state, traj)
        params = state.params
        metrics = dict(diagnostics.advantage_stats(pg))
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


def validate_impala(cfg) -> None:
    from tclock.errors import ConfigError

    if cfg.num_envs % cfg.num_minibatches:
        raise ConfigError(f"num_minibatches: IMPALA splits the {cfg.num_envs} env sequences into minibatches, so "
                          f"num_envs must be divisible by num_minibatches={cfg.num_minibatches}; pick a divisor "
                          f"of {cfg.num_envs} or change num_envs")


SPEC = LearnerSpec(
    name="impala",
    factory=IMPALA,
    description="IMPALA: V-trace actor-critic (rho_bar = c_bar = 1), minibatches of whole env sequences",
    defaults={"num_epochs": 1, "lr": 5e-4},
    fields=("vtrace_rho_bar", "vtrace_c_bar", "vtrace_lambda"),
    batch_multiple=lambda cfg: cfg.num_minibatches,
    validate=validate_impala,
)
