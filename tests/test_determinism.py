"""The same ``tclock train`` command in two fresh processes gives identical metrics (timing
keys aside): both compile from scratch (no persistent compilation cache) and run at the same
time, competing for the same cores."""
import os
import subprocess
import sys

import pytest

from tclock import runlog

from golden_runs import deterministic  # noqa: E402


def _command(out):
    return [sys.executable, "-m", "tclock.cli", "train", "--num-envs", "32", "--unroll-length", "16",
            "--num-minibatches", "4", "--num-epochs", "2", "--seeds", "2", "--policy-hidden", "32", "32",
            "--value-hidden", "32", "32", "--gdc-every", "2", "--gdc-minibatch", "32", "--no-progress",
            "--total-steps", str(512 * 12), "--out", str(out)]


@pytest.mark.slow
def test_two_fresh_processes_give_identical_metrics(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    procs = [subprocess.Popen(_command(tmp_path / name), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for name in ("a", "b")]
    try:
        errors = [p.communicate(timeout=400)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], errors
    a, b = (deterministic(runlog.read_metrics(tmp_path / name))
            for name in ("a", "b"))
    assert len(a) == 12
    for ra, rb in zip(a, b):
        assert ra == rb, {k: (ra[k], rb.get(k)) for k in ra if ra[k] != rb.get(k)}
