"""Env registry, verifiable-reward semantics, truncation vs termination, real auto-resets."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tclock import envs
from tclock.envs.tasks import PointMass
from tclock.envs.wrappers import BatchedEnv, EpisodeLimit, SuccessReward


def test_registry_lists_brax_envs_and_tasks():
    names = envs.names()
    for name in ("ant", "halfcheetah", "reacher", "hopper", "pointmass_reach", "reacher_sparse", "ant_goal_sparse"):
        assert name in names
    assert names == sorted(names)


def test_unknown_env_lists_known_names():
    with pytest.raises(envs.UnknownEnvError) as e:
        envs.make("no_such_env")
    assert "pointmass_reach" in str(e.value) and "halfcheetah" in str(e.value)


def test_register_custom_task_and_duplicate_error():
    envs.register("test_pm_wide", lambda **kw: SuccessReward(PointMass(**kw), lambda s: s.metrics["distance"] < 5.0),
                  episode_length=7, overwrite=True)
    assert "test_pm_wide" in envs.names()
    assert envs.spec("test_pm_wide").episode_length == 7
    with pytest.raises(ValueError, match="already registered"):
        envs.register("test_pm_wide", PointMass)
    env = envs.make("test_pm_wide")
    state = env.step(env.reset(jax.random.PRNGKey(0)), jnp.zeros(2))
    assert float(state.reward) == 1.0  # every point is within 5.0 of a target at most 0.9 away


def _place(env, state, pos):
    """A pointmass state with the mass at ``pos`` (velocity zero)."""
    ps = env.unwrapped.pipeline_init(jnp.asarray(pos, jnp.float32), jnp.zeros(2))
    return state.replace(pipeline_state=ps)


def test_pointmass_reach_reward_is_binary_success_and_keeps_original():
    env = envs.make("pointmass_reach", radius=0.1)
    state = env.reset(jax.random.PRNGKey(1))
    target = state.info["target"]
    step = jax.jit(env.step)
    at_target = step(_place(env, state, target), jnp.zeros(2))
    assert float(at_target.reward) == 1.0 and float(at_target.metrics["success"]) == 1.0
    np.testing.assert_allclose(at_target.metrics["original_reward"], -at_target.metrics["distance"], atol=1e-6)
    far = step(_place(env, state, target + jnp.array([0.5, 0.0])), jnp.zeros(2))
    assert float(far.reward) == 0.0 and float(far.metrics["success"]) == 0.0
    assert float(far.metrics["original_reward"]) < -0.4
    # Obs = position, velocity, target - position.
    np.testing.assert_allclose(far.obs[4:], target - far.pipeline_state.q[:2], atol=1e-5)


def test_pointmass_reach_shaped_reward_trains_on_distance_and_measures_success_the_same():
    env = envs.make("pointmass_reach", radius=0.1, shaped_reward=True)
    state = env.reset(jax.random.PRNGKey(1))
    assert float(state.reward) < -0.25  # the reset keeps -distance (targets are >= 0.3 away)
    target = state.info["target"]
    step = jax.jit(env.step)
    near = step(_place(env, state, target + jnp.array([0.05, 0.0])), jnp.zeros(2))
    far = step(_place(env, state, target + jnp.array([0.5, 0.0])), jnp.zeros(2))
    for s, success in ((near, 1.0), (far, 0.0)):
        assert float(s.metrics["success"]) == success
        np.testing.assert_allclose(s.reward, -s.metrics["distance"], atol=1e-6)
        np.testing.assert_allclose(s.reward, s.metrics["original_reward"], atol=1e-6)
    assert float(near.reward) > float(far.reward)



def test_success_reward_hold_steps_counts_only_consecutive_hits():
    """With hold_steps=3 success is 1 only from the third consecutive step the predicate holds;
    the reward stays the per-step predicate.  Compared with a plain loop over a random rollout
    whose predicate (x velocity > 0) flips often."""
    env = SuccessReward(PointMass(), lambda s: s.obs[2] > 0.0, hold_steps=3)
    step = jax.jit(env.step)
    state = env.reset(jax.random.PRNGKey(3))
    actions = jax.random.uniform(jax.random.PRNGKey(4), (80, 2), minval=-1.0, maxval=1.0)
    hits, successes, rewards = [], [], []
    for a in actions:
        state = step(state, a)
        hits.append(float(state.obs[2] > 0.0))
        successes.append(float(state.metrics["success"]))
        rewards.append(float(state.reward))
    streak, expected = 0, []
    for h in hits:
        streak = streak + 1 if h else 0
        expected.append(1.0 if streak >= 3 else 0.0)
    assert 0 < sum(expected) < sum(hits)  # the rollout has both short and long runs of hits
    assert successes == expected
    assert rewards == hits
    with pytest.raises(ValueError, match="hold_steps"):
        SuccessReward(PointMass(), lambda s: s.obs[2] > 0.0, hold_steps=0)
    assert envs.make("reacher_sparse", threshold=0.02, hold_steps=10).hold_steps == 10


def test_reacher_sparse_shaped_reward_trains_on_brax_reward():
    """``shaped_reward=True`` on the reacher trains on Brax's dense reward (-distance - control
    cost, negative away from the target); the sparse default pays 0 there."""
    actions = jnp.full((2,), 0.5)
    for shaped in (True, False):
        env = envs.make("reacher_sparse", backend="spring", threshold=0.02, shaped_reward=shaped)
        state = jax.jit(env.step)(env.reset(jax.random.PRNGKey(0)), actions)
        assert float(state.metrics["success"]) == 0.0
        assert float(state.metrics["original_reward"]) < 0.0
        expected = state.metrics["original_reward"] if shaped else 0.0
        np.testing.assert_allclose(state.reward, expected, atol=1e-6)

def _roll(benv, carry, steps, action=0.0):
    step = jax.jit(benv.step)
    outs = []
    for _ in range(steps):
        carry, tr = step(carry, jnp.full((benv.num_envs, benv.action_size), action))
        outs.append((carry, tr))
    return outs


def test_time_limit_is_truncation_not_termination_and_resets_are_real():
    benv = BatchedEnv(EpisodeLimit(envs.make("pointmass_reach"), 5), num_envs=3)
    carry = jax.jit(benv.reset)(jax.random.PRNGKey(2))
    targets = [np.asarray(carry.state.info["target"])]
    outs = _roll(benv, carry, 12)
    for t, (carry, tr) in enumerate(outs, start=1):
        ended = t % 5 == 0
        np.testing.assert_array_equal(tr.truncation, np.full(3, float(ended)))
        np.testing.assert_array_equal(tr.termination, np.zeros(3))
        np.testing.assert_array_equal(carry.state.info["steps"], np.full(3, 0.0 if ended else t % 5))
        if ended:
            # The final observation is the pre-reset one; the carried obs belongs to a new episode.
            assert not np.allclose(tr.final_obs, carry.state.obs)
            targets.append(np.asarray(carry.state.info["target"]))
    # Real resets: each episode of each env gets a freshly drawn target.
    assert len(targets) == 3
    assert not np.allclose(targets[0], targets[1]) and not np.allclose(targets[1], targets[2])


def test_termination_on_success_is_not_truncation():
    env = envs.make("pointmass_reach", radius=5.0, terminate_on_success=True)  # succeeds on the first step
    benv = BatchedEnv(EpisodeLimit(env, 50), num_envs=4)
    carry = jax.jit(benv.reset)(jax.random.PRNGKey(3))
    (_, tr), = _roll(benv, carry, 1)
    np.testing.assert_array_equal(tr.termination, np.ones(4))
    np.testing.assert_array_equal(tr.truncation, np.zeros(4))
    np.testing.assert_array_equal(tr.done_success, np.ones(4))
    np.testing.assert_array_equal(tr.done_return, np.ones(4))


def test_episode_return_and_success_bookkeeping():
    benv = BatchedEnv(EpisodeLimit(envs.make("pointmass_reach", radius=5.0), 4), num_envs=2)
    carry = jax.jit(benv.reset)(jax.random.PRNGKey(4))
    outs = _roll(benv, carry, 8)
    done_returns = [np.asarray(tr.done_return) for _, tr in outs]
    np.testing.assert_array_equal(done_returns[3], [4.0, 4.0])  # four rewarded steps per episode
    np.testing.assert_array_equal(done_returns[7], [4.0, 4.0])
    assert all(np.all(r == 0) for i, r in enumerate(done_returns) if i not in (3, 7))


def test_reacher_sparse_reward_matches_fingertip_threshold():
    env = envs.make("reacher_sparse", threshold=0.05)
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    state = reset(jax.random.PRNGKey(5))
    key = jax.random.PRNGKey(6)
    for _ in range(5):
        key, k = jax.random.split(key)
        state = step(state, jax.random.uniform(k, (env.action_size,), minval=-1, maxval=1))
        dist = float(jnp.linalg.norm(state.obs[-3:]))
        assert float(state.reward) == float(dist < 0.05)
        assert float(state.metrics["original_reward"]) < 0.0  # Brax's shaped reward is kept


def test_reacher_sparse_success_when_fingertip_at_target():
    env = envs.make("reacher_sparse", threshold=0.05)
    state = env.reset(jax.random.PRNGKey(7))
    # A huge threshold makes every state a success; a zero threshold none.
    assert float(envs.make("reacher_sparse", threshold=10.0).step(state, jnp.zeros(2)).reward) == 1.0
    assert float(envs.make("reacher_sparse", threshold=0.0).step(state, jnp.zeros(2)).reward) == 0.0


@pytest.mark.slow
def test_ant_goal_sparse_smoke():
    env = envs.make("ant_goal_sparse")
    ant = envs.make("ant", exclude_current_positions_from_observation=True)
    benv = BatchedEnv(EpisodeLimit(env, 3), num_envs=2)
    carry = jax.jit(benv.reset)(jax.random.PRNGKey(8))
    assert carry.state.obs.shape == (2, int(ant.observation_size) + 2)
    outs = _roll(benv, carry, 3)
    rewards = np.concatenate([np.asarray(tr.reward) for _, tr in outs])
    assert set(np.unique(rewards)) <= {0.0, 1.0}
    goal = np.asarray(carry.state.info["goal"])
    assert np.all((np.linalg.norm(goal, axis=1) >= 2.0) & (np.linalg.norm(goal, axis=1) <= 4.0))
    np.testing.assert_array_equal(outs[-1][1].truncation, np.ones(2))
