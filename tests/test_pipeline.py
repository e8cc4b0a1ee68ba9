"""Tests for tclock.pipeline (ARP): buffer bound, max age, newest-first, errors, shutdown.

Every test runs under ``hard_timeout``: the body runs in a daemon thread and the test fails if
it has not finished after N seconds, so a hang is a failure, never a stuck suite.
"""
from __future__ import annotations

import functools
import subprocess
import sys
import threading
import time

import pytest

from tclock.pipeline import AsyncPipeline, Item, RingBuffer, calibrate_max_age


def hard_timeout(seconds: float):
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            box: dict = {}

            def body():
                try:
                    fn(*args, **kwargs)
                except BaseException as exc:  # noqa: BLE001 - re-raised below
                    box["exc"] = exc

            t = threading.Thread(target=body, name=f"test-{fn.__name__}", daemon=True)
            t.start()
            t.join(seconds)
            if t.is_alive():
                pytest.fail(f"{fn.__name__} did not finish within {seconds} s (hang)")
            if "exc" in box:
                raise box["exc"]
        return wrapper
    return deco


def wait_until(pred, timeout=5.0, what="condition"):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def assert_accounting(stats):
    assert stats["produced"] == (stats["consumed"] + stats["dropped_age"]
                                 + stats["dropped_overflow"] + stats["still_buffered"]), stats


class FakeClock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def add_one(params, item):
    return params + 1, {"traj": item.trajectory}


# --------------------------------------------------------------------------- module hygiene
def test_pipeline_imports_no_jax():
    code = ("import sys, tclock.pipeline; "
            "bad = [m for m in ('jax', 'optax', 'jaxlib') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --------------------------------------------------------------------------- ring buffer
@hard_timeout(5)
def test_ring_buffer_max_age_with_fake_clock():
    clock = FakeClock()
    buf = RingBuffer(8, clock)
    for k in range(4):
        buf.push(Item(k, 0, created_at=float(k)))
    clock.t = 4.5                        # ages 4.5, 3.5, 2.5, 1.5
    item = buf.take_newest(max_age_s=2.0)
    assert item.trajectory == 3
    c = buf.counts()
    assert (c["dropped_age"], c["consumed"], c["still_buffered"]) == (3, 1, 0)
    buf.push(Item("edge", 0, created_at=10.0))
    clock.t = 12.0                       # age == max_age: still fresh
    assert buf.take_newest(max_age_s=2.0).trajectory == "edge"
    buf.push(Item("old", 0, created_at=10.0))
    clock.t = 12.5
    assert buf.take_newest(max_age_s=2.0, timeout_s=0.05) is None   # only stale -> nothing
    c = buf.counts()
    assert (c["produced"], c["consumed"], c["dropped_age"]) == (6, 2, 4)
    assert_accounting(c)


@hard_timeout(5)
def test_ring_buffer_evicts_oldest_and_takes_newest():
    buf = RingBuffer(3, FakeClock())
    evicted = [buf.push(Item(k, 0, 0.0)) for k in range(5)]
    assert evicted == [False, False, False, True, True]
    assert len(buf) == 3
    assert [buf.take_newest().trajectory for _ in range(3)] == [4, 3, 2]
    assert buf.take_newest() is None
    c = buf.counts()
    assert (c["dropped_overflow"], c["max_depth"]) == (2, 3)
    assert_accounting(c)
    with pytest.raises(ValueError, match="capacity"):
        RingBuffer(0)


def test_calibrate_max_age():
    # numpy linear quantile of 1..100 at .95: index 94.05 -> 95.05; x 1.5 = 142.575
    assert calibrate_max_age(range(1, 101)) == pytest.approx(142.575)
    assert calibrate_max_age([2.0] * 10) == pytest.approx(3.0)
    assert calibrate_max_age([1.0, 3.0], quantile=0.5, factor=2.0) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="empty"):
        calibrate_max_age([])
    with pytest.raises(ValueError, match="quantile"):
        calibrate_max_age([1.0], quantile=0)


