"""Batch-size sweeps: files, resume/skip, bad input, and devices (fake CPU devices)."""
import json
import os
import sys

import pytest

from tclock import runlog
from tclock.config import ConfigError, TrainConfig
from tclock.sweep import SweepSpec, run_sweep, sweep_configs

from golden_runs import deterministic  # noqa: E402
from side_by_side import run_side_by_side  # noqa: E402

BASE = dict(unroll_length=16, num_minibatches=2, num_epochs=2, seeds=2, policy_hidden=(16,), value_hidden=(16,),
            gdc_every=2, gdc_minibatch=32, total_steps=16 * 16 * 6, target_success=0.05, progress=False)


def test_bad_batch_sizes_rejected_before_compiling(tmp_path):
    base = TrainConfig(**{**BASE, "num_minibatches": 3})
    with pytest.raises(ConfigError, match="batch size 16: num_minibatches"):
        sweep_configs(base, SweepSpec(batch_sizes=(48, 16)), tmp_path)
    with pytest.raises(ConfigError, match="duplicates"):
        sweep_configs(TrainConfig(**BASE), SweepSpec(batch_sizes=(16, 16)), tmp_path)
    with pytest.raises(ConfigError, match="minibatch_size=24"):
        sweep_configs(TrainConfig(**BASE), SweepSpec(batch_sizes=(16,), minibatch="size", minibatch_size=24), tmp_path)
    assert not any(tmp_path.iterdir())


def test_sweep_semantics_of_fixed_quantities(tmp_path):
    base = TrainConfig(**{**BASE, "num_envs": 16, "total_steps": 16 * 16 * 10})
    steps = sweep_configs(base, SweepSpec(batch_sizes=(16, 64)), tmp_path)
    assert [c.total_steps for c in steps] == [2560, 2560]
    iters = sweep_configs(base, SweepSpec(batch_sizes=(16, 64), budget="iterations"), tmp_path)
    assert [c.num_iterations for c in iters] == [10, 10]
    sized = sweep_configs(base, SweepSpec(batch_sizes=(16, 64), minibatch="size", minibatch_size=64), tmp_path)
    assert [c.minibatch_size for c in sized] == [64, 64] and [c.num_minibatches for c in sized] == [4, 16]
    scaled = sweep_configs(base.replace(lr_scaling="sqrt", lr_base_envs=16), SweepSpec(batch_sizes=(16, 64)), tmp_path)
    assert [round(c.scaled_lr() / c.lr, 6) for c in scaled] == [1.0, 2.0]


@pytest.mark.slow
def test_tiny_sweep_writes_everything_and_resume_skips(tmp_path):
    out = tmp_path / "sweep"
    messages = []
    summary = run_sweep(TrainConfig(**BASE), SweepSpec(batch_sizes=(16, 32)), out, progress=False,
                        announce=messages.append)
    for b in ("B0016", "B0032"):
        assert runlog.read_status(out / b)["state"] == "finished"
        assert len(runlog.read_metrics(out / b)) == {"B0016": 6, "B0032": 3}[b]
    for name in ("sweep.yaml", "summary.json", "report.md"):
        assert (out / name).stat().st_size > 0
    assert list(out.glob("sweep_*.png"))
    saved = runlog.read_json(out / "summary.json")
    assert saved == json.loads(json.dumps(runlog.to_jsonable(summary)))

    # Interrupt one run (status back to running) and resume: the finished one is skipped.
    before = (out / "B0016" / "metrics.jsonl").read_text()
    writer_status = runlog.read_status(out / "B0032")
    runlog.write_json(out / "B0032" / "status.json", {**writer_status, "state": "interrupted"})
    messages.clear()
    run_sweep(TrainConfig(**BASE), SweepSpec(batch_sizes=(16, 32)), out, progress=False, announce=messages.append)
    assert any("skipped finished runs: B=[16]" in m for m in messages), messages
    assert (out / "B0016" / "metrics.jsonl").read_text() == before
    assert runlog.read_status(out / "B0032")["state"] == "finished"
    assert len(runlog.read_metrics(out / "B0032")) == 3


