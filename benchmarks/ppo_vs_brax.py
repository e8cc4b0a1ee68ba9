"""tclock PPO vs Brax PPO, side by side in one run: training env-steps/s, compile time, time to the
first logged iteration, rollout speed.

    python benchmarks/ppo_vs_brax.py [--envs pointmass_reach,reacher] [--num-envs 256] [--unroll-length 32]
                                     [--num-minibatches 4] [--num-epochs 4] [--total-steps 1048576]
    python benchmarks/ppo_vs_brax.py --raw-only [--raw-num-envs 256,1024]

For each env it trains, with one seed each and identical sizes:

* tclock PPO (``tclock.loop.train``) twice: ``gdc_every=0`` (no gradient diagnostics) and the
  default ``gdc_every`` (GDC + noise scale every iteration).  Clocks, cheap diagnostics,
  metrics.jsonl and checkpoints stay at their defaults (the tqdm bar is off unless ``--progress``).
  Figure: ``RunResult.env_steps_per_s`` (loop time only, compile excluded), plus the median over
  iterations of ``B*T / (rt_s + learn_s)`` from metrics.jsonl.
* Brax PPO (``brax.training.agents.ppo.train.train``) on the same bare env (``tclock.envs.make``),
  ``episode_length`` = tclock's registered length, ``batch_size = num_envs / num_minibatches``
  (so ``batch_size * num_minibatches == num_envs``: one unroll of ``T`` steps of all envs per
  training step, the same ``B*T`` env steps per iteration, ``num_minibatches`` minibatches of
  ``B*T/num_minibatches`` transitions), ``num_updates_per_batch = num_epochs``, the same
  networks (separate policy/value MLPs, Gaussian with a state-independent log-std,
  ``distribution_type='normal'``), activation, lr, gamma, lambda, clip, entropy cost,
  grad-norm clip and observation normalisation.  (Truncation handling differs: Brax's default masks
  truncated steps out of GAE; its ``bootstrap_on_timeout`` needs an env that sets ``info['time_out']``,
  which Brax's own EpisodeWrapper does not; tclock bootstraps from ``final_obs``.)  Brax runs
  ``num_evals = 1 + --brax-epochs`` with ``run_evals=False``: its training is split into
  ``--brax-epochs`` equal jitted/pmapped epochs; the FIRST epoch includes XLA compilation, so
  Brax's figure is the env steps of epochs 2..N divided by the growth of Brax's own
  ``training/walltime`` over them (== the aggregate of Brax's logged ``training/sps`` for those
  epochs).  The median per-epoch ``training/sps`` and the host time between the first and last
  ``progress_fn`` callbacks are printed as cross-checks.  Brax's compile time is estimated as
  (first epoch time - median later epoch time).
* Time to the first logged iteration (start-up: env, init, compile, and one iteration): tclock's
  from the ``train`` call to its first ``on_iteration`` callback; Brax's from its ``train`` call
  to the first ``progress_fn`` call (the end of the first epoch) less the first epoch's training
  (the median later epoch) plus one training step.  Both processes start cold (no persistent
  compilation cache unless ``JAX_COMPILATION_CACHE_DIR`` is set).

``total_steps`` is rounded up to a multiple of ``brax_epochs * B * T`` so both do exactly the
same env steps.  The rollout table compares tclock's rollout phase (``B*T / median rt_s``) with a
raw ``jax.jit`` of a ``lax.scan`` of 100 ``jax.vmap(env.step)`` calls of the bare env at the
same ``B`` with random actions (median of ``--repeats`` calls, compile excluded).

Brax's trainer calls ``jax.device_put_replicated``, removed in JAX 0.10; this script patches
it at runtime (only here) with a ``NamedSharding``-based equivalent.  The machines are shared
and noisy: read the ratios more than the absolute figures.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
import warnings

import jax
import numpy as np

warnings.filterwarnings("ignore", message=".*Brax System, piplines and environments.*")


import brax_shims  # noqa: E402,F401  (puts back jax.device_put_replicated for Brax's trainers)
import flax.linen as linen  # noqa: E402
from brax.training.agents.ppo import networks as ppo_networks  # noqa: E402
from brax.training.agents.ppo import train as brax_ppo  # noqa: E402

from bench_common import raw_steps_per_s, table  # noqa: E402
from tclock import envs as tenvs  # noqa: E402
from tclock import runlog  # noqa: E402
from tclock.config import TrainConfig  # noqa: E402
from tclock.loop import train as tclock_train  # noqa: E402

BRAX_ACTIVATIONS = {"tanh": linen.tanh, "relu": linen.relu, "swish": linen.swish}


# --------------------------------------------------------------------------- tclock
def run_tclock(cfg: TrainConfig):
    first = []  # host time of the first logged iteration
    t0 = time.perf_counter()
    res = tclock_train(cfg, overwrite=True, on_iteration=lambda record: first or first.append(time.perf_counter()))
    total = time.perf_counter() - t0
    rows = runlog.read_metrics(res.run_dir)
    bt = cfg.num_envs * cfg.unroll_length
    med_rt = statistics.median(r["rt_s"] for r in rows)
    med_iter = statistics.median(r["rt_s"] + r["learn_s"] for r in rows)
    med_learn = statistics.median(r["learn_s"] for r in rows)
    return {
        "sps": res.env_steps_per_s,
        "sps_med_iter": bt / med_iter,
        "rollout_sps": bt / med_rt,
        "med_rt_s": med_rt,
        "med_learn_s": med_learn,
        "compile_s": res.compile_s,
        "first_iter_s": first[0] - t0,
        "wall_s": res.wall_s,
        "total_s": total,
        "iterations": res.iterations,
        "success": float(np.mean(res.final.get("success_rate", [float("nan")]))),
        "return": float(np.mean(res.final.get("episode_return", [float("nan")]))),
    }


# --------------------------------------------------------------------------- Brax
def run_brax(name: str, cfg: TrainConfig, episode_length: int, epochs: int):
    B, T = cfg.num_envs, cfg.unroll_length
    batch_size = B // cfg.num_minibatches
    assert batch_size * cfg.num_minibatches == B
    calls = []  # (host time, step, metrics)

    def progress(step, metrics):
        calls.append((time.perf_counter(), int(step), {k: float(v) for k, v in metrics.items()
                                                       if k.startswith("training/")}))

    network_factory = functools.partial(
        ppo_networks.make_ppo_networks,
        policy_hidden_layer_sizes=tuple(cfg.policy_hidden),
        value_hidden_layer_sizes=tuple(cfg.value_hidden),
        activation=BRAX_ACTIVATIONS[cfg.activation],
        distribution_type="normal",
        noise_std_type="log",
        init_noise_std=1.0,
        state_dependent_std=False,
    )
    t0 = time.perf_counter()
    brax_ppo.train(
        environment=tenvs.make(name),
        num_timesteps=cfg.total_steps,
        episode_length=episode_length,
        num_envs=B,
        unroll_length=T,
        batch_size=batch_size,
        num_minibatches=cfg.num_minibatches,
        num_updates_per_batch=cfg.num_epochs,
        network_factory=network_factory,
        learning_rate=cfg.lr,
        entropy_cost=cfg.ent_coef,
        discounting=cfg.gamma,
        gae_lambda=cfg.gae_lambda,
        clipping_epsilon=cfg.clip_eps,
        max_grad_norm=cfg.max_grad_norm,
        vf_loss_coefficient=cfg.vf_coef,
        normalize_observations=cfg.normalize_obs,
        reward_scaling=cfg.reward_scale,
        num_evals=1 + epochs,
        run_evals=False,
        seed=cfg.seed,
        progress_fn=progress,
    )
    total = time.perf_counter() - t0
    if len(calls) != epochs:
        raise RuntimeError(f"Brax called progress_fn {len(calls)} times, expected {epochs}")
    walls = [m["training/walltime"] for _, _, m in calls]
    epoch_s = [walls[0]] + [b - a for a, b in zip(walls, walls[1:])]
    steps = [calls[0][1]] + [b[1] - a[1] for a, b in zip(calls, calls[1:])]
    later_steps = sum(steps[1:])
    later_epoch_s = statistics.median(epoch_s[1:])
    iters_per_epoch = steps[0] / (B * T)  # Brax training steps (one unroll of B envs x T each) per epoch
    return {
        "sps": later_steps / (walls[-1] - walls[0]),
        "sps_med_epoch": statistics.median(m["training/sps"] for _, _, m in calls[1:]),
        "sps_callbacks": (calls[-1][1] - calls[0][1]) / (calls[-1][0] - calls[0][0]),
        "first_epoch_s": epoch_s[0],
        "compile_s": epoch_s[0] - later_epoch_s,
        # start-up + one training step: host time to the first progress_fn call (the end of the
        # first epoch) minus that epoch's training, estimated from the later epochs, plus one step
        "first_iter_s": (calls[0][0] - t0) - later_epoch_s + later_epoch_s / iters_per_epoch,
        "total_steps": calls[-1][1],
        "total_s": total,
        "per_epoch_steps": steps[0],
    }


# --------------------------------------------------------------------------- output
def _fmt(x, spec=",.0f"):
    return "n/a" if x is None or (isinstance(x, float) and not np.isfinite(x)) else format(x, spec)


def _median_dict(results: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in results) if isinstance(results[0][k], (int, float)) else results[0][k]
            for k in results[0]}


def raw_only(a):
    names = a.envs.split(",") if a.envs_given else ["pointmass_reach"]
    counts = [int(n) for n in a.raw_num_envs.split(",")]
    rows = []
    for name in names:
        for n in counts:
            sps, comp = raw_steps_per_s(name, n, a.repeats)
            rows.append([name, n, _fmt(sps), _fmt(comp, ".1f")])
    print(f"raw jax.jit(lax.scan(100 x jax.vmap(env.step))) of the bare env, random actions, "
          f"median of {a.repeats} calls (compile excluded); backend {jax.default_backend()}")
    print(table(["env", "num_envs", "raw env-steps/s", "compile s"], rows))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", default=None, help="comma-separated (default pointmass_reach,reacher; "
                                                 "--raw-only: pointmass_reach)")
    p.add_argument("--num-envs", type=int, default=256)
    p.add_argument("--unroll-length", type=int, default=32)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--num-epochs", type=int, default=4)
    p.add_argument("--total-steps", type=int, default=1 << 20,
                   help="per run; rounded up to a multiple of brax_epochs*num_envs*unroll_length")
    p.add_argument("--hidden", default="64,64", help="policy and value MLP widths")
    p.add_argument("--activation", default="tanh", choices=sorted(BRAX_ACTIVATIONS))
    p.add_argument("--episode-length", type=int, default=0, help="0: tclock's registered default per env")
    p.add_argument("--brax-epochs", type=int, default=4, help="Brax training epochs (num_evals - 1); "
                                                             "the first includes compile")
    p.add_argument("--repeats", type=int, default=5, help="calls per raw-throughput median")
    p.add_argument("--train-repeats", type=int, default=1, help="training runs per variant (median)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="", help="tclock run directories go here (default: a temp dir, deleted)")
    p.add_argument("--progress", action="store_true", help="show tclock's tqdm bar")
    p.add_argument("--skip-brax", action="store_true")
    p.add_argument("--raw-only", action="store_true",
                   help="only raw vmapped env steps/s (pointmass_reach at --raw-num-envs)")
    p.add_argument("--raw-num-envs", default="256,1024")
    a = p.parse_args(argv)
    a.envs_given = a.envs is not None
    if a.envs is None:
        a.envs = "pointmass_reach,reacher"

    print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}, "
          f"cpu count {os.cpu_count()}", flush=True)
    if a.raw_only:
        raw_only(a)
        return 0

    B, T, M = a.num_envs, a.unroll_length, a.num_minibatches
    if B % M:
        p.error(f"--num-envs {B} must be divisible by --num-minibatches {M} (Brax's batch_size = num_envs / "
                "num_minibatches so that batch_size * num_minibatches == num_envs)")
    chunk = a.brax_epochs * B * T
    total = -(-a.total_steps // chunk) * chunk
    hidden = tuple(int(h) for h in a.hidden.split(","))
    print(f"num_envs={B} unroll_length={T} num_minibatches={M} (Brax batch_size={B // M}) num_epochs={a.num_epochs} "
          f"hidden={hidden} activation={a.activation} total_steps={total:,} per run "
          f"({total // (B * T)} iterations of {B * T:,} env steps; Brax: {a.brax_epochs} epochs of "
          f"{total // chunk} training steps) seed={a.seed}", flush=True)

    tmp = None
    out_root = a.out
    if not out_root:
        tmp = tempfile.TemporaryDirectory(prefix="ppo_vs_brax_")
        out_root = tmp.name
    summaries = []
    try:
        for name in a.envs.split(","):
            ep_len = a.episode_length or tenvs.spec(name).episode_length
            print(f"\n=== {name} (episode_length={ep_len}) ===", flush=True)
            raw_sps, raw_comp = raw_steps_per_s(name, B, a.repeats, seed=a.seed)
            print(f"raw vmapped env.step at num_envs={B}: {raw_sps:,.0f} steps/s (compile {raw_comp:.1f}s)", flush=True)
            base = TrainConfig(env=name, episode_length=ep_len, num_envs=B, unroll_length=T, num_minibatches=M,
                               num_epochs=a.num_epochs, total_steps=total, seed=a.seed, policy_hidden=hidden,
                               value_hidden=hidden, activation=a.activation, progress=a.progress)
            default_gdc = base.gdc_every
            results = {}
            for rep in range(a.train_repeats):
                for label, gdc in (("tclock gdc_every=0", 0), (f"tclock gdc_every={default_gdc} (default)", default_gdc)):
                    cfg = base.replace(gdc_every=gdc, out=os.path.join(out_root, f"{name}_gdc{gdc}_r{rep}"))
                    r = run_tclock(cfg)
                    print(f"  {label}: {r['sps']:,.0f} env-steps/s, compile {r['compile_s']:.1f}s, first iteration "
                          f"after {r['first_iter_s']:.1f}s, loop {r['wall_s']:.1f}s, "
                          f"median rt {r['med_rt_s'] * 1e3:.1f} ms, median learn {r['med_learn_s'] * 1e3:.1f} ms, "
                          f"final success {r['success']:.2f}", flush=True)
                    results.setdefault(label, []).append(r)
                if not a.skip_brax:
                    r = run_brax(name, base, ep_len, a.brax_epochs)
                    if r["total_steps"] != total:
                        print(f"  WARNING: Brax did {r['total_steps']:,} env steps, tclock {total:,}")
                    print(f"  Brax PPO: {r['sps']:,.0f} env-steps/s (epochs 2..{a.brax_epochs}), first epoch "
                          f"{r['first_epoch_s']:.1f}s incl. compile, est. compile {r['compile_s']:.1f}s, first iteration after "
                          f"{r['first_iter_s']:.1f}s (est.)", flush=True)
                    results.setdefault("Brax PPO", []).append(r)
            res = {k: _median_dict(v) for k, v in results.items()}
            summaries.append((name, res, raw_sps))
    finally:
        if tmp is not None:
            tmp.cleanup()

    note = "" if a.train_repeats == 1 else f" (median of {a.train_repeats} runs each)"
    for name, res, raw_sps in summaries:
        brax = res.get("Brax PPO")
        print(f"\n## {name}: training env-steps/s, compile excluded{note}")
        rows = []
        for label, r in res.items():
            if label == "Brax PPO":
                rows.append([label, _fmt(r["sps"]), _fmt(r["sps_med_epoch"]), "1.00", "1.00",
                             _fmt(r["compile_s"], ".1f"), _fmt(r["first_iter_s"], ".1f"), "1.00"])
                continue
            ratio = r["sps"] / brax["sps"] if brax else float("nan")
            ratio_med = r["sps_med_iter"] / brax["sps_med_epoch"] if brax else float("nan")
            first_ratio = r["first_iter_s"] / brax["first_iter_s"] if brax else float("nan")
            rows.append([label, _fmt(r["sps"]), _fmt(r["sps_med_iter"]), _fmt(ratio, ".2f"), _fmt(ratio_med, ".2f"),
                         _fmt(r["compile_s"], ".1f"), _fmt(r["first_iter_s"], ".1f"), _fmt(first_ratio, ".2f")])
        print(table(["run", "sps", "sps (median iter/epoch)", "ratio vs Brax", "ratio (medians)", "compile s",
                      "first iteration s", "first iteration vs Brax"], rows))
        if brax:
            print(f"(Brax sps = env steps of epochs 2..{a.brax_epochs} / growth of Brax's training/walltime over them; "
                  f"median = median per-epoch training/sps; host time between first and last progress_fn "
                  f"callbacks gives {brax['sps_callbacks']:,.0f}; Brax compile = first epoch - median later epoch. "
                  f"tclock sps = RunResult.env_steps_per_s (whole loop incl. logging/checkpoints); median = "
                  f"B*T / median(rt_s + learn_s). First iteration = seconds from the train call to the first "
                  f"logged iteration (env, init, compile, one iteration); Brax's: to its first progress_fn call, "
                  f"less the first epoch's training (median later epoch) plus one training step.)")
        print(f"\n## {name}: rollout phase vs raw vmapped env.step at num_envs={B}")
        rows = []
        for label, r in res.items():
            if label == "Brax PPO":
                continue
            rows.append([label, _fmt(r["rollout_sps"]), _fmt(raw_sps), _fmt(r["rollout_sps"] / raw_sps, ".2f")])
        print(table(["run", "tclock rollout sps (B*T/median rt_s)", "raw env.step sps", "ratio"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
