"""Fresh Python processes run side by side (each test that needs fake devices or a clean JAX)."""
from __future__ import annotations

import subprocess
import tempfile


def run_side_by_side(argvs: list[list[str]], envs: list[dict], timeout: float = 900.0) -> list[str]:
    """Starts one process per ``(argv, env)`` at once and waits for all; returns their stdouts.
    Output goes to temporary files, not pipes, so a chatty process cannot block on a full pipe
    while another is awaited.  A failure names the command with the end of its stderr, and every
    process still running then is killed."""
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in argvs]
    procs = [subprocess.Popen(argv, env=env, stdout=out, stderr=err, text=True)
             for argv, env, (out, err) in zip(argvs, envs, files)]
    try:
        for argv, p, (_, err) in zip(argvs, procs, files):
            p.wait(timeout=timeout)
            err.seek(0)
            assert p.returncode == 0, (argv[:3], err.read()[-4000:])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    outs = []
    for out, err in files:
        out.seek(0)
        outs.append(out.read())
        out.close()
        err.close()
    return outs
