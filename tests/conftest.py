"""Shared test set-up: a persistent XLA compilation cache so repeated programs compile once.

The cache directory is passed to subprocesses through the environment, so CLI tests that
start ``tclock`` in a child process reuse what the parent compiled.
"""
import os
import warnings
from pathlib import Path

CACHE = Path(os.environ.setdefault("TCLOCK_TEST_CACHE", str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "xla")))
CACHE.mkdir(parents=True, exist_ok=True)
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(CACHE))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
warnings.filterwarnings("ignore", message=".*not actively being maintained.*")


import gc  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Each test module's compiled programs are released when the module ends (programs are still
    shared between the tests of a module, and the persistent cache above makes a later module's
    recompile cheap).  One pytest process compiles hundreds of XLA executables; kept alive, their
    code mappings approach the kernel's vm.max_map_count (65530 here) and XLA then crashes inside
    a later compile (seen as a segfault or an abort in the last test modules of the suite)."""
    yield
    runtime = sys.modules.get("tclock.runtime")
    if runtime is not None:
        runtime.release_compiled()
    elif "jax" in sys.modules:
        sys.modules["jax"].clear_caches()
        gc.collect()
