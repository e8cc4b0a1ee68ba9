"""PPO end to end on real Brax envs: learning, determinism, resume after a kill, NaN stop."""
import math
import subprocess
import sys

import numpy as np
import pytest
from nan_env import NanAfter40

from tclock import envs, runlog
from tclock.config import TrainConfig
from tclock.loop import TrainingDiverged, train

from golden_runs import deterministic as strip_timing  # noqa: E402
from killed_runs import kill_when  # noqa: E402
SMALL = dict(num_envs=32, unroll_length=16, num_minibatches=4, num_epochs=2, seeds=2, policy_hidden=(32, 32),
             value_hidden=(32, 32), gdc_every=2, gdc_minibatch=32, progress=False)


def small_cfg(out, **changes):
    return TrainConfig(out=str(out), **{**SMALL, **changes})


@pytest.mark.slow
def test_ppo_learns_pointmass_reach(tmp_path):
    cfg = TrainConfig(num_envs=256, unroll_length=32, total_steps=450_000, seeds=2, gdc_every=0, progress=False,
                      out=str(tmp_path / "learn"))
    result = train(cfg)
    records = runlog.read_metrics(result.run_dir)
    success = np.array([r["success_rate"] for r in records], dtype=float)  # [iterations, seeds]
    assert success.shape == (cfg.num_iterations, 2)
    assert success[:3].mean() < 0.1, success[:3]
    assert (success[-5:].mean(axis=0) > 0.6).all(), success[-5:]
    ret = np.array([r["episode_return"] for r in records], dtype=float)
    assert ret[-5:].mean() > 5 * max(ret[:3].mean(), 0.2)


def test_metrics_keys_and_clocks(tmp_path):
    result = train(small_cfg(tmp_path / "keys", total_steps=32 * 16 * 6))
    records = runlog.read_metrics(result.run_dir)
    assert [r["iteration"] for r in records] == list(range(1, 7))
    assert [r["env_steps"] for r in records] == [512 * i for i in range(1, 7)]
    first, later = records[0], records[1:]
    # compile_s is 0 when an earlier test in this process compiled the same programs (test_compile_cache: > 0)
    assert first["ut_s"] is None and first["rt_ut_ratio"] is None and first["compile_s"] >= 0
    for r in later:
        assert r["ut_s"] >= r["rt_s"] > 0 and 0 < r["rt_ut_ratio"] < 1
        assert math.isclose(r["rt_ut_ratio"], r["rt_s"] / r["ut_s"])
    ratios = [r["rt_ut_ratio"] for r in later]
    assert math.isclose(records[-1]["rt_ut_ratio_w50"], float(np.mean(ratios)))
    for key in ("episode_return", "success_rate", "activation_rate", "adv_skew", "kl_behavior", "clip_frac"):
        assert len(records[-1][key]) == 2
    assert all(("gdc" in r) == (r["iteration"] % 2 == 0) for r in records)
    assert all(-1.0 <= g <= 1.0 for g in records[1]["gdc"])
    assert runlog.read_status(result.run_dir)["state"] == "finished"
    assert runlog.read_config(result.run_dir)["num_envs"] == 32
    assert runlog.load_checkpoint(result.run_dir).iteration == 6


def test_same_seed_same_metrics_and_seeds_differ(tmp_path):
    a = runlog.read_metrics(train(small_cfg(tmp_path / "a", total_steps=512 * 5)).run_dir)
    b = runlog.read_metrics(train(small_cfg(tmp_path / "b", total_steps=512 * 5)).run_dir)
    assert strip_timing(a) == strip_timing(b)
    assert a[-1]["adv_mean"][0] != a[-1]["adv_mean"][1]  # the two seeds are different runs
    c = runlog.read_metrics(train(small_cfg(tmp_path / "c", total_steps=512 * 5, seed=1)).run_dir)
    assert strip_timing(a) != strip_timing(c)


