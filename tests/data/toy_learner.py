"""A toy learner registered from outside tclock (``tclock train --import toy_learner.py --algo vpg``).

Vanilla policy gradient with a value baseline: GAE advantages, one epoch, one full-batch step
of ``-mean(adv * log pi) + vf_coef * value loss - ent_coef * entropy``.  It is built only from
tclock's public learner pieces and registered with one call; nothing else in tclock knows it.
"""
import jax
import jax.numpy as jnp

from tclock import diagnostics
from tclock.advantages import gae
from tclock.agents import ActorCritic, LearnerSpec, LossTerms, register_learner
from tclock.networks import gaussian_entropy, gaussian_log_prob


class VPG(ActorCritic):
    def loss_terms(self, params, normalizer, batch):
        mean, log_std = self.policy_dist(params, normalizer, batch["obs"])
        logp = gaussian_log_prob(mean, log_std, batch["action"])
        adv = jax.lax.stop_gradient(batch["adv"])
        value = self.value_of(params, normalizer, batch["obs"])
        return LossTerms(policy=-jnp.mean(adv * logp), value=0.5 * jnp.mean(jnp.square(value - batch["ret"])),
                         entropy=jnp.mean(gaussian_entropy(log_std)), aux={"vpg_adv_abs": jnp.mean(jnp.abs(adv))})

    def update_one(self, state, traj, lr, with_gdc):
        cfg = self.cfg
        normalizer = self.observe(state.normalizer, traj)
        values = self.value_of(state.params, normalizer, traj.obs)
        next_values = self.value_of(state.params, normalizer, traj.final_obs)
        adv, ret = gae(traj.reward, values, next_values, traj.termination, traj.truncation, cfg.gamma, cfg.gae_lambda)
        metrics = dict(diagnostics.advantage_stats(adv))
        data = self.transitions(traj, adv, ret)
        key, k_diag, k_sgd = jax.random.split(state.key, 3)
        if with_gdc:
            metrics.update(self.gradient_diagnostics(state.params, normalizer, data, k_diag))
        params, opt_state, info = self.sgd_epochs(
            state.params, state.opt_state, lr, k_sgd, lambda k: jax.tree.map(lambda x: x[None], data),
            lambda carry, mb: self.sgd_step(carry, normalizer, mb))
        return self.finish_update(state, params, opt_state, normalizer, key, data, lr, info, metrics)


register_learner(LearnerSpec(name="vpg", factory=VPG, description="toy: vanilla policy gradient with a baseline",
                             defaults={"num_epochs": 1, "lr": 3e-3}, metrics=("vpg_adv_abs",)), overwrite=True)
