"""SAC (Haarnoja et al. 2018): an off-policy learner on the same clocked loop as PPO.

The two clocks for an off-policy learner: a **rollout** is ``unroll_length`` steps of B envs
acting with the squashed-Gaussian actor (timed as RT; the shared
:func:`tclock.agents.acting.rollout`); the **learning phase** (its start-to-start interval is
UT) first writes the rollout's ``T*B`` transitions into the seed's replay ring
(:mod:`tclock.replay`, part of the training state, so checkpoints and ``--resume`` carry it)
and updates the observation normaliser, then runs ``G = max(1, round(sac_replay_ratio * B * T))``
gradient steps, each on ``sac_batch_size`` transitions drawn uniformly from the ring.  The
replay ratio (gradient steps per env step) is the config field, so G follows B.  Until the
ring holds ``sac_min_replay`` transitions the phase only stores (warm-up with the initial
policy) and the step metrics are ``null``.

One gradient step (:func:`tclock.agents.losses` holds the three losses as pure functions):

1. critics: ``0.5 * sum_i mean((Q_i(s, a) - y)^2)``, ``y = r + gamma (1 - termination)
   (min_i Q'_i(s', a') - alpha log pi(a'|s'))`` with ``a' ~ pi(s')`` and the target critics
   ``Q'``; ``s'`` is the real next observation (a truncated episode bootstraps from its final
   observation, a terminated one does not);
2. actor: ``mean(alpha log pi(a|s) - min_i Q_i(s, a))``, ``a ~ pi(s)`` reparameterised, with the
   critics just updated;
3. temperature: ``mean(alpha * (-log pi - target_entropy))`` with the log-probabilities held
   constant; ``target_entropy = sac_target_entropy * action_size``;
4. target critics: Polyak averaging ``Q' <- (1 - tau) Q' + tau Q``.

Each of actor, critics and temperature has its own Adam (the shared clip + Adam of
:func:`tclock.agents.sgd.make_optimizer`) at the phase's ``lr``.  Rewards are multiplied by
``reward_scale``.  With gradient diagnostics (``with_gdc``) the phase starts with ``gdc_k``
minibatch gradients of ``gdc_minibatch`` replay transitions at the phase's starting
parameters: GDC and the simple noise scale of the critic loss, of the actor loss and of both
together (``gdc``, ``b_simple``), before any step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from brax.training.acme import running_statistics, specs
from flax import struct

from tclock import diagnostics, replay
from tclock.agents import acting, losses, sgd
from tclock.agents.acting import Trajectory
from tclock.agents.base import LearnerSpec, MeshLayout
from tclock.agents.seeding import SeededInit
from tclock.envs.wrappers import BatchedEnv, EnvCarry
from tclock.networks import TanhGaussianActor, TwinQ, sample_tanh_gaussian

# Per-iteration keys only SAC logs (docs/metrics.md); the step keys are null during the warm-up.
SAC_METRICS = ("alpha", "alpha_loss", "q_mean", "policy_entropy", "replay_size", "grad_steps", "gdc_actor",
               "gdc_critic", "b_simple_actor", "b_simple_critic")


@struct.dataclass
class SACState:
    params: Any  # {"actor": ..., "q": ...}
    target_q: Any
    log_alpha: jax.Array
    opt_state: Any  # {"actor": ..., "q": ..., "alpha": ...}
    normalizer: Any
    replay: replay.Replay
    env: EnvCarry
    key: jax.Array
    last_return: jax.Array
    last_success: jax.Array


def grad_steps(cfg, num_envs: int) -> int:
    """Gradient steps per learning phase at ``num_envs``: the replay ratio times the rollout's
    env steps, at least one."""
    return max(1, round(cfg.sac_replay_ratio * num_envs * cfg.unroll_length))


@dataclass
class SAC(SeededInit, MeshLayout):
    """Soft actor-critic learner; see the module docstring."""

    env_sharded_fields = ("env", "replay")  # the ring splits along its capacity with the envs

    cfg: Any
    env: BatchedEnv

    def __post_init__(self):
        cfg = self.cfg
        self.obs_size = self.env.observation_size
        self.action_size = self.env.action_size
        self.actor = TanhGaussianActor(tuple(cfg.policy_hidden), self.action_size, cfg.activation)
        self.q = TwinQ(tuple(cfg.value_hidden), cfg.activation)
        self.optimizer = sgd.make_optimizer(cfg.max_grad_norm)
        self.target_entropy = float(cfg.sac_target_entropy) * self.action_size

    # ------------------------------------------------------------------ init
    def init_one(self, key: jax.Array) -> SACState:
        k_pi, k_q, k_env, k_state = jax.random.split(key, 4)
        obs = jnp.zeros((1, self.obs_size))
        params = {"actor": self.actor.init(k_pi, obs), "q": self.q.init(k_q, obs, jnp.zeros((1, self.action_size)))}
        log_alpha = jnp.log(jnp.asarray(self.cfg.sac_init_alpha, jnp.float32))
        opt_state = {"actor": self.optimizer.init(params["actor"]), "q": self.optimizer.init(params["q"]),
                     "alpha": self.optimizer.init(log_alpha)}
        normalizer = running_statistics.init_state(specs.Array((self.obs_size,), jnp.dtype("float32")))
        example = {"obs": jnp.zeros(self.obs_size), "action": jnp.zeros(self.action_size), "reward": jnp.zeros(()),
                   "next_obs": jnp.zeros(self.obs_size), "termination": jnp.zeros(())}
        zero = jnp.zeros(())
        return SACState(params=params, target_q=params["q"], log_alpha=log_alpha, opt_state=opt_state,
                        normalizer=normalizer, replay=replay.empty(self.cfg.sac_buffer_size, example),
                        env=self.env.reset(k_env), key=k_state, last_return=zero, last_success=zero)

    # ------------------------------------------------------------------ networks
    def _normalize(self, normalizer, obs):
        return running_statistics.normalize(obs, normalizer) if self.cfg.normalize_obs else obs

    def policy_dist(self, params, normalizer, obs):
        return self.actor.apply(params["actor"], self._normalize(normalizer, obs))

    def q_values(self, q_params, normalizer, obs, action):
        return self.q.apply(q_params, self._normalize(normalizer, obs), action)

    # ------------------------------------------------------------------ acting
    def rollout(self, state: SACState, active: int | None = None):
        return acting.rollout(self.env, self.cfg.unroll_length, self.policy_dist, state, active,
                              sample=sample_tanh_gaussian, blocks=self.env_blocks)

    def behaviour(self, state: SACState):
        return state.params, state.normalizer

    def with_behaviour(self, state: SACState, behaviour) -> SACState:
        params, normalizer = behaviour
        return state.replace(params=params, normalizer=normalizer)

    # ------------------------------------------------------------------ losses of one step
    def critic_loss(self, q_params, target_q, actor_params, log_alpha, normalizer, batch, key):
        mean, log_std = self.actor.apply(actor_params, self._normalize(normalizer, batch["next_obs"]))
        next_action, next_logp = sample_tanh_gaussian(key, mean, log_std)
        next_q = self.q_values(target_q, normalizer, batch["next_obs"], next_action)
        target = losses.sac_critic_target(batch["reward"] * self.cfg.reward_scale, batch["termination"], next_q,
                                          next_logp, jnp.exp(log_alpha), self.cfg.gamma)
        q = self.q_values(q_params, normalizer, batch["obs"], batch["action"])
        return losses.sac_critic_loss(q, target), q

    def actor_loss(self, actor_params, q_params, log_alpha, normalizer, batch, key):
        mean, log_std = self.actor.apply(actor_params, self._normalize(normalizer, batch["obs"]))
        action, logp = sample_tanh_gaussian(key, mean, log_std)
        q = self.q_values(q_params, normalizer, batch["obs"], action)
        return losses.sac_actor_loss(q, logp, jnp.exp(jax.lax.stop_gradient(log_alpha))), logp

    # ------------------------------------------------------------------ learning phase
    def store(self, state: SACState, traj: Trajectory) -> SACState:
        """One seed's rollout (leaves ``[T, B, ...]``) into its ring and its normaliser."""
        batch = sgd.flatten_rollout({"obs": traj.obs, "action": traj.action, "reward": traj.reward,
                                     "next_obs": traj.final_obs, "termination": traj.termination})
        normalizer = state.normalizer
        if self.cfg.normalize_obs:
            normalizer = running_statistics.update(normalizer, traj.obs)
        return state.replace(replay=replay.add(state.replay, batch), normalizer=normalizer)

    def gradient_step(self, state: SACState, lr, key):
        cfg = self.cfg
        k_batch, k_q, k_pi = jax.random.split(key, 3)
        batch = replay.sample(state.replay, k_batch, cfg.sac_batch_size)
        opt = {k: v._replace(hyperparams={**v.hyperparams, "learning_rate": lr}) for k, v in state.opt_state.items()}
        params = state.params
        (q_loss, q), g_q = jax.value_and_grad(self.critic_loss, has_aux=True)(
            params["q"], state.target_q, params["actor"], state.log_alpha, state.normalizer, batch, k_q)
        upd, opt["q"] = self.optimizer.update(g_q, opt["q"], params["q"])
        q_params = optax.apply_updates(params["q"], upd)
        (pi_loss, logp), g_pi = jax.value_and_grad(self.actor_loss, has_aux=True)(
            params["actor"], q_params, state.log_alpha, state.normalizer, batch, k_pi)
        upd, opt["actor"] = self.optimizer.update(g_pi, opt["actor"], params["actor"])
        actor_params = optax.apply_updates(params["actor"], upd)
        a_loss, g_a = jax.value_and_grad(losses.sac_alpha_loss)(state.log_alpha, logp, self.target_entropy)
        upd, opt["alpha"] = self.optimizer.update(g_a, opt["alpha"], state.log_alpha)
        log_alpha = optax.apply_updates(state.log_alpha, upd)
        target_q = jax.tree.map(lambda t, p: (1.0 - cfg.sac_tau) * t + cfg.sac_tau * p, state.target_q, q_params)
        state = state.replace(params={"actor": actor_params, "q": q_params}, target_q=target_q, log_alpha=log_alpha,
                              opt_state=opt)
        info = {"policy_loss": pi_loss, "value_loss": q_loss, "alpha_loss": a_loss, "alpha": jnp.exp(log_alpha),
                "q_mean": jnp.mean(q), "policy_entropy": -jnp.mean(logp)}
        return state, info

    def gradient_diagnostics(self, state: SACState, key):
        """GDC and ``b_simple`` of the critic loss, the actor loss and both, from ``gdc_k``
        replay minibatches of ``gdc_minibatch`` transitions at the phase's starting parameters."""
        cfg = self.cfg
        k_batch, k_loss = jax.random.split(key)
        batches = jax.vmap(lambda k: replay.sample(state.replay, k, cfg.gdc_minibatch))(
            jax.random.split(k_batch, cfg.gdc_k))
        p = state.params

        def grads(mb):
            g_q = jax.grad(lambda q: self.critic_loss(q, state.target_q, p["actor"], state.log_alpha,
                                                      state.normalizer, mb, k_loss)[0])(p["q"])
            g_pi = jax.grad(lambda a: self.actor_loss(a, p["q"], state.log_alpha, state.normalizer, mb,
                                                      k_loss)[0])(p["actor"])
            return {"q": g_q, "actor": g_pi}

        g = jax.vmap(grads)(batches)  # leaves [K, ...]
        total = diagnostics.noise_scale(g, cfg.gdc_minibatch)
        return {"gdc": diagnostics.gdc(g), "gdc_actor": diagnostics.gdc(g["actor"]),
                "gdc_critic": diagnostics.gdc(g["q"]), "b_simple": total["b_simple"],
                "grad_norm_sq": total["grad_norm_sq"], "trace_sigma": total["trace_sigma"],
                "b_simple_actor": diagnostics.noise_scale(g["actor"], cfg.gdc_minibatch)["b_simple"],
                "b_simple_critic": diagnostics.noise_scale(g["q"], cfg.gdc_minibatch)["b_simple"]}

    def learn_one(self, state: SACState, lr, num_envs: int, with_gdc: bool):
        """One seed's gradient steps on its ring (after :meth:`store`)."""
        key, k_diag, k_steps = jax.random.split(state.key, 3)
        metrics = self.gradient_diagnostics(state, k_diag) if with_gdc else {}
        lr = jnp.asarray(lr, jnp.float32)
        state, info = jax.lax.scan(lambda s, k: self.gradient_step(s, lr, k), state,
                                   jax.random.split(k_steps, grad_steps(self.cfg, num_envs)))
        metrics.update({k: v.mean() for k, v in info.items()})
        leaves = jax.tree.leaves((state.params, state.log_alpha))
        metrics["finite"] = (jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))
                             & jnp.isfinite(metrics["policy_loss"]) & jnp.isfinite(metrics["value_loss"]))
        return state.replace(key=key), metrics

    def update(self, state: SACState, traj: Trajectory, lr, with_gdc: bool = False):
        """Store the rollout, then (once the rings hold ``sac_min_replay`` transitions) the
        gradient steps; ``traj`` leaves ``[T, S, B, ...]``."""
        B = traj.reward.shape[2]
        state = jax.vmap(self.store, in_axes=(0, 1))(state, traj)
        learn = lambda s: jax.vmap(lambda one: self.learn_one(one, lr, B, with_gdc))(s)  # noqa: E731
        shapes = jax.eval_shape(learn, state)[1]

        def warm_up(s):  # only stored: the step metrics are NaN (null in metrics.jsonl), finite is true
            return s, {k: (jnp.ones(v.shape, bool) if k == "finite" else jnp.full(v.shape, jnp.nan, v.dtype))
                       for k, v in shapes.items()}

        ready = state.replay.size[0] >= self.cfg.sac_min_replay  # the same on every seed
        state, metrics = jax.lax.cond(ready, learn, warm_up, state)
        metrics["replay_size"] = state.replay.size.astype(jnp.float32)
        metrics["grad_steps"] = jnp.where(ready, grad_steps(self.cfg, B), 0) * jnp.ones_like(metrics["replay_size"])
        metrics["lr"] = jnp.full(metrics["replay_size"].shape, lr, jnp.float32)
        return state, metrics


