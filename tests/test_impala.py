"""IMPALA (V-trace actor-critic) on PPO's networks and rollout: update, targets (that it learns the
default task on every seed is in test_learners.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tclock import diagnostics
from tclock.agents import IMPALA, PPO, ActorCritic, make_agent
from tclock.config import ConfigError, TrainConfig, drbs_ladder, validate
from tclock.loop import build_agent
from tclock.networks import gaussian_log_prob

SMALL = dict(algo="impala", num_envs=16, unroll_length=16, num_minibatches=4, num_epochs=2, seeds=2,
             policy_hidden=(32, 32), value_hidden=(32, 32), gdc_minibatch=32, progress=False)


def small_batch(**changes):
    cfg = TrainConfig(**{**SMALL, **changes})
    agent = build_agent(cfg)
    state = agent.init(0, cfg.seeds)
    state, traj, _ = jax.jit(agent.rollout)(state)
    return cfg, agent, state, traj


def one_seed(tree, i=0, axis=0):
    return jax.tree.map(lambda x: jnp.take(x, i, axis=axis), tree)


def test_make_agent_picks_impala_and_checks_env_groups():
    cfg = TrainConfig(**SMALL)
    agent = build_agent(cfg)
    assert type(agent) is IMPALA and isinstance(agent, ActorCritic) and not isinstance(agent, PPO)  # siblings
    assert type(make_agent(cfg.replace(algo="ppo"), agent.env)) is PPO
    with pytest.raises(ConfigError, match="num_minibatches: IMPALA"):  # 30*16 divides by 4, 30 envs do not
        validate(TrainConfig(**{**SMALL, "num_envs": 30}))
    drbs = dict(drbs=True, num_envs=64, drbs_min=32, drbs_max=128, unroll_length=32)
    assert all(b % 4 == 0 for b in drbs_ladder(TrainConfig(**{**SMALL, **drbs})))  # ladder made of valid sizes
    assert type(build_agent(TrainConfig(**{**SMALL, **drbs, "num_minibatches": 1}))) is IMPALA


def test_jitted_update_runs_with_ppo_metric_keys_and_gdc_in_range():
    cfg, agent, state, traj = small_batch()
    lr = jnp.float32(1e-3)
    ppo_keys = {g: set(jax.eval_shape(lambda s, t: PPO(cfg, agent.env).update(s, t, lr, g), state, traj)[1])
                for g in (False, True)}
    for with_gdc in (False, True):
        new_state, m = jax.jit(lambda s, t, l: agent.update(s, t, l, with_gdc))(state, traj, lr)
        m = jax.device_get(m)
        assert set(m) == ppo_keys[with_gdc]
        assert {"finite", "kl_behavior", "lr", "clip_frac", "adv_skew"} <= set(m)
        assert ("gdc" in m) == with_gdc
        assert m["finite"].all() and m["finite"].shape == (2,)
        nan_by_design = ("b_simple", "b_noise_envs", "b_noise_update_envs")  # NaN when the signal estimate is <= 0
        for k, v in m.items():
            assert v.shape == (2,) and (k in nan_by_design or np.all(np.isfinite(v))), (k, v)
        np.testing.assert_allclose(m["lr"], 1e-3)
        assert np.all((m["clip_frac"] >= 0) & (m["clip_frac"] <= 1)) and np.all(m["kl_behavior"] >= 0)
        moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), state.params, new_state.params)
        assert max(jax.tree.leaves(moved)) > 0
        assert int(new_state.opt_state.inner_state[1][0].count[0]) == cfg.num_epochs * cfg.num_minibatches
    for key in ("gdc", "gdc_policy", "gdc_value"):
        assert np.all((m[key] >= -1) & (m[key] <= 1)), (key, m[key])
    assert np.all(m["grad_norm_sq"] > 0)


def numpy_vtrace(blogp, tlogp, r, v, nv, term, trunc, gamma, lam, rho_bar, c_bar):
    """V-trace from the paper's recursion, one loop over time; [T, B] float64 arrays."""
    T = r.shape[0]
    ratio = np.exp(tlogp - blogp)
    rho, c = np.minimum(rho_bar, ratio), lam * np.minimum(c_bar, ratio)
    vs, pg = np.zeros_like(v), np.zeros_like(v)
    for t in reversed(range(T)):
        boot = (1.0 - term[t]) * nv[t]
        delta = rho[t] * (r[t] + gamma * boot - v[t])
        cut = (term[t] + trunc[t] > 0) | (t == T - 1)  # the trace stops at an episode end / rollout end
        later = 0.0 if t == T - 1 else vs[t + 1] - v[t + 1]
        vs[t] = v[t] + delta + np.where(cut, 0.0, gamma * c[t] * later)
        vs_next = np.where(cut, nv[t], vs[t + 1] if t < T - 1 else 0.0)
        pg[t] = rho[t] * (r[t] + gamma * (1.0 - term[t]) * vs_next - v[t])
    return vs, pg, rho


