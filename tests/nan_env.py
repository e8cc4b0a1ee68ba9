"""A test task whose observations turn to NaN after 40 steps (a run that diverges on schedule)."""
import jax.numpy as jnp

from tclock.envs.tasks import PointMass


class NanAfter40(PointMass):
    """A pointmass whose observations turn to NaN after 40 steps."""

    def reset(self, rng):
        state = super().reset(rng)
        state.info["t"] = jnp.zeros(())
        return state

    def step(self, state, action):
        t = state.info["t"] + 1
        state = super().step(state, action)
        state.info["t"] = t
        return state.replace(obs=jnp.where(t > 40, jnp.nan, state.obs))
