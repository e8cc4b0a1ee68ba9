"""One run across a device mesh, and runs and sweeps across processes (tclock.mesh, tclock.distributed).

Fake CPU devices need their own processes (``XLA_FLAGS`` before JAX starts): ``mesh_runs.py`` trains
one small config on every mesh in one process with 4 devices; the multi-process tests start real
``tclock`` processes that join on localhost with ``jax.distributed`` (2 fake devices each).  On one
CPU these runs measure correctness, not speed.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tclock import distributed, runlog
from tclock.agents.acting import flatten_envs, unflatten_envs
from tclock.config import ConfigError, TrainConfig, validate
from tclock.mesh import MeshShape, parse_mesh, resolve

from side_by_side import run_side_by_side  # noqa: E402

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import mesh_runs  # noqa: E402


# --------------------------------------------------------------------------- parsing and checks
@pytest.mark.parametrize("text, shape", [("seeds=2,envs=4", MeshShape(2, 4)), ("envs=8", MeshShape(1, 8)),
                                         (" seeds=3 ", MeshShape(3, 1)), ("", None), ("auto", None)])
def test_mesh_text_is_read(text, shape):
    assert parse_mesh(text) == shape


@pytest.mark.parametrize("text", ["seeds=0", "gpus=2", "seeds=2,seeds=2", "envs=x", "envs"])
def test_bad_mesh_text_names_the_flag(text):
    with pytest.raises(ConfigError, match=r"^mesh: "):
        parse_mesh(text)


@pytest.mark.parametrize("changes, pattern", [
    ({"mesh": "seeds=3", "seeds": 4}, r"^mesh: seeds=3 does not divide the run's 4 seeds"),
    ({"mesh": "envs=3", "num_envs": 64, "num_minibatches": 4}, r"^mesh: envs=3 does not divide num_envs 64"),
    ({"mesh": "envs=2", "arp": True}, r"^mesh: the asynchronous pipeline"),
])
def test_a_mesh_that_does_not_fit_the_config_is_refused_before_compiling(changes, pattern):
    with pytest.raises(ConfigError, match=pattern):
        validate(TrainConfig(**changes))


def test_drbs_ladder_sizes_divide_by_the_env_devices():
    from tclock.config import drbs_ladder

    ladder = drbs_ladder(TrainConfig(drbs=True, mesh="envs=8", num_envs=256, drbs_min=64, drbs_max=1024))
    assert ladder and all(b % 8 == 0 for b in ladder)


def test_a_mesh_larger_than_the_devices_is_refused():
    import jax

    devices = jax.devices()[:1]
    with pytest.raises(ConfigError, match=r"^mesh: seeds=2,envs=1 needs 2 devices, but this run sees 1"):
        resolve("seeds=2", 2, [16], devices)
    auto = resolve("", 2, [16], devices)
    assert auto.shape == MeshShape() and not auto.note


@pytest.mark.parametrize("launch, field", [
    (distributed.Launch(num_processes=2, process_id=0), "coordinator"),
    (distributed.Launch("localhost", 2, 0), "coordinator"),
    (distributed.Launch("localhost:1234", 0, 0), "num_processes"),
    (distributed.Launch("localhost:1234", 2, 2), "process_id"),
    (distributed.Launch("localhost:1234", 2, -1, auto=False), "process_id"),
    (distributed.Launch("localhost:1234", 2, 0, auto=True), "distributed"),
    (distributed.Launch(timeout_s=0), "init_timeout"),
])
def test_bad_launch_flags_name_the_flag(launch, field):
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        distributed.check_launch(launch)


def test_partition_gives_every_item_to_exactly_one_process():
    items = list(range(11))
    shares = [distributed.partition(items, i, 3) for i in range(3)]
    assert sorted(x for s in shares for x in s) == items
    assert shares[1] == [1, 4, 7, 10] and shares == [distributed.partition(items, i, 3) for i in range(3)]


@pytest.mark.parametrize("blocks", [(1, 1), (2, 1), (1, 2), (2, 2), (4, 2), (2, 4)])
def test_the_flat_env_batch_keeps_each_devices_envs_contiguous(blocks):
    S, B = 8, 12 if blocks[1] != 8 else 16
    x = np.random.default_rng(0).normal(size=(S, B, 3)).astype(np.float32)
    flat = np.asarray(flatten_envs(x, blocks))
    ns, ne = blocks
    n = S * B // (ns * ne)
    for i in range(ns):  # the reference: device (i, j)'s block, in row-major order, is slice k = i*ne + j
        for j in range(ne):
            block = x[i * S // ns:(i + 1) * S // ns, j * B // ne:(j + 1) * B // ne].reshape(-1, 3)
            k = i * ne + j
            np.testing.assert_array_equal(flat[k * n:(k + 1) * n], block)
    np.testing.assert_array_equal(np.asarray(unflatten_envs(flat, S, B, blocks)), x)
    if blocks[1] == 1:
        np.testing.assert_array_equal(flat, x.reshape(S * B, 3))  # one env device: the plain row-major order


def test_importing_tclock_starts_no_jax_backend():
    """jax.distributed.initialize must come before any backend starts; importing tclock must not start one."""
    code = ("import tclock.cli, tclock.loop, tclock.sweep, tclock.arp, tclock.agents, tclock.envs\n"
            "from jax._src import xla_bridge as xb\nprint('started' if xb._backends else 'idle')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "idle", out.stderr[-2000:]


def test_an_unreachable_coordinator_is_an_error_naming_the_flag_within_the_timeout(tmp_path):
    port = free_port()
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "tclock.cli", "train", "--coordinator", f"localhost:{port}",
                          "--num-processes", "2", "--process-id", "1", "--init-timeout", "3", "--out",
                          str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"error: coordinator: nothing answered at localhost:{port} within 3 s" in out.stderr
    assert time.monotonic() - t0 < 60 and not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- one process, 4 devices
@pytest.fixture(scope="module")
def mesh_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("mesh")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    # two halves of the jobs side by side: each run is mostly one core's compiling
    run_side_by_side([[sys.executable, str(HERE / "mesh_runs.py"), str(out), str(i), "2"] for i in range(2)], [env] * 2)
    return out


def per_seed(run_dir: Path) -> dict[str, np.ndarray]:
    """Every per-seed metric of a run, ``[iterations, seeds]``."""
    records = runlog.read_metrics(run_dir)
    keys = [k for k, v in records[0].items() if isinstance(v, list)]
    return {k: runlog.seed_matrix(records, k)[1] for k in keys}


def final_params(run_dir: Path) -> list[np.ndarray]:
    train = runlog.load_checkpoint(run_dir).train  # flat: path -> array
    params = [np.asarray(train[k]) for k in sorted(train) if k.startswith(".params")]
    assert params, sorted(train)[:5]
    return params


# float tolerance: another shape per device (or a sum split over devices) rounds differently
RTOL, ATOL = 1e-4, 1e-5


@pytest.mark.slow
def test_seeds_sharded_four_ways_give_the_per_seed_metrics_of_one_device(mesh_dir):
    one, sharded = per_seed(mesh_dir / "one"), per_seed(mesh_dir / "seeds4")
    assert one.keys() == sharded.keys() and one["episode_return"].shape == (4, 4)
    for key in one:
        np.testing.assert_allclose(sharded[key], one[key], rtol=RTOL, atol=ATOL, err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["envs2", "envs4", "seeds2_envs2"])
def test_envs_sharded_give_the_parameters_of_one_device(mesh_dir, mesh):
    for a, b in zip(final_params(mesh_dir / "one"), final_params(mesh_dir / mesh), strict=True):
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)
    one, sharded = per_seed(mesh_dir / "one"), per_seed(mesh_dir / mesh)
    for key in ("policy_loss", "value_loss", "episode_return", "approx_kl"):
        np.testing.assert_allclose(sharded[key], one[key], rtol=RTOL, atol=ATOL, err_msg=key)
    assert runlog.read_status(mesh_dir / mesh)["mesh"] == parse_mesh(mesh_runs.MESHES[mesh]).text()


@pytest.mark.slow
def test_every_device_holds_its_own_shard(mesh_dir):
    info = json.loads((mesh_dir / "shardings.json").read_text())
    assert len(info["devices"]) == 4
    for leaf in info["env"]:  # [S=4, B=16, ...]: 2 seeds x 8 envs on each of the 4 devices
        assert leaf["spec"][:2] == ["seeds", "envs"] and leaf["devices"] == sorted(info["devices"])
        assert leaf["shard_shapes"] == [[2, 8, *leaf["shape"][2:]]]
    for leaf in info["trajectory"]:  # [T, S, B, ...]
        assert leaf["spec"][:3] == [None, "seeds", "envs"] and leaf["shard_shapes"] == [[8, 2, 8, *leaf["shape"][3:]]]
    for leaf in info["params"]:  # per seed, replicated along envs
        assert leaf["spec"][0] == "seeds" and leaf["devices"] == sorted(info["devices"])
        assert leaf["shard_shapes"] == [[2, *leaf["shape"][1:]]]


@pytest.mark.slow
def test_sac_with_its_replay_ring_split_over_two_devices_learns_as_on_one(mesh_dir):
    for a, b in zip(final_params(mesh_dir / "sac_one"), final_params(mesh_dir / "sac_envs2"), strict=True):
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)
    one, sharded = per_seed(mesh_dir / "sac_one"), per_seed(mesh_dir / "sac_envs2")
    assert np.isfinite(one["value_loss"][-1]).all()  # the gradient steps ran (past the warm-up)
    for key in ("policy_loss", "value_loss", "q_mean", "replay_size"):
        np.testing.assert_allclose(sharded[key], one[key], rtol=RTOL, atol=ATOL, err_msg=key)
    info = json.loads((mesh_dir / "sac_shardings.json").read_text())
    assert info["replay"] and len(info["devices"]) == 2
    for leaf in info["replay"]:  # [S=2, capacity 512, ...] on envs=2: half the ring on each device
        if len(leaf["shape"]) >= 2:
            assert leaf["spec"][:2] == [None, "envs"] and leaf["devices"] == sorted(info["devices"])
            assert leaf["shard_shapes"] == [[2, leaf["shape"][1] // 2, *leaf["shape"][2:]]]


# --------------------------------------------------------------------------- several processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def start_processes(command: str, args: list[str], n: int = 2, devices: int = 2) -> list[subprocess.Popen]:
    """``n`` real tclock processes joined on a fresh localhost port, ``devices`` fake CPUs each."""
    port = free_port()
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    return [subprocess.Popen([sys.executable, "-m", "tclock.cli", command, *args, "--coordinator", f"localhost:{port}",
                              "--num-processes", str(n), "--process-id", str(i)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for i in range(n)]


def finish(procs: list[subprocess.Popen], timeout: float = 600) -> list[tuple[int, str]]:
    out = []
    for p in procs:
        _, err = p.communicate(timeout=timeout)
        out.append((p.returncode, err))
    return out


@pytest.mark.slow
def test_one_run_across_two_processes_matches_one_process_with_four_devices(mesh_dir, tmp_path):
    run = tmp_path / "two"
    results = finish(start_processes("train", [*mesh_runs.ARGS, "--mesh", "seeds=2,envs=2", "--out", str(run)]))
    for code, err in results:
        assert code == 0, err[-3000:]
    one_process = per_seed(mesh_dir / "seeds2_envs2")
    two_processes = per_seed(run)
    for key in one_process:
        np.testing.assert_allclose(two_processes[key], one_process[key], rtol=RTOL, atol=ATOL, err_msg=key)
    for a, b in zip(final_params(mesh_dir / "seeds2_envs2"), final_params(run), strict=True):
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)
    assert runlog.read_status(run)["state"] == "finished"
    assert len(runlog.read_metrics(run)) == 4  # written once, by process 0


@pytest.mark.slow
def test_a_two_process_sweep_writes_each_batch_size_once_and_one_summary(tmp_path):
    out = tmp_path / "sweep"
    args = ["--env", "pointmass_reach", "--seeds", "2", "--num-envs", "16", "--batch-sizes", "16", "32",
            "--unroll-length", "8", "--total-steps", str(32 * 8 * 2), "--gdc-every", "0", "--no-noise-split",
            "--policy-hidden", "16", "--value-hidden", "16", "--num-minibatches", "2", "--num-epochs", "1",
            "--target-success", "0.05", "--no-progress", "--out", str(out)]
    results = finish(start_processes("sweep", args, devices=1))
    for code, err in results:
        assert code == 0, err[-3000:]
    devices = {b: runlog.read_status(out / f"B{b:04d}")["device"] for b in (16, 32)}
    assert devices == {16: "cpu:0", 32: "cpu:2048"}  # B=16 on process 0, B=32 on process 1 (its first device)
    for b in (16, 32):
        assert len(runlog.read_metrics(out / f"B{b:04d}")) == 2 * 32 // b  # trained once: no duplicate lines
    summary = runlog.read_json(out / "summary.json")
    assert summary["batch_sizes"] == [16, 32] and (out / "report.md").exists()
    assert "processes: 2" in (out / "sweep.yaml").read_text()


@pytest.mark.slow
def test_killing_one_process_ends_the_other_with_an_error_and_a_resumable_checkpoint(tmp_path):
    run = tmp_path / "killed"
    args = [*mesh_runs.ARGS, "--total-steps", str(16 * 8 * 100_000), "--mesh", "seeds=2,envs=2", "--out", str(run)]
    procs = start_processes("train", args)
    try:
        deadline = time.monotonic() + 300
        while len(runlog.read_metrics(run, missing_ok=True)) < 5:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "the run did not start"
            time.sleep(0.5)
        procs[1].send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        code, err = finish(procs[:1], timeout=120)[0]
        waited = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert waited < 60 and code != 0  # measured here: 8 s (exit code 5, or JAX's own abort)
    # status.json says failed (exit 5), or still running with a writer that is gone (abort): read as failed
    status = runlog.read_status(run)
    assert status["state"] == "failed" and status["last_good_checkpoint"] >= 2
    assert runlog.load_checkpoint(run) is not None  # a --resume on every process starts from it
