"""Seeds as a vmap axis: one sweep point with S vmapped seeds vs S sequential single-seed runs.

Same config, same env-step budget per seed, in one process.  Wall time counts training and
compilation (what a user waits for); the ratio vmapped / sequential is printed with and
without compile time.  Target: <= 0.5 at S = 8.

    python benchmarks/seeds_vmap.py [--seeds 8] [--num-envs 128] [--total-steps 100000]
"""
import argparse
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")

from tclock.config import TrainConfig  # noqa: E402
from tclock.loop import train  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="pointmass_reach")
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--num-envs", type=int, default=128)
    p.add_argument("--total-steps", type=int, default=100_000)
    args = p.parse_args()
    tmp = tempfile.mkdtemp()
    base = dict(env=args.env, num_envs=args.num_envs, total_steps=args.total_steps, gdc_every=4, progress=False)

    t0 = time.perf_counter()
    vm = train(TrainConfig(seeds=args.seeds, out=f"{tmp}/vmapped", **base))
    vmapped_s = time.perf_counter() - t0

    seq_s, seq_loop_s = 0.0, 0.0
    for s in range(args.seeds):
        t0 = time.perf_counter()
        r = train(TrainConfig(seeds=1, seed=1000 + s, out=f"{tmp}/seq{s}", **base))
        seq_s += time.perf_counter() - t0
        seq_loop_s += r.wall_s
    print(f"env={args.env} num_envs={args.num_envs} total_steps={args.total_steps} per seed, S={args.seeds}")
    print(f"{'':34s} {'vmapped':>10s} {'sequential':>11s} {'ratio':>7s}")
    print(f"{'wall s incl. compile':34s} {vmapped_s:10.1f} {seq_s:11.1f} {vmapped_s / seq_s:7.3f}")
    print(f"{'training loop s (compile excluded)':34s} {vm.wall_s:10.1f} {seq_loop_s:11.1f} {vm.wall_s / seq_loop_s:7.3f}")
    print("the sequential runs reuse one compiled program (same shapes), so compile counts once on both sides")
    print("target: ratio <= 0.5")


if __name__ == "__main__":
    main()
