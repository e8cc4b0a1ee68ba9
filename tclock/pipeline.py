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
import contextlib
import math
import threading
import time
from typing import Any, Callable, Iterator


from tclock.rollout_buffer import POLL_S, Item, RingBuffer, calibrate_max_age

__all__ = ["Item", "RingBuffer", "AsyncPipeline", "calibrate_max_age"]


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
            _add_thread_note(exc, where)
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
        try:
            self._learner_loop(t_start, num_updates, deadline_s, on_update)
        except BaseException as exc:
            self._stop_after_error(exc)
            raise
        self.close()
        return self.stats()

    def _past_deadline(self, t_start: float, deadline_s: float | None) -> bool:
        return deadline_s is not None and self._clock() - t_start >= deadline_s

    def _learner_loop(self, t_start: float, num_updates: int | None, deadline_s: float | None,
                      on_update: Callable[[dict], Any] | None) -> None:
        """Take, learn, publish, report -- until a stop condition of :meth:`run` holds."""
        last_phase_start: float | None = None
        done = 0
        while True:
            self._raise_if_error()
            if self._stop.is_set():
                break
            if num_updates is not None and done >= num_updates:
                break
            w0 = self._clock()
            item = self._wait_for_item(t_start, deadline_s)
            now = self._clock()
            wait = now - w0
            self._learner_wait_s += wait
            if item is None:
                self._raise_if_error()
                break
            ut = None if last_phase_start is None else now - last_phase_start
            last_phase_start = now
            record = self._learner_step(item, now, wait, ut)
            done += 1
            if on_update is not None:
                with self._reporting("on_update"):
                    on_update(record)
            if self._past_deadline(t_start, deadline_s):
                break

    def _wait_for_item(self, t_start: float, deadline_s: float | None) -> Item | None:
        """The next fresh item, or None once the pipeline stops or the deadline passes."""
        while True:
            self._raise_if_error()
            if self._stop.is_set() or self._past_deadline(t_start, deadline_s):
                return None
            item = self.buffer.take_newest(self.max_age_s, POLL_S, self._stop)
            if item is not None:
                return item

    @contextlib.contextmanager
    def _reporting(self, role: str) -> Iterator[None]:
        """An exception in the body is recorded as ``role``'s (stopping the actors), re-raised."""
        try:
            yield
        except BaseException as exc:
            self._record_error(f"{role} ({threading.current_thread().name})", exc)
            raise

    def _learner_step(self, item: Item, now: float, wait: float, ut: float | None) -> dict:
        """One learning phase on ``item`` (started at ``now``): publish the new params as the
        next version and return the update's record."""
        params, version = self.latest()
        with self._reporting("learner"):
            new_params, info = self._learner_fn(params, item)
        t_done = self._clock()
        with self._params_lock:
            self._params = new_params
            self._version = version + 1
        self._updates += 1
        return self._update_record(item, version + 1, now, wait, t_done - now, ut, info)

    def _update_record(self, item: Item, version: int, now: float, wait: float,
                       update_s: float, ut: float | None, info: dict | None) -> dict:
        """The record passed to ``on_update`` (fields listed in :meth:`run`)."""
        c = self.buffer.counts()
        return {
            "version": version,
            "policy_lag": (version - 1) - item.behaviour_version,
            "behaviour_version": item.behaviour_version,
            "actor_index": item.actor_index,
            "data_age_s": now - item.created_at,
            "rollout_s": item.rollout_s,
            "queue_depth": c["still_buffered"],
            "learner_wait_s": wait,
            "update_s": update_s,
            "ut_s": ut,
            "rt_ut_ratio": (item.rollout_s / ut) if ut else None,
            "produced": c["produced"],
            "consumed": c["consumed"],
            "dropped_age": c["dropped_age"],
            "dropped_overflow": c["dropped_overflow"],
            "info": dict(info) if info is not None else {},
        }

    def _stop_after_error(self, exc: BaseException) -> None:
        """Stop and join everything; if ``exc`` is the recorded first error, note its thread."""
        self.close()
        where = None
        with self._err_lock:
            if self._error is not None and self._error[1] is exc:
                where = self._error[0]
        if where is not None:
            _add_thread_note(exc, where)


def _add_thread_note(exc: BaseException, where: str) -> None:
    """Add (once) the note naming the thread ``exc`` was raised in."""
    note = f"tclock.pipeline: raised in thread {where!r}"
    if note not in getattr(exc, "__notes__", []):
        exc.add_note(note)
