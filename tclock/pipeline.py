"""Asynchronous rollout pipeline (ARP, write-up 4.2): actor threads, a bounded buffer, max age.

The two clocks are decoupled physically: ``num_actors`` actor threads generate rollouts with
the latest *published* parameters, and the learner (the thread that calls :meth:`run`) trains
on the newest rollout that is still fresh.  Generic over callables, so it is tested without RL
and carries no JAX import:

* ``actor_fn(params, version, actor_index) -> trajectory`` -- one rollout with ``params``
  (published as policy version ``version``);
* ``learner_fn(params, item) -> (new_params, info_dict)`` -- one learning phase on ``item``
  (an :class:`Item`); the result is published as the next version.

Buffer.  A ring buffer of at most ``capacity`` items.  Pushing never blocks: when it is full
the *oldest* item is evicted (counted ``dropped_overflow``).  The learner takes the *newest*
item (LIFO: the freshest data, the smallest policy lag).  With ``max_age_s`` set, at every take
the learner first drops *all* items in the buffer whose age (``clock() - created_at``) exceeds
``max_age_s`` (counted ``dropped_age``): they can only get older, so dropping them now frees
memory sooner and keeps ``queue_depth`` honest.  ``created_at`` is when the rollout *finished*
(the write-up's "time spent in the buffer"); the rollout's own duration is ``Item.rollout_s``.
Use :func:`calibrate_max_age` on measured rollout latencies to choose ``max_age_s``.

Accounting.  ``produced`` counts items pushed into the buffer; every one of them ends in
exactly one place, so at any quiescent moment (and after :meth:`close`)::

    produced == consumed + dropped_age + dropped_overflow + still_buffered

A trajectory that an actor finishes after the stop signal is not pushed; it is counted
``abandoned`` (outside the identity).

Versions.  ``initial_params`` is version 0; each learner update publishes ``version + 1``.
Each update's record has ``version`` (the version just published) and
``policy_lag = (version - 1) - behaviour_version``: how many updates the parameters being
trained had moved past the ones that generated the data.

Reliability.  Every wait uses a timeout and a shared stop ``Event``.  The first exception in an
actor, in ``learner_fn`` or in ``on_update`` sets the stop event; :meth:`run` then joins the
actors and re-raises that exception (its original type, with a note naming the thread).
``KeyboardInterrupt`` in the learner stops and joins everything before propagating.  After
``run`` returns (``num_updates`` reached, deadline passed, or :meth:`close` called from another
thread) all threads are stopped and joined.  An actor stuck inside ``actor_fn`` cannot be
interrupted from outside: it is joined with ``join_timeout_s`` and, being a daemon thread, does
not keep the process alive; ``stats()["threads_alive"]`` reports it.  A long ``actor_fn`` may poll
:attr:`AsyncPipeline.stop_event` to return early.

Placement is the caller's concern.  ``actor_fn`` receives the published params as they are; to
act on another device, place them there inside ``actor_fn`` (e.g. ``jax.device_put(params,
actor_device)``, cached per version), or have ``learner_fn`` return params already placed (e.g.
replicated with a ``NamedSharding``).  Likewise ``learner_fn`` moves ``item.trajectory`` to the
learner devices.  JAX dispatch is asynchronous: ``learner_fn`` should block on (or at least
return) finished arrays if the record's timings are to mean anything.

Timestamps, ages, waits and the ``run`` deadline all use the injected ``clock`` (tests pass a
fake one); the internal poll timeouts are real time.
"""
from __future__ import annotations

import collections
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["Item", "RingBuffer", "AsyncPipeline", "calibrate_max_age"]

_POLL_S = 0.02  # real-time slice for every wait, so stop / errors are noticed promptly


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
                self._cond.wait(min(left, _POLL_S))

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


