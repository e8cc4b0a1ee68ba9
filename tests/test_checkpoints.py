"""The checkpoint format and the checkpoint files (no training: small hand-made states).

Data only (a pickle is refused and never opened), restored against a template with the
structure and shapes checked, atomic, the last N kept, a corrupt or truncated newest file
skipped in favour of the previous good one.
"""
import json
import pickle
import subprocess
import sys
from typing import NamedTuple

import flax.struct
import jax
import numpy as np
import pytest

from tclock import checkpoints, runlog


@flax.struct.dataclass
class State:
    params: dict
    opt: "Opt"
    key: np.ndarray


class Opt(NamedTuple):
    count: np.ndarray
    mu: dict


def make_state(value: float, width: int = 3) -> State:
    params = {"w": np.full((2, width), value, np.float32), "b": np.full((2,), value, np.float32)}
    return State(params=params, opt=Opt(np.full((2,), int(value), np.int32), {"w": np.zeros((2, width), np.float32)}),
                 key=np.arange(4, dtype=np.uint32).reshape(2, 2))


TEMPLATE = jax.eval_shape(lambda: make_state(0.0))
HOST = {"wall_s": 1.25, "env_steps": 512, "ratios": [0.25, 0.5], "drbs": None}


def writer(run_dir, keep=3):
    return runlog.RunWriter(run_dir, {"num_envs": 2}, keep_checkpoints=keep)


def test_round_trip_restores_types_from_the_template():
    data = checkpoints.encode(7, make_state(1.5), HOST)
    content = checkpoints.decode(data)
    assert content["iteration"] == 7 and content["host"] == HOST
    state = checkpoints.restore(content["leaves"], TEMPLATE)
    assert isinstance(state, State) and isinstance(state.opt, Opt)
    np.testing.assert_array_equal(state.params["w"], np.full((2, 3), 1.5, np.float32))
    assert state.opt.count.dtype == np.int32 and state.key.dtype == np.uint32


