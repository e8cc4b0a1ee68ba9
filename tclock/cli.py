"""Command line: ``tclock train | sweep | profile | doctor | plot | envs``.

Every ``TrainConfig`` field is a flag of ``train`` and ``sweep`` (``num_envs`` ->
``--num-envs``); ``--config FILE.yaml`` supplies fields too, and flags win over the file.

Exit codes: 0 success; 1 ``doctor`` found the two-clocks pattern; 2 bad input (config, a
run directory or checkpoint that cannot be read or written); 3 training diverged (non-finite
loss or parameters; ``sweep``: at least one batch size diverged, the others ran); 4 an
unexpected error (a bug: the traceback is printed and status.json says ``failed``); 5 in a run
across processes, a collective with another process failed (that process died or was cut off:
status.json says ``failed``; rerun every process with ``--resume``).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback
import warnings

from tclock.config import ConfigError, TrainConfig

EXIT_OK, EXIT_TWO_CLOCKS, EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_INTERNAL, EXIT_PEER_LOST = 0, 1, 2, 3, 4, 5


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_import_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import a module or .py file first, e.g. one that registers your own tasks "
                             "with tclock.envs.register or learners with tclock.agents.register_learner "
                             "(repeatable)")


def add_config_flags(parser: argparse.ArgumentParser, skip: tuple = ()) -> None:
    """One flag per TrainConfig field; defaults are None so only given flags override."""
    parser.add_argument("--config", help="YAML file of config fields (flags override it)")
    add_import_flag(parser)
    group = parser.add_argument_group("config fields (see docs/config.md)")
    for f in dataclasses.fields(TrainConfig):
        if f.name in skip:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if isinstance(default, bool):
            group.add_argument(_flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                               help=f"(default {default})")
        elif isinstance(default, tuple):
            group.add_argument(_flag(f.name), dest=f.name, nargs="+", type=int, default=None,
                               help=f"(default {' '.join(map(str, default))})")
        elif isinstance(default, dict):
            group.add_argument(_flag(f.name), dest=f.name, type=_yaml_mapping, default=None,
                               help="YAML/JSON mapping passed to the env factory, e.g. '{radius: 0.2}'")
        else:
            group.add_argument(_flag(f.name), dest=f.name, type=str, default=None, help=f"(default {default!r})")


def _yaml_mapping(text: str) -> dict:
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise argparse.ArgumentTypeError(f"not valid YAML: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a mapping such as '{radius: 0.2}'")
    return value


def import_user_modules(specs: list[str]) -> None:
    """``--import``: modules or .py files that register tasks (``tclock.envs.register``) or
    learners (``tclock.agents.register_learner``)."""
    import importlib
    import importlib.util
    from pathlib import Path

    for spec in specs:
        try:
            if spec.endswith(".py"):
                path = Path(spec)
                if not path.exists():
                    raise FileNotFoundError(f"no such file {path}")
                module_spec = importlib.util.spec_from_file_location(f"tclock_user_{path.stem}", path)
                module = importlib.util.module_from_spec(module_spec)
                sys.modules[module_spec.name] = module
                module_spec.loader.exec_module(module)
            else:
                importlib.import_module(spec)
        except Exception as e:  # noqa: BLE001 - reported as bad input
            raise ConfigError(f"--import: cannot import {spec!r} ({type(e).__name__}: {e}); give a module name on "
                              "the Python path or a path to a .py file") from None


def config_from_args(args: argparse.Namespace, extra: dict | None = None, defaults: dict | None = None):
    """Defaults < ``defaults`` (command-specific) < YAML file < flags < ``extra``."""
    from tclock.config import from_dict, load_config

    names = {f.name for f in dataclasses.fields(TrainConfig)}
    overrides = {k: v for k, v in vars(args).items() if k in names and v is not None}
    overrides.update(extra or {})
    base = from_dict(defaults or {}, source="command defaults")
    return load_config(args.config, overrides, base=base)


def add_launch_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that join several processes (hosts) on JAX's distributed runtime (tclock.distributed)."""
    group = parser.add_argument_group("several processes or hosts (README: More than one device or host)")
    group.add_argument("--coordinator", default="", metavar="HOST:PORT",
                       help="address of process 0's coordinator (with --num-processes and --process-id)")
    group.add_argument("--num-processes", type=int, default=0, help="processes taking part, all hosts together")
    group.add_argument("--process-id", type=int, default=-1, help="this process's index, 0 .. num-processes - 1")
    group.add_argument("--distributed", action="store_true",
                       help="let jax.distributed.initialize() detect the cluster (SLURM, Open MPI, TPU pods)")
    group.add_argument("--init-timeout", type=int, default=60,
                       help="seconds to wait for the coordinator and the other processes (default 60)")


