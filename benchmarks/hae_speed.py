"""HAE speed, side by side in one run: jitted ``hae`` vs jitted ``gae`` vs the Python-loop reference.

    python benchmarks/hae_speed.py [--T 2048] [--B 128] [--event-rate 0.01] [--repeats 21] [--loop-columns 32]

Random inputs ``[T, B]`` with sparse rewards (a fraction ``--event-rate`` of steps get a positive
reward, the rest are 0) and random terminations/truncations.  Each jitted function is compiled
first and then timed as the median of ``--repeats`` calls (``block_until_ready``), hae and gae
calls interleaved.  The loop reference (``tests/reference_advantages.hae_ref``, the write-up's
algorithm one column at a time) is timed on ``--loop-columns`` columns and scaled linearly to
``B`` (the loop's cost is linear in the columns); the output says when it scales.  The machines are shared, so read the
ratios, not the absolute times.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from reference_advantages import hae_ref  # noqa: E402
from tclock.advantages import gae, hae  # noqa: E402


def _interleaved_medians(fns, repeats):
    """Median seconds per call of each function, calls interleaved so load spikes hit all alike."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, default=2048)
    p.add_argument("--B", type=int, default=128)
    p.add_argument("--event-rate", type=float, default=0.01)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--done-rate", type=float, default=0.002)
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--loop-columns", type=int, default=32, help="columns the Python loop runs on (then scaled to B)")
    p.add_argument("--loop-repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)

    rng = np.random.default_rng(a.seed)
    T, B = a.T, a.B
    rewards = np.where(rng.random((T, B)) < a.event_rate, rng.random((T, B)) + 0.5, 0.0).astype(np.float32)
    values = rng.normal(size=(T, B)).astype(np.float32)
    next_values = rng.normal(size=(T, B)).astype(np.float32)
    terms = (rng.random((T, B)) < a.done_rate).astype(np.float32)
    truncs = (rng.random((T, B)) < a.done_rate).astype(np.float32)
    args = tuple(jnp.asarray(x) for x in (rewards, values, next_values, terms, truncs))

    hae_j = jax.jit(lambda *xs: hae(*xs, window=a.window))
    gae_j = jax.jit(gae)
    adv_h, _ = jax.block_until_ready(hae_j(*args))
    jax.block_until_ready(gae_j(*args))

    med = _interleaved_medians({"hae": lambda: hae_j(*args), "gae": lambda: gae_j(*args)}, a.repeats)
    t_hae, t_gae = med["hae"], med["gae"]

    cols = min(a.loop_columns, B)
    sub = tuple(x[:, :cols] for x in (rewards, values, next_values, terms, truncs))
    loop_times = []
    for _ in range(a.loop_repeats):
        t0 = time.perf_counter()
        ref_adv = hae_ref(*sub, window=a.window)[0]
        loop_times.append(time.perf_counter() - t0)
    t_loop_cols = statistics.median(loop_times)
    t_loop = t_loop_cols * B / cols
    err = float(np.max(np.abs(np.asarray(adv_h)[:, :cols] - ref_adv)))

    print(f"backend={jax.default_backend()}  T={T} B={B} window={a.window} event_rate={a.event_rate} "
          f"events={int((rewards > 0).sum())} ({(rewards > 0).sum() / B:.1f}/column)")
    print(f"hae (jit)        median {t_hae * 1e3:10.3f} ms  over {a.repeats} repeats")
    print(f"gae (jit)        median {t_gae * 1e3:10.3f} ms  over {a.repeats} repeats")
    scaled = "" if cols == B else f"  (measured {t_loop_cols * 1e3:.1f} ms on {cols} columns, scaled linearly x{B / cols:g})"
    print(f"loop reference   median {t_loop * 1e3:10.3f} ms{scaled}")
    print(f"max |hae - loop| on the looped columns: {err:.2e}")
    print(f"ratio loop/hae = {t_loop / t_hae:8.1f}x   (target >= 50x)")
    print(f"ratio hae/gae  = {t_hae / t_gae:8.2f}x   (target <= 3x)")


if __name__ == "__main__":
    main()
