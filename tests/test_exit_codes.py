"""Every failure path of ``tclock train`` ends with its documented exit code (README: 0 ok,
1 doctor's two-clocks verdict, 2 bad input, 3 diverged, 4 unexpected error) and, once the run
directory is open, with status ``failed`` and the reason.  Divergence (3) is in
test_sweep_failures.py, a full disk (2) in test_faults.py, a missing tracking package (2) in
test_tracking.py."""
import pickle

import pytest
import yaml

from tclock import cli, runlog
from tclock.config import ConfigError, TrainConfig, validate

# test_train.py's small config: the same programs, compiled once per session.
ARGS = ["--num-envs", "32", "--unroll-length", "16", "--num-minibatches", "4", "--num-epochs", "2", "--seeds", "2",
        "--policy-hidden", "32", "32", "--value-hidden", "32", "32", "--gdc-every", "2", "--gdc-minibatch", "32",
        "--no-progress", "--checkpoint-every", "1"]


def train_cli(out, *extra) -> int:
    return cli.main(["train", *ARGS, "--out", str(out), *extra])


@pytest.mark.parametrize("clock", ["wall", "hybrid"])
def test_a_wall_lr_clock_without_a_wall_budget_is_bad_input(tmp_path, capsys, clock):
    with pytest.raises(ConfigError, match=rf"^total_seconds: lr_clock={clock} .*--total-seconds"):
        validate(TrainConfig(lr_clock=clock))  # with the constant schedule too
    validate(TrainConfig(lr_clock=clock, total_seconds=60))
    out = tmp_path / "run"
    assert train_cli(out, "--lr-clock", clock) == cli.EXIT_BAD_INPUT
    assert "total_seconds" in capsys.readouterr().err and not out.exists()  # before anything compiled


def test_an_error_after_the_run_directory_opens_fails_the_run(tmp_path, capsys, monkeypatch):
    def broken(cfg):
        raise ValueError("lr clock exploded")

    monkeypatch.setattr("tclock.loop.make_lr_clock", broken)
    out = tmp_path / "run"
    assert train_cli(out, "--total-steps", str(512 * 2)) == cli.EXIT_INTERNAL
    err = capsys.readouterr().err
    assert "Traceback" in err and "unexpected ValueError" in err
    status = runlog.read_status(out)
    assert status["state"] == "failed" and status["reason"] == "ValueError: lr clock exploded"


@pytest.fixture
def stopped_run(tmp_path):
    """A run that stopped after 2 iterations (checkpoints 1 and 2), status ``interrupted``."""
    out = tmp_path / "run"
    assert train_cli(out, "--total-steps", str(512 * 2)) == cli.EXIT_OK
    runlog.write_json(out / runlog.STATUS_FILE, {"state": "interrupted"})
    return out


def test_an_old_pickle_checkpoint_on_resume_is_bad_input(stopped_run, tmp_path, capsys):
    ckpt_dir = stopped_run / runlog.CHECKPOINT_DIR
    for path in ckpt_dir.glob("ckpt_*"):
        path.unlink()
    marker = tmp_path / "unpickled"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (ckpt_dir / "ckpt_000002.pkl").write_bytes(pickle.dumps({"iteration": 2, "state": Payload()}))
    (ckpt_dir / "latest").write_text("ckpt_000002.pkl")
    assert train_cli(stopped_run, "--total-steps", str(512 * 3), "--resume") == cli.EXIT_BAD_INPUT
    assert "never loads" in capsys.readouterr().err and not marker.exists()
    assert runlog.read_status(stopped_run)["state"] == "interrupted"  # refused, not started


def test_no_loadable_checkpoint_on_resume_is_bad_input(stopped_run, capsys):
    for path in (stopped_run / runlog.CHECKPOINT_DIR).glob("ckpt_*"):
        path.write_bytes(path.read_bytes()[:100])
    assert train_cli(stopped_run, "--total-steps", str(512 * 3), "--resume") == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "no loadable checkpoint" in err and "ckpt_000001.ckpt: truncated" in err


def test_a_checkpoint_of_another_shape_on_resume_is_bad_input(stopped_run, capsys):
    """config.yaml edited by hand to another network: the checkpoint no longer fits."""
    config = runlog.read_config(stopped_run)
    runlog.write_text(stopped_run / runlog.CONFIG_FILE, yaml.safe_dump({**config, "value_hidden": [16]}))
    code = train_cli(stopped_run, "--value-hidden", "16", "--total-steps", str(512 * 3), "--resume")
    assert code == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "does not match this config's training state" in err and "['value']" in err


def test_the_doctor_exits_0_on_a_short_healthy_run_below_the_critical_batch(tmp_path, capsys):
    """Issue 11: a normal short run (32 envs on pointmass_reach, below its lr-tuned B_crit of 84-108
    envs from two base seeds, RESULTS.md) is not given a two-clocks exit for its batch, its GDC or its RT/UT."""
    from tclock.doctor import diagnose

    out = tmp_path / "run"
    assert train_cli(out, "--total-steps", str(512 * 12)) == cli.EXIT_OK
    capsys.readouterr()
    report = diagnose(out)
    assert report.row("critical_batch").verdict in ("info", "not-checkable"), report.row("critical_batch")
    assert report.row("gdc").verdict == "info" and report.row("rt_ut_ratio_w50").verdict != "two-clocks"
    assert cli.main(["doctor", str(out)]) == cli.EXIT_OK, capsys.readouterr().out