def join_processes(args) -> None:
    """Before anything touches a device: join the other processes when the flags say so."""
    from tclock import distributed

    distributed.initialize(distributed.Launch(args.coordinator, args.num_processes, args.process_id,
                                              args.distributed, args.init_timeout))


# ----------------------------------------------------------------------------- commands
def cmd_train(args) -> int:
    from tclock.loop import TrainingDiverged, train

    join_processes(args)
    cfg = config_from_args(args)
    try:
        result = train(cfg, resume=args.resume, overwrite=args.overwrite)
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_DIVERGED
    final = result.final
    success = final.get("success_rate") or []
    mean_success = sum(v for v in success if v is not None) / max(1, len(success))
    print(f"run: {result.run_dir}  iterations: {result.iterations}  compile: {result.compile_s:.1f}s  "
          f"train wall: {result.wall_s:.1f}s  env steps/s (all seeds): {result.env_steps_per_s:,.0f}  "
          f"final success: {mean_success:.2f}  rt/ut (w50): {final.get('rt_ut_ratio_w50') or 0:.2f}")
    print(f"next: tclock doctor {result.run_dir}   |   tclock plot {result.run_dir}")
    return EXIT_OK


SWEEP_DEFAULTS = {"seeds": 3, "total_steps": 600_000, "gdc_every": 4, "noise_split": True, "out": "runs/sweep"}


def cmd_sweep(args) -> int:
    from tclock import agents
    from tclock.sweep import SweepSpec, run_sweep

    join_processes(args)
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    given = {k for k, v in vars(args).items() if k in names and v is not None}
    from_file = set(_yaml_keys(args.config))
    defaults = {k: v for k, v in SWEEP_DEFAULTS.items() if k not in given | from_file}
    algo = args.algo or _yaml_value(args.config, "algo") or "ppo"
    if algo in agents.learner_names() and not agents.learner_spec(algo).on_policy:
        defaults.pop("noise_split", None)  # the half-phase split is an on-policy estimator
    base = config_from_args(args, extra=None, defaults=defaults)
    spec = SweepSpec(batch_sizes=tuple(args.batch_sizes), budget=args.budget, minibatch=args.minibatch,
                     minibatch_size=args.minibatch_size, devices=args.devices, lrs=tuple(args.lrs or ()),
                     axis=args.sweep_axis)
    summary = run_sweep(base, spec, base.out, progress=base.progress, retry_failed=args.retry_failed)
    diverged = [r["batch"] for r in summary["incomplete"] if r.get("diverged")]
    if diverged:
        print(f"error: training diverged at B={diverged} (see {base.out}/report.md); the other batch sizes ran",
              file=sys.stderr)
        return EXIT_DIVERGED
    return EXIT_OK


def _yaml_value(path, key: str):
    from tclock.config import read_yaml

    return read_yaml(path).get(key) if path else None


def _yaml_keys(path) -> list:
    from tclock.config import read_yaml

    return list(read_yaml(path)) if path else []


def cmd_pool(args) -> int:
    from tclock.sweep_pool import PoolError, pool_sweeps
    from tclock.sweep_report import format_summary, summarize_sweep

    try:
        out = pool_sweeps(args.sweeps, args.out)
    except PoolError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(format_summary(summarize_sweep(out)))
    return EXIT_OK


def cmd_profile(args) -> int:
    from tclock.profile import format_profile, profile

    cfg = config_from_args(args)
    result = profile(cfg, batch_sizes=tuple(args.batch_sizes), rollout_steps=args.rollout_steps,
                     update_every=args.update_every, repeats=args.repeats, with_update=not args.no_update,
                     out_dir=args.out_dir)
    print(format_profile(result))
    return EXIT_OK


def cmd_doctor(args) -> int:
    from tclock.doctor import run_doctor

    return run_doctor(args.run_dir, as_json=args.json)


def cmd_plot(args) -> int:
    from tclock import runlog
    from tclock.plots import plot_run

    try:
        paths = plot_run(args.run_dir, args.out)
    except runlog.RunFormatError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for p in paths:
        print(p)
    return EXIT_OK


def cmd_envs(args) -> int:
    from tclock import envs

    for name in envs.names():
        s = envs.spec(name)
        print(f"{name:28s} episode_length={s.episode_length:<5d} {s.description}")
    return EXIT_OK


