"""The learner contract: the registry, each learner's own defaults, and a learner added from
outside tclock that trains through the CLI with clocks, diagnostics and the doctor."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tclock import agents, runlog
from tclock.agents import IMPALA, PPO, ActorCritic, Learner
from tclock.config import ConfigError, TrainConfig, defaults_for, load_config, validate

TOY = Path(__file__).resolve().parent / "data" / "toy_learner.py"


def test_registry_lists_builtins_and_refuses_unknown_or_duplicate_names():
    assert {"ppo", "impala"} <= set(agents.learner_names())
    assert agents.learner_spec("ppo").factory is PPO and agents.learner_spec("impala").factory is IMPALA
    assert issubclass(PPO, ActorCritic) and issubclass(IMPALA, ActorCritic)
    assert not issubclass(IMPALA, PPO) and not issubclass(PPO, IMPALA)  # siblings
    with pytest.raises(ConfigError, match="algo: 'nope' is not one of"):
        validate(TrainConfig(algo="nope"))
    with pytest.raises(ValueError, match="already registered"):
        agents.register_learner(agents.learner_spec("ppo"))


def test_each_learner_brings_its_defaults_and_explicit_values_win(tmp_path):
    assert load_config(overrides={"algo": "impala"}).num_epochs == 1
    assert load_config(overrides={"algo": "ppo"}).num_epochs == TrainConfig().num_epochs == 4
    assert load_config(overrides={"algo": "impala", "num_epochs": "3"}).num_epochs == 3  # a flag wins
    path = tmp_path / "run.yaml"
    path.write_text("algo: impala\nnum_epochs: 2\n")
    assert load_config(path).num_epochs == 2  # so does a YAML value
    path.write_text("algo: impala\n")
    assert load_config(path).num_epochs == 1
    assert load_config(path, overrides={"algo": "ppo"}).num_epochs == 4  # the flag's learner decides
    impala = defaults_for("impala", num_envs=64)
    assert impala.num_epochs == 1 and impala.num_envs == 64 and defaults_for("impala").num_envs == 256


def test_built_in_learners_satisfy_the_protocol():
    cfg = TrainConfig(num_envs=8, unroll_length=4, progress=False)
    from tclock.runtime import build_agent

    for algo in ("ppo", "impala"):
        agent = build_agent(cfg.replace(algo=algo, num_minibatches=2))
        assert isinstance(agent, Learner), algo


@pytest.mark.slow
def test_toy_learner_from_outside_trains_through_the_cli_with_clocks_diagnostics_and_doctor(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(TOY.parent)}
    listed = subprocess.run([sys.executable, "-m", "tclock.cli", "learners", "--import", str(TOY)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert listed.returncode == 0 and "vpg" in listed.stdout, listed.stderr
    out = tmp_path / "vpg"
    train = subprocess.run([sys.executable, "-m", "tclock.cli", "train", "--import", str(TOY), "--algo", "vpg",
                            "--num-envs", "32", "--unroll-length", "16", "--total-steps", str(32 * 16 * 12),
                            "--seeds", "2", "--gdc-every", "2", "--no-progress", "--out", str(out)],
                           capture_output=True, text=True, env=env, timeout=600)
    assert train.returncode == 0, train.stderr[-3000:]
    cfg = runlog.read_config(out)
    assert cfg["algo"] == "vpg" and cfg["num_epochs"] == 1 and cfg["lr"] == 3e-3  # the toy's own defaults
    records = runlog.read_metrics(out)
    assert len(records) == 12 and runlog.read_status(out)["state"] == "finished"
    assert all(r["rt_s"] > 0 and r["learn_s"] > 0 for r in records)
    assert all(r["ut_s"] > 0 and 0 < r["rt_ut_ratio"] < 1 for r in records[1:])
    assert all(len(r["vpg_adv_abs"]) == 2 and len(r["activation_rate"]) == 2 for r in records)
    gdc = [v for r in records[1::2] for v in r["gdc"]]
    assert len(gdc) == 12 and all(-1 <= v <= 1 for v in gdc) and "gdc" not in records[0]
    assert np.isfinite([v for r in records for v in r["policy_loss"]]).all()
    doctor = subprocess.run([sys.executable, "-m", "tclock.cli", "doctor", str(out), "--json"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert doctor.returncode in (0, 1), doctor.stderr
    report = json.loads(doctor.stdout)
    signals = {row["signal"] for row in report["signals"]}
    assert {"rt_ut_ratio_w50", "gdc", "activation_rate"} <= signals


class _Reached(Exception):
    pass


def _stop_when_every_seed_reached(level: float, window: int = 5):
    history = []

    def on_iteration(record):
        history.append(record["success_rate"])
        recent = np.array(history[-window:], dtype=float)
        if len(history) >= window and (recent.mean(axis=0) >= level).all():
            raise _Reached(record["env_steps"])

    return on_iteration


@pytest.mark.slow
@pytest.mark.parametrize("arp", [False, True], ids=["sync", "arp"])
def test_impala_defaults_learn_the_default_task_on_every_seed_within_1m_steps(tmp_path, arp):
    """``tclock train --algo impala [--arp]`` with every default but the seed count: each of 3
    seeds holds success >= 0.9 over 5 iterations before 1M env steps.  (gdc_every=0 only skips
    the diagnostics; they do not change what the learner does.)"""
    from tclock.loop import train

    cfg = defaults_for("impala", seeds=3, gdc_every=0, arp=arp, progress=False, total_steps=1_000_000,
                       out=str(tmp_path / "impala"))
    assert cfg.env == "pointmass_reach" and cfg.num_envs == 256
    with pytest.raises(_Reached) as reached:
        train(cfg, on_iteration=_stop_when_every_seed_reached(0.9))
    assert reached.value.args[0] <= 1_000_000
