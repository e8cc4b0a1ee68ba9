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
