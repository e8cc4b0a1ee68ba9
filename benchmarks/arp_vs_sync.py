"""Asynchronous rollout pipeline (ARP) + PPO vs synchronous PPO at the same batch size.

Side by side in one process, per env: the same config trained synchronously and on the ARP
(one actor thread, calibrated max data age), same env-step budget and seeds.  Printed:
training env-steps/s (all seeds, compile excluded) and the ARP/sync ratio, median RT/UT,
mean policy lag, dropped rollouts, and env steps to a success target (mean over seeds).

On a CPU the actor and the learner share the same cores, so no speed-up is expected there:
the ARP's benefit is that the learner never waits for a rollout when actors have their own
device.  Report what comes out.

    python benchmarks/arp_vs_sync.py [--envs pointmass_reach reacher_sparse] [--total-steps 400000]
"""
import argparse
import statistics
import tempfile
import warnings

import numpy as np

warnings.filterwarnings("ignore")

from tclock import critical, runlog  # noqa: E402
from tclock.config import TrainConfig  # noqa: E402
from tclock.loop import train  # noqa: E402


def summarize(run_dir, target):
    records = runlog.read_metrics(run_dir)
    status = runlog.read_status(run_dir)
    ratios = [r["rt_ut_ratio"] for r in records if r["rt_ut_ratio"] is not None]
    success = np.array([np.nanmean(np.array(r["success_rate"], dtype=float)) for r in records])
    hit = critical.steps_to_target([r["env_steps"] for r in records], success, target)
    return {
        "sps": status["env_steps_per_s"],
        "rt_ut": statistics.median(ratios) if ratios else float("nan"),
        "lag": float(np.mean([r.get("policy_lag", 0) for r in records])),
        "dropped": records[-1].get("dropped_age", 0) + records[-1].get("dropped_overflow", 0),
        "to_target": hit.env_steps,
        "final": float(success[-5:].mean()),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=["pointmass_reach", "reacher_sparse"])
    p.add_argument("--num-envs", type=int, default=256)
    p.add_argument("--unroll-length", type=int, default=32)
    p.add_argument("--total-steps", type=int, default=400_000)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--target", type=float, default=0.5)
    args = p.parse_args()
    tmp = tempfile.mkdtemp()
    print(f"num_envs={args.num_envs} unroll_length={args.unroll_length} total_steps={args.total_steps} per seed, "
          f"seeds={args.seeds}, target success {args.target}")
    for env in args.envs:
        rows = {}
        for mode in ("sync", "arp"):
            cfg = TrainConfig(env=env, num_envs=args.num_envs, unroll_length=args.unroll_length,
                              total_steps=args.total_steps, seeds=args.seeds, gdc_every=0, progress=False,
                              arp=(mode == "arp"), out=f"{tmp}/{env}_{mode}")
            train(cfg, overwrite=True)
            rows[mode] = summarize(cfg.out, args.target)
        print(f"\n## {env}")
        print(f"{'mode':6s} {'env steps/s':>12s} {'ratio':>6s} {'RT/UT med':>10s} {'policy lag':>10s} "
              f"{'dropped':>8s} {'steps to target':>16s} {'final success':>14s}")
        for mode, r in rows.items():
            ratio = r["sps"] / rows["sync"]["sps"]
            target = "not reached" if not np.isfinite(r["to_target"]) else f"{r['to_target']:,.0f}"
            print(f"{mode:6s} {r['sps']:12,.0f} {ratio:6.2f} {r['rt_ut']:10.3f} {r['lag']:10.2f} {r['dropped']:8d} "
                  f"{target:>16s} {r['final']:14.2f}")


if __name__ == "__main__":
    main()
