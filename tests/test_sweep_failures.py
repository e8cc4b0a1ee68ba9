"""A batch size that diverges is recorded as failed and the sweep goes on; a later run of the
sweep keeps it failed unless --retry-failed; train and sweep exit 3 (README's exit codes)."""

from nan_env import NanAfter40

from tclock import cli, envs, runlog
from tclock.config import TrainConfig
from tclock.sweep import SweepSpec, run_sweep

NAME = "test_sweep_nan_after_40"


BASE = dict(env=NAME, unroll_length=8, num_minibatches=2, num_epochs=1, seeds=1, policy_hidden=(16,),
            value_hidden=(16,), gdc_every=0, total_steps=16 * 8 * 6, target_success=0.05, progress=False)
FLAGS = ["--env", NAME, "--unroll-length", "8", "--num-minibatches", "2", "--num-epochs", "1", "--seeds", "1",
         "--policy-hidden", "16", "--value-hidden", "16", "--gdc-every", "0", "--total-steps", str(16 * 8 * 6),
         "--target-success", "0.05", "--no-progress", "--no-noise-split"]  # = BASE (the CLI sweep turns it on)


def test_a_diverging_batch_size_is_recorded_and_the_sweep_goes_on(tmp_path, capsys):
    envs.register(NAME, NanAfter40, episode_length=1000, overwrite=True)
    out = tmp_path / "sweep"
    messages = []
    summary = run_sweep(TrainConfig(**BASE), SweepSpec(batch_sizes=(16, 32)), out, progress=False,
                        announce=messages.append)
    failed = runlog.read_status(out / "B0016")
    assert failed["state"] == "failed" and failed["diverged"] is True and failed["iteration"] == 6
    assert runlog.read_status(out / "B0032")["state"] == "finished"
    assert any(m.startswith("diverged") and "B=[16]" in m for m in messages), messages
    (entry,) = summary["incomplete"]
    assert entry["batch"] == 16 and entry["diverged"] and "non-finite" in entry["reason"]
    assert [r["num_envs"] for r in summary["runs"]] == [32]
    assert "B0016 (B=16): status is 'failed'" in (out / "report.md").read_text()

    # Run the sweep again: the diverged B stays failed, the finished one is skipped.
    before = (out / "B0016" / runlog.METRICS_FILE).read_text()
    messages.clear()
    run_sweep(TrainConfig(**BASE), SweepSpec(batch_sizes=(16, 32)), out, progress=False, announce=messages.append)
    assert any("not retrained" in m and "B=[16]" in m for m in messages), messages
    assert (out / "B0016" / runlog.METRICS_FILE).read_text() == before

    # The CLI: --retry-failed trains it again (it diverges again: exit 3, the summary still written).
    sweep = ["sweep", *FLAGS, "--num-envs", "16", "--batch-sizes", "16", "32", "--out", str(out)]
    assert cli.main(sweep) == cli.EXIT_DIVERGED
    assert "not retrained" in capsys.readouterr().out
    (out / "summary.json").unlink()
    assert cli.main(sweep + ["--retry-failed"]) == cli.EXIT_DIVERGED
    captured = capsys.readouterr()
    assert "diverged (recorded as failed" in captured.out and "training diverged at B=[16]" in captured.err
    assert (out / "summary.json").exists()
    # and tclock train on the diverging config exits 3 too
    run = tmp_path / "train"
    assert cli.main(["train", *FLAGS, "--num-envs", "16", "--out", str(run)]) == cli.EXIT_DIVERGED
    assert runlog.read_status(run)["state"] == "failed"
