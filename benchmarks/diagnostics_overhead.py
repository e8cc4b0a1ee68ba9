"""Cost of gradient diagnostics: iteration time with them off, at the default cadence (every 8:
GDC and the per-env gradient noise, without the half learning phase), at that cadence with the
half phase (``noise_split``: the update's noise scale and the step-size signal, whose held-out
half is judged too), with the half phase every 32 iterations, and with it every iteration.

Three runs of the same config side by side in one process (same compiled programs; only the
host decides when to call the GDC variant).  Iteration time = rt_s + learn_s from
metrics.jsonl, averaged over all iterations after a warm-up (a mean, not a median, so the
occasional GDC iteration of the every-10 run is counted).  The runs are interleaved in
rounds and the per-round ratios' median is printed, since the machine is shared.

    python benchmarks/diagnostics_overhead.py [--num-envs 256] [--iterations 60] [--rounds 3]
"""
import argparse
import statistics
import tempfile
import warnings

import numpy as np

warnings.filterwarnings("ignore")

from tclock import runlog  # noqa: E402
from tclock.config import TrainConfig  # noqa: E402
from tclock.loop import train  # noqa: E402


def mean_iteration_s(run_dir, warmup=3):
    records = runlog.read_metrics(run_dir)[warmup:]
    return float(np.mean([r["rt_s"] + r["learn_s"] for r in records]))


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--env", default="pointmass_reach")
    p.add_argument("--num-envs", type=int, default=256)
    p.add_argument("--unroll-length", type=int, default=32)
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    tmp = tempfile.mkdtemp()
    steps = args.num_envs * args.unroll_length * args.iterations
    variants = {"off": (0, False), "every 8 (default)": (8, False), "every 8, split": (8, True),
                "every 32, split": (32, True), "every 1, split": (1, True)}
    times = {k: [] for k in variants}
    for r in range(args.rounds):
        for name, (every, split) in variants.items():
            cfg = TrainConfig(env=args.env, num_envs=args.num_envs, unroll_length=args.unroll_length,
                              total_steps=steps, gdc_every=every, noise_split=split, progress=False,
                              out=f"{tmp}/{r}_{every}_{split}")
            times[name].append(mean_iteration_s(train(cfg, overwrite=True).run_dir))
    print(f"env={args.env} num_envs={args.num_envs} unroll_length={args.unroll_length} "
          f"iterations={args.iterations} rounds={args.rounds} (gdc_k=5, gdc_minibatch=64)")
    print(f"{'variant':20s} {'mean iteration s (median over rounds)':>38s} {'ratio to off':>14s}")
    for name in variants:
        ratios = [t / o for t, o in zip(times[name], times["off"])]
        print(f"{name:20s} {statistics.median(times[name]):38.4f} {statistics.median(ratios):14.3f}")
    print("target: the default cadence <= 1.05x; the step-size signal needs the split")


if __name__ == "__main__":
    main()
