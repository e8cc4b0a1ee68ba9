"""The online critical batch: the per-env noise scale from groups of whole env trajectories,
on a synthetic problem with correlated trajectories and a known per-env noise."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tclock.agents.actor_critic import env_group_noise, envs_per_group
from tclock.online_critical import OnlineCriticalBatch, windowed_ratio

D, T, B = 6, 16, 64
S_ENV, S_STEP = 1.0, 0.5  # per-env offset (shared by the T steps of a trajectory) and per-step noise
CENTRE = jnp.full((D,), 0.3)
PARAMS = jnp.zeros((D,))


def rollout_data(key):
    """Flat time-major ``[T*B, D]`` transitions x = centre + z_env + eps_t: the gradient of
    0.5*|w - x|^2 at w is w - x, so G = w - centre, |G|^2 = D*0.09, and one env's trajectory
    gradient has covariance (S_ENV^2 + S_STEP^2/T) I: tr Sigma_env = D*(1 + 0.25/16)."""
    k1, k2 = jax.random.split(key)
    z = S_ENV * jax.random.normal(k1, (1, B, D))
    eps = S_STEP * jax.random.normal(k2, (T, B, D))
    return {"obs": (CENTRE + z + eps).reshape(T * B, D)}


def loss(w, batch):
    return 0.5 * jnp.mean(jnp.sum(jnp.square(w - batch["obs"]), axis=-1))


TRUE_TRACE = D * (S_ENV**2 + S_STEP**2 / T)
TRUE_G2 = float(jnp.sum(jnp.square(PARAMS - CENTRE)))
TRUE_ENVS = TRUE_TRACE / TRUE_G2  # ~68 envs


@pytest.fixture(scope="module")
def many_estimates():
    keys = jax.random.split(jax.random.PRNGKey(0), 400)

    def one(k):
        kd, kn = jax.random.split(k)
        data = rollout_data(kd)
        return env_group_noise(loss, PARAMS, data, kn, T, groups=4, per_group=envs_per_group(B, 4, 1.0))
    return jax.jit(jax.vmap(one))(keys)


def test_env_group_noise_recovers_the_per_env_noise_of_correlated_trajectories(many_estimates):
    trace = np.asarray(many_estimates["noise_env_trace"])
    g2 = np.asarray(many_estimates["noise_env_grad_sq"])
    np.testing.assert_allclose(trace.mean(), TRUE_TRACE, rtol=0.05)  # unbiased per-env trace
    np.testing.assert_allclose(g2.mean(), TRUE_G2, rtol=0.2)  # unbiased |G|^2 (noisy)
    ratio = windowed_ratio(trace[:, None], g2[:, None])[0]
    assert 0.8 * TRUE_ENVS < ratio < 1.25 * TRUE_ENVS, (ratio, TRUE_ENVS)


def test_iid_transition_noise_scale_over_t_understates_the_per_env_noise():
    """The old estimator: b_simple from i.i.d. transitions divided by T.  Its per-transition
    variance is S_ENV^2 + S_STEP^2 (the correlation inside a trajectory is ignored), so
    b_simple/T is ~T times too small here — the gap the env-grouped estimator closes."""
    from tclock import diagnostics

    data = rollout_data(jax.random.PRNGKey(1))
    idx = jax.random.randint(jax.random.PRNGKey(2), (64, 64), 0, T * B)
    grads = jax.vmap(lambda i: jax.grad(loss)(PARAMS, {"obs": data["obs"][i]}))(idx)
    b_simple = float(diagnostics.noise_scale(grads, 64)["trace_sigma"]) / TRUE_G2
    true_per_transition = D * (S_ENV**2 + S_STEP**2) / TRUE_G2
    assert 0.7 * true_per_transition < b_simple < 1.4 * true_per_transition
    assert b_simple / T < TRUE_ENVS / 8


def test_envs_per_group_and_groups_are_disjoint_envs():
    assert envs_per_group(256, 4, 0.25) == 16 and envs_per_group(8, 4, 0.25) == 1
    # With one env per group and no per-step noise, each group gradient is one env's offset:
    # the estimate of tr Sigma_env is then exactly the spread of the picked envs' offsets.
    data = {"obs": jnp.broadcast_to(jnp.arange(B, dtype=jnp.float32)[None, :, None], (T, B, 1)).reshape(T * B, 1)}
    out = env_group_noise(loss, jnp.zeros((1,)), data, jax.random.PRNGKey(3), T, groups=B, per_group=1)
    var = np.var(np.arange(B), ddof=1)
    np.testing.assert_allclose(float(out["noise_env_trace"]), var, rtol=1e-4)


def test_windowed_ratio_sums_before_dividing_and_keeps_a_window():
    assert windowed_ratio([[2.0, 1.0], [4.0, 1.0]], [[-1.0, 0.5], [3.0, -0.5]]) == [3.0, None]
    online = OnlineCriticalBatch(window=2)
    assert online.add({"gdc": np.zeros(2)}) is None  # not a diagnostic iteration
    for trace, g2 in ((10.0, 1.0), (30.0, 1.0), (50.0, 4.0)):
        value = online.add({"noise_env_trace": np.array([trace]), "noise_env_grad_sq": np.array([g2])})
    assert value == [80.0 / 5.0]  # the first pair left the window
    again = OnlineCriticalBatch(window=2, history=online.state_dict())
    assert again.add({"noise_env_trace": np.array([0.0]), "noise_env_grad_sq": np.array([1.0])}) == [50.0 / 5.0]


def _split_estimates(update_one, n=600, seed=5, data=lambda k: rollout_data(k)["obs"].reshape(T, B, D),
                     opt_state=()):
    """``split_update_noise`` on ``n`` independent synthetic rollouts ``data(key)`` (``[T, B, dim]``),
    vmapped as in training; the phase moves the parameters by ``update_one(x)``, or with an
    ``opt_state`` by ``update_one(x, opt_state)`` (the state the phase starts from)."""
    from flax import struct
    from synthetic_phase import State

    from tclock.agents.actor_critic import split_update_noise

    @struct.dataclass
    class Traj:
        x: jax.Array  # [T, B, D]
        reward: jax.Array  # [T, B] (the estimator reads B from it)

    def one(k):
        kd, ks = jax.random.split(k)
        x = data(kd)
        move = (lambda s, t: update_one(t.x)) if opt_state == () else (lambda s, t: update_one(t.x, s.opt_state))
        return split_update_noise(lambda s, t, lr, g: (s.replace(params=s.params + move(s, t)), {}),
                                  State(params=jnp.zeros(x.shape[-1]), key=ks, opt_state=opt_state),
                                  Traj(x, jnp.zeros((T, B))), 0.0)

    return jax.jit(jax.vmap(one))(jax.random.split(jax.random.PRNGKey(seed), n))


def test_split_update_noise_recovers_the_noise_of_a_linear_learning_phase():
    """A learning phase that moves the parameters by the mean of the rollout's x: D(b) = mean over
    b envs of (centre + z_env + mean_t eps), so |D*|^2 = |centre|^2 and the per-env noise trace
    is D*(S_ENV^2 + S_STEP^2/T) — the known answer the two-halves estimator must recover."""
    out = _split_estimates(lambda x: x.mean(axis=(0, 1)))
    np.testing.assert_allclose(np.mean(out["update_noise_trace"]), TRUE_TRACE, rtol=0.1)
    np.testing.assert_allclose(np.mean(out["update_signal_sq"]), float(jnp.sum(CENTRE**2)), rtol=0.2)
    ratio = windowed_ratio(np.asarray(out["update_noise_trace"])[:, None], np.asarray(out["update_signal_sq"])[:, None])
    assert 0.75 * TRUE_TRACE / 0.54 < ratio[0] < 1.33 * TRUE_TRACE / 0.54


@pytest.mark.parametrize("length", [1e-3, 1.0])
def test_split_update_noise_does_not_depend_on_the_length_of_a_normalised_update(length):
    """Adam and the gradient-norm clip make an update's length nearly independent of the batch.
    A phase that moves by ``length`` along the mean of its envs' x (200 dimensions, as a network
    has many parameters, so the angles concentrate), with a noise scale of ~400 envs, far above
    B = 64: the estimate must be the noise scale of the direction, tr(Sigma)/|centre|^2 per env.
    Reading the noise from |D_half - D_full| instead gives ~175 envs here (0.43x)."""
    dim, centre = 200, 0.05

    def data(key):
        k1, k2 = jax.random.split(key)
        return (centre + S_ENV * jax.random.normal(k1, (1, B, dim)) + S_STEP * jax.random.normal(k2, (T, B, dim)))

    out = _split_estimates(lambda x: length * x.mean(axis=(0, 1)) / jnp.linalg.norm(x.mean(axis=(0, 1))),
                           n=2000, data=data)
    truth = dim * (S_ENV**2 + S_STEP**2 / T) / (dim * centre**2)  # ~406 envs
    ratio = windowed_ratio(np.asarray(out["update_noise_trace"])[:, None], np.asarray(out["update_signal_sq"])[:, None])
    assert 0.8 * truth < ratio[0] < 1.25 * truth


def test_split_update_noise_leaves_out_the_momentum_earlier_phases_left():
    """An Adam state carries a first moment from earlier phases; a phase started from it moves by
    that drift plus what its own data says, and the drift is the same for both halves.  The
    estimate must be the noise scale of the data's part (TRUE_TRACE / |centre|^2), not the one the
    drift dilutes: here it would read ~7x too low (|centre + drift|^2 = 7.5 |centre|^2)."""
    import optax

    from tclock.agents import sgd

    drift = jnp.full((D,), 0.5)
    adam = sgd.make_optimizer(1.0).init(jnp.zeros(D))
    adam = jax.tree.map(lambda node: node._replace(mu=drift) if isinstance(node, optax.ScaleByAdamState) else node,
                        adam, is_leaf=lambda node: isinstance(node, optax.ScaleByAdamState))

    def carried(opt_state):
        return sum(node.mu for node in jax.tree.leaves(opt_state, is_leaf=lambda n: isinstance(n, optax.ScaleByAdamState))
                   if isinstance(node, optax.ScaleByAdamState))

    assert float(jnp.sum(carried(adam))) == pytest.approx(0.5 * D)  # the synthetic phase does see the drift
    out = _split_estimates(lambda x, opt_state: x.mean(axis=(0, 1)) + carried(opt_state), opt_state=adam)
    truth = TRUE_TRACE / float(jnp.sum(CENTRE**2))
    ratio = windowed_ratio(np.asarray(out["update_noise_trace"])[:, None], np.asarray(out["update_signal_sq"])[:, None])
    assert 0.75 * truth < ratio[0] < 1.33 * truth


def test_without_momentum_zeroes_only_adams_first_moment():
    from tclock.agents import sgd

    params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    opt = sgd.make_optimizer(0.5)
    state = opt.init(params)
    for i in range(3):  # a few steps, so both moments and the count are non-trivial
        _, state = opt.update(jax.tree.map(lambda p, i=i: p + i + 1.0, params), state, params)
    reset = sgd.without_momentum(state)
    adam = [n for n in jax.tree.leaves(state, is_leaf=lambda n: hasattr(n, "mu")) if hasattr(n, "mu")]
    adam_reset = [n for n in jax.tree.leaves(reset, is_leaf=lambda n: hasattr(n, "mu")) if hasattr(n, "mu")]
    assert len(adam) == len(adam_reset) == 1
    assert all(float(jnp.abs(x).sum()) > 0 for x in jax.tree.leaves(adam[0].mu))
    assert all(float(jnp.abs(x).sum()) == 0 for x in jax.tree.leaves(adam_reset[0].mu))
    for a, b in zip(jax.tree.leaves((adam[0].nu, adam[0].count)), jax.tree.leaves((adam_reset[0].nu, adam_reset[0].count))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert jax.tree.structure(reset) == jax.tree.structure(state)