class AsyncPipeline:
    """Actor threads + bounded buffer + learner loop; see the module docstring.

    ::

        with AsyncPipeline(actor_fn, learner_fn, params, num_actors=2, capacity=8,
                           max_age_s=calibrate_max_age(latencies)) as pipe:
            pipe.run(num_updates=1000, on_update=log)
        params, version = pipe.latest()
    """

    def __init__(
        self,
        actor_fn: Callable[[Any, int, int], Any],
        learner_fn: Callable[[Any, Item], tuple[Any, dict]],
        initial_params: Any,
        num_actors: int = 1,
        capacity: int = 8,
        max_age_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        join_timeout_s: float = 10.0,
    ) -> None:
        if not callable(actor_fn) or not callable(learner_fn):
            raise TypeError("actor_fn and learner_fn must be callables")
        if not isinstance(num_actors, int) or isinstance(num_actors, bool) or num_actors < 1:
            raise ValueError(f"num_actors={num_actors!r} must be an integer >= 1")
        if max_age_s is not None and not (math.isfinite(max_age_s) and max_age_s > 0):
            raise ValueError(f"max_age_s={max_age_s!r} must be > 0 seconds or None (no limit); "
                             "calibrate_max_age(rollout latencies) gives the write-up's value")
        self._actor_fn = actor_fn
        self._learner_fn = learner_fn
        self.num_actors = num_actors
        self.max_age_s = max_age_s
        self._clock = clock
        self.join_timeout_s = float(join_timeout_s)
        self.buffer = RingBuffer(capacity, clock)
        self._params_lock = threading.Lock()
        self._params = initial_params
        self._version = 0
        self._stop = threading.Event()
        self._err_lock = threading.Lock()
        self._error: tuple[str, BaseException] | None = None
        self._threads: list[threading.Thread] = []
        self._started = False
        self._ran = False
        self._closed = False
        self._abandoned = 0
        self._updates = 0
        self._learner_wait_s = 0.0
        self._rollout_s: collections.deque[float] = collections.deque(maxlen=1000)

    # ------------------------------------------------------------------ state
    @property
    def stop_event(self) -> threading.Event:
        """Set when the pipeline is stopping (a long ``actor_fn`` may poll it)."""
        return self._stop

    def latest(self) -> tuple[Any, int]:
        """The latest published ``(params, version)``."""
        with self._params_lock:
            return self._params, self._version

    def rollout_latencies(self) -> list[float]:
        """Durations of the most recent (up to 1000) rollouts, for :func:`calibrate_max_age`."""
        with self._err_lock:
            return list(self._rollout_s)

    def stats(self) -> dict:
        c = self.buffer.counts()
        c.update(
            abandoned=self._abandoned,
            updates=self._updates,
            version=self.latest()[1],
            learner_wait_s=self._learner_wait_s,
            threads_alive=sum(t.is_alive() for t in self._threads),
        )
        return c

    # ------------------------------------------------------------------ threads
    def _record_error(self, where: str, exc: BaseException) -> None:
        with self._err_lock:
            if self._error is None:
                self._error = (where, exc)
        self._stop.set()
        self.buffer.wake()

    def _actor_loop(self, index: int) -> None:
        name = threading.current_thread().name
        try:
            while not self._stop.is_set():
                params, version = self.latest()
                t0 = self._clock()
                traj = self._actor_fn(params, version, index)
                t1 = self._clock()
                if self._stop.is_set():
                    with self._err_lock:
                        self._abandoned += 1
                    break
                with self._err_lock:
                    self._rollout_s.append(t1 - t0)
                self.buffer.push(Item(traj, version, t1, index, t1 - t0))
        except BaseException as exc:  # noqa: BLE001 - reported to the learner and re-raised
            self._record_error(name, exc)

    def start(self) -> "AsyncPipeline":
        """Start the actor threads (``run`` does it if needed).  Idempotent."""
        if self._closed:
            raise RuntimeError("this AsyncPipeline is closed; create a new one")
        if self._started:
            return self
        self._started = True
        for i in range(self.num_actors):
            t = threading.Thread(target=self._actor_loop, args=(i,),
                                 name=f"tclock-actor-{i}", daemon=True)
            self._threads.append(t)
            t.start()
        return self

    def close(self) -> None:
        """Set the stop event and join every actor thread (each with ``join_timeout_s``).
        Idempotent; safe to call from any thread (a ``run`` in progress then returns)."""
        self._stop.set()
        self.buffer.wake()
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:
                t.join(self.join_timeout_s)
        self._closed = True

    def __enter__(self) -> "AsyncPipeline":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _raise_if_error(self) -> None:
        with self._err_lock:
            err = self._error
        if err is not None:
            where, exc = err
            self.close()
            note = f"tclock.pipeline: raised in thread {where!r}"
            if note not in getattr(exc, "__notes__", []):
                exc.add_note(note)
            raise exc

    # ------------------------------------------------------------------ learner
    def run(self, num_updates: int | None = None, deadline_s: float | None = None,
            on_update: Callable[[dict], Any] | None = None) -> dict:
        """The learner loop, in the calling thread.  Stops after ``num_updates`` updates, once
        ``deadline_s`` (seconds on ``clock`` since ``run`` began) has passed, or when
        :meth:`close` is called; then joins the actors and returns :meth:`stats`.  One call per
        pipeline.

        Each update's record (passed to ``on_update``): ``version``, ``policy_lag``,
        ``behaviour_version``, ``actor_index``, ``data_age_s``, ``rollout_s``, ``queue_depth``
        (items left after the take), ``learner_wait_s`` (time waiting for this item),
        ``update_s`` (``learner_fn`` time), ``ut_s`` (time between the starts of this and the
        previous learning phase; None for the first), ``rt_ut_ratio`` (``rollout_s / ut_s``),
        the counters ``produced``, ``consumed``, ``dropped_age``, ``dropped_overflow``, and
        ``info`` (the dict ``learner_fn`` returned).
        """
        if num_updates is not None and (not isinstance(num_updates, int) or num_updates < 0):
            raise ValueError(f"num_updates={num_updates!r} must be an integer >= 0 or None")
        if self._ran:
            raise RuntimeError("AsyncPipeline.run() may be called once; create a new pipeline")
        self._ran = True
        self.start()
        t_start = self._clock()
        last_phase_start: float | None = None
        done = 0
        try:
            while True:
                self._raise_if_error()
                if self._stop.is_set():
                    break
                if num_updates is not None and done >= num_updates:
                    break
                # -- wait for a fresh item
                w0 = self._clock()
                item = None
                while item is None:
                    self._raise_if_error()
                    if self._stop.is_set():
                        break
                    if deadline_s is not None and self._clock() - t_start >= deadline_s:
                        break
                    item = self.buffer.take_newest(self.max_age_s, _POLL_S, self._stop)
                now = self._clock()
                wait = now - w0
                self._learner_wait_s += wait
                if item is None:
                    self._raise_if_error()
                    break
                # -- learn, publish
                params, version = self.latest()
                ut = None if last_phase_start is None else now - last_phase_start
                last_phase_start = now
                try:
                    new_params, info = self._learner_fn(params, item)
                except BaseException as exc:
                    self._record_error(f"learner ({threading.current_thread().name})", exc)
                    raise
                t_done = self._clock()
                with self._params_lock:
                    self._params = new_params
                    self._version = version + 1
                done += 1
                self._updates += 1
                c = self.buffer.counts()
                record = {
                    "version": version + 1,
                    "policy_lag": version - item.behaviour_version,
                    "behaviour_version": item.behaviour_version,
                    "actor_index": item.actor_index,
                    "data_age_s": now - item.created_at,
                    "rollout_s": item.rollout_s,
                    "queue_depth": c["still_buffered"],
                    "learner_wait_s": wait,
                    "update_s": t_done - now,
                    "ut_s": ut,
                    "rt_ut_ratio": (item.rollout_s / ut) if ut else None,
                    "produced": c["produced"],
                    "consumed": c["consumed"],
                    "dropped_age": c["dropped_age"],
                    "dropped_overflow": c["dropped_overflow"],
                    "info": dict(info) if info is not None else {},
                }
                if on_update is not None:
                    try:
                        on_update(record)
                    except BaseException as exc:
                        self._record_error(f"on_update ({threading.current_thread().name})",
                                           exc)
                        raise
                if deadline_s is not None and self._clock() - t_start >= deadline_s:
                    break
        except BaseException as exc:
            self.close()
            note = None
            with self._err_lock:
                if self._error is not None and self._error[1] is exc:
                    note = f"tclock.pipeline: raised in thread {self._error[0]!r}"
            if note and note not in getattr(exc, "__notes__", []):
                exc.add_note(note)
            raise
        self.close()
        return self.stats()