def validate_sac(cfg) -> None:
    """SAC's config checks, before anything compiles (each names the field and the fix)."""
    from tclock.errors import ConfigError

    B_max = cfg.drbs_max if cfg.drbs else cfg.num_envs
    rollout = B_max * cfg.unroll_length
    if cfg.sac_replay_ratio <= 0 or not math.isfinite(cfg.sac_replay_ratio):
        raise ConfigError(f"sac_replay_ratio: gradient steps per env step must be > 0 (got {cfg.sac_replay_ratio}); "
                          "e.g. 0.0625 (one step per 16 env steps)")
    if cfg.sac_batch_size < 1:
        raise ConfigError(f"sac_batch_size: must be >= 1 (got {cfg.sac_batch_size})")
    if cfg.sac_batch_size > cfg.sac_buffer_size:
        raise ConfigError(f"sac_batch_size: {cfg.sac_batch_size} transitions per gradient step do not fit the replay "
                          f"buffer of sac_buffer_size={cfg.sac_buffer_size}; lower sac_batch_size or raise "
                          "sac_buffer_size")
    if cfg.sac_min_replay > cfg.sac_buffer_size:
        raise ConfigError(f"sac_min_replay: the warm-up of {cfg.sac_min_replay} transitions exceeds the replay buffer "
                          f"(sac_buffer_size={cfg.sac_buffer_size}); lower sac_min_replay or raise sac_buffer_size")
    if cfg.sac_min_replay < cfg.sac_batch_size:
        raise ConfigError(f"sac_min_replay: the first gradient step samples {cfg.sac_batch_size} transitions "
                          f"(sac_batch_size) from a buffer of at least sac_min_replay={cfg.sac_min_replay}; raise "
                          "sac_min_replay to at least sac_batch_size")
    if rollout > cfg.sac_buffer_size:
        raise ConfigError(f"sac_buffer_size: one rollout writes num_envs*unroll_length = {rollout} transitions, more "
                          f"than the buffer holds ({cfg.sac_buffer_size}); raise sac_buffer_size or lower num_envs")
    if not 0 < cfg.sac_tau <= 1:
        raise ConfigError(f"sac_tau: the Polyak rate must be in (0, 1] (got {cfg.sac_tau}); e.g. 0.005")
    if not cfg.sac_init_alpha > 0:
        raise ConfigError(f"sac_init_alpha: the initial temperature must be > 0 (got {cfg.sac_init_alpha})")
    if cfg.noise_split:
        raise ConfigError("noise_split: the half learning phase is defined for on-policy learners; SAC learns from "
                          "its replay buffer; drop --noise-split (SAC's noise scales come from replay minibatches)")
    if cfg.noise_groups:
        raise ConfigError("noise_groups: groups of whole env trajectories are an on-policy estimator; set "
                          "noise_groups 0 with --algo sac")
    if cfg.drbs:
        raise ConfigError("drbs: dynamic batch sizes are not built for SAC yet; drop --drbs with --algo sac")


SPEC = LearnerSpec(
    name="sac",
    factory=SAC,
    description="SAC: twin Q + target critics (Polyak), tanh-squashed Gaussian actor, learned temperature, "
                "a jitted replay ring per seed",
    defaults={"num_envs": 64, "unroll_length": 16, "lr": 1e-3, "activation": "relu", "policy_hidden": (128, 128),
              "value_hidden": (128, 128), "max_grad_norm": 10.0, "noise_groups": 0, "total_steps": 400_000},
    fields=("sac_batch_size", "sac_buffer_size", "sac_min_replay", "sac_replay_ratio", "sac_tau", "sac_init_alpha",
            "sac_target_entropy"),
    validate=validate_sac,
    metrics=SAC_METRICS,
    on_policy=False,
)
