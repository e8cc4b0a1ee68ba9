"""The process-wide compile cache follows the task behind a name: re-registering it with
``overwrite=True`` (as notebook 02 invites) compiles the new env instead of reusing the old."""
import jax.numpy as jnp

from tclock import envs, runlog, runtime
from tclock.config import TrainConfig
from tclock.envs import SuccessReward
from tclock.envs.tasks import PointMass
from tclock.loop import train

TINY = dict(num_envs=8, unroll_length=16, num_minibatches=2, num_epochs=1, seeds=1, policy_hidden=(8,),
            value_hidden=(8,), gdc_every=0, total_steps=8 * 16, progress=False)


def _task(success: bool):
    return lambda **kw: SuccessReward(PointMass(**kw), lambda s: jnp.asarray(success))


def test_reregistering_a_task_recompiles_its_programs(tmp_path):
    name = "test_cache_probe"
    envs.register(name, _task(True), episode_length=8, overwrite=True)
    cfg = TrainConfig(env=name, out=str(tmp_path / "always"), **TINY)
    key_before = runtime.program_key(cfg, 8, 8, False)
    train(cfg)
    assert runlog.read_metrics(cfg.out)[-1]["episode_return"] == [8.0]  # reward 1 at each of 8 steps
    envs.register(name, _task(False), episode_length=8, overwrite=True)
    assert runtime.program_key(cfg, 8, 8, False) != key_before
    cfg = cfg.replace(out=str(tmp_path / "never"))
    train(cfg)
    records = runlog.read_metrics(cfg.out)
    assert records[-1]["episode_return"] == [0.0]  # the new task, not the cached one
    assert records[0]["compile_s"] > 0  # compiled afresh, and the time is logged


def test_release_compiled_drops_the_programs_and_the_next_run_compiles_again(tmp_path):
    runtime.release_compiled()  # whatever earlier tests left
    cfg = TrainConfig(env="pointmass_reach", out=str(tmp_path / "first"), **TINY)
    train(cfg)
    held = set(runtime._COMPILED)
    assert held
    train(cfg.replace(out=str(tmp_path / "reused")))
    assert set(runtime._COMPILED) == held  # the same programs, not compiled again
    assert runlog.read_metrics(tmp_path / "reused")[0]["compile_s"] == 0
    runtime.release_compiled()
    assert runtime._COMPILED == {}
    train(cfg.replace(out=str(tmp_path / "after")))
    assert set(runtime._COMPILED) == held and runlog.read_metrics(tmp_path / "after")[0]["compile_s"] > 0
