"""PPO env-steps/s on big batches over 1, 2, 4, ... devices, beside the raw vmapped env step.

    python benchmarks/accelerator.py                                  # every local device (a GPU machine)
    python benchmarks/accelerator.py --cpu-devices 4                  # CPU, 4 fake devices (set before JAX starts)
    python benchmarks/accelerator.py --envs ant --batch-sizes 2048 8192 --mesh-sizes 1 8 --sweep

For each env and batch size B it trains tclock's PPO (``tclock.loop.train``, one seed,
default config otherwise, the progress bar off) once per mesh size E (``--mesh envs=E``: the
env axis split over E devices, the update averaged over all of them), for ``--iterations``
logged iterations after compile, and prints:

* training env-steps/s: ``B*T / median(rt_s + learn_s)`` over the run's iterations (compile
  and host bookkeeping excluded; ``RunResult.env_steps_per_s``, loop time, beside it);
* the raw rate of the bare env at the same B: a jitted ``lax.scan`` of ``--raw-steps`` (100) ``jax.vmap(env.step)``
  calls with random actions on one device (median of ``--repeats`` calls, compile excluded);
* ratios: training / raw step (what learning, the policy and the bookkeeping cost on top of
  physics) and E devices / 1 device (the speed-up of the mesh).

``--sweep`` also times the default sweep (``tclock sweep`` with its defaults, in a subprocess
with the same devices) and prints its wall seconds.

On a CPU, ``--cpu-devices N`` splits the host into N fake XLA devices that share the same
cores: an E-device ratio above 1 then says one device's program left cores idle (XLA's CPU
backend runs small ops on one thread), one below 1 the mesh's overhead; neither predicts what
E accelerators give.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path


def _early_cpu_devices(argv: list[str]) -> None:
    """``--cpu-devices N`` must reach XLA before JAX starts, so it is read before the imports."""
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith("--cpu-devices=") else (
            argv[i + 1] if arg == "--cpu-devices" and i + 1 < len(argv) else None)
        if value is not None:
            os.environ["JAX_PLATFORMS"] = "cpu"
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                       + f" --xla_force_host_platform_device_count={int(value)}").strip()


_early_cpu_devices(sys.argv[1:])

import jax  # noqa: E402

warnings.filterwarnings("ignore", message=".*Brax System, piplines and environments.*")

from bench_common import raw_steps_per_s, table  # noqa: E402
from tclock import runlog  # noqa: E402
from tclock.config import TrainConfig  # noqa: E402
from tclock.loop import train as tclock_train  # noqa: E402


def train_steps_per_s(name: str, num_envs: int, mesh_envs: int, iterations: int, unroll_length: int,
                      out: Path) -> dict:
    """One short PPO run on ``mesh_envs`` devices; its median per-iteration env-steps/s."""
    cfg = TrainConfig(env=name, num_envs=num_envs, unroll_length=unroll_length, seeds=1, progress=False,
                      total_steps=num_envs * unroll_length * iterations, mesh=f"envs={mesh_envs}",
                      checkpoint_every=10**6, out=str(out))
    res = tclock_train(cfg, overwrite=True)
    rows = runlog.read_metrics(res.run_dir)
    steps = num_envs * unroll_length
    return {"median_sps": steps / statistics.median(r["rt_s"] + r["learn_s"] for r in rows),
            "loop_sps": res.env_steps_per_s, "compile_s": res.compile_s}


def sweep_wall_s(out: Path) -> float:
    """Wall seconds of the default sweep (``tclock sweep``) in a fresh process."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tclock.cli", "sweep", "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _mesh_sizes(requested: list[int] | None, count: int) -> list[int]:
    sizes = requested or [e for e in (1, 2, 4, 8, 16, 32) if e <= count]
    too_many = [e for e in sizes if e > count]
    if too_many:
        sys.exit(f"--mesh-sizes: {too_many} exceed the {count} devices present; on a CPU add --cpu-devices N")
    return sizes


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", nargs="+", default=["ant", "halfcheetah"])
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[2048, 4096, 8192, 16384, 32768])
    p.add_argument("--mesh-sizes", nargs="+", type=int, default=None,
                   help="devices on the envs axis (default 1, 2, 4, ... up to the devices present)")
    p.add_argument("--cpu-devices", type=int, default=0, help="fake CPU devices (set before JAX starts)")
    p.add_argument("--iterations", type=int, default=6, help="logged iterations per run (after compile)")
    p.add_argument("--unroll-length", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5, help="calls per raw-rate median")
    p.add_argument("--raw-steps", type=int, default=100, help="env steps per raw-rate call (fewer on a CPU)")
    p.add_argument("--sweep", action="store_true", help="also time the default sweep (tclock sweep)")
    a = p.parse_args(argv)

    devices = jax.devices()
    sizes = _mesh_sizes(a.mesh_sizes, len(devices))
    print(f"devices: {len(devices)} x {devices[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}; "
          f"mesh sizes (envs axis) {sizes}", flush=True)
    if a.cpu_devices:
        print(f"{a.cpu_devices} fake CPU devices share this host's {os.cpu_count()} cores: an E-device ratio above 1 "
              "means one device left cores idle, below 1 the mesh's overhead; neither predicts accelerators",
              flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.envs:
            for B in a.batch_sizes:
                raw = raw_steps_per_s(name, B, a.repeats, a.raw_steps)[0]
                base = None
                for E in sizes:
                    if B % E:
                        continue
                    r = train_steps_per_s(name, B, E, a.iterations, a.unroll_length, Path(tmp) / f"{name}_{B}_{E}")
                    base = base or r["median_sps"]
                    rows.append([name, f"{B:,}", str(E), f"{r['median_sps']:,.0f}", f"{r['loop_sps']:,.0f}",
                                 f"{raw:,.0f}", f"{r['median_sps'] / raw:.2f}", f"{r['median_sps'] / base:.2f}",
                                 f"{r['compile_s']:.0f}"])
                    print("  ".join(rows[-1]), flush=True)
        print()
        print(table(["env", "B", "E devices", "train sps (median iter)", "train sps (loop)", "raw step sps (1 dev)",
                      "train/raw", "E/1 dev", "compile s"], rows))
        if a.sweep:
            print(f"\ndefault sweep (tclock sweep) on {len(devices)} device(s): "
                  f"{sweep_wall_s(Path(tmp) / 'sweep'):.0f} s wall")


if __name__ == "__main__":
    main()
