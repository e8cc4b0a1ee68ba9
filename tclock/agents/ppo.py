"""PPO: init, rollout and update as separate pure functions, seeds on a leading axis.

``PPO(cfg, env)`` builds three functions that the host loop jits:

* ``init(seed) -> state``                 a ``PPOState`` with a leading seed axis S.
* ``rollout(state) -> (state, traj, m)``  T steps of S*B envs; the policy is vmapped over
  seeds, the env steps one flat batch of S*B envs (so the auto-reset's ``lax.cond`` is
  real, not a select).  ``traj`` is time-major ``[T, S, B, ...]``.
* ``update(state, traj, lr, with_gdc) -> (state, m)``  per seed (vmapped): observation
  statistics, values of the real next states, advantages, cheap diagnostics, optionally
  K-minibatch gradient diagnostics at the behaviour parameters (before any step), then
  epochs x minibatches of clipped-surrogate steps in ``lax.scan``.  ``lr`` is an argument,
  so learning-rate schedules (on steps or on the wall clock) never recompile.

All metrics come back as arrays with a leading seed axis.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from brax.training.acme import specs
from brax.training.acme import running_statistics
from flax import struct

from tclock import diagnostics
from tclock.advantages import gae, hae
from tclock.config import TrainConfig
from tclock.envs.wrappers import BatchedEnv, EnvCarry
from tclock.networks import GaussianPolicy, ValueNet, gaussian_entropy, gaussian_log_prob, sample_gaussian


@struct.dataclass
class PPOState:
    params: Any
    opt_state: Any
    normalizer: Any
    env: EnvCarry
    key: jax.Array
    last_return: jax.Array  # mean return of the latest rollout that finished an episode
    last_success: jax.Array  # success rate of the latest rollout that finished an episode


@struct.dataclass
class Trajectory:
    obs: jax.Array
    action: jax.Array  # unclipped Gaussian sample (the env sees it clipped to [-1, 1])
    logp: jax.Array  # behaviour log-probability of ``action``
    reward: jax.Array
    termination: jax.Array
    truncation: jax.Array
    final_obs: jax.Array
    success: jax.Array
    done_return: jax.Array
    done_success: jax.Array


def _make_optimizer(max_grad_norm: float):
    def factory(learning_rate):
        return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(learning_rate, eps=1e-5))

    return optax.inject_hyperparams(factory)(learning_rate=0.0)


@dataclass
class PPO:
    cfg: TrainConfig
    env: BatchedEnv

    def __post_init__(self):
        cfg = self.cfg
        self.obs_size = self.env.observation_size
        self.action_size = self.env.action_size
        self.policy = GaussianPolicy(tuple(cfg.policy_hidden), self.action_size, cfg.activation)
        self.value = ValueNet(tuple(cfg.value_hidden), cfg.activation)
        self.optimizer = _make_optimizer(cfg.max_grad_norm)

    # ------------------------------------------------------------------ init
    def init_one(self, key: jax.Array) -> PPOState:
        k_pi, k_v, k_env, k_state = jax.random.split(key, 4)
        dummy = jnp.zeros((1, self.obs_size))
        params = {"policy": self.policy.init(k_pi, dummy), "value": self.value.init(k_v, dummy)}
        normalizer = running_statistics.init_state(specs.Array((self.obs_size,), jnp.dtype("float32")))
        zero = jnp.zeros(())
        return PPOState(params=params, opt_state=self.optimizer.init(params), normalizer=normalizer,
                        env=self.env.reset(k_env), key=k_state, last_return=zero, last_success=zero)

    def init(self, seed: int, num_seeds: int) -> PPOState:
        keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(seed), i))(jnp.arange(num_seeds))
        return jax.vmap(self.init_one)(keys)

    # ------------------------------------------------------------------ networks
    def _normalize(self, normalizer, obs):
        if not self.cfg.normalize_obs:
            return obs
        return running_statistics.normalize(obs, normalizer)

    def policy_dist(self, params, normalizer, obs):
        return self.policy.apply(params["policy"], self._normalize(normalizer, obs))

    def value_of(self, params, normalizer, obs):
        return self.value.apply(params["value"], self._normalize(normalizer, obs))

    # ------------------------------------------------------------------ rollout
    def rollout(self, state: PPOState, active: int | None = None):
        """Steps the first ``active`` envs of the pool (all by default); the rest stay paused
        mid-episode, so changing the batch size (DRBS) never throws an episode away."""
        S = state.key.shape[0]
        pool = self.env.num_envs
        B = active or pool
        flat = lambda x: x.reshape((S * B,) + x.shape[2:])  # noqa: E731
        unflat = lambda x: x.reshape((S, B) + x.shape[1:])  # noqa: E731
        keys = jax.vmap(lambda k: jax.random.split(k, self.cfg.unroll_length + 1))(state.key)
        step_keys = jnp.swapaxes(keys[:, 1:], 0, 1)  # [T, S, 2]

        def act(params, normalizer, obs, key):
            mean, log_std = self.policy_dist(params, normalizer, obs)
            action = sample_gaussian(key, mean, log_std)
            return action, gaussian_log_prob(mean, log_std, action)

        def step(env_carry, key_s):
            obs = env_carry.state.obs.reshape((S, B, -1))
            action, logp = jax.vmap(act)(state.params, state.normalizer, obs, key_s)
            env_carry, tr = self.env.step(env_carry, flat(jnp.clip(action, -1.0, 1.0)))
            out = Trajectory(obs=obs, action=action, logp=logp, reward=unflat(tr.reward),
                             termination=unflat(tr.termination), truncation=unflat(tr.truncation),
                             final_obs=unflat(tr.final_obs), success=unflat(tr.success),
                             done_return=unflat(tr.done_return), done_success=unflat(tr.done_success))
            return env_carry, out

        env_carry = jax.tree.map(lambda x: flat(x[:, :B]), state.env)
        env_carry, traj = jax.lax.scan(step, env_carry, step_keys)
        env_carry = jax.tree.map(unflat, env_carry)
        if B < pool:
            env_carry = jax.tree.map(lambda p, a: p.at[:, :B].set(a), state.env, env_carry)

        dones = traj.termination + traj.truncation
        episodes = dones.sum(axis=(0, 2))
        finished = episodes > 0
        ep_return = jnp.where(finished, traj.done_return.sum(axis=(0, 2)) / jnp.maximum(episodes, 1), state.last_return)
        success_rate = jnp.where(finished, traj.done_success.sum(axis=(0, 2)) / jnp.maximum(episodes, 1),
                                 state.last_success)
        state = state.replace(env=env_carry, key=keys[:, 0],
                              last_return=ep_return, last_success=success_rate)
        metrics = {
            "episode_return": ep_return,
            "success_rate": success_rate,
            "episodes": episodes,
            "success_episode_rate": jnp.where(finished, success_rate, jnp.nan),
            "activation_rate": jax.vmap(diagnostics.activation_rate, in_axes=1)(traj.reward),
        }
        return state, traj, metrics

    # ------------------------------------------------------------------ losses
    def loss_terms(self, params, normalizer, batch):
        """Per-minibatch PPO terms: (policy loss, value loss, entropy, aux)."""
        cfg = self.cfg
        mean, log_std = self.policy_dist(params, normalizer, batch["obs"])
        logp = gaussian_log_prob(mean, log_std, batch["action"])
        log_ratio = logp - batch["logp"]
        ratio = jnp.exp(log_ratio)
        adv = batch["adv"]
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg_loss = -jnp.mean(jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv))
        value = self.value_of(params, normalizer, batch["obs"])
        v_loss = 0.5 * jnp.mean(jnp.square(value - batch["ret"]))
        entropy = jnp.mean(gaussian_entropy(log_std))
        aux = {"clip_frac": jnp.mean(jnp.abs(ratio - 1.0) > cfg.clip_eps),
               "approx_kl": jnp.mean((ratio - 1.0) - log_ratio)}
        return pg_loss, v_loss, entropy, aux

    def total_loss(self, params, normalizer, batch):
        pg, vl, ent, aux = self.loss_terms(params, normalizer, batch)
        total = pg + self.cfg.vf_coef * vl - self.cfg.ent_coef * ent
        return total, {"policy_loss": pg, "value_loss": vl, "entropy": ent, **aux}

    # ------------------------------------------------------------------ gradient diagnostics
    def gradient_diagnostics(self, params, normalizer, data, key):
        """GDC and noise scale from K random minibatches at the behaviour parameters."""
        cfg = self.cfg
        n = data["obs"].shape[0]
        # Sampling with replacement: the setting in which the noise-scale estimator is unbiased,
        # and far cheaper on a CPU than a permutation of all n transitions per minibatch.
        idx = jax.random.randint(key, (cfg.gdc_k, cfg.gdc_minibatch), 0, n)
        minibatches = jax.tree.map(lambda x: x[idx], data)  # [K, m, ...]

        def terms(p, mb):
            pg, vl, ent, _ = self.loss_terms(p, normalizer, mb)
            return jnp.stack([pg, vl, ent])

        jac = jax.vmap(lambda mb: jax.jacrev(terms)(params, mb))(minibatches)  # leaves [K, 3, ...]
        pick = lambda i: jax.tree.map(lambda g: g[:, i], jac)  # noqa: E731
        g_pg, g_vl, g_ent = pick(0), pick(1), pick(2)
        g_total = jax.tree.map(lambda a, b, c: a + cfg.vf_coef * b - cfg.ent_coef * c, g_pg, g_vl, g_ent)
        noise = diagnostics.noise_scale(g_total, cfg.gdc_minibatch)
        return {
            "gdc": diagnostics.gdc(g_total),
            "gdc_policy": diagnostics.gdc(g_pg["policy"]),
            "gdc_value": diagnostics.gdc(g_vl["value"]),
            "b_simple": noise["b_simple"],
            "grad_norm_sq": noise["grad_norm_sq"],
            "trace_sigma": noise["trace_sigma"],
        }

    # ------------------------------------------------------------------ learning-phase pieces
    # Shared by every learner built on PPO (see agents/impala.py): the normaliser update that
    # opens a learning phase, the flat transition batch, the SGD machinery with the injected
    # learning rate, and the metrics / state that close it.
    def observe(self, normalizer, traj: Trajectory):
        """The observation normaliser after seeing this rollout (first step of a learning phase)."""
        if self.cfg.normalize_obs:
            return running_statistics.update(normalizer, traj.obs)
        return normalizer

    @staticmethod
    def transitions(traj: Trajectory, adv, ret) -> dict:
        """The ``[T, B, ...]`` rollout as one flat batch of ``T*B`` transitions with targets."""
        n = adv.size
        flat = lambda x: x.reshape((n,) + x.shape[2:])  # noqa: E731
        return {"obs": flat(traj.obs), "action": flat(traj.action), "logp": flat(traj.logp),
                "adv": flat(adv), "ret": flat(ret)}

    def sgd_step(self, carry, normalizer, batch):
        """One optimizer step on ``total_loss`` of ``batch``: ``(params, opt_state) -> (new, info)``."""
        params, opt_state = carry
        grads, info = jax.grad(self.total_loss, has_aux=True)(params, normalizer, batch)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), info

    def sgd_epochs(self, params, opt_state, lr, key, minibatches, step):
        """``num_epochs`` passes in ``lax.scan`` at learning rate ``lr``.

        ``minibatches(k)`` gives one epoch's minibatches stacked on a leading axis (shuffled
        with key ``k``); ``step(carry, minibatch)`` is one SGD step on ``(params, opt_state)``.
        Returns ``(params, opt_state, info)`` with ``info`` leaves ``[epochs, minibatches]``."""
        opt_state = opt_state._replace(hyperparams={**opt_state.hyperparams,
                                                    "learning_rate": jnp.asarray(lr, jnp.float32)})

        def epoch(carry, k):
            return jax.lax.scan(step, carry, minibatches(k))

        (params, opt_state), info = jax.lax.scan(epoch, (params, opt_state),
                                                 jax.random.split(key, self.cfg.num_epochs))
        return params, opt_state, info

    def finish_update(self, state: PPOState, params, opt_state, normalizer, key, data, lr, info, metrics):
        """Closes a learning phase: mean step metrics, KL to the behaviour policy on the rollout
        ``data``, ``lr``, ``finite``; returns ``(new_state, metrics)``."""
        metrics.update({k: v.mean() for k, v in info.items() if k != "approx_kl"})
        mean, log_std = self.policy_dist(params, normalizer, data["obs"])
        log_ratio = gaussian_log_prob(mean, log_std, data["action"]) - data["logp"]
        metrics["kl_behavior"] = jnp.mean(jnp.expm1(log_ratio) - log_ratio)
        metrics["lr"] = jnp.asarray(lr, jnp.float32)
        leaves = jax.tree.leaves(params)
        metrics["finite"] = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])) & jnp.isfinite(
            metrics["policy_loss"]) & jnp.isfinite(metrics["value_loss"])
        new_state = state.replace(params=params, opt_state=opt_state, normalizer=normalizer, key=key)
        return new_state, metrics

    # ------------------------------------------------------------------ update
    def advantages(self, rewards, values, next_values, terminations, truncations):
        cfg = self.cfg
        if cfg.advantage == "hae":
            return hae(rewards, values, next_values, terminations, truncations, cfg.gamma, cfg.gae_lambda,
                       window=cfg.hae_window, threshold=cfg.hae_threshold, window_bootstrap=cfg.hae_window_bootstrap,
                       combine=cfg.hae_combine, outside=cfg.hae_outside, max_events=cfg.hae_max_events or None)
        return gae(rewards, values, next_values, terminations, truncations, cfg.gamma, cfg.gae_lambda)

    def update_one(self, state: PPOState, traj: Trajectory, lr, with_gdc: bool):
        """One seed's learning phase. ``traj`` leaves are ``[T, B, ...]``."""
        cfg = self.cfg
        normalizer = self.observe(state.normalizer, traj)
        params = state.params
        values = self.value_of(params, normalizer, traj.obs)
        next_values = self.value_of(params, normalizer, traj.final_obs)
        adv, ret = self.advantages(traj.reward * cfg.reward_scale, values, next_values, traj.termination,
                                   traj.truncation)
        metrics = dict(diagnostics.advantage_stats(adv))
        data = self.transitions(traj, adv, ret)
        key, k_diag, k_epochs = jax.random.split(state.key, 3)
        if with_gdc:
            metrics.update(self.gradient_diagnostics(params, normalizer, data, k_diag))

        n = adv.size
        mb_size = n // cfg.num_minibatches

        def minibatches(k):
            perm = jnp.argsort(jax.random.uniform(k, (n,)))  # a permutation; cheaper than random.permutation
            return jax.tree.map(lambda x: x[perm].reshape((cfg.num_minibatches, mb_size) + x.shape[1:]), data)

        params, opt_state, info = self.sgd_epochs(params, state.opt_state, lr, k_epochs, minibatches,
                                                  lambda carry, mb: self.sgd_step(carry, normalizer, mb))
        return self.finish_update(state, params, opt_state, normalizer, key, data, lr, info, metrics)

    def update(self, state: PPOState, traj: Trajectory, lr, with_gdc: bool = False):
        return jax.vmap(lambda s, t: self.update_one(s, t, lr, with_gdc), in_axes=(0, 1))(state, traj)
