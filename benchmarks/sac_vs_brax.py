"""tclock SAC vs Brax SAC, side by side in one run: training env-steps/s and gradient-steps/s.

    python benchmarks/sac_vs_brax.py [--envs pointmass_reach,reacher] [--num-envs 64] [--replay-ratio 0.0625]
                                     [--batch-size 256] [--hidden 128,128] [--total-steps 98304]

For each env, with one seed each and the same work per env step:

* tclock SAC (``tclock.loop.train``, ``--algo sac``, ``gdc_every=0``): each iteration is a rollout
  of ``T`` steps of ``B`` envs into the replay ring and ``G = replay_ratio * B * T`` gradient
  steps of ``batch_size`` transitions.
* Brax SAC (``brax.training.agents.sac.train.train``) on the same bare env: each training step
  is one step of ``B`` envs and ``grad_updates_per_step = replay_ratio * B`` gradient steps of
  ``batch_size`` transitions, so both sides do the same gradient steps per env step.

Same on both sides: ``num_envs``, replay ratio, batch size, replay capacity, warm-up
(``min_replay``), hidden sizes (actor and both critics), ReLU, lr, gamma, tau, reward scale,
observation normalisation, episode length.  Different: Brax's actor has a state-dependent
scale through a softplus, tclock's a tanh-squashed log-std; Brax's temperature starts at 1,
tclock's at ``sac_init_alpha``; neither changes the work per step.

Figures (compile and warm-up excluded): tclock's median over the iterations after the warm-up
of ``B*T / (rt_s + learn_s)``; Brax's median per-epoch ``training/sps`` of epochs 2..N (the
first includes compilation; Brax's prefill and its evaluations lie outside its epoch timing).
Gradient steps/s = env-steps/s x replay ratio on both sides.  Brax's trainer needs
``jax.device_put_replicated`` (removed in JAX 0.10): ``brax_shims`` patches it in this process.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import warnings

import jax

warnings.filterwarnings("ignore", message=".*Brax System, piplines and environments.*")

import brax_shims  # noqa: E402,F401  (puts back jax.device_put_replicated for Brax's trainers)
import flax.linen as linen  # noqa: E402
from brax.training.agents.sac import networks as sac_networks  # noqa: E402
from brax.training.agents.sac import train as brax_sac  # noqa: E402

from bench_common import table  # noqa: E402
from tclock import envs as tenvs  # noqa: E402
from tclock import runlog  # noqa: E402
from tclock.config import defaults_for  # noqa: E402
from tclock.loop import train as tclock_train  # noqa: E402


def run_tclock(cfg) -> dict:
    res = tclock_train(cfg, overwrite=True)
    rows = [r for r in runlog.read_metrics(res.run_dir) if r["grad_steps"][0] > 0]
    if not rows:
        raise RuntimeError("tclock SAC ran no gradient steps: raise --total-steps above the warm-up")
    bt = cfg.num_envs * cfg.unroll_length
    sps = statistics.median(bt / (r["rt_s"] + r["learn_s"]) for r in rows)
    return {"sps": sps, "grad_sps": sps * cfg.sac_replay_ratio, "compile_s": res.compile_s,
            "iterations": len(rows), "grad_steps": rows[0]["grad_steps"][0],
            "success": rows[-1]["success_rate"][0]}


def run_brax(name: str, cfg, episode_length: int, epochs: int) -> dict:
    calls = []

    def progress(step, metrics):
        calls.append({k: float(v) for k, v in metrics.items() if k.startswith("training/")})

    per_step = cfg.sac_replay_ratio * cfg.num_envs
    if abs(per_step - round(per_step)) > 1e-9 or round(per_step) < 1:
        raise SystemExit(f"replay_ratio * num_envs = {per_step} must be a positive integer for Brax's "
                         "grad_updates_per_step")
    network_factory = functools.partial(sac_networks.make_sac_networks,
                                        hidden_layer_sizes=tuple(cfg.policy_hidden), activation=linen.relu)
    brax_sac.train(
        environment=tenvs.make(name), num_timesteps=cfg.total_steps, episode_length=episode_length,
        num_envs=cfg.num_envs, num_eval_envs=1, learning_rate=cfg.lr, discounting=cfg.gamma, seed=cfg.seed,
        batch_size=cfg.sac_batch_size, num_evals=1 + epochs, normalize_observations=cfg.normalize_obs,
        reward_scaling=cfg.reward_scale, tau=cfg.sac_tau, min_replay_size=cfg.sac_min_replay,
        max_replay_size=cfg.sac_buffer_size, grad_updates_per_step=int(round(per_step)),
        network_factory=network_factory, progress_fn=progress)
    later = [c["training/sps"] for c in calls[1:] if "training/sps" in c]
    if not later:
        raise RuntimeError(f"Brax reported no training/sps after its first epoch ({len(calls)} progress calls)")
    sps = statistics.median(later)
    return {"sps": sps, "grad_sps": sps * cfg.sac_replay_ratio, "epochs": len(calls)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", default="pointmass_reach,reacher")
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--unroll-length", type=int, default=16, help="tclock's T (Brax steps one env step at a time)")
    p.add_argument("--replay-ratio", type=float, default=0.0625, help="gradient steps per env step")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--hidden", default="128,128")
    p.add_argument("--min-replay", type=int, default=4096)
    p.add_argument("--buffer-size", type=int, default=131072)
    p.add_argument("--total-steps", type=int, default=98304)
    p.add_argument("--brax-epochs", type=int, default=4, help="Brax epochs (num_evals - 1); the first compiles")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    hidden = tuple(int(h) for h in a.hidden.split(","))
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}, cpu count {os.cpu_count()}")
    print(f"num_envs={a.num_envs} replay_ratio={a.replay_ratio} batch_size={a.batch_size} hidden={hidden} "
          f"min_replay={a.min_replay} buffer={a.buffer_size} total_steps={a.total_steps:,} "
          f"(tclock: T={a.unroll_length}, {a.replay_ratio * a.num_envs * a.unroll_length:g} gradient steps per "
          f"iteration; Brax: {a.replay_ratio * a.num_envs:g} per env step)", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="sac_vs_brax_") as tmp:
        for name in a.envs.split(","):
            ep_len = tenvs.spec(name).episode_length
            cfg = defaults_for("sac", env=name, num_envs=a.num_envs, unroll_length=a.unroll_length,
                               sac_replay_ratio=a.replay_ratio, sac_batch_size=a.batch_size, sac_min_replay=a.min_replay,
                               sac_buffer_size=a.buffer_size, policy_hidden=hidden, value_hidden=hidden,
                               total_steps=a.total_steps, seed=a.seed, gdc_every=0, progress=False,
                               episode_length=ep_len, out=os.path.join(tmp, name))
            print(f"\n=== {name} (episode_length={ep_len}) ===", flush=True)
            t = run_tclock(cfg)
            print(f"  tclock SAC: {t['sps']:,.0f} env-steps/s, {t['grad_sps']:,.0f} gradient-steps/s "
                  f"(median of {t['iterations']} iterations after the warm-up), compile {t['compile_s']:.1f}s",
                  flush=True)
            b = run_brax(name, cfg, ep_len, a.brax_epochs)
            print(f"  Brax SAC: {b['sps']:,.0f} env-steps/s, {b['grad_sps']:,.0f} gradient-steps/s "
                  f"(median of epochs 2..{b['epochs']})", flush=True)
            results.append((name, t, b))
    print("\n## training throughput, compile and warm-up excluded")
    rows = [[name, f"{t['sps']:,.0f}", f"{b['sps']:,.0f}", f"{t['sps'] / b['sps']:.2f}", f"{t['grad_sps']:,.0f}",
             f"{b['grad_sps']:,.0f}", f"{t['grad_sps'] / b['grad_sps']:.2f}"] for name, t, b in results]
    print(table(["env", "tclock env-steps/s", "Brax env-steps/s", "ratio", "tclock grad-steps/s",
                  "Brax grad-steps/s", "ratio"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
