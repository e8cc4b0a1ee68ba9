"""Learners, found through a registry (:mod:`tclock.agents.base`): ``--algo <name>`` picks one.

Built in: ``ppo`` and ``impala`` (siblings on :class:`~tclock.agents.actor_critic.ActorCritic`) and
``sac`` (off-policy, with a replay ring in its state).
A new learner is one module with a :class:`LearnerSpec` passed to :func:`register_learner`;
the loops, sweeps, doctor and pipeline need no edit.
"""
from tclock.agents import impala as _impala
from tclock.agents import ppo as _ppo
from tclock.agents import sac as _sac
from tclock.agents.actor_critic import ActorCritic
from tclock.agents.base import (Learner, LearnerSpec, LossTerms, learner_names, learner_spec, make_agent,
                                register_learner)
from tclock.agents.impala import IMPALA
from tclock.agents.ppo import PPO
from tclock.agents.sac import SAC

for _spec in (_ppo.SPEC, _impala.SPEC, _sac.SPEC):
    register_learner(_spec, overwrite=True)

__all__ = ["ActorCritic", "IMPALA", "PPO", "SAC", "Learner", "LearnerSpec", "LossTerms", "learner_names", "learner_spec",
           "make_agent", "register_learner"]
