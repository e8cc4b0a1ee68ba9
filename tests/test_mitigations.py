"""Mitigations inside real training runs: DRBS (ladder, env pool), PURM (injected clock), HAE."""
import jax
import numpy as np
import pytest

from tclock import runlog
from tclock.config import ConfigError, TrainConfig, drbs_ladder, validate
from tclock.loop import build_agent, train

SMALL = dict(unroll_length=16, num_minibatches=4, num_epochs=2, seeds=2, policy_hidden=(16,), value_hidden=(16,),
             gdc_every=0, progress=False)


def test_drbs_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="num_envs: with --drbs"):
        validate(TrainConfig(drbs=True, num_envs=32, drbs_min=64))
    with pytest.raises(ConfigError, match="drbs: "):
        validate(TrainConfig(drbs=True, drbs_signal="rt_ut", num_envs=64, drbs_min=64, drbs_max=128, drbs_low=0.9,
                             drbs_high=0.5))
    with pytest.raises(ConfigError, match="drbs: band="):
        validate(TrainConfig(drbs=True, num_envs=64, drbs_min=64, drbs_max=128, drbs_band=0.5))
    with pytest.raises(ConfigError, match="drbs_signal: critical .* gdc_every"):
        validate(TrainConfig(drbs=True, num_envs=64, drbs_min=64, drbs_max=128, gdc_every=0))
    with pytest.raises(ConfigError, match="lr_scaling: noise"):
        validate(TrainConfig(lr_scaling="noise", gdc_every=0))
    assert drbs_ladder(TrainConfig(drbs=True, num_envs=32, drbs_min=16, drbs_max=64, drbs_step=1.0, **SMALL)) == (
        16, 32, 64)


def test_rollout_on_a_prefix_leaves_paused_envs_untouched():
    cfg = TrainConfig(num_envs=8, drbs=True, drbs_min=4, drbs_max=8, drbs_step=1.0, **SMALL)
    agent = build_agent(cfg)
    assert agent.env.num_envs == 8  # the pool is the ladder's top
    state = agent.init(0, 2)
    new_state, traj, _ = jax.jit(lambda s: agent.rollout(s, 4))(state)
    assert traj.reward.shape == (16, 2, 4)
    steps_before = np.asarray(state.env.state.info["steps"])
    steps_after = np.asarray(new_state.env.state.info["steps"])
    np.testing.assert_array_equal(steps_after[:, 4:], steps_before[:, 4:])  # paused mid-episode, not reset
    assert (steps_after[:, :4] != steps_before[:, :4]).all()
    np.testing.assert_array_equal(np.asarray(new_state.env.state.obs)[:, 4:], np.asarray(state.env.state.obs)[:, 4:])


@pytest.mark.slow
def test_drbs_run_changes_batch_within_compile_bound(tmp_path):
    # low=0.95: the synchronous ratio is always below it, so the controller grows 16 -> 32 -> 64.
    cfg = TrainConfig(num_envs=16, drbs=True, drbs_signal="rt_ut", drbs_min=16, drbs_max=64, drbs_step=1.0, drbs_window=2,
                      drbs_low=0.95, drbs_high=0.99, total_steps=16 * 16 * 12, out=str(tmp_path / "drbs"), **SMALL)
    train(cfg)
    records = runlog.read_metrics(cfg.out)
    sizes = [r["num_envs"] for r in records]
    assert sizes[0] == 16 and 32 in sizes and sizes[-1] == 64
    assert sizes == sorted(sizes)
    assert max(r["compiled_sizes"] for r in records) <= len(drbs_ladder(cfg))
    assert records[-1]["env_steps"] == sum(b * 16 for b in sizes) <= cfg.total_steps
    # The ratio history restarts at every change (reset_on_change), and the decision is logged.
    assert all(r["drbs_next_num_envs"] in (16, 32, 64) for r in records)