@pytest.mark.parametrize("cut", ["truncated", "flipped", "header", "other"])
def test_damaged_bytes_are_reported_as_corrupt(cut):
    data = checkpoints.encode(3, make_state(2.0), HOST)
    damaged = {"truncated": data[: len(data) // 2], "flipped": data[:-5] + bytes([data[-5] ^ 1]) + data[-4:],
               "header": data[:20], "other": b"\x80\x04not a checkpoint"}[cut]
    with pytest.raises(checkpoints.CorruptCheckpoint):
        checkpoints.decode(damaged)


def test_structure_and_shape_differences_are_named():
    leaves = checkpoints.decode(checkpoints.encode(1, make_state(1.0, width=5), HOST))["leaves"]
    with pytest.raises(checkpoints.TemplateMismatch, match=r"\.params\['w'\]: saved float32\[2, 5\], this config "
                                                           r"needs float32\[2, 3\]"):
        checkpoints.restore(leaves, TEMPLATE)
    del leaves[".params['b']"]
    leaves[".params['extra']"] = np.zeros(1)
    diff = checkpoints.differences(leaves, TEMPLATE)
    assert ".params['b'] missing from the checkpoint" in diff
    assert ".params['extra'] in the checkpoint but not in this config's state" in diff


def test_the_last_n_are_kept_and_restored_against_the_template(tmp_path):
    w = writer(tmp_path, keep=3)
    for it in range(1, 6):
        w.save_checkpoint(it, make_state(float(it)), {**HOST, "env_steps": it})
    w.close()
    names = sorted(p.name for p in (tmp_path / runlog.CHECKPOINT_DIR).iterdir())
    assert names == ["ckpt_000003.ckpt", "ckpt_000004.ckpt", "ckpt_000005.ckpt", "latest"]
    ckpt = runlog.load_checkpoint(tmp_path, TEMPLATE)
    assert (ckpt.iteration, ckpt.host["env_steps"], ckpt.skipped) == (5, 5, [])
    np.testing.assert_array_equal(ckpt.train.params["b"], [5.0, 5.0])
    assert runlog.checkpoint_iteration(tmp_path) == 5
    with pytest.raises(runlog.RunFormatError, match=r"does not match this config.*\.params\['w'\]"):
        runlog.load_checkpoint(tmp_path, jax.eval_shape(lambda: make_state(0.0, width=4)))


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_good_one(tmp_path):
    w = writer(tmp_path)
    for it in (2, 4, 6):
        w.save_checkpoint(it, make_state(float(it)), HOST)
    w.close()
    ckpt_dir = tmp_path / runlog.CHECKPOINT_DIR
    newest = ckpt_dir / "ckpt_000006.ckpt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a copy cut short
    middle = ckpt_dir / "ckpt_000004.ckpt"
    raw = bytearray(middle.read_bytes())
    raw[-3] ^= 0xFF  # one flipped byte
    middle.write_bytes(bytes(raw))
    ckpt = runlog.load_checkpoint(tmp_path, TEMPLATE)
    assert ckpt.iteration == 2
    assert [s["file"] for s in ckpt.skipped] == ["ckpt_000006.ckpt", "ckpt_000004.ckpt"]
    assert "truncated" in ckpt.skipped[0]["reason"] and "SHA-256" in ckpt.skipped[1]["reason"]
    (ckpt_dir / "ckpt_000002.ckpt").write_bytes(b"")
    with pytest.raises(runlog.RunFormatError, match="no loadable checkpoint.*ckpt_000002.ckpt"):
        runlog.load_checkpoint(tmp_path, TEMPLATE)


def test_checkpoints_past_the_metrics_are_not_used(tmp_path):
    w = writer(tmp_path)
    for it in (2, 4):
        w.save_checkpoint(it, make_state(float(it)), HOST)
    w.close()
    ckpt = runlog.load_checkpoint(tmp_path, TEMPLATE, max_iteration=3)
    assert ckpt.iteration == 2 and "metrics.jsonl" in ckpt.skipped[0]["reason"]
    with pytest.raises(runlog.RunFormatError, match="no loadable checkpoint"):
        runlog.load_checkpoint(tmp_path, TEMPLATE, max_iteration=1)


def test_an_old_pickle_checkpoint_is_refused_and_never_unpickled(tmp_path):
    marker = tmp_path / "pickle_ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    ckpt_dir = tmp_path / "run" / runlog.CHECKPOINT_DIR
    ckpt_dir.mkdir(parents=True)
    (ckpt_dir / "ckpt_000040.pkl").write_bytes(pickle.dumps({"iteration": 40, "state": Payload()}))
    (ckpt_dir / "latest").write_text("ckpt_000040.pkl")
    with pytest.raises(runlog.RunFormatError, match="pickle.*never loads"):
        runlog.load_checkpoint(tmp_path / "run", TEMPLATE)
    assert not marker.exists()
    assert runlog.checkpoint_iteration(tmp_path / "run") is None


def test_a_left_over_temporary_file_is_ignored_and_cleared(tmp_path):
    w = writer(tmp_path)
    w.save_checkpoint(1, make_state(1.0), HOST)
    w.close()
    ckpt_dir = tmp_path / runlog.CHECKPOINT_DIR
    stale = ckpt_dir / ".ckpt_000002.ckpt.abc.tmp"
    stale.write_bytes(checkpoints.encode(2, make_state(2.0), HOST)[:100])
    assert runlog.load_checkpoint(tmp_path, TEMPLATE).iteration == 1
    runlog.RunWriter(tmp_path, {"num_envs": 2}, resume_iteration=1).close()
    assert not stale.exists()


def test_a_running_status_whose_writer_ended_without_marking_reads_as_failed(tmp_path):
    """A writer that leaves without marking the run (SIGKILL, or JAX's runtime aborting a process whose
    peer died) is read back as ``failed`` with its newest checkpoint; a live writer stays ``running``."""
    run = tmp_path / "run"
    script = ("import os, sys\nfrom tclock import runlog\nw = runlog.RunWriter(sys.argv[1], {})\n"
              "w.save_checkpoint(3, {'x': [1.0]}, {})\nos._exit(134)\n")
    done = subprocess.run([sys.executable, "-c", script, str(run)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 134, done.stderr
    assert json.loads((run / runlog.STATUS_FILE).read_text())["state"] == "running"  # the file is left as it is
    status = runlog.read_status(run)
    assert status["state"] == "failed" and status["inferred"] is True and status["last_good_checkpoint"] == 3
    assert f"pid {status['writer']['pid']}" in status["reason"]

    live = runlog.RunWriter(tmp_path / "live", {})
    assert runlog.read_status(tmp_path / "live")["state"] == "running"  # this process is its writer
    live.close()
    for writer, state in [({**runlog.writer_identity(), "started": "0"}, "failed"),  # the pid was reused
                          ({**runlog.writer_identity(), "host": "elsewhere"}, "running"),  # cannot be checked here
                          (None, "running")]:  # written by an older tclock
        runlog.write_json(tmp_path / "live" / runlog.STATUS_FILE, {"state": "running", "writer": writer})
        assert runlog.read_status(tmp_path / "live")["state"] == state, writer
