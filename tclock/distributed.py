"""Several processes (hosts) on JAX's own distributed runtime.

``tclock train|sweep --coordinator HOST:PORT --num-processes N --process-id I`` calls
:func:`initialize` before anything touches a device; ``--distributed`` alone lets
``jax.distributed.initialize()`` find the cluster itself (SLURM, Open MPI, Kubernetes, Cloud TPU).
After it, ``jax.devices()`` lists the devices of every process and one run's mesh
(:mod:`tclock.mesh`) can span them; each process runs the same program on its own devices.

Who writes: a run that spans processes is written by process 0 alone (run directory, metrics,
checkpoints, progress bar, trackers); every process reads the same checkpoint on ``--resume``
(the run directory must be on a filesystem all of them see).  A sweep instead gives each process
its own batch sizes (:func:`partition`), each trained on that process's devices, so no two
processes write the same run directory, and process 0 writes the summary after all of them
finish (:func:`barrier`).

Faults: a coordinator that does not answer within ``--init-timeout`` seconds is an error naming
``--coordinator`` (checked with a plain TCP connection first, because JAX's client ends the process
without a Python exception when it cannot register; process 0 waiting for peers that never come is
ended by JAX after the same timeout, with its own message); a process that dies mid-run stops the others (JAX's heartbeat, or a collective
that fails) with an error instead of a hang, and the run resumes from its last periodic checkpoint.
When it is JAX's heartbeat that ends process 0 (an abort, no Python exception), ``status.json``
is left ``running``; :func:`tclock.runlog.read_status` reads it back as ``failed`` because its
writer is gone.
"""
from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass

from tclock.errors import ConfigError

__all__ = ["Launch", "check_launch", "initialize", "partition", "barrier", "is_lead", "HEARTBEAT_S"]

HEARTBEAT_S = 10  # seconds without a heartbeat before the coordinator declares a process dead


@dataclass(frozen=True)
class Launch:
    """How this process joins the others: nothing (one process), auto-detection, or explicit."""

    coordinator: str = ""
    num_processes: int = 0
    process_id: int = -1
    auto: bool = False
    timeout_s: int = 60

    @property
    def explicit(self) -> bool:
        return bool(self.coordinator) or self.num_processes > 0 or self.process_id >= 0


def check_launch(launch: Launch) -> Launch:
    """Raises ``ConfigError`` naming the flag for a launch that cannot work; returns it."""
    if launch.auto and launch.explicit:
        raise ConfigError("distributed: --distributed detects the cluster itself; drop --coordinator, "
                          "--num-processes and --process-id, or drop --distributed")
    if launch.timeout_s <= 0:
        raise ConfigError(f"init_timeout: must be a positive number of seconds, got {launch.timeout_s}")
    if not launch.explicit:
        return launch
    if not launch.coordinator:
        raise ConfigError("coordinator: give --coordinator HOST:PORT (process 0's address) with --num-processes "
                          "and --process-id")
    if not re.fullmatch(r"\[?[A-Za-z0-9_.:-]+\]?:\d{1,5}", launch.coordinator):
        raise ConfigError(f"coordinator: {launch.coordinator!r} is not HOST:PORT; e.g. --coordinator 10.0.0.1:1234")
    if launch.num_processes < 1:
        raise ConfigError(f"num_processes: give --num-processes N >= 1 with --coordinator, got {launch.num_processes}")
    if not 0 <= launch.process_id < launch.num_processes:
        raise ConfigError(f"process_id: --process-id {launch.process_id} is out of range for --num-processes "
                          f"{launch.num_processes}; give 0 .. {launch.num_processes - 1} (0 on the coordinator's host)")
    return launch


def initialize(launch: Launch) -> None:
    """Joins the other processes (no-op for a single-process launch).  Must run before any device
    is touched; a coordinator that cannot be reached in time raises ``ConfigError``."""
    check_launch(launch)
    if not (launch.auto or launch.explicit):
        return
    import jax

    if launch.explicit:
        _check_coordinator(launch)
    kwargs = dict(initialization_timeout=launch.timeout_s, heartbeat_timeout_seconds=HEARTBEAT_S)
    try:
        if launch.auto:
            jax.distributed.initialize(**kwargs)
        else:
            jax.distributed.initialize(launch.coordinator, launch.num_processes, launch.process_id, **kwargs)
    except Exception as e:  # noqa: BLE001 - JAX raises RuntimeError/XlaRuntimeError/ValueError here
        where = "the cluster's coordinator (auto-detected)" if launch.auto else launch.coordinator
        raise ConfigError(f"coordinator: could not join {where} within {launch.timeout_s} s "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); start process 0 "
                          "first, check the host and port (--coordinator) and that every process gives the same "
                          "--num-processes") from None


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _check_coordinator(launch: Launch) -> None:
    """Before JAX's client starts (it ends the process, uncatchably, when it cannot register):
    process 0 checks that it can open the coordinator's port; every other process waits up to
    ``timeout_s`` for the coordinator to accept a connection.  ``ConfigError`` naming
    ``--coordinator`` otherwise."""
    host, port = _split_address(launch.coordinator)
    if launch.process_id == 0:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("", port))
            except OSError as e:
                raise ConfigError(f"coordinator: process 0 cannot open port {port} ({e.strerror}); pick a free port "
                                  f"in --coordinator on every process") from None
        return
    deadline = time.monotonic() + launch.timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=2.0):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise ConfigError(f"coordinator: nothing answered at {launch.coordinator} within {launch.timeout_s} s "
                                  f"({e.strerror or e}); start process 0 (--process-id 0) on that host first, check "
                                  "the address and port, or raise --init-timeout") from None
            time.sleep(0.5)


def is_lead() -> bool:
    """Whether this is process 0 (or the only process)."""
    import jax

    return jax.process_index() == 0


def partition(items: list, process_id: int | None = None, num_processes: int | None = None) -> list:
    """This process's share of ``items``: item ``i`` goes to process ``i mod N`` (deterministic,
    so every process computes the same split without talking)."""
    import jax

    pid = jax.process_index() if process_id is None else process_id
    n = jax.process_count() if num_processes is None else num_processes
    return [x for i, x in enumerate(items) if i % n == pid]


def barrier(name: str) -> None:
    """Waits until every process reaches the barrier ``name`` (no-op with one process)."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
