"""The jitted init (``tclock.agents.seeding``): the state a per-seed loop builds, no batched QR
in the program, and many runs of it at 8 seeds x 128 envs finish (the XLA CPU deadlock it
avoids hangs a vmapped init within a few runs on this 2-core machine; docs/design.md)."""
import os
import re
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from tclock.config import TrainConfig, validate
from tclock.runtime import build_agent


@pytest.fixture(scope="module")
def agent():
    return build_agent(validate(TrainConfig(env="pointmass_reach", seeds=3, num_envs=16)))


def qr_batch_dims(agent, num_seeds: int) -> set:
    """``num_batch_dims`` of every QR custom call in the lowered init program (not run)."""
    text = jax.jit(lambda: agent.init(0, num_seeds)).lower().as_text()
    return set(re.findall(r'@lapack_\w*(?:geqrf|orgqr)\w*\(.*?num_batch_dims = "(\d+)"', text))


def test_init_equals_a_loop_over_seeds_of_the_one_seed_init(agent):
    # checked first: a program with batched QRs could hang this process instead of failing
    assert qr_batch_dims(agent, 3) == {"0"}
    state = agent.init(7, 3)
    for i in range(3):
        ref = agent.init_one(jax.random.fold_in(jax.random.PRNGKey(7), i))
        got = jax.tree.map(lambda x: x[i], state)
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(ref), jax.tree.leaves(got)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-6,
                                       err_msg=f"seed {i}: {jax.tree_util.keystr(path)}")
    # seeds differ from each other (the keys are folded in, not shared)
    kernels = [np.asarray(x) for x in jax.tree.leaves(state.params) if x.ndim == 3]
    assert kernels and all(not np.allclose(w[0], w[1]) for w in kernels)


def test_init_program_holds_no_batched_qr(agent):
    """The orthogonal initialiser's QR factorisations must stay unbatched (num_batch_dims 0):
    a batched one is the custom call that deadlocks XLA's CPU thread pool."""
    dims = qr_batch_dims(agent, 8)
    assert dims, "expected the orthogonal initialiser's QR calls in the init program"
    assert dims == {"0"}, f"batched QR in the init program: num_batch_dims {sorted(dims)}"


def test_jitted_init_at_8_seeds_by_128_envs_runs_25_times_without_hanging(tmp_path):
    script = textwrap.dedent("""
        import jax
        from tclock.config import TrainConfig, validate
        from tclock.runtime import build_agent
        agent = build_agent(validate(TrainConfig(env="pointmass_reach", seeds=8, num_envs=128)))
        for i in range(25):
            jax.block_until_ready(agent.init(i, 8))
        print("finished", flush=True)
    """)
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla")}  # compile and run fresh
    try:
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("the jitted init did not finish 25 runs within 240 s (the XLA CPU thread-pool deadlock)")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "finished" in out.stdout