# --------------------------------------------------------------------------- pipeline
@hard_timeout(10)
def test_max_age_dropping_deterministic_fake_clock():
    clock = FakeClock()
    release = threading.Event()
    calls = []
    pipe = AsyncPipeline(lambda p, v, i: actor(p, v, i), add_one, 0, num_actors=1,
                         capacity=8, max_age_s=5.0, clock=clock)

    def actor(params, version, index):
        k = len(calls)
        calls.append(k)
        if k < 3:
            clock.t = float(k)           # items created at t = 0, 1, 2
            return k
        if k == 3:
            assert release.wait(5)
            clock.t = 10.0               # a fresh item at t = 10
            return k
        pipe.stop_event.wait(5)          # then idle until the pipeline stops
        return k

    pipe.start()
    wait_until(lambda: pipe.stats()["produced"] == 3, what="3 items")
    clock.t = 10.0                       # the three items are now 10, 9, 8 s old > 5 s
    release.set()
    records = []
    stats = pipe.run(num_updates=1, on_update=records.append)
    assert [r["info"]["traj"] for r in records] == [3]
    assert records[0]["data_age_s"] == 0.0
    assert records[0]["dropped_age"] == 3
    assert (stats["produced"], stats["consumed"], stats["dropped_age"],
            stats["dropped_overflow"], stats["still_buffered"]) == (4, 1, 3, 0, 0)
    assert stats["abandoned"] == 1       # the 5th rollout finished after the stop
    assert stats["threads_alive"] == 0
    assert_accounting(stats)


@hard_timeout(10)
def test_newest_first_and_policy_lag():
    produced = []
    pipe = None

    def actor(params, version, index):
        if len(produced) < 5:
            produced.append(version)
            return len(produced) - 1
        pipe.stop_event.wait(5)
        return -1

    pipe = AsyncPipeline(actor, add_one, 100, capacity=8)
    pipe.start()
    wait_until(lambda: pipe.stats()["produced"] == 5, what="5 items")
    records = []
    stats = pipe.run(num_updates=3, on_update=records.append)
    assert produced == [0] * 5                                  # all from version 0
    assert [r["info"]["traj"] for r in records] == [4, 3, 2]    # newest first (LIFO)
    assert [r["version"] for r in records] == [1, 2, 3]
    assert [r["policy_lag"] for r in records] == [0, 1, 2]
    assert [r["queue_depth"] for r in records] == [4, 3, 2]
    assert [r["consumed"] for r in records] == [1, 2, 3]
    assert records[0]["ut_s"] is None and records[1]["ut_s"] >= 0
    assert pipe.latest() == (103, 3)
    assert (stats["consumed"], stats["still_buffered"], stats["updates"]) == (3, 2, 3)
    assert stats["threads_alive"] == 0
    assert_accounting(stats)


@hard_timeout(15)
def test_buffer_bound_fast_producer_slow_consumer():
    def actor(params, version, index):
        time.sleep(0.0005)
        return (index, version)

    def learner(params, item):
        time.sleep(0.02)
        return params + 1, {}

    records = []

    def on_update(rec):
        assert 0 <= rec["queue_depth"] <= 4
        records.append(rec)

    with AsyncPipeline(actor, learner, 0, num_actors=2, capacity=4) as pipe:
        stats = pipe.run(num_updates=10, on_update=on_update)
    assert len(records) == 10 and stats["consumed"] == 10
    assert stats["max_depth"] <= 4 and stats["still_buffered"] <= 4
    assert stats["dropped_overflow"] > 0
    assert stats["produced"] > 14
    assert_accounting(stats)
    assert stats["threads_alive"] == 0
    for r in records:
        assert r["policy_lag"] == r["version"] - 1 - r["behaviour_version"] >= 0
        assert r["produced"] >= r["consumed"]
    assert {r["actor_index"] for r in records} <= {0, 1}
    assert len(pipe.rollout_latencies()) > 0


@hard_timeout(10)
def test_actor_exception_stops_everything_and_is_reraised():
    calls = []

    def actor(params, version, index):
        calls.append(index)
        if index == 1 and len(calls) > 6:
            raise ValueError("boom in actor")
        time.sleep(0.001)
        return 0

    def learner(params, item):
        time.sleep(0.005)
        return params, {}

    pipe = AsyncPipeline(actor, learner, 0, num_actors=2, capacity=4)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="boom in actor") as ei:
        pipe.run()                                  # no limits: only the error ends it
    assert time.monotonic() - t0 < 3.0
    assert any("tclock-actor-1" in n for n in ei.value.__notes__)
    stats = pipe.stats()
    assert stats["threads_alive"] == 0
    assert_accounting(stats)


