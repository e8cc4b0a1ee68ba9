"""A real ``tclock train`` subprocess killed with SIGKILL once its run directory has enough in it."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tclock import runlog


def kill_when(cmd: list[str], out: Path, min_checkpoint: int, min_lines: int = 0, cache_dir: Path | None = None,
              timeout: float = 240.0) -> None:
    """Starts ``cmd`` (which trains into ``out``), waits until a checkpoint of iteration
    ``>= min_checkpoint`` and ``>= min_lines`` metrics lines exist, then SIGKILLs it.

    ``cache_dir``: the child's own compilation cache; a kill in the middle of writing a cache entry
    must not leave a truncated entry that a later test (same program) reads and aborts on."""
    env = dict(os.environ)
    if cache_dir is not None:
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            ckpt = runlog.checkpoint_iteration(out)
            lines = len(runlog.read_metrics(out, missing_ok=True)) if (out / "metrics.jsonl").exists() else 0
            if ckpt and ckpt >= min_checkpoint and lines >= min_lines:
                break
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.005)
        else:
            raise AssertionError(f"{out}: no checkpoint >= {min_checkpoint} within {timeout:.0f} s")
        assert runlog.read_status(out)["state"] == "running"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
