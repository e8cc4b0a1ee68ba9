"""What the on-policy actor-critic learners (PPO, IMPALA) share, as one base class.

:class:`ActorCritic` holds the networks (a Gaussian policy and a value MLP, flax), the
observation normaliser (Brax ``running_statistics``), ``init``, the rollout
(:func:`tclock.agents.acting.rollout`), the K-minibatch gradient diagnostics, and the frame
of a learning phase (normaliser update first, metrics and the ``finite`` flag last).  A
subclass supplies ``loss_terms`` (a :class:`~tclock.agents.base.LossTerms` per minibatch) and
``update_one`` (one seed's learning phase); ``update`` vmaps it over seeds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from brax.training.acme import running_statistics, specs
from flax import struct

from tclock import diagnostics
from tclock.agents import acting, losses, sgd
from tclock.agents.acting import Trajectory
from tclock.agents.base import LossTerms, MeshLayout
from tclock.agents.seeding import SeededInit
from tclock.envs.wrappers import BatchedEnv, EnvCarry
from tclock.networks import GaussianPolicy, ValueNet


@struct.dataclass
class ActorCriticState:
    params: Any  # {"policy": ..., "value": ...}
    opt_state: Any
    normalizer: Any
    env: EnvCarry
    key: jax.Array
    last_return: jax.Array  # mean return of the latest rollout that finished an episode
    last_success: jax.Array  # success rate of the latest rollout that finished an episode


def gradient_diagnostics(loss_terms, params, data: dict, key, k: int, m: int, vf_coef: float, ent_coef: float):
    """GDC and the gradient noise scale from ``k`` random minibatches of ``m`` transitions of
    ``data`` at ``params`` (the behaviour parameters, before any step).

    ``loss_terms(params, minibatch) -> LossTerms``; the policy, value and entropy terms are
    differentiated separately (one ``jacrev``), so GDC is reported for the total loss, the
    policy loss (policy parameters) and the value loss (value parameters)."""
    n = data["obs"].shape[0]
    # Sampling with replacement: the setting in which the noise-scale estimator is unbiased,
    # and far cheaper on a CPU than a permutation of all n transitions per minibatch.
    idx = jax.random.randint(key, (k, m), 0, n)
    minibatches = jax.tree.map(lambda x: x[idx], data)  # [K, m, ...]

    def terms(p, mb):
        t = loss_terms(p, mb)
        return jnp.stack([t.policy, t.value, t.entropy])

    jac = jax.vmap(lambda mb: jax.jacrev(terms)(params, mb))(minibatches)  # leaves [K, 3, ...]
    pick = lambda i: jax.tree.map(lambda g: g[:, i], jac)  # noqa: E731
    g_pg, g_vl, g_ent = pick(0), pick(1), pick(2)
    g_total = jax.tree.map(lambda a, b, c: a + vf_coef * b - ent_coef * c, g_pg, g_vl, g_ent)
    noise = diagnostics.noise_scale(g_total, m)
    return {
        "gdc": diagnostics.gdc(g_total),
        "gdc_policy": diagnostics.gdc(g_pg["policy"]),
        "gdc_value": diagnostics.gdc(g_vl["value"]),
        "b_simple": noise["b_simple"],
        "grad_norm_sq": noise["grad_norm_sq"],
        "trace_sigma": noise["trace_sigma"],
    }


def envs_per_group(num_envs: int, groups: int, share: float) -> int:
    """Envs in each group of :func:`env_group_noise`: ``floor(share * num_envs / groups)``, at least 1."""
    return max(1, int(share * num_envs) // groups)


def env_group_noise(loss_fn, params, data: dict, key, unroll_length: int, groups: int, per_group: int):
    """The gradient noise scale **per env** from ``groups`` disjoint groups of ``per_group``
    whole env trajectories of the rollout ``data`` (flat ``[T*B, ...]`` leaves, time-major).

    Transitions of one env's trajectory are correlated, so the i.i.d.-transition noise scale
    (``b_simple``) describes noise per transition, and dividing it by T assumes the T steps are
    independent.  Here each group gradient ``g_i`` averages the gradients of ``per_group``
    independent envs (each a whole T-step trajectory), so ``Cov g_i = Sigma_env / per_group`` and
    :func:`tclock.diagnostics.noise_scale` with ``minibatch_size = per_group`` estimates
    ``tr(Sigma_env)`` (per env) and ``|G|^2`` without assuming anything about the correlation
    inside a trajectory.  Their ratio is the noise scale in **envs**, the unit of ``B_crit``.
    ``loss_fn(params, batch) -> scalar`` (the learner's total loss)."""
    n = data["obs"].shape[0]
    T, B = unroll_length, n // unroll_length
    pick = jax.random.permutation(key, B)[: groups * per_group]

    def grouped(x):  # [T*B, ...] -> [groups, T*per_group, ...]
        x = x.reshape((T, B) + x.shape[1:])[:, pick].reshape((T, groups, per_group) + x.shape[1:])
        return jnp.swapaxes(x, 0, 1).reshape((groups, T * per_group) + x.shape[3:])

    batches = jax.tree.map(grouped, data)
    grads = jax.vmap(lambda mb: jax.grad(loss_fn)(params, mb))(batches)
    noise = diagnostics.noise_scale(grads, per_group)
    return {"noise_env_trace": noise["trace_sigma"], "noise_env_grad_sq": noise["grad_norm_sq"],
            "b_noise_envs": noise["b_simple"]}


def flat_params(tree) -> jax.Array:
    """A parameter pytree as one vector (the space the update-noise estimates live in)."""
    return jnp.concatenate([x.reshape(-1) for x in jax.tree.leaves(tree)])


def split_update_noise(update_one, state, traj: Trajectory, lr, heldout_loss=None):
    """The noise scale of a whole learning phase, in **envs**, from two extra learning phases on
    disjoint random halves of the rollout's envs (one seed; ``traj`` leaves ``[T, B, ...]``),
    and with ``heldout_loss`` the step-size terms of the first half's phase measured on the
    second half.

    A learning phase (epochs x minibatches of Adam steps) maps ``b`` envs to a parameter change
    ``D(b) = D* + n/sqrt(b)`` (per-env noise covariance ``Sigma_D``).  Two halves share no env, so
    their noises are independent: ``E[D_A . D_B] = |D*|^2`` and ``E[(|D_A|^2 + |D_B|^2)/2] =
    |D*|^2 + tr(Sigma_D)/b``, and

        update_noise_trace = b ((|D_A|^2 + |D_B|^2)/2 - D_A . D_B)     (b = B // 2)
        update_signal_sq   = D_A . D_B

    estimate ``tr(Sigma_D)`` and ``|D*|^2`` (the latter noisy, can be <= 0); their ratio is
    ``b (1/cos - 1)`` with ``cos`` the cosine of the two updates, so it does not depend on the
    updates' length.  That matters: Adam's normalisation and the global gradient-norm clip make
    ``|D(b)|`` nearly independent of ``b`` (pointmass_reach, one state: ``|D|^2`` 0.21 from 128 envs,
    0.13 from 512, where a 1/b noise would shrink it 4x), which biases a noise read from how far a half's update lands from the full one
    (0.43x on a normalised phase with a known answer, tests/test_online_critical.py); the angle
    between two independent halves is unbiased there.  On a real learning phase neither is fully
    independent of ``b`` (experiments/noise_vs_batch.py: at one state the estimate grows as
    b^0.05-0.49 from b = 128 to 512, most near the initial policy; the previous one as b^0.08-0.75).

    Both half phases start with Adam's first moment at zero (:func:`tclock.agents.sgd.without_momentum`;
    second moment and step count kept).  The momentum earlier phases left moves both halves the
    same way, so it would count as signal although no env of this rollout produced it: with it,
    the estimate read 1.7-5.6x lower on pointmass_reach (B = 1024 and 128, several training states).

    Step size (:mod:`tclock.step_size`): ``heldout_loss(state, traj_other)`` returns the
    learner's loss as a function of the parameters on the *other* half's data (targets at the
    behaviour parameters).  Since that half is independent of the first half's data,
    ``step_gain_linear = -g . D_A`` (g its gradient at the behaviour parameters) is the
    first-order gain of the half phase's update and ``step_gain_actual = L(theta) -
    L(theta + D_A)`` the gain it really makes on fresh data.  The half phases are discarded;
    the run's state is untouched."""
    B = traj.reward.shape[1]
    half = B // 2
    perm = jax.random.permutation(jax.random.fold_in(state.key, 2), B)
    halves = [jax.tree.map(lambda x, idx=idx: x[:, idx], traj) for idx in (perm[:half], perm[half: 2 * half])]
    start = flat_params(state.params)
    fresh = state.replace(opt_state=sgd.without_momentum(state.opt_state))
    (state_a, _), (state_b, _) = (update_one(fresh, h, lr, False) for h in halves)
    d_a, d_b = flat_params(state_a.params) - start, flat_params(state_b.params) - start
    signal = jnp.sum(d_a * d_b)
    trace = half * (0.5 * (jnp.sum(jnp.square(d_a)) + jnp.sum(jnp.square(d_b))) - signal)
    out = {"update_noise_trace": trace, "update_signal_sq": signal,
           "b_noise_update_envs": jnp.where(signal > 0, trace / jnp.where(signal > 0, signal, 1.0), jnp.nan)}
    if heldout_loss is not None:
        loss = heldout_loss(state, halves[1])
        before, grad = jax.value_and_grad(loss)(state.params)
        out["step_gain_linear"] = -jnp.sum(flat_params(grad) * d_a)
        out["step_gain_actual"] = before - loss(state_a.params)
    return out


@dataclass
class ActorCritic(SeededInit, MeshLayout):
    """Base of the on-policy learners; see the module docstring and :mod:`tclock.agents.base`."""

    cfg: Any
    env: BatchedEnv

    def __post_init__(self):
        cfg = self.cfg
        self.obs_size = self.env.observation_size
        self.action_size = self.env.action_size
        self.policy = GaussianPolicy(tuple(cfg.policy_hidden), self.action_size, cfg.activation)
        self.value = ValueNet(tuple(cfg.value_hidden), cfg.activation)
        self.optimizer = sgd.make_optimizer(cfg.max_grad_norm)

    # ------------------------------------------------------------------ init
    def init_one(self, key: jax.Array) -> ActorCriticState:
        k_pi, k_v, k_env, k_state = jax.random.split(key, 4)
        dummy = jnp.zeros((1, self.obs_size))
        params = {"policy": self.policy.init(k_pi, dummy), "value": self.value.init(k_v, dummy)}
        normalizer = running_statistics.init_state(specs.Array((self.obs_size,), jnp.dtype("float32")))
        zero = jnp.zeros(())
        return ActorCriticState(params=params, opt_state=self.optimizer.init(params), normalizer=normalizer,
                                env=self.env.reset(k_env), key=k_state, last_return=zero, last_success=zero)

    # ------------------------------------------------------------------ networks
    def _normalize(self, normalizer, obs):
        if not self.cfg.normalize_obs:
            return obs
        return running_statistics.normalize(obs, normalizer)

    def policy_dist(self, params, normalizer, obs):
        return self.policy.apply(params["policy"], self._normalize(normalizer, obs))

    def value_of(self, params, normalizer, obs):
        return self.value.apply(params["value"], self._normalize(normalizer, obs))

    # ------------------------------------------------------------------ acting
    def rollout(self, state: ActorCriticState, active: int | None = None):
        return acting.rollout(self.env, self.cfg.unroll_length, self.policy_dist, state, active,
                              blocks=self.env_blocks)

    def behaviour(self, state: ActorCriticState):
        return state.params, state.normalizer

    def with_behaviour(self, state: ActorCriticState, behaviour) -> ActorCriticState:
        params, normalizer = behaviour
        return state.replace(params=params, normalizer=normalizer)

    # ------------------------------------------------------------------ losses
    def loss_terms(self, params, normalizer, batch) -> LossTerms:
        raise NotImplementedError

    def total_loss(self, params, normalizer, batch):
        return losses.combine(self.loss_terms(params, normalizer, batch), self.cfg.vf_coef, self.cfg.ent_coef)

    def gradient_diagnostics(self, params, normalizer, data, key):
        """GDC and ``b_simple`` on i.i.d. transitions, and (``noise_groups`` > 0) the noise scale
        per env from groups of whole env trajectories (:func:`env_group_noise`)."""
        cfg = self.cfg
        out = gradient_diagnostics(lambda p, mb: self.loss_terms(p, normalizer, mb), params, data, key,
                                   cfg.gdc_k, cfg.gdc_minibatch, cfg.vf_coef, cfg.ent_coef)
        k_env = jax.random.fold_in(key, 1)
        if cfg.noise_groups:
            B = data["obs"].shape[0] // cfg.unroll_length
            out.update(env_group_noise(lambda p, mb: self.total_loss(p, normalizer, mb)[0], params, data, k_env,
                                       cfg.unroll_length, cfg.noise_groups,
                                       envs_per_group(B, cfg.noise_groups, cfg.noise_env_share)))
        return out

    # ------------------------------------------------------------------ learning-phase frame
    def observe(self, normalizer, traj: Trajectory):
        """The observation normaliser after seeing this rollout (first step of a learning phase)."""
        if self.cfg.normalize_obs:
            return running_statistics.update(normalizer, traj.obs)
        return normalizer

    transitions = staticmethod(sgd.transitions)

    def sgd_step(self, carry, normalizer, batch):
        return sgd.sgd_step(lambda p, b: self.total_loss(p, normalizer, b), self.optimizer, carry, batch)

    def sgd_epochs(self, params, opt_state, lr, key, minibatches, step):
        return sgd.sgd_epochs(params, opt_state, lr, key, self.cfg.num_epochs, minibatches, step)

    def finish_update(self, state, params, opt_state, normalizer, key, data, lr, info, metrics):
        """Closes a learning phase: mean step metrics, KL to the behaviour policy on the rollout
        ``data``, ``lr``, ``finite``; returns ``(new_state, metrics)``."""
        metrics.update({k: v.mean() for k, v in info.items()})
        mean, log_std = self.policy_dist(params, normalizer, data["obs"])
        metrics["kl_behavior"] = losses.behaviour_kl(mean, log_std, data["action"], data["logp"])
        metrics["lr"] = jnp.asarray(lr, jnp.float32)
        leaves = jax.tree.leaves(params)
        metrics["finite"] = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])) & jnp.isfinite(
            metrics["policy_loss"]) & jnp.isfinite(metrics["value_loss"])
        new_state = state.replace(params=params, opt_state=opt_state, normalizer=normalizer, key=key)
        return new_state, metrics

    def phase_data(self, state, traj: Trajectory):
        """``(normalizer, transitions with targets at the behaviour parameters, advantages)``
        of one seed's rollout: what a learning phase starts from."""
        raise NotImplementedError

    def heldout_loss(self, state, traj: Trajectory):
        """The learner's loss as a function of the parameters on ``traj``'s transitions (targets
        at ``state``'s behaviour parameters): the held-out objective of the step-size signal."""
        normalizer, data, _ = self.phase_data(state, traj)
        return lambda params: self.total_loss(params, normalizer, data)[0]

    def update_one(self, state, traj: Trajectory, lr, with_gdc: bool):
        raise NotImplementedError

    def can_split(self, num_envs: int) -> bool:
        """Whether a learning phase on half of ``num_envs`` envs is well defined (minibatching)."""
        half = num_envs // 2
        return half > 0 and (half * self.cfg.unroll_length) % self.cfg.num_minibatches == 0

    def update(self, state, traj: Trajectory, lr, with_gdc: bool = False):
        new_state, metrics = jax.vmap(lambda s, t: self.update_one(s, t, lr, with_gdc), in_axes=(0, 1))(state, traj)
        B = traj.reward.shape[2]
        if with_gdc and self.cfg.noise_split and self.can_split(B):
            metrics.update(jax.vmap(lambda s, t: split_update_noise(self.update_one, s, t, lr, self.heldout_loss),
                                    in_axes=(0, 1))(state, traj))
        return new_state, metrics