class FakeClock:
    """Time moves only when the loop sleeps (PURM's yield) or by a tiny tick per reading."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 1e-5
        return self.t

    def sleep(self, dt):
        self.t += dt


@pytest.mark.slow
def test_purm_rhythm_and_wall_clock_lr_with_injected_clock(tmp_path):
    clock = FakeClock()
    cfg = TrainConfig(num_envs=16, purm=True, purm_t_base=1.0, purm_alpha=0.0, total_seconds=10.0,
                      lr_clock="wall", lr_schedule="linear", lr=1e-3, total_steps=10**9,
                      out=str(tmp_path / "purm"), **SMALL)
    train(cfg, clock=clock, sleep=clock.sleep)
    records = runlog.read_metrics(cfg.out)
    # R(t) = floor(t / 1 s): update k+1 may start once t >= k+1, and the budget ends at t = 10.
    assert len(records) == 9
    starts = np.array([r["wall_s"] for r in records])
    np.testing.assert_allclose(starts, np.arange(1, 10), atol=0.02)
    lrs = np.array([r["lr"][0] for r in records])
    np.testing.assert_allclose(lrs, 1e-3 * (1 - np.arange(1, 10) / 10.0), rtol=0.02)
    assert runlog.read_status(cfg.out)["state"] == "finished"


def test_purm_needs_wall_budget():
    with pytest.raises(ConfigError, match="total_seconds"):
        validate(TrainConfig(purm=True))
    with pytest.raises(ConfigError, match="total_seconds"):
        validate(TrainConfig(lr_clock="wall", lr_schedule="cosine"))


def test_hae_training_run_logs_raw_advantage_stats(tmp_path):
    cfg = TrainConfig(num_envs=16, advantage="hae", hae_window=8, total_steps=16 * 16 * 3,
                      out=str(tmp_path / "hae"), **SMALL)
    train(cfg)
    records = runlog.read_metrics(cfg.out)
    assert len(records) == 3 and runlog.read_config(cfg.out)["advantage"] == "hae"
    assert all(np.isfinite(r["adv_std"]).all() for r in records)


@pytest.mark.slow
def test_drbs_steered_by_the_critical_batch_moves_towards_its_target(tmp_path):
    """Every change the loop makes goes towards the logged target (the online critical batch or
    B*), to the ladder size nearest it, and only when B is outside the hysteresis band around it;
    with ``lr_scaling noise`` the lr follows the estimate made at the current size (the
    controller's), not the logged window that spans the sizes the run left."""
    from tclock.control import CriticalBatchController
    from tclock.control.coscale import lr_multiplier
    from tclock.runlog import seed_median

    cfg = TrainConfig(num_envs=32, drbs=True, drbs_min=16, drbs_max=128, drbs_step=1.0, drbs_estimates=1,
                      lr_scaling="noise", total_steps=32 * 16 * 24, out=str(tmp_path / "crit"),
                      **{**SMALL, "gdc_every": 2, "gdc_minibatch": 32, "noise_groups": 2})
    train(cfg)
    records = runlog.read_metrics(cfg.out)
    replay = CriticalBatchController(base=32, min=16, max=128, step=1.0, band=cfg.drbs_band, min_estimates=1,
                                     ladder=drbs_ladder(cfg), window=cfg.noise_window)
    b_lr, mixed = None, 0
    for r, nxt in zip(records, records[1:]):  # the lr of the next iteration, from this one's record
        logged = seed_median(r.get("b_crit_online_envs")) or b_lr
        replay.observe(r)
        b_lr = replay.noise_scale or logged
        assert replay.batch_size == nxt["num_envs"]
        assert nxt["lr"][0] == pytest.approx(cfg.lr * lr_multiplier("noise", nxt["num_envs"], cfg.lr_base_envs, b_lr),
                                             rel=1e-5), nxt["iteration"]
        mixed += replay.noise_scale is not None and logged != pytest.approx(replay.noise_scale, rel=1e-3)
    assert mixed >= 1  # the logged window did differ from the current size's estimate at some point
    assert any(r.get("drbs_target_envs") for r in records)
    assert records[0]["num_envs"] == 32 and records[0]["drbs_next_num_envs"] == cfg.drbs_min  # the timing probe
    _check_moves(cfg, records[1:])  # after the probe a CPU's B* usually keeps the run at the bottom
    # without the probe, from the bottom: one size timed, so the first decision follows the estimate,
    # which on this task near the initial policy is far above 16 envs
    cfg = cfg.replace(num_envs=16, drbs_timing_probe=False, out=str(tmp_path / "no_probe"))
    train(cfg)
    records = runlog.read_metrics(cfg.out)
    assert _check_moves(cfg, records) >= 1
    firsts = [r for i, r in enumerate(records) if i == 0 or records[i - 1]["num_envs"] != r["num_envs"]]
    assert all(r.get("gdc") is not None for r in firsts)  # a new size is measured at once,
    assert any(r["iteration"] % cfg.gdc_every for r in firsts)  # off the gdc_every cadence


def _check_moves(cfg, records) -> int:
    """Every change in ``records`` goes towards the logged target, to the ladder size nearest it
    (log scale), and only from outside the hysteresis band; returns how many there were."""
    moves = 0
    for r in records:
        b, nxt, target = r["num_envs"], r["drbs_next_num_envs"], r.get("drbs_target_envs")
        if nxt != b:
            moves += 1
            assert target is not None and (nxt < b) == (b > cfg.drbs_band * target), r
            assert (nxt > b) == (b * cfg.drbs_band < target)
            side = [s for s in drbs_ladder(cfg) if (s < b if nxt < b else s > b)]
            assert nxt == min(side, key=lambda s: abs(np.log(s / target))), r
    assert {r["num_envs"] for r in records} <= set(drbs_ladder(cfg))
    assert max(r["compiled_sizes"] for r in records) <= len(drbs_ladder(cfg))
    return moves


class _Stop(Exception):
    pass


def test_lr_scaling_noise_resumes_with_the_noise_scale_it_had(tmp_path):
    """A run stopped after a checkpoint and resumed gives the metrics (lr included) of the run that
    never stopped: the lr's noise scale comes back from the checkpointed window, not from 1x."""
    from golden_runs import deterministic

    def cfg(name):
        return TrainConfig(num_envs=32, lr_scaling="noise", total_steps=32 * 16 * 8, checkpoint_every=2,
                           out=str(tmp_path / name), **{**SMALL, "gdc_every": 3, "gdc_minibatch": 32})

    train(cfg("ref"))
    reference = runlog.read_metrics(cfg("ref").out)

    def stop_at_5(record):
        if record["iteration"] == 5:
            raise _Stop

    with pytest.raises(_Stop):
        train(cfg("stopped"), on_iteration=stop_at_5)
    status = runlog.read_status(cfg("stopped").out)
    runlog.write_json(tmp_path / "stopped" / runlog.STATUS_FILE, {**status, "state": "running"})
    train(cfg("stopped"), resume=True)
    resumed = runlog.read_metrics(cfg("stopped").out)
    assert [r["iteration"] for r in resumed] == list(range(1, 9))
    assert len({r["lr"][0] for r in reference}) > 1  # the lr did follow the estimate
    assert deterministic(resumed) == deterministic(reference)