@hard_timeout(10)
def test_actor_exception_while_learner_waits_for_data():
    def actor(params, version, index):
        time.sleep(0.05)
        raise KeyError("no env")

    pipe = AsyncPipeline(actor, add_one, 0)
    t0 = time.monotonic()
    with pytest.raises(KeyError):
        pipe.run(num_updates=5)
    assert time.monotonic() - t0 < 3.0
    assert pipe.stats()["threads_alive"] == 0 and pipe.stats()["consumed"] == 0


@hard_timeout(10)
def test_learner_exception_stops_actors_and_is_reraised():
    def actor(params, version, index):
        time.sleep(0.001)
        return version

    def learner(params, item):
        if params == 2:
            raise RuntimeError("nan in loss")
        return params + 1, {}

    pipe = AsyncPipeline(actor, learner, 0, num_actors=2, capacity=4)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="nan in loss") as ei:
        pipe.run(num_updates=100)
    assert time.monotonic() - t0 < 3.0
    assert any("learner" in n for n in ei.value.__notes__)
    stats = pipe.stats()
    assert stats["threads_alive"] == 0 and stats["updates"] == 2 and stats["consumed"] == 3
    assert pipe.latest() == (2, 2)
    assert_accounting(stats)


@hard_timeout(10)
def test_keyboard_interrupt_joins_threads():
    def on_update(rec):
        if rec["version"] == 3:
            raise KeyboardInterrupt

    pipe = AsyncPipeline(lambda p, v, i: time.sleep(0.001), add_one, 0, num_actors=2)
    with pytest.raises(KeyboardInterrupt):
        pipe.run(on_update=on_update)
    assert pipe.stats()["threads_alive"] == 0
    assert pipe.stop_event.is_set()
    assert_accounting(pipe.stats())


@hard_timeout(10)
def test_close_from_another_thread_ends_run_cleanly():
    pipe = AsyncPipeline(lambda p, v, i: time.sleep(0.002), add_one, 0, num_actors=2,
                         capacity=3)
    threading.Timer(0.3, pipe.close).start()
    t0 = time.monotonic()
    stats = pipe.run()                               # unbounded: ends by close()
    assert 0.2 < time.monotonic() - t0 < 3.0
    assert stats["threads_alive"] == 0 and stats["updates"] > 0
    assert_accounting(stats)
    with pytest.raises(RuntimeError, match="once"):
        pipe.run(num_updates=1)


@hard_timeout(10)
def test_deadline_and_context_manager_shutdown():
    with AsyncPipeline(lambda p, v, i: time.sleep(0.002), add_one, 0) as pipe:
        t0 = time.monotonic()
        stats = pipe.run(deadline_s=0.3)
        assert 0.25 < time.monotonic() - t0 < 3.0
    assert stats["threads_alive"] == 0
    assert_accounting(stats)
    # started but never run: leaving the with-block stops and joins the actors
    with AsyncPipeline(lambda p, v, i: time.sleep(0.001), add_one, 0, num_actors=3,
                       capacity=2) as idle:
        idle.start()
        wait_until(lambda: idle.stats()["produced"] > 5, what="some items")
    s = idle.stats()
    assert s["threads_alive"] == 0 and s["consumed"] == 0 and s["still_buffered"] <= 2
    assert_accounting(s)


@hard_timeout(10)
def test_stuck_actor_does_not_hang_close():
    def actor(params, version, index):
        time.sleep(0.6)                              # ignores the stop event
        return 0

    pipe = AsyncPipeline(actor, add_one, 0, join_timeout_s=0.1)
    pipe.start()
    t0 = time.monotonic()
    pipe.close()
    assert time.monotonic() - t0 < 0.5
    assert pipe.stats()["threads_alive"] == 1        # reported, not hidden
    wait_until(lambda: pipe.stats()["threads_alive"] == 0, what="actor exit")
    assert pipe.stats()["produced"] == 0 and pipe.stats()["abandoned"] == 1


def test_pipeline_validation():
    with pytest.raises(ValueError, match="max_age_s"):
        AsyncPipeline(lambda *a: 0, add_one, 0, max_age_s=-1.0)
    with pytest.raises(ValueError, match="num_actors"):
        AsyncPipeline(lambda *a: 0, add_one, 0, num_actors=0)
    with pytest.raises(ValueError, match="capacity"):
        AsyncPipeline(lambda *a: 0, add_one, 0, capacity=0)
