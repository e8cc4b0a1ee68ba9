"""Runs for the device-mesh tests, in a process of its own (fake CPU devices must be set before JAX
starts): ``python tests/mesh_runs.py OUT [PART PARTS]`` trains one small config on every mesh in :data:`MESHES`
(run directories ``OUT/<name>``) and writes ``OUT/shardings.json``: for the mesh ``seeds=2,envs=2``,
where each array of the state lies after one rollout and one update on it.
"""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

# The config every mesh test trains: small, one update program (gdc_every 0), 4 seeds, 16 envs.
ARGS = ["--env", "pointmass_reach", "--seeds", "4", "--num-envs", "16", "--unroll-length", "8",
        "--total-steps", str(16 * 8 * 4), "--gdc-every", "0", "--policy-hidden", "16", "--value-hidden", "16",
        "--num-minibatches", "2", "--num-epochs", "2", "--checkpoint-every", "2", "--no-progress"]
MESHES = {"one": "seeds=1,envs=1", "seeds4": "seeds=4", "envs2": "envs=2", "envs4": "envs=4",
          "seeds2_envs2": "seeds=2,envs=2"}
# SAC on one device and on envs=2: its replay ring splits along its capacity with the envs.
SAC_ARGS = ["--algo", "sac", "--env", "pointmass_reach", "--seeds", "2", "--num-envs", "16", "--unroll-length", "8",
            "--total-steps", str(16 * 8 * 4), "--gdc-every", "0", "--policy-hidden", "16", "--value-hidden", "16",
            "--sac-buffer-size", "512", "--sac-min-replay", "128", "--sac-batch-size", "32", "--sac-replay-ratio",
            "0.03125", "--checkpoint-every", "2", "--no-progress"]
SAC_MESHES = {"sac_one": "seeds=1,envs=1", "sac_envs2": "envs=2"}


def config(out: str, mesh: str, args: list[str] = ARGS):
    from tclock import cli

    args = cli.build_parser().parse_args(["train", *args, "--mesh", mesh, "--out", out])
    return cli.config_from_args(args)


def shardings(cfg) -> dict:
    """Per state leaf of the ``env`` field and of the parameters: the partition spec and the devices
    holding a piece, after one rollout and one update on the mesh."""
    import jax
    import jax.numpy as jnp

    from tclock.loop import run_mesh
    from tclock.runtime import build_agent, compiled_for

    mesh = run_mesh(cfg)
    agent = build_agent(cfg)
    agent.env_blocks = mesh.blocks
    state = mesh.place(agent.init(cfg.seed, cfg.seeds), agent.env_sharded_fields)
    programs, _ = compiled_for(agent, state, cfg.num_envs, False, mesh=mesh)
    state, traj, _ = programs.rollout(state)
    state, _ = programs.update_plain(state, traj, jnp.float32(cfg.lr))
    jax.block_until_ready(state)

    def describe(x):
        return {"spec": [a for a in x.sharding.spec], "devices": sorted(s.device.id for s in x.addressable_shards),
                "shard_shapes": sorted({tuple(s.data.shape) for s in x.addressable_shards}), "shape": list(x.shape)}

    return {"env": [describe(x) for x in jax.tree.leaves(state.env)],
            "replay": [describe(x) for x in jax.tree.leaves(getattr(state, "replay", ()))],
            "params": [describe(x) for x in jax.tree.leaves(state.params)],
            "trajectory": [describe(x) for x in jax.tree.leaves(traj)],
            "devices": [d.id for d in mesh.devices]}


def jobs(out: str) -> list:
    """Every run and probe, as ``(function, argument)``: the runs train, the probes write JSON."""
    from tclock.loop import train

    def probe(name: str, cfg) -> None:
        with open(os.path.join(out, name), "w") as f:
            json.dump(shardings(cfg), f)

    todo = [(train, config(os.path.join(out, name), mesh)) for name, mesh in MESHES.items()]
    todo += [(train, config(os.path.join(out, name), mesh, SAC_ARGS)) for name, mesh in SAC_MESHES.items()]
    return todo + [(lambda cfg: probe("shardings.json", cfg), config(os.path.join(out, "probe"), MESHES["seeds2_envs2"])),
                   (lambda cfg: probe("sac_shardings.json", cfg),
                    config(os.path.join(out, "sac_probe"), SAC_MESHES["sac_envs2"], SAC_ARGS))]


def main(out: str, part: int = 0, parts: int = 1) -> None:
    """The jobs whose index is ``part`` modulo ``parts`` (the tests start the parts side by side:
    compiling dominates and uses about one core each)."""
    for i, (fn, arg) in enumerate(jobs(out)):
        if i % parts == part:
            fn(arg)


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:4]))