@pytest.mark.slow
def test_lr_grid_writes_one_run_per_pair_and_resumes(tmp_path):
    out = tmp_path / "grid"
    spec = SweepSpec(batch_sizes=(16,), lrs=(1e-3, 3e-4))
    messages = []
    summary = run_sweep(TrainConfig(**BASE), spec, out, progress=False, announce=messages.append)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["B0016_lr1e-03", "B0016_lr3e-04"]
    assert [runlog.read_config(out / n)["lr"] for n in ("B0016_lr3e-04", "B0016_lr1e-03")] == [3e-4, 1e-3]
    assert summary["lr_grid"]["lrs"] == [3e-4, 1e-3] and len(summary["lr_grid"]["cells"]) == 2
    assert "x 2 learning rates ['3e-04', '1e-03']" in messages[0]
    before = (out / "B0016_lr3e-04" / "metrics.jsonl").read_text()
    status = runlog.read_status(out / "B0016_lr1e-03")
    runlog.write_json(out / "B0016_lr1e-03" / "status.json", {**status, "state": "interrupted"})
    messages.clear()
    run_sweep(TrainConfig(**BASE), spec, out, progress=False, announce=messages.append)
    assert any("skipped finished runs: (B, lr)=[(16, 0.0003)]" in m for m in messages), messages
    assert (out / "B0016_lr3e-04" / "metrics.jsonl").read_text() == before
    assert runlog.read_status(out / "B0016_lr1e-03")["state"] == "finished"


def test_bad_learning_rates_rejected(tmp_path):
    for lrs, match in (((1e-3, -1e-4), "positive"), ((1e-3, 1e-3), "duplicates")):
        with pytest.raises(ConfigError, match=f"lrs: .*{match}"):
            sweep_configs(TrainConfig(**BASE), SweepSpec(batch_sizes=(16,), lrs=lrs), tmp_path)
    assert not any(tmp_path.iterdir())


SWEEP_SCRIPT = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
from tclock.config import TrainConfig
from tclock.sweep import SweepSpec, run_sweep
from tclock import runlog
import jax
base = TrainConfig(**json.loads(sys.argv[2]))
run_sweep(base, SweepSpec(batch_sizes=(8, 16, 24)), sys.argv[1], progress=False, announce=lambda s: None)
out = {}
for b in (8, 16, 24):
    d = f"{sys.argv[1]}/B{b:04d}"
    out[b] = {"device": runlog.read_status(d)["device"], "metrics": runlog.read_metrics(d)}
print(json.dumps({"devices": len(jax.devices()), "runs": out}))
"""


def _sweep_subprocesses(outs_and_devices):
    """The same small sweep in one fresh process per ``(out, devices)``, run side by side."""
    base = {**BASE, "policy_hidden": [16], "value_hidden": [16], "gdc_every": 0, "total_steps": 32 * 16 * 3}
    outs = run_side_by_side([[sys.executable, "-c", SWEEP_SCRIPT, str(out), json.dumps(base)]
                             for out, _ in outs_and_devices],
                            [{**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
                             for _, devices in outs_and_devices])
    return [json.loads(stdout.strip().splitlines()[-1]) for stdout in outs]


@pytest.mark.slow
def test_two_fake_devices_are_both_used_and_match_one_device(tmp_path):
    # three batch sizes on two devices: one device takes a second run when it frees up
    one, two = _sweep_subprocesses([(tmp_path / "one", 1), (tmp_path / "two", 2)])
    assert one["devices"] == 1 and two["devices"] == 2
    assert len({r["device"] for r in two["runs"].values()}) == 2
    for b, run in one["runs"].items():
        assert deterministic(run["metrics"]) == deterministic(two["runs"][b]["metrics"]), \
            f"B={b} differs across device counts"


def test_impala_sweep_configs_validate_on_the_default_task(tmp_path):
    configs = sweep_configs(TrainConfig(algo="impala"), SweepSpec(), tmp_path)
    assert [c.num_envs for c in configs] == [32, 64, 128, 256, 512, 1024]
    assert all(c.algo == "impala" and c.num_envs % c.num_minibatches == 0 for c in configs)
    with pytest.raises(ConfigError, match="batch size 30: num_minibatches: IMPALA"):
        sweep_configs(TrainConfig(algo="impala", unroll_length=32), SweepSpec(batch_sizes=(32, 30)), tmp_path)
