"""PPO: clipped surrogate on GAE (or HAE) advantages, epochs x shuffled minibatches.

The learning phase of one seed (``update_one``, ``traj`` leaves ``[T, B, ...]``): the
observation normaliser sees the rollout; values of the observed and the real next states;
advantages (``advantage``: GAE, or HAE, see :mod:`tclock.advantages`); cheap diagnostics;
optionally the K-minibatch gradient diagnostics at the behaviour parameters (before any step);
then ``num_epochs`` x ``num_minibatches`` steps of :func:`tclock.agents.losses.ppo_terms` in
``lax.scan``.  ``lr`` is an argument, so learning-rate schedules never recompile.
"""
from __future__ import annotations

import jax

from tclock import diagnostics
from tclock.advantages import gae, hae
from tclock.agents import losses, sgd
from tclock.agents.acting import Trajectory
from tclock.agents.actor_critic import ActorCritic, ActorCriticState
from tclock.agents.base import LearnerSpec, LossTerms

PPOState = ActorCriticState


class PPO(ActorCritic):
    def loss_terms(self, params, normalizer, batch) -> LossTerms:
        """Per-minibatch PPO terms (see :func:`tclock.agents.losses.ppo_terms`)."""
        mean, log_std = self.policy_dist(params, normalizer, batch["obs"])
        value = self.value_of(params, normalizer, batch["obs"])
        return losses.ppo_terms(mean, log_std, value, batch, self.cfg.clip_eps)

    def advantages(self, rewards, values, next_values, terminations, truncations):
        cfg = self.cfg
        if cfg.advantage == "hae":
            return hae(rewards, values, next_values, terminations, truncations, cfg.gamma, cfg.gae_lambda,
                       window=cfg.hae_window, threshold=cfg.hae_threshold, window_bootstrap=cfg.hae_window_bootstrap,
                       combine=cfg.hae_combine, outside=cfg.hae_outside, max_events=cfg.hae_max_events or None)
        return gae(rewards, values, next_values, terminations, truncations, cfg.gamma, cfg.gae_lambda)

    def phase_data(self, state: ActorCriticState, traj: Trajectory):
        """``(normalizer, transitions with GAE/HAE targets at the behaviour parameters, adv)``."""
        cfg = self.cfg
        normalizer = self.observe(state.normalizer, traj)
        values = self.value_of(state.params, normalizer, traj.obs)
        next_values = self.value_of(state.params, normalizer, traj.final_obs)
        adv, ret = self.advantages(traj.reward * cfg.reward_scale, values, next_values, traj.termination,
                                   traj.truncation)
        return normalizer, self.transitions(traj, adv, ret), adv

    def update_one(self, state: ActorCriticState, traj: Trajectory, lr, with_gdc: bool):
        """One seed's learning phase. ``traj`` leaves are ``[T, B, ...]``."""
        cfg = self.cfg
        normalizer, data, adv = self.phase_data(state, traj)
        params = state.params
        metrics = dict(diagnostics.advantage_stats(adv))
        key, k_diag, k_epochs = jax.random.split(state.key, 3)
        if with_gdc:
            metrics.update(self.gradient_diagnostics(params, normalizer, data, k_diag))
        params, opt_state, info = self.sgd_epochs(
            params, state.opt_state, lr, k_epochs, lambda k: sgd.shuffled_minibatches(data, cfg.num_minibatches, k),
            lambda carry, mb: self.sgd_step(carry, normalizer, mb))
        return self.finish_update(state, params, opt_state, normalizer, key, data, lr, info, metrics)


def ppo_batch_multiple(cfg) -> int:
    """PPO splits the B*T transitions of a rollout into ``num_minibatches`` equal parts."""
    import math

    return cfg.num_minibatches // math.gcd(cfg.num_minibatches, cfg.unroll_length)


SPEC = LearnerSpec(
    name="ppo",
    factory=PPO,
    description="PPO: clipped surrogate, GAE or HAE, observation normalisation, epochs x minibatches",
    fields=("clip_eps", "gae_lambda", "advantage", "hae_window", "hae_threshold", "hae_combine", "hae_outside",
            "hae_window_bootstrap", "hae_max_events"),
    batch_multiple=ppo_batch_multiple,
)
