"""Training on the asynchronous rollout pipeline: accounting, lag logging, errors, shutdown."""
import threading

import numpy as np
import pytest

from tclock import runlog
from tclock.config import ConfigError, TrainConfig, validate
from tclock.loop import train

SMALL = dict(num_envs=16, unroll_length=16, num_minibatches=4, num_epochs=2, seeds=2, policy_hidden=(16,),
             value_hidden=(16,), gdc_every=2, gdc_minibatch=32, progress=False, arp=True)


def test_arp_config_errors():
    with pytest.raises(ConfigError, match="arp: "):
        validate(TrainConfig(arp=True, drbs=True))
    with pytest.raises(ConfigError, match="arp_capacity"):
        validate(TrainConfig(arp=True, arp_capacity=0))


@pytest.mark.slow
def test_arp_run_logs_lag_and_keeps_the_accounting(tmp_path):
    cfg = TrainConfig(total_steps=16 * 16 * 12, arp_capacity=3, out=str(tmp_path / "arp"), **SMALL)
    train(cfg)
    records = runlog.read_metrics(cfg.out)
    assert [r["iteration"] for r in records] == list(range(1, 13))
    assert records[-1]["env_steps"] == 12 * 256
    status = runlog.read_status(cfg.out)
    p = status["pipeline"]
    assert p["produced"] == p["consumed"] + p["dropped_age"] + p["dropped_overflow"] + p["still_buffered"]
    assert p["consumed"] == 12 and p["max_depth"] <= 3 and p["threads_alive"] == 0
    assert status["max_age_s"] > 0 and len(records[0]["arp_calibration_s"]) == cfg.arp_calibration_rollouts
    for r in records:
        assert r["policy_lag"] >= 0 and r["policy_lag_max"] >= r["policy_lag"]
        assert 0 <= r["queue_depth"] <= 3 and r["data_age_s"] >= 0
        assert len(r["success_rate"]) == 2
    assert all("gdc" in r for r in records if r["iteration"] % 2 == 0)
    assert all(r["rt_ut_ratio"] is None or r["rt_ut_ratio"] > 0 for r in records)


def test_arp_error_in_the_learner_side_stops_every_thread(tmp_path):
    before = threading.active_count()
    cfg = TrainConfig(total_steps=16 * 16 * 50, out=str(tmp_path / "boom"), **SMALL)

    def explode(record):
        if record["iteration"] == 3:
            raise RuntimeError("boom at 3")

    with pytest.raises(RuntimeError, match="boom at 3"):
        train(cfg, on_iteration=explode)
    assert threading.active_count() == before
    assert len(runlog.read_metrics(cfg.out)) == 3


def test_arp_max_age_can_be_given(tmp_path):
    cfg = TrainConfig(total_steps=16 * 16 * 4, arp_max_age_s=30.0, out=str(tmp_path / "age"), **SMALL)
    train(cfg)
    assert runlog.read_status(cfg.out)["max_age_s"] == 30.0
    assert all(r["dropped_age"] == 0 for r in runlog.read_metrics(cfg.out))
    assert np.isfinite([r["data_age_s"] for r in runlog.read_metrics(cfg.out)]).all()


def test_arp_error_marks_the_run_failed(tmp_path):
    cfg = TrainConfig(total_steps=16 * 16 * 50, out=str(tmp_path / "boom2"), **SMALL)

    def explode(record):
        raise ValueError("bad callback")

    with pytest.raises(ValueError):
        train(cfg, on_iteration=explode)
    status = runlog.read_status(cfg.out)
    assert status["state"] == "failed" and "bad callback" in status["reason"]
    assert runlog.load_checkpoint(cfg.out).iteration == 1