def _cli(out, *extra):
    return [sys.executable, "-m", "tclock.cli", "train", "--num-envs", "32", "--unroll-length", "16",
            "--num-minibatches", "4", "--num-epochs", "2", "--seeds", "2", "--policy-hidden", "32", "32",
            "--value-hidden", "32", "32", "--gdc-every", "2", "--gdc-minibatch", "32", "--no-progress",
            "--total-steps", str(512 * 300), "--checkpoint-every", "3", "--out", str(out), *extra]


@pytest.mark.slow
def test_resume_after_killed_process_loses_and_duplicates_nothing(tmp_path):
    reference = runlog.read_metrics(train(small_cfg(tmp_path / "ref", total_steps=512 * 300)).run_dir)
    out = tmp_path / "killed"
    kill_when(_cli(out), out, min_checkpoint=6, min_lines=10, cache_dir=tmp_path / "xla_killed")
    partial = runlog.read_metrics(out)
    assert len(partial) < 300
    status = runlog.read_status(out)  # the file says "running"; its writer is gone
    assert status["state"] == "failed" and status["inferred"] is True
    assert status["last_good_checkpoint"] == runlog.checkpoint_iteration(out) >= 6
    resumed = subprocess.run(_cli(out, "--resume"), capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stderr
    final = runlog.read_metrics(out)
    assert [r["iteration"] for r in final] == list(range(1, 301))
    assert strip_timing(final) == strip_timing(reference)
    # Resuming a finished run does nothing and says so through the same result.
    again = subprocess.run(_cli(out, "--resume"), capture_output=True, text=True, timeout=200)
    assert again.returncode == 0 and len(runlog.read_metrics(out)) == 300


def test_existing_run_is_not_overwritten_without_flag(tmp_path):
    out = tmp_path / "once"
    train(small_cfg(out, total_steps=512 * 2))
    from tclock.config import ConfigError
    with pytest.raises(ConfigError, match="--resume"):
        train(small_cfg(out, total_steps=512 * 2))
    with pytest.raises(ConfigError, match="config differs"):
        train(small_cfg(out, total_steps=512 * 4, num_epochs=3), resume=True)


def test_nan_stops_run_and_keeps_last_good_checkpoint(tmp_path):
    envs.register("test_nan_after_40", NanAfter40, episode_length=1000, overwrite=True)
    cfg = small_cfg(tmp_path / "nan", env="test_nan_after_40", unroll_length=8, total_steps=32 * 8 * 20,
                    checkpoint_every=2, gdc_every=0)
    with pytest.raises(TrainingDiverged, match="iteration 6"):
        train(cfg)
    status = runlog.read_status(cfg.out)
    assert status["state"] == "failed" and status["last_good_checkpoint"] == 5
    ckpt = runlog.load_checkpoint(cfg.out)
    assert ckpt.iteration == 5  # the last finite state is checkpointed when the run stops
    params = [x for path, x in ckpt.train.items() if path.startswith(".params")]
    assert params and all(np.isfinite(x).all() for x in params)


def test_gdc_and_noise_scale_agree_on_real_ppo_batches(tmp_path):
    """Theory (docs/design.md §2): expected cosine c ≈ 1/(1 + b_simple/b), so b_simple ≈ b(1-c)/c.

    Both are noisy K=5 estimates, so the check compares medians over 40 iterations x 2 seeds
    and allows a factor of 2.5 either way.
    """
    cfg = small_cfg(tmp_path / "agree", gdc_every=1, gdc_k=5, gdc_minibatch=32, total_steps=512 * 40)
    records = runlog.read_metrics(train(cfg).run_dir)
    c = np.array([r["gdc"] for r in records], dtype=float).ravel()
    b_simple = np.array([r["b_simple"] for r in records], dtype=float).ravel()
    valid = np.isfinite(b_simple) & (c > 0)
    assert valid.mean() > 0.7
    implied = cfg.gdc_minibatch * (1 - c[valid]) / c[valid]
    ratio = np.median(b_simple[valid]) / np.median(implied)
    assert 1 / 2.5 < ratio < 2.5, (np.median(b_simple[valid]), np.median(implied))
