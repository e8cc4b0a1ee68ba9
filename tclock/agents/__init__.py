"""Learners. Each gives init / rollout / update functions that plug into the one host loop."""
from tclock.agents.impala import IMPALA
from tclock.agents.ppo import PPO


def make_agent(cfg, env):
    """The learner named by ``cfg.algo`` for a batched env."""
    if cfg.algo == "ppo":
        return PPO(cfg, env)
    if cfg.algo == "impala":
        return IMPALA(cfg, env)
    raise ValueError(f"algo: {cfg.algo!r} has no learner yet")
