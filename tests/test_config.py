"""Config validation: bad input fails before compiling, naming the field and the fix."""
import subprocess
import sys

import pytest

from tclock.config import ConfigError, TrainConfig, from_dict, load_config, validate


def test_defaults_validate():
    cfg = validate(TrainConfig())
    assert cfg.env == "pointmass_reach" and cfg.minibatch_size * cfg.num_minibatches == cfg.transitions_per_rollout


@pytest.mark.parametrize("changes, field, fix", [
    ({"num_envs": 100, "unroll_length": 32, "num_minibatches": 7}, "num_minibatches", "pick num_minibatches"),
    ({"num_envs": 0}, "num_envs", "positive"),
    ({"unroll_length": -3}, "unroll_length", "positive"),
    ({"env": "nope"}, "env", "pointmass_reach"),
    ({"total_steps": 10}, "total_steps", "raise total_steps"),
    ({"gamma": 1.5}, "gamma", "(0, 1]"),
    ({"lr_schedule": "exp"}, "lr_schedule", "cosine"),
    ({"gdc_minibatch": 10**6}, "gdc_minibatch", "gdc_minibatch <="),
])
def test_bad_values_name_field_and_fix(changes, field, fix):
    with pytest.raises(ConfigError) as e:
        validate(from_dict(changes))
    msg = str(e.value)
    assert msg.startswith(field) and fix in msg


def test_type_errors_and_unknown_fields():
    with pytest.raises(ConfigError, match="num_envs: cannot read 'many'"):
        from_dict({"num_envs": "many"})
    with pytest.raises(ConfigError, match="unknown field"):
        from_dict({"num_env": 3})


def test_yaml_config_and_override_precedence(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("num_envs: 64\nunroll_length: 16\nseeds: 3\npolicy_hidden: [8, 8]\n")
    cfg = load_config(path, {"seeds": 2})
    assert (cfg.num_envs, cfg.unroll_length, cfg.seeds, cfg.policy_hidden) == (64, 16, 2, (8, 8))


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("num_envs: 64\nseeds: [1\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(path) in str(e.value) and "line" in str(e.value)
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(path)


def test_cli_rejects_bad_config_before_compiling(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "tclock.cli", "train", "--num-envs", "100", "--num-minibatches", "7",
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "num_minibatches" in proc.stderr and "not divisible" in proc.stderr
    assert not out.exists()  # failed before anything was written or compiled


def test_cli_import_registers_a_user_task(tmp_path):
    module = tmp_path / "my_tasks.py"
    module.write_text(
        "from tclock import envs\n"
        "from tclock.envs import SuccessReward\n"
        "from tclock.envs.tasks import PointMass\n"
        "envs.register('pointmass_wide_test', lambda **kw: SuccessReward(PointMass(**kw),\n"
        "              lambda s: s.metrics['distance'] < 0.5), episode_length=20)\n")
    proc = subprocess.run([sys.executable, "-m", "tclock.cli", "envs", "--import", str(module)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "pointmass_wide_test" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "tclock.cli", "envs", "--import", str(tmp_path / "nope.py")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--import: cannot import" in bad.stderr
