"""--tensorboard and --wandb mirror every numeric scalar of metrics.jsonl (read back here)."""
import importlib.machinery
import math
import struct
import sys
import types
from pathlib import Path

import pytest

from tclock import cli, runlog, tracking
from tclock.config import ConfigError, TrainConfig, validate
from tclock.loop import train

# test_train.py's small config: the same programs, compiled once per session.
SMALL = dict(num_envs=32, unroll_length=16, num_minibatches=4, num_epochs=2, seeds=2, policy_hidden=(32, 32),
             value_hidden=(32, 32), gdc_every=2, gdc_minibatch=32, progress=False)


def read_event_scalars(logdir: Path) -> dict:
    """``{tag: [(step, value), ...]}`` from TensorBoard event files, with TensorBoard's own reader
    when it is installed, else by parsing the TFRecord framing with tensorboardX's protobufs."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        EventAccumulator = None
    if EventAccumulator is not None:
        acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
        acc.Reload()
        return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    from tensorboardX.proto import event_pb2

    out: dict = {}
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


class FakeWandbRun:
    def __init__(self, **kwargs):
        self.init_kwargs, self.logged, self.finished = kwargs, [], False

    def log(self, data, step):
        self.logged.append((step, dict(data)))

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    module.runs = []
    module.init = lambda **kw: module.runs.append(FakeWandbRun(**kw)) or module.runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", module)
    return module


def test_tensorboard_and_wandb_mirror_every_scalar_per_seed(tmp_path, fake_wandb):
    cfg = TrainConfig(out=str(tmp_path / "tb"), total_steps=512 * 3, tensorboard=True, wandb="tclock-test", **SMALL)
    train(cfg)
    records = runlog.read_metrics(cfg.out)
    events = read_event_scalars(Path(cfg.out) / runlog.TENSORBOARD_DIR)
    expected = {}
    for r in records:
        for tag, value in tracking.scalars(r):
            expected.setdefault(tag, []).append((r["env_steps"], value))
    assert {"success_rate/seed0", "success_rate/seed1", "iteration", "rt_ut_ratio"} <= set(expected)
    assert set(events) == set(expected)
    for tag, want in expected.items():
        got = events[tag]
        assert [s for s, _ in got] == [s for s, _ in want], tag
        assert all(math.isclose(g, w, rel_tol=1e-6, abs_tol=1e-30) for (_, g), (_, w) in zip(got, want)), tag
    # every numeric scalar of the records is there (per-seed lists as /seedN tags)
    r = records[-1]
    assert all(f"{k}/seed{i}" in events for k, v in r.items() if isinstance(v, list)
               for i, x in enumerate(v) if x is not None)
    (run,) = fake_wandb.runs
    assert run.init_kwargs["project"] == "tclock-test" and run.init_kwargs["config"]["num_envs"] == 32
    assert [step for step, _ in run.logged] == [r["env_steps"] for r in records]
    assert run.logged[-1][1] == dict(tracking.scalars(records[-1])) and run.finished


def test_missing_tracking_packages_fail_before_compiling_with_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"^tensorboard: .*tclock\[tracking\]"):
        validate(TrainConfig(tensorboard=True))
    with pytest.raises(ConfigError, match=r"^wandb: --wandb proj needs the wandb package.*tclock\[tracking\]"):
        validate(TrainConfig(wandb="proj"))
    out = tmp_path / "none"
    assert cli.main(["train", "--wandb", "proj", "--out", str(out)]) == cli.EXIT_BAD_INPUT
    assert "tclock[tracking]" in capsys.readouterr().err and not out.exists()


def test_wandb_offline_run_when_installed(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = TrainConfig(out=str(tmp_path / "wb"), total_steps=512 * 2, wandb="tclock-test", **SMALL)
    train(cfg)
    assert list((Path(cfg.out) / "wandb").glob("offline-run-*"))
