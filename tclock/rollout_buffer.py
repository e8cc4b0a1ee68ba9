"""The bounded rollout buffer of the asynchronous pipeline (``tclock.pipeline``): one
:class:`Item` per rollout, a thread-safe :class:`RingBuffer` that evicts the oldest when full
and hands the learner the newest item younger than a maximum age, and the write-up's rule for
that age (:func:`calibrate_max_age`: p95 rollout latency x 1.5).  Plain Python and NumPy.
"""
from __future__ import annotations

import collections
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

POLL_S = 0.02  # real-time slice for every wait, so stop / errors are noticed promptly


@dataclass(frozen=True)
class Item:
    """One rollout in the buffer."""

    trajectory: Any
    behaviour_version: int
    created_at: float
    actor_index: int = 0
    rollout_s: float = float("nan")  # how long actor_fn took (for calibrate_max_age)


def calibrate_max_age(rollout_latencies_s: Sequence[float], quantile: float = 0.95,
                      factor: float = 1.5) -> float:
    """``max_age_s`` from measured rollout latencies: the ``quantile`` (p95) times ``factor``
    (1.5), the write-up's rule (p95 latency x 1.5).  NumPy's default (linear) quantile."""
    lat = np.asarray(list(rollout_latencies_s), dtype=float)
    if lat.size == 0:
        raise ValueError("rollout_latencies_s is empty; measure a few rollouts first")
    if not np.all(np.isfinite(lat)) or np.any(lat < 0):
        raise ValueError("rollout_latencies_s must be finite and >= 0 seconds")
    if not 0 < quantile <= 1:
        raise ValueError(f"quantile={quantile!r} must be in (0, 1], e.g. 0.95")
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor={factor!r} must be > 0, e.g. 1.5")
    return float(np.quantile(lat, quantile)) * float(factor)


class RingBuffer:
    """Bounded, thread-safe buffer: push evicts the oldest when full; take returns the newest
    after dropping every item older than ``max_age_s``.  Keeps the accounting counters."""

    def __init__(self, capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"capacity={capacity!r} must be an integer >= 1 (items held "
                             "between actors and learner)")
        self.capacity = capacity
        self._clock = clock
        self._items: collections.deque[Item] = collections.deque()
        self._cond = threading.Condition()
        self.produced = 0
        self.consumed = 0
        self.dropped_age = 0
        self.dropped_overflow = 0
        self.max_depth = 0

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def push(self, item: Item) -> bool:
        """Add ``item``; never blocks.  Returns True if the oldest item was evicted."""
        with self._cond:
            evicted = False
            if len(self._items) >= self.capacity:
                self._items.popleft()
                self.dropped_overflow += 1
                evicted = True
            self._items.append(item)
            self.produced += 1
            self.max_depth = max(self.max_depth, len(self._items))
            self._cond.notify_all()
            return evicted

    def _drop_stale(self, max_age_s: float | None) -> None:
        if max_age_s is None or not self._items:
            return
        now = self._clock()
        fresh = [it for it in self._items if now - it.created_at <= max_age_s]
        self.dropped_age += len(self._items) - len(fresh)
        self._items = collections.deque(fresh)

    def take_newest(self, max_age_s: float | None = None, timeout_s: float = 0.0,
                    stop_event: threading.Event | None = None) -> Item | None:
        """Drop stale items, then pop the newest.  Waits up to ``timeout_s`` real seconds for
        one (returns None if none arrives, or as soon as ``stop_event`` is set)."""
        end = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            while True:
                self._drop_stale(max_age_s)
                if self._items:
                    self.consumed += 1
                    return self._items.pop()
                left = end - time.monotonic()
                if left <= 0 or (stop_event is not None and stop_event.is_set()):
                    return None
                self._cond.wait(min(left, POLL_S))

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def counts(self) -> dict:
        with self._cond:
            return {
                "produced": self.produced,
                "consumed": self.consumed,
                "dropped_age": self.dropped_age,
                "dropped_overflow": self.dropped_overflow,
                "still_buffered": len(self._items),
                "max_depth": self.max_depth,
            }
