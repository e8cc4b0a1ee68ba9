"""What the benchmark scripts share: the raw rate of a bare env and the plain-text table."""
from __future__ import annotations

import statistics
import time

import jax

from tclock import envs as tenvs


def raw_steps_per_s(name: str, num_envs: int, repeats: int, steps: int = 100, seed: int = 0) -> tuple[float, float]:
    """Median env steps/s of a jitted ``lax.scan`` of ``steps`` vmapped bare-env steps with
    random actions (one device, compile excluded), and the compile seconds."""
    env = tenvs.make(name)
    state = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(seed), num_envs))

    def run(state, key):
        def body(s, k):
            a = jax.random.uniform(k, (num_envs, env.action_size), minval=-1.0, maxval=1.0)
            return jax.vmap(env.step)(s, a), None

        return jax.lax.scan(body, state, jax.random.split(key, steps))[0]

    t0 = time.perf_counter()
    fn = jax.jit(run).lower(state, jax.random.PRNGKey(1)).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(fn(state, jax.random.PRNGKey(1)))  # warm-up
    times = []
    for i in range(repeats):
        key = jax.random.PRNGKey(2 + i)
        t0 = time.perf_counter()
        jax.block_until_ready(fn(state, key))
        times.append(time.perf_counter() - t0)
    return num_envs * steps / statistics.median(times), compile_s


def table(headers, rows) -> str:
    """Headers, a rule and rows: the first column left-aligned, the others right-aligned."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(str(c).rjust(w) if i else str(c).ljust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])
