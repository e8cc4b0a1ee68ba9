"""Faults on real files: a process killed mid-checkpoint, a checkpoint cut short by hand, a
metrics.jsonl whose last line is cut, a full disk.  Each ends with a loadable state and a
run that continues without losing or duplicating a metrics line."""
import errno
import json
import random
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from tclock import cli, runlog
from tclock.config import TrainConfig
from tclock.loop import train

from golden_runs import deterministic as strip_timing  # noqa: E402
# test_train.py's small config: the same programs, compiled once per session.
SMALL = dict(num_envs=32, unroll_length=16, num_minibatches=4, num_epochs=2, seeds=2, policy_hidden=(32, 32),
             value_hidden=(32, 32), gdc_every=2, gdc_minibatch=32, progress=False)
ITER = 32 * 16


def small_cfg(out, iterations, **changes):
    return TrainConfig(out=str(out), total_steps=ITER * iterations, **{**SMALL, **changes})


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 6-iteration run: what every repaired run must reproduce."""
    out = tmp_path_factory.mktemp("reference") / "run"
    train(small_cfg(out, 6))
    return strip_timing(runlog.read_metrics(out))


def interrupt(out, iterations: int = 6):
    """Marks a run as a process that died (status ``running``) and returns its resume config."""
    status = runlog.read_status(out)
    runlog.write_json(out / runlog.STATUS_FILE, {**status, "state": "running"})
    return small_cfg(out, iterations)


# ------------------------------------------------------------------ SIGKILL mid-write
WRITER = r"""
import sys, numpy as np
from tclock import runlog
n = int(sys.argv[2])
w = runlog.RunWriter(sys.argv[1], {"n": n}, keep_checkpoints=2)
for it in range(1, 1000):
    state = {"a": np.full(n, it, np.float32), "b": np.full(n // 2, -it, np.int32)}
    print("writing", it, flush=True)
    w.save_checkpoint(it, state, {"env_steps": it})
    print("wrote", it, flush=True)
"""
N_BIG = 3_000_000  # 18 MB per checkpoint


def _big_template():
    return {"a": jax.ShapeDtypeStruct((N_BIG,), np.float32), "b": jax.ShapeDtypeStruct((N_BIG // 2,), np.int32)}


def _check_loadable(out, at_least: int) -> int:
    ckpt = runlog.load_checkpoint(out, _big_template())
    assert ckpt is not None and ckpt.iteration >= at_least and ckpt.skipped == []
    assert (ckpt.train["a"] == ckpt.iteration).all() and (ckpt.train["b"] == -ckpt.iteration).all()
    return ckpt.iteration


def test_sigkill_during_checkpoint_writes_keeps_the_previous_one_loadable(tmp_path):
    rng = random.Random(12)
    mid_write = 0
    for round_ in range(4):
        out = tmp_path / f"round{round_}"
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(out), str(N_BIG)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            starts, durations = {}, []
            for line in proc.stdout:
                word, it = line.split()
                if word == "writing":
                    starts[int(it)] = time.perf_counter()
                    if int(it) == 4:  # two finished writes timed: kill somewhere inside this one
                        time.sleep(rng.uniform(0.0, 1.2) * min(durations))
                        proc.send_signal(signal.SIGKILL)
                        break
                else:
                    durations.append(time.perf_counter() - starts[int(it)])
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
        leftovers = list((out / runlog.CHECKPOINT_DIR).glob(".*.tmp"))
        mid_write += bool(leftovers)
        _check_loadable(out, at_least=3)
    # A writer that dies once the temporary file is half written (deterministically mid-write).
    out = tmp_path / "half"
    child = WRITER.replace("w = runlog.RunWriter", HALF_WRITE + "w = runlog.RunWriter")
    proc = subprocess.run([sys.executable, "-c", child, str(out), "200000"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert list((out / runlog.CHECKPOINT_DIR).glob(".*.tmp")), "the child died before touching the new file"
    ckpt = runlog.load_checkpoint(out, {"a": jax.ShapeDtypeStruct((200000,), np.float32),
                                        "b": jax.ShapeDtypeStruct((100000,), np.int32)})
    assert ckpt.iteration == 2 and (ckpt.train["a"] == 2).all()
    print(f"{mid_write}/4 timed kills left a partial temporary file")


HALF_WRITE = r"""
import os, signal
_real_fsync = os.fsync
def _die_on_third(fd, _count=[0]):
    if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp") and "ckpt_000003" in os.readlink(f"/proc/self/fd/{fd}"):
        os.ftruncate(fd, os.fstat(fd).st_size // 2)
        os.kill(os.getpid(), signal.SIGKILL)
    return _real_fsync(fd)
os.fsync = _die_on_third
"""


# ------------------------------------------------------------------ damaged files, then --resume
def test_a_checkpoint_truncated_by_hand_makes_resume_fall_back(tmp_path, reference, capsys):
    out = tmp_path / "cut"
    train(small_cfg(out, 4, checkpoint_every=2))  # checkpoints after iterations 2 and 4
    newest = out / runlog.CHECKPOINT_DIR / "ckpt_000004.ckpt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 3])
    train(interrupt(out), resume=True)
    assert "ckpt_000004.ckpt" in capsys.readouterr().err  # the warning names the skipped file
    status = runlog.read_status(out)
    assert status["state"] == "finished"
    fallback = status["checkpoint_fallback"]
    assert fallback["resumed_from"] == 2 and fallback["skipped"][0]["file"] == "ckpt_000004.ckpt"
    assert "truncated" in fallback["skipped"][0]["reason"]
    assert strip_timing(runlog.read_metrics(out)) == reference


@pytest.mark.parametrize("checkpointed", [False, True])
def test_a_cut_last_metrics_line_is_repaired_on_resume(tmp_path, reference, checkpointed):
    """The process died while writing line 5: the cut line is dropped, iteration 5 runs again.
    ``checkpointed``: the cut line's iteration was checkpointed too (cut by hand), so the
    resume must go back to the checkpoint the intact lines cover."""
    out = tmp_path / "lines"
    train(small_cfg(out, 5, checkpoint_every=2))  # checkpoints after 2, 4 and (at the end) 5
    if not checkpointed:
        (out / runlog.CHECKPOINT_DIR / "ckpt_000005.ckpt").unlink()
    metrics = out / runlog.METRICS_FILE
    text = metrics.read_text()
    last_start = text.rstrip("\n").rfind("\n") + 1
    metrics.write_text(text[: last_start + (len(text) - last_start) // 2])  # half of the last line, no newline
    with pytest.raises(runlog.RunFormatError):
        runlog.read_metrics(out)  # the reader itself stays strict
    train(interrupt(out), resume=True)
    records = runlog.read_metrics(out)
    assert [r["iteration"] for r in records] == list(range(1, 7))
    assert strip_timing(records) == reference
    assert runlog.read_status(out)["metrics_repaired"]["dropped_partial_line"] is True


def _full_disk_after(monkeypatch, iteration: int):
    """Checkpoint writes after ``iteration`` fail as on a full disk, leaving a partial temporary file."""
    real = runlog._atomic_write_bytes

    def write(path, data):
        if path.name.startswith("ckpt_") and int(path.stem.split("_")[1]) > iteration:
            (path.parent / f".{path.name}.partial.tmp").write_bytes(data[: len(data) // 3])
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)

    monkeypatch.setattr(runlog, "_atomic_write_bytes", write)


def test_a_full_disk_fails_the_run_clearly_and_keeps_the_last_good_checkpoint(tmp_path, reference, monkeypatch,
                                                                             capsys):
    out = tmp_path / "full"
    _full_disk_after(monkeypatch, 2)
    argv = ["train", "--num-envs", "32", "--unroll-length", "16", "--num-minibatches", "4", "--num-epochs", "2",
            "--seeds", "2", "--policy-hidden", "32", "32", "--value-hidden", "32", "32", "--gdc-every", "2",
            "--gdc-minibatch", "32", "--no-progress", "--total-steps", str(ITER * 6), "--checkpoint-every", "2",
            "--out", str(out)]
    assert cli.main(argv) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "No space left on device" in err and "--resume" in err and "iteration 2" in err
    status = runlog.read_status(out)
    assert status["state"] == "failed" and "No space left on device" in status["reason"]
    assert status["last_good_checkpoint"] == 2
    monkeypatch.undo()
    assert runlog.checkpoint_iteration(out) == 2
    # The space is back: --resume continues from the intact checkpoint.
    assert cli.main(argv + ["--resume"]) == cli.EXIT_OK
    assert strip_timing(runlog.read_metrics(out)) == reference
    assert not list((out / runlog.CHECKPOINT_DIR).glob(".*.tmp"))
    json.dumps(runlog.read_status(out))
