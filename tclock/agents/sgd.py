"""The SGD machinery every actor-critic learner shares, as pure functions: the optimizer with
an injected learning rate, one step, epochs x minibatches in ``lax.scan``, and the flat
transition batch of a rollout."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax


def make_optimizer(max_grad_norm: float):
    """Adam (eps 1e-5) after a global-norm clip; the learning rate is a hyperparameter of the
    state (``inject_hyperparams``), set per learning phase by :func:`sgd_epochs`."""
    def factory(learning_rate):
        return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(learning_rate, eps=1e-5))

    return optax.inject_hyperparams(factory)(learning_rate=0.0)


def without_momentum(opt_state):
    """``opt_state`` with Adam's first moment set to zero (second moment, step count and learning
    rate kept): a learning phase started from it moves by what its own data says, without the
    drift of the momentum earlier phases left (:func:`tclock.agents.actor_critic.split_update_noise`)."""
    def reset(node):
        if isinstance(node, optax.ScaleByAdamState):
            return node._replace(mu=jax.tree.map(jnp.zeros_like, node.mu))
        return node

    return jax.tree.map(reset, opt_state, is_leaf=lambda node: isinstance(node, optax.ScaleByAdamState))


def flatten_rollout(fields: dict) -> dict:
    """Leaves ``[T, B, ...]`` (one seed's rollout) as ``[T*B, ...]``: one flat batch of transitions."""
    return jax.tree.map(lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:]), fields)


def transitions(traj, adv, ret) -> dict:
    """The ``[T, B, ...]`` rollout as one flat batch of ``T*B`` transitions with targets."""
    return flatten_rollout({"obs": traj.obs, "action": traj.action, "logp": traj.logp, "adv": adv, "ret": ret})


def sgd_step(loss_fn: Callable, optimizer, carry, batch):
    """One optimizer step on ``loss_fn(params, batch) -> (loss, info)``:
    ``(params, opt_state) -> ((new_params, new_opt_state), info)``."""
    params, opt_state = carry
    grads, info = jax.grad(loss_fn, has_aux=True)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), info


def sgd_epochs(params, opt_state, lr, key, num_epochs: int, minibatches: Callable, step: Callable):
    """``num_epochs`` passes in ``lax.scan`` at learning rate ``lr``.

    ``minibatches(k)`` gives one epoch's minibatches stacked on a leading axis (shuffled with
    key ``k``); ``step(carry, minibatch)`` is one SGD step on ``(params, opt_state)``.  Returns
    ``(params, opt_state, info)`` with ``info`` leaves ``[epochs, minibatches]``."""
    opt_state = opt_state._replace(hyperparams={**opt_state.hyperparams,
                                                "learning_rate": jnp.asarray(lr, jnp.float32)})

    def epoch(carry, k):
        return jax.lax.scan(step, carry, minibatches(k))

    (params, opt_state), info = jax.lax.scan(epoch, (params, opt_state), jax.random.split(key, num_epochs))
    return params, opt_state, info


def shuffled_minibatches(data: dict, num_minibatches: int, key):
    """``data`` (leaves ``[n, ...]``) permuted and split into ``num_minibatches`` equal parts."""
    n = jax.tree.leaves(data)[0].shape[0]
    mb_size = n // num_minibatches
    perm = jnp.argsort(jax.random.uniform(key, (n,)))  # a permutation; cheaper than random.permutation
    return jax.tree.map(lambda x: x[perm].reshape((num_minibatches, mb_size) + x.shape[1:]), data)
