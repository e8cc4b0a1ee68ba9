"""Environments: Brax's own by name plus verifiable-reward tasks. See ``registry``."""
from tclock.envs.registry import (DEFAULT_ENV, UnknownEnvError, make, make_training_env, names, register,
                                  spec)
from tclock.envs.wrappers import BatchedEnv, EnvCarry, EpisodeLimit, SuccessReward, Transition

__all__ = ["DEFAULT_ENV", "UnknownEnvError", "make", "make_training_env", "names", "register", "spec",
           "BatchedEnv", "EnvCarry", "EpisodeLimit", "SuccessReward", "Transition"]