def test_vtrace_targets_match_numpy_reference_on_a_real_trajectory():
    # Large success radius + terminate on success + short episodes: the 16-step rollout holds
    # rewards, true terminations and time-limit truncations.
    cfg, agent, state, traj = small_batch(env_kwargs={"radius": 0.6, "terminate_on_success": True},
                                          episode_length=6, vtrace_rho_bar=1.1, vtrace_c_bar=0.9,
                                          vtrace_lambda=0.9, reward_scale=2.0)
    state, traj = one_seed(state), one_seed(traj, axis=1)
    assert traj.termination.sum() > 0 and traj.truncation.sum() > 0 and traj.reward.sum() > 0
    normalizer = agent.observe(state.normalizer, traj)
    # target parameters away from the behaviour ones, so importance weights spread around 1
    leaves, tree = jax.tree.flatten(state.params)
    keys = jax.random.split(jax.random.PRNGKey(7), len(leaves))
    params = jax.tree.unflatten(tree, [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])

    vs, pg = jax.jit(agent.targets)(params, normalizer, traj)
    mean, log_std = agent.policy_dist(params, normalizer, traj.obs)
    f64 = lambda x: np.asarray(x, np.float64)  # noqa: E731
    tlogp = f64(gaussian_log_prob(mean, log_std, traj.action))
    v, nv = f64(agent.value_of(params, normalizer, traj.obs)), f64(agent.value_of(params, normalizer, traj.final_obs))
    ref_vs, ref_pg, rho = numpy_vtrace(f64(traj.logp), tlogp, 2.0 * f64(traj.reward), v, nv, f64(traj.termination),
                                       f64(traj.truncation), cfg.gamma, 0.9, 1.1, 0.9)
    assert 0.05 < np.mean(rho < 1.1) < 0.95  # both clipped and unclipped weights are exercised
    np.testing.assert_allclose(vs, ref_vs, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pg, ref_pg, rtol=1e-4, atol=1e-4)
    assert np.abs(ref_vs - v).max() > 0.1  # the correction is not trivially zero


def test_update_recomputes_vtrace_targets_at_current_parameters():
    """One minibatch, two epochs: the update equals two hand-written SGD steps whose V-trace
    targets come from ``targets`` under the parameters of each step, and its advantage stats
    are those of the pg advantages at the behaviour parameters."""
    cfg, agent, state, traj = small_batch(num_minibatches=1, num_epochs=2)
    state, traj = one_seed(state), one_seed(traj, axis=1)
    lr = jnp.float32(1e-2)
    new_state, m = jax.jit(lambda s, t: agent.update_one(s, t, lr, False))(state, traj)

    normalizer = agent.observe(state.normalizer, traj)
    opt_state = state.opt_state._replace(hyperparams={**state.opt_state.hyperparams, "learning_rate": lr})

    def sgd(params, opt_state, vs, pg):
        batch = agent.transitions(traj, pg, vs)
        grads = jax.grad(lambda p: agent.total_loss(p, normalizer, batch)[0])(params)
        updates, opt_state = agent.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    p0 = state.params
    vs0, pg0 = agent.targets(p0, normalizer, traj)
    p1, o1 = sgd(p0, opt_state, vs0, pg0)
    p2, _ = sgd(p1, o1, *agent.targets(p1, normalizer, traj))
    stale, _ = sgd(p1, o1, vs0, pg0)  # targets not recomputed: must be told apart

    gap = lambda a, b: max(jax.tree.leaves(jax.tree.map(lambda x, y: float(jnp.abs(x - y).max()), a, b)))  # noqa: E731
    assert gap(new_state.params, p2) < 1e-5
    assert gap(stale, p2) > 1e-4
    stats = diagnostics.advantage_stats(pg0)
    for k in ("adv_mean", "adv_std", "adv_skew"):
        np.testing.assert_allclose(m[k], stats[k], rtol=1e-5, atol=1e-6)
