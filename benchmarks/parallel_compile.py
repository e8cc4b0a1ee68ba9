"""One batch size's programs (rollout, update, update with diagnostics) compiled one after another
vs side by side in threads, as ``tclock.runtime.compile_agent`` does; alternating, median of rounds.

    python benchmarks/parallel_compile.py [--envs pointmass_reach,halfcheetah] [--rounds 2]

Run it without a persistent compilation cache (``JAX_COMPILATION_CACHE_DIR`` unset): every
round lowers the programs afresh and compiles them cold.  Prints seconds per mode and the ratio
side-by-side / one-after-another (below 1: start-up waits less).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp

warnings.filterwarnings("ignore", message=".*Brax System, piplines and environments.*")

from tclock.config import TrainConfig, validate  # noqa: E402
from tclock.runtime import build_agent  # noqa: E402


def lowered_programs(agent, state, num_envs: int) -> list:
    rollout = jax.jit(lambda s: agent.rollout(s, num_envs)).lower(state)
    traj = rollout.out_info[1]
    updates = [jax.jit(lambda s, t, lr, g=g: agent.update(s, t, lr, g)).lower(state, traj, jnp.float32(0.0))
               for g in (False, True)]
    return [rollout, *updates]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", default="pointmass_reach,halfcheetah")
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args(argv)
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}")
    for env in a.envs.split(","):
        cfg = validate(TrainConfig(env=env))
        agent = build_agent(cfg)
        state = agent.init(cfg.seed, cfg.seeds)
        times = {"one after another": [], "side by side": []}
        for _ in range(a.rounds):
            for mode in times:
                programs = lowered_programs(agent, state, cfg.num_envs)
                t0 = time.perf_counter()
                if mode == "one after another":
                    for prog in programs:
                        prog.compile()
                else:
                    with ThreadPoolExecutor(len(programs)) as pool:
                        list(pool.map(lambda prog: prog.compile(), programs))
                times[mode].append(time.perf_counter() - t0)
        seq, par = (statistics.median(v) for v in times.values())
        print(f"{env} (num_envs={cfg.num_envs}, 3 programs): one after another {seq:.1f}s, side by side {par:.1f}s, "
              f"ratio {par / seq:.2f} (median of {a.rounds} alternating rounds)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