def cmd_learners(args) -> int:
    from tclock import agents

    for name in agents.learner_names():
        spec = agents.learner_spec(name)
        defaults = ", ".join(f"{k}={v!r}" for k, v in spec.defaults.items()) or "the shared defaults"
        print(f"{name:10s} {spec.description}")
        print(f"{'':10s} defaults: {defaults}; own fields: {', '.join(spec.fields) or 'none'}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tclock", description="Two clocks in on-policy RL: measure, locate, mitigate.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train one config (S seeds in one program) into a run directory")
    add_config_flags(p)
    add_launch_flags(p)
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in --out")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("sweep", help="train every batch size in a list (S seeds each) and locate the critical point")
    add_config_flags(p)
    add_launch_flags(p)
    from tclock.sweep import DEFAULT_BATCH_SIZES

    p.add_argument("--batch-sizes", nargs="+", type=int, default=list(DEFAULT_BATCH_SIZES),
                   help="values of the swept field, num_envs unless --sweep-axis says (default: %(default)s)")
    p.add_argument("--sweep-axis", choices=("num_envs", "sac_batch_size"), default="num_envs",
                   help="the field --batch-sizes sets: num_envs (the rollout batch) or, with --algo sac, "
                        "sac_batch_size (the gradient batch, at fixed num_envs and replay ratio)")
    p.add_argument("--budget", choices=("steps", "iterations"), default="steps",
                   help="fixed across the sweep: env steps per seed (total_steps) or iterations (default: steps)")
    p.add_argument("--minibatch", choices=("count", "size"), default="count",
                   help="fixed across the sweep: num_minibatches or --minibatch-size transitions (default: count)")
    p.add_argument("--minibatch-size", type=int, default=0, help="transitions per minibatch with --minibatch size")
    p.add_argument("--devices", type=int, default=0, help="JAX devices to spread batch sizes over (0 = all)")
    p.add_argument("--lrs", nargs="+", type=float, default=None,
                   help="learning rates of a B x lr grid (e.g. 1e-4 3e-4 1e-3): one run per pair, B_crit fitted on "
                        "the best lr at each B (default: every B at --lr)")
    p.add_argument("--retry-failed", action="store_true",
                   help="train batch sizes that diverged in an earlier run of this sweep again (default: keep them "
                        "as failed)")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("pool", help="pool sweeps trained with different --seed into one sweep of all their "
                                    "seeds, and summarise it")
    p.add_argument("sweeps", nargs="+", help="sweep directories (the same batch sizes, lrs and config, "
                                             "different base seeds)")
    p.add_argument("--out", required=True, help="new directory for the pooled sweep")
    p.set_defaults(func=cmd_pool)

    p = sub.add_parser("profile", help="pre-flight latency profile: rollout time vs batch size, RT/UT estimate")
    add_config_flags(p)
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[64, 128, 256, 512])
    p.add_argument("--rollout-steps", type=int, default=100, help="steps per timed rollout (default 100)")
    p.add_argument("--update-every", type=int, default=1000,
                   help="planned update interval in env steps for the write-up's RT/UT estimate (default 1000)")
    p.add_argument("--repeats", type=int, default=3, help="timed rollouts per batch size (median)")
    p.add_argument("--no-update", action="store_true", help="time rollouts only, not the learning phase")
    p.add_argument("--out-dir", default=None, help="write profile.json and profile.md here")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("doctor", help="read a run directory and say whether it is healthy (exit 0/1/2)")
    p.add_argument("run_dir")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("plot", help="write PNG plots of a run directory")
    p.add_argument("run_dir")
    p.add_argument("--out", default=None, help="folder for the PNGs (default: the run directory)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("envs", help="list the registered environments")
    add_import_flag(p)
    p.set_defaults(func=cmd_envs)

    p = sub.add_parser("learners", help="list the registered learners (--algo), their defaults and own fields")
    add_import_flag(p)
    p.set_defaults(func=cmd_learners)

    return parser


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message=".*not actively being maintained.*")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        import_user_modules(getattr(args, "imports", []))
        return args.func(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted: the last complete iteration is checkpointed; continue with --resume", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - every failure gets its documented exit code
        return _exit_code_for(e)


def _exit_code_for(error: Exception) -> int:
    from tclock import runlog

    if isinstance(error, (runlog.RunFormatError, runlog.RunWriteError)):
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if _peer_lost(error):
        print(f"error: a collective with the other processes failed ({str(error).splitlines()[0]}): another process "
              "of this run most likely died. The last periodic checkpoint is kept (status.json names it); start every "
              "process again with --resume", file=sys.stderr)
        sys.stderr.flush()
        sys.stdout.flush()
        # JAX's distributed service would abort this process at exit (its shutdown barrier waits for the dead
        # peer); leave now with the documented code instead.
        os._exit(EXIT_PEER_LOST)
    traceback.print_exception(error)
    print(f"error: unexpected {type(error).__name__} (a bug in tclock or in an --import module; the traceback is "
          "above)", file=sys.stderr)
    return EXIT_INTERNAL


def _peer_lost(error: Exception) -> bool:
    """Whether ``error`` is a JAX runtime error in a run joined to other processes."""
    if "jax" not in sys.modules:
        return False
    import jax

    try:
        return jax.process_count() > 1 and isinstance(error, jax.errors.JaxRuntimeError)
    except RuntimeError:
        return False


if __name__ == "__main__":
    sys.exit(main())
