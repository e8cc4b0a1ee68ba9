"""Built-in tasks with verifiable (binary success) rewards.

* ``pointmass_reach`` (the default): a point mass on a plane, pushed by two motors toward a
  target drawn at random each episode; reward 1.0 on every step the mass is within
  ``radius`` of the target, else 0.  Tiny MJCF, so it steps fast on a CPU.  With
  ``shaped_reward=True`` it is trained on the dense ``-distance`` instead (success unchanged).
* ``reacher_sparse``: Brax's ``reacher`` where reward is 1.0 while the fingertip is within
  ``threshold`` of the target (``shaped_reward=True``: Brax's dense reward, success unchanged).
* ``ant_goal_sparse``: Brax's ``ant`` that must bring its torso within ``radius`` of a goal
  drawn on a ring around the start; the goal's offset from the torso is appended to the
  observation.

Each keeps the original shaped reward in ``metrics['original_reward']`` (see
``SuccessReward``).  ``terminate_on_success`` is available on every task.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from brax.envs.ant import Ant
from brax.envs.base import PipelineEnv, State
from brax.envs.reacher import Reacher
from brax.io import mjcf

from tclock.envs.wrappers import SuccessReward

POINTMASS_XML = """
<mujoco model="pointmass">
  <compiler angle="radian"/>
  <option timestep="0.02" integrator="Euler"/>
  <worldbody>
    <body name="mass" pos="0 0 0.05">
      <joint name="slide_x" type="slide" axis="1 0 0" damping="2.0" limited="false"/>
      <joint name="slide_y" type="slide" axis="0 1 0" damping="2.0" limited="false"/>
      <geom name="ball" type="sphere" size="0.05" mass="1.0" contype="0" conaffinity="0"/>
    </body>
  </worldbody>
  <actuator>
    <motor joint="slide_x" gear="2.0" ctrlrange="-1 1" ctrllimited="true"/>
    <motor joint="slide_y" gear="2.0" ctrlrange="-1 1" ctrllimited="true"/>
  </actuator>
</mujoco>
"""


class PointMass(PipelineEnv):
    """A point mass driven on a plane toward a random target.

    Observation (6): position (2), velocity (2), target minus position (2).
    Reward: the shaped ``-distance`` to the target (``pointmass_reach`` replaces it with the
    binary success flag).  The target is drawn uniformly on an annulus
    ``[target_min, target_max]`` around a start point drawn in ``[-start_noise, start_noise]^2``.
    """

    def __init__(self, backend: str = "generalized", target_min: float = 0.3, target_max: float = 0.8,
                 start_noise: float = 0.1, n_frames: int = 2, **kwargs):
        sys = mjcf.loads(POINTMASS_XML)
        super().__init__(sys=sys, backend=backend, n_frames=n_frames, **kwargs)
        self.target_min, self.target_max, self.start_noise = target_min, target_max, start_noise

    def reset(self, rng: jax.Array) -> State:
        k_start, k_angle, k_radius = jax.random.split(rng, 3)
        start = jax.random.uniform(k_start, (2,), minval=-self.start_noise, maxval=self.start_noise)
        angle = jax.random.uniform(k_angle, (), minval=-jnp.pi, maxval=jnp.pi)
        radius = jax.random.uniform(k_radius, (), minval=self.target_min, maxval=self.target_max)
        target = start + radius * jnp.array([jnp.cos(angle), jnp.sin(angle)])
        pipeline_state = self.pipeline_init(start, jnp.zeros(2))
        obs = self._obs(pipeline_state, target)
        zero = jnp.zeros(())
        return State(pipeline_state, obs, -radius, zero, {"distance": radius}, {"target": target})

    def step(self, state: State, action: jax.Array) -> State:
        pipeline_state = self.pipeline_step(state.pipeline_state, action)
        target = state.info["target"]
        distance = jnp.linalg.norm(pipeline_state.q[:2] - target)
        state.metrics.update(distance=distance)
        obs = self._obs(pipeline_state, target)
        return state.replace(pipeline_state=pipeline_state, obs=obs, reward=-distance)

    @staticmethod
    def _obs(pipeline_state, target) -> jax.Array:
        pos = pipeline_state.q[:2]
        return jnp.concatenate([pos, pipeline_state.qd[:2], target - pos])


def pointmass_reach(radius: float = 0.1, terminate_on_success: bool = False, shaped_reward: bool = False,
                    **kwargs) -> SuccessReward:
    """The default task: binary reward while the mass is within ``radius`` of the target
    (``shaped_reward=True``: the dense ``-distance`` reward, success measured the same way)."""
    return SuccessReward(PointMass(**kwargs), lambda s: s.metrics["distance"] < radius, terminate_on_success,
                         shaped_reward)


def reacher_sparse(threshold: float = 0.01, terminate_on_success: bool = False, hold_steps: int = 1,
                   shaped_reward: bool = False, **kwargs) -> SuccessReward:
    """Brax reacher with reward 1.0 while the fingertip is within ``threshold`` of the target;
    success once it has stayed there ``hold_steps`` steps in a row (:class:`SuccessReward`).
    ``shaped_reward=True`` trains on Brax's own dense reward (-distance - control cost) instead,
    success measured the same way."""
    # Brax's reacher observation ends with the fingertip-to-target vector (3 entries).
    return SuccessReward(Reacher(**kwargs), lambda s: jnp.linalg.norm(s.obs[-3:]) < threshold,
                         terminate_on_success, shaped_reward, hold_steps=hold_steps)


class AntGoal(Ant):
    """Brax ant with a goal on a ring of radius ``[goal_min, goal_max]`` around the origin.

    Observation: the ant's own observation plus the goal minus torso xy (2 entries).
    Shaped reward (kept as ``original_reward``): minus the torso's distance to the goal.
    """

    def __init__(self, goal_min: float = 2.0, goal_max: float = 4.0, **kwargs):
        kwargs.setdefault("exclude_current_positions_from_observation", True)
        super().__init__(**kwargs)
        self.goal_min, self.goal_max = goal_min, goal_max

    @property
    def observation_size(self) -> int:
        return int(super().observation_size) + 2

    def reset(self, rng: jax.Array) -> State:
        rng, k_angle, k_radius = jax.random.split(rng, 3)
        state = super().reset(rng)
        angle = jax.random.uniform(k_angle, (), minval=-jnp.pi, maxval=jnp.pi)
        radius = jax.random.uniform(k_radius, (), minval=self.goal_min, maxval=self.goal_max)
        goal = radius * jnp.array([jnp.cos(angle), jnp.sin(angle)])
        state.info["goal"] = goal
        return self._with_goal(state, goal)

    def step(self, state: State, action: jax.Array) -> State:
        goal = state.info["goal"]
        inner = state.replace(obs=state.obs[:-2])
        state = super().step(inner, action)
        return self._with_goal(state, goal)

    @staticmethod
    def _with_goal(state: State, goal: jax.Array) -> State:
        offset = goal - state.pipeline_state.x.pos[0, :2]
        distance = jnp.linalg.norm(offset)
        state.metrics["goal_distance"] = distance
        return state.replace(obs=jnp.concatenate([state.obs, offset]), reward=-distance)


def ant_goal_sparse(radius: float = 0.5, terminate_on_success: bool = False, **kwargs) -> SuccessReward:
    """Ant that must reach a goal position: reward 1.0 while the torso is within ``radius``."""
    return SuccessReward(AntGoal(**kwargs), lambda s: s.metrics["goal_distance"] < radius, terminate_on_success)
