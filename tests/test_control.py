"""Tests for tclock.control: batch ladder, DRBS, PURM rhythm and gate, learning-rate clocks.

Expected values are computed by hand in the comments, not by re-running the code under test.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tclock.control import (
    DRBSController,
    LRClock,
    RhythmGate,
    UpdateRhythm,
    WallClock,
    batch_ladder,
    lr_clock_value,
    make_schedule,
)


# --------------------------------------------------------------------------- module hygiene
def test_control_imports_no_jax():
    code = ("import sys, tclock.control; "
            "bad = [m for m in ('jax', 'optax', 'jaxlib') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --------------------------------------------------------------------------- ladder
@pytest.mark.parametrize("lo,hi,mult,step", [
    (64, 1024, 1, 0.25), (60, 1000, 8, 0.25), (1, 10, 1, 0.25), (64, 4096, 64, 0.5),
    (3, 3000, 6, 0.1), (100, 100, 4, 0.25), (17, 90, 16, 1.0),
])
def test_ladder_properties(lo, hi, mult, step):
    lad = batch_ladder(lo, hi, mult, step)
    assert list(lad) == sorted(set(lad))
    assert all(s % mult == 0 and s > 0 for s in lad)
    assert lad[0] == -(-lo // mult) * mult          # min rounded up
    assert lad[-1] == (hi // mult) * mult            # max rounded down
    assert all(lo <= s <= hi for s in lad)
    # geometric spacing: no gap much wider than one step (plus rounding / endpoint merge)
    f = 1 + step
    for a, b in zip(lad, lad[1:]):
        assert b / a <= f ** 1.5 + mult / a + 1e-9, (a, b)


def test_ladder_hand_values():
    # x2 anchored at 256: the write-up's ladder
    assert batch_ladder(64, 1024, 1, 1.0, anchor=256) == (64, 128, 256, 512, 1024)
    # +25% anchored at 256: up 320, 400, 500, 625, 781.25->781, 976.6->977 (1024/977 < sqrt(1.25):
    # merged into 1024); down 204.8->205, 163.84->164, 131.07->131, 104.86->105, 83.89->84,
    # 67.1->67 (67/64 < sqrt(1.25): merged into 64)
    assert batch_ladder(64, 1024, 1, 0.25, anchor=256) == (
        64, 84, 105, 131, 164, 205, 256, 320, 400, 500, 625, 781, 1024)
    # multiples of 8, x1.5 from 64: 96, 144, 216, 324->328 (40.5 rounds up to 41), 486->488
    # (512/488 < sqrt(1.5): merged into 512)
    assert batch_ladder(64, 512, 8, 0.5) == (64, 96, 144, 216, 328, 512)
    # min/max not multiples: rounded inwards
    assert batch_ladder(60, 130, 16, 1.0) == (64, 128)
    assert batch_ladder(64, 64, 1) == (64,)


def test_ladder_errors_name_field_and_fix():
    with pytest.raises(ValueError, match=r"min_size=100 is larger than max_size=50"):
        batch_ladder(100, 50)
    with pytest.raises(ValueError, match=r"multiple=64.*lower min_size to 64 or raise max_size "
                                         r"to at least 128"):
        batch_ladder(65, 127, 64)
    with pytest.raises(ValueError, match=r"raise max_size to at least 64"):
        batch_ladder(1, 10, 64)
    with pytest.raises(ValueError, match=r"step="):
        batch_ladder(1, 10, 1, 0.0)
    with pytest.raises(ValueError, match=r"multiple="):
        batch_ladder(1, 10, 0)
    with pytest.raises(ValueError, match=r"min_size="):
        batch_ladder(0, 10)
    with pytest.raises(ValueError, match=r"anchor="):
        batch_ladder(64, 1024, 8, 0.25, anchor=100)


# --------------------------------------------------------------------------- DRBS
def test_drbs_default_ladder_and_scripted_step_025():
    c = DRBSController(window=3)  # base 256, [64, 1024], +-25%, reset_on_change
    assert c.ladder == (64, 84, 105, 131, 164, 205, 256, 320, 400, 500, 625, 781, 1024)
    script = [
        (0.8, 205),   # mean .8 > .75: nearest to 256/1.25 = 204.8 -> 205; history cleared
        (0.5, 205),   # mean .5: hold
        (0.9, 205),   # mean (.5+.9)/2 = .7: hold
        (1.0, 164),   # mean (.5+.9+1)/3 = .8: 205/1.25 = 164 -> 164; cleared
        (0.1, 205),   # mean .1 < .35: 164*1.25 = 205 -> 205; cleared
        (None, 205),  # ignored
        (float("nan"), 205),
        (0.34, 256),  # 205*1.25 = 256.25 -> 256
    ]
    for ratio, want in script:
        assert c.update(ratio) == want, ratio
        assert c.batch_size == want
    assert [d.size for d in c.history] == [205, 164, 205, 256]
    assert c.history[1].ratio_mean == pytest.approx(0.8)
    assert c.history[0] == (0.8, 205)


def test_drbs_step_1_is_writeup_x2_and_respects_bounds():
    c = DRBSController(base=256, min=64, max=1024, step=1.0, window=1)
    assert c.ladder == (64, 128, 256, 512, 1024)
    ups = [c.update(0.1) for _ in range(4)]
    assert ups == [512, 1024, 1024, 1024]            # clamped at max
    downs = [c.update(0.9) for _ in range(6)]
    assert downs == [512, 256, 128, 64, 64, 64]      # clamped at min
    assert [d.size for d in c.history] == [512, 1024, 512, 256, 128, 64]


def test_drbs_ratios_held_at_a_bound_still_count():
    # window=20: .1 -> 512, .1 -> 1024 (both clear the history); two more .1 are held at the
    # max (they describe 1024).  Then k ratios of .9 give mean (0.2 + 0.9k) / (2 + k) (all
    # 2 + k <= 20 values are in the window): k=8: 7.4/10 = .74 -> hold; k=9: 8.3/11 = .7545
    # > .75 -> the 9th .9 shrinks 1024 -> 512.
    c = DRBSController(base=256, step=1.0, window=20)
    assert [c.update(0.1) for _ in range(4)] == [512, 1024, 1024, 1024]
    sizes = [c.update(0.9) for _ in range(9)]
    assert sizes == [1024] * 8 + [512]
    assert c.history[-1].ratio_mean == pytest.approx(8.3 / 11)


def test_drbs_window_averages_only_last_values():
    # window=2: last two are (.5, 1.1) -> mean .8 > .75 -> shrink 256 -> 128
    c2 = DRBSController(step=1.0, window=2, reset_on_change=False)
    assert [c2.update(r) for r in (0.5, 0.5, 0.5, 1.1)] == [256, 256, 256, 128]
    # window=4: (.5+.5+.5+1.1)/4 = .65 -> hold
    c4 = DRBSController(step=1.0, window=4, reset_on_change=False)
    assert [c4.update(r) for r in (0.5, 0.5, 0.5, 1.1)] == [256, 256, 256, 256]
    assert len(c2.ratios) == 2 and len(c4.ratios) == 4


def test_drbs_reset_on_change():
    seq = (1.0, 0.6, 0.6)
    # no reset: 1.0 -> 512->256; mean(1.0, .6)=.8 -> 128; mean(1,.6,.6)=.733 -> hold
    keep = DRBSController(base=512, step=1.0, window=4, reset_on_change=False)
    assert [keep.update(r) for r in seq] == [256, 128, 128]
    # reset: 1.0 -> 256, history cleared; then mean .6 -> hold
    reset = DRBSController(base=512, step=1.0, window=4, reset_on_change=True)
    assert [reset.update(r) for r in seq] == [256, 256, 256]
    assert reset.ratios == (0.6, 0.6)


def test_drbs_min_samples_and_explicit_ladder():
    c = DRBSController(base=200, min=100, max=400, ladder=[100, 200, 300, 400], step=0.5,
                       window=3, min_samples=3)
    assert [c.update(0.9) for _ in range(3)] == [200, 200, 100]  # 200/1.5=133 -> 100
    assert [c.update(0.1) for _ in range(3)] == [100, 100, 200]  # 100*1.5=150 -> 200 (tie
    # 100 vs 200 is impossible: only sizes above 100 are candidates; 200 nearest to 150)


def test_drbs_coarse_ladder_still_moves():
    # 256/1.25 = 204.8 is nearer to 256 itself than to 128, but a shrink must move
    c = DRBSController(base=256, ladder=[64, 128, 256, 512, 1024], step=0.25)
    assert c.update(0.9) == 128


def test_drbs_validation_messages():
    with pytest.raises(ValueError, match=r"min=512 is larger than max=128"):
        DRBSController(base=256, min=512, max=128)
    with pytest.raises(ValueError, match=r"base=2000 is outside"):
        DRBSController(base=2000)
    with pytest.raises(ValueError, match=r"base=100 is not a multiple of multiple=64; use 128"):
        DRBSController(base=100, multiple=64)
    with pytest.raises(ValueError, match=r"low < high"):
        DRBSController(low=0.8, high=0.7)
    with pytest.raises(ValueError, match=r"window="):
        DRBSController(window=0)
    with pytest.raises(ValueError, match=r"step="):
        DRBSController(step=-0.25)
    with pytest.raises(ValueError, match=r"sorted"):
        DRBSController(ladder=[256, 128])
    with pytest.raises(ValueError, match=r"not on the ladder"):
        DRBSController(ladder=[128, 512])
    with pytest.raises(ValueError, match=r"\[2000\].*inside \[min=64, max=1024\]"):
        DRBSController(ladder=[256, 2000])
    with pytest.raises(ValueError, match=r"min_samples="):
        DRBSController(window=5, min_samples=6)


def test_drbs_state_round_trip_continues_identically():
    ratios = [0.8, 0.2, 0.5, 0.9, 0.95, 0.1, 0.6, 0.76, 0.3, 0.3, 0.8, 0.9]
    a = DRBSController(window=4, reset_on_change=False)
    for r in ratios[:6]:
        a.update(r)
    state = json.loads(json.dumps(a.state_dict()))   # survives a JSON checkpoint
    b = DRBSController(window=4, reset_on_change=False)
    b.load_state_dict(state)
    assert b.batch_size == a.batch_size and b.ratios == a.ratios and b.history == a.history
    assert [a.update(r) for r in ratios[6:]] == [b.update(r) for r in ratios[6:]]
    assert a.history == b.history
    other = DRBSController(step=1.0)
    bad = dict(state, batch_size=205)
    with pytest.raises(ValueError, match=r"not on this controller's ladder"):
        other.load_state_dict(bad)
    with pytest.raises(ValueError, match=r"malformed"):
        other.load_state_dict({})


# --------------------------------------------------------------------------- PURM rhythm
def test_rhythm_values_by_hand():
    r = UpdateRhythm(t_base=3.0, alpha=0.2, t_cycle=60.0)
    assert r.target_updates(0.0) == 0.0
    assert r.target_updates(2.9) == 0.0                       # floor(2.9/3) = 0
    assert r.target_updates(15.0) == pytest.approx(6.0)       # 5 * (1 + .2 sin(pi/2))
    assert r.allowed_updates(15.0) == 6
    assert r.target_updates(45.0) == pytest.approx(12.0)      # 15 * (1 + .2 sin(3pi/2))
    # t=10: floor(10/3)=3; 3 * (1 + .2 * sin(pi/3)) = 3 * 1.173205 = 3.519615
    assert r.target_updates(10.0) == pytest.approx(3.5196152, rel=1e-7)
    assert r.allowed_updates(10.0) == 3                       # the product is floored
    # t=40: floor(13.33)=13; 13 * (1 + .2 sin(4pi/3)) = 13 * 0.8267949 = 10.748334
    assert r.target_updates(40.0) == pytest.approx(10.748334, rel=1e-6)
    assert r.should_update(40.0, 9) and not r.should_update(40.0, 10)
    # alpha = 0 is the write-up's loop: step < int(elapsed / 3)
    flat = UpdateRhythm(3.0, 0.0, 60.0)
    assert [flat.allowed_updates(t) for t in (0, 2.99, 3.0, 8.9, 9.0)] == [0, 0, 1, 2, 3]
    # exact multiples survive float error: 0.3 / 0.1 = 2.9999999999999996
    assert UpdateRhythm(0.1, 0.0, 60.0).allowed_updates(0.3) == 3


def test_rhythm_validation():
    for kw, field in (({"t_base": 0}, "t_base"), ({"alpha": 1.5}, "alpha"),
                      ({"t_cycle": -1}, "t_cycle")):
        with pytest.raises(ValueError, match=field):
            UpdateRhythm(**kw)


class FakeClock:
    """Time only moves when sleep() (or the test) advances it; 0.25 steps are exact floats."""

    def __init__(self, t0: float = 100.0):
        self.t = t0
        self.sleeps = 0

    def __call__(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.sleeps += 1
        self.t += dt


def _drive(gate, clock, deadline, update_cost=0.0):
    """Run a PURM loop; returns the elapsed times at which updates were granted."""
    gate.start()
    granted = []
    done = 0
    while gate.wait_for_slot(done, deadline_s=deadline):
        t = gate.elapsed()
        assert done < gate.rhythm.allowed_updates(t)  # only when the rhythm owes one
        granted.append(t)
        done += 1
        clock.t += update_cost
    assert gate.elapsed() >= deadline
    return granted


def test_gate_flat_rhythm_grants_on_schedule():
    clock = FakeClock()
    gate = RhythmGate(UpdateRhythm(3.0, 0.0, 60.0), clock=clock, sleep=clock.sleep, poll_s=0.25)
    assert isinstance(clock, WallClock)
    assert _drive(gate, clock, deadline=10.0) == [3.0, 6.0, 9.0]
    assert gate.elapsed() == 10.0       # returned False exactly at the deadline
    assert clock.sleeps == 40           # 10 s / 0.25 s, no real sleeping
    assert gate.waited_s == pytest.approx(10.0)


def test_gate_with_update_cost():
    clock = FakeClock()
    gate = RhythmGate(UpdateRhythm(3.0, 0.0, 60.0), clock=clock, sleep=clock.sleep, poll_s=0.25)
    # each update takes 2 s: granted at 3, 6, 9, 12, 15, 18 (ready again at 5, 8, ... < next slot)
    assert _drive(gate, clock, deadline=20.0, update_cost=2.0) == [3, 6, 9, 12, 15, 18]


@pytest.mark.parametrize("deadline,expected", [
    (15.0, 4),    # max floor R on [0, 15): [12, 15) gives 4 * (1 + .2 sin) <= 4.8 -> 4
    (15.25, 6),   # R(15) = 6.0 exactly
    (30.25, 10),  # R(30) = 10; R on (15, 30) stays below 10 (e.g. [27,30): 9 * 1.0618 -> 9)
    (45.25, 12),  # [42,45): 14 * (1 + .2 sin(1.4 pi)) = 11.34 -> 11; R(45) = 12
])
def test_gate_sine_rhythm_counts_match_R(deadline, expected):
    clock = FakeClock()
    gate = RhythmGate(UpdateRhythm(3.0, 0.2, 60.0), clock=clock, sleep=clock.sleep, poll_s=0.25)
    granted = _drive(gate, clock, deadline)
    assert len(granted) == expected
    assert granted[-1] < deadline


def test_gate_requires_start_and_validates():
    gate = RhythmGate(UpdateRhythm(), clock=lambda: 0.0, sleep=lambda s: None)
    with pytest.raises(RuntimeError, match="start"):
        gate.wait_for_slot(0, 1.0)
    with pytest.raises(ValueError, match="poll_s"):
        RhythmGate(UpdateRhythm(), poll_s=0)


def test_gate_deadline_before_first_slot_returns_false():
    clock = FakeClock()
    gate = RhythmGate(UpdateRhythm(3.0, 0.0, 60.0), clock=clock, sleep=clock.sleep, poll_s=0.25)
    gate.start()
    assert gate.wait_for_slot(0, deadline_s=2.0) is False
    assert gate.elapsed() == 2.0


# --------------------------------------------------------------------------- LR clocks
def test_lr_clock_value_modes():
    assert lr_clock_value("steps", 7, 123.0) == 7.0
    assert lr_clock_value("wall", 7, 12.5) == 12.5
    # hybrid: 100 steps or 50 s. At step 10, 25 s: wall fraction .5 > step fraction .1 -> 50
    assert lr_clock_value("hybrid", 10, 25.0, total_steps=100, total_seconds=50) == 50.0
    # at step 80, 10 s: step fraction .8 > .2 -> 80
    assert lr_clock_value("hybrid", 80, 10.0, total_steps=100, total_seconds=50) == 80.0
    # with only a rate hint: max(10, 3 s * 5 steps/s) = 15
    assert lr_clock_value("hybrid", 10, 3.0, steps_per_second_hint=5.0) == 15.0
    with pytest.raises(ValueError, match="total_steps and total_seconds"):
        lr_clock_value("hybrid", 1, 1.0)
    with pytest.raises(ValueError, match="mode="):
        lr_clock_value("epochs", 1, 1.0)
    with pytest.raises(ValueError, match="elapsed_s="):
        lr_clock_value("wall", 1, -1.0)


def test_make_schedule_values_by_hand():
    const = make_schedule("constant", 0.5, horizon=100, warmup=10)
    assert float(const(5)) == pytest.approx(0.25)        # half-way up the warmup
    assert float(const(10)) == pytest.approx(0.5)
    assert float(const(1e6)) == pytest.approx(0.5)
    lin = make_schedule("linear", 1e-3, horizon=100)
    assert float(lin(0)) == pytest.approx(1e-3)
    assert float(lin(25)) == pytest.approx(7.5e-4)
    assert float(lin(100)) == pytest.approx(0.0, abs=1e-12)
    assert float(lin(150)) == pytest.approx(0.0, abs=1e-12)
    # wall-clock horizon in seconds, float time
    wall = make_schedule("linear", 1.0, horizon=60.0)
    assert float(wall(15.5)) == pytest.approx(1 - 15.5 / 60, rel=1e-6)
    cos = make_schedule("cosine", 1.0, horizon=110, warmup=10)
    assert float(cos(0)) == pytest.approx(0.0, abs=1e-12)
    assert float(cos(10)) == pytest.approx(1.0)
    assert float(cos(35)) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)), rel=1e-6)
    assert float(cos(60)) == pytest.approx(0.5, rel=1e-6)
    assert float(cos(110)) == pytest.approx(0.0, abs=1e-7)
    floor = make_schedule("cosine", 1.0, horizon=100, end_value=0.1)
    assert float(floor(50)) == pytest.approx(0.55, rel=1e-6)   # .1 + .9 * .5
    assert float(floor(500)) == pytest.approx(0.1, rel=1e-6)
    with pytest.raises(ValueError, match="warmup=100"):
        make_schedule("cosine", 1.0, horizon=100, warmup=100)
    with pytest.raises(ValueError, match="kind="):
        make_schedule("step", 1.0, horizon=100)
    with pytest.raises(ValueError, match="horizon="):
        make_schedule("linear", 1.0, horizon=0)


def test_lr_clock_bundle_returns_plain_floats():
    wall = LRClock("wall", "linear", 1.0, total_seconds=100.0)
    v = wall.lr(step=999, elapsed_s=25.0)                  # the step count is irrelevant
    assert type(v) is float and v == pytest.approx(0.75)
    hyb = LRClock("hybrid", "cosine", 1.0, total_steps=100, total_seconds=50.0)
    assert hyb.lr(step=10, elapsed_s=25.0) == pytest.approx(0.5, rel=1e-6)  # t = 50 steps
    steps = LRClock("steps", "linear", 2.0, total_steps=10)
    assert steps.lr(step=5, elapsed_s=1e6) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="needs total_seconds"):
        LRClock("wall", "linear", 1.0, total_steps=10)
    with pytest.raises(ValueError, match="total_steps and total_seconds"):
        LRClock("hybrid", "linear", 1.0, total_steps=10)


# --------------------------------------------------------------------------- DRBS by the critical batch
def _record(b_crit=None, num_envs=64, rt=0.01, learn=0.02):
    """One iteration's record; ``b_crit``: its per-env noise estimate (trace / signal), per seed
    0.9, 1 and 1.1 times it (seed median: ``b_crit``); None: an iteration without one."""
    est = {} if b_crit is None else {"update_noise_trace": [b_crit * 0.9, b_crit, b_crit * 1.1],
                                     "update_signal_sq": [1.0, 1.0, 1.0]}
    return {**est, "num_envs": num_envs, "rt_s": rt, "learn_s": learn}


def test_critical_drbs_steps_towards_the_estimate_with_hysteresis():
    from tclock.control import CriticalBatchController

    c = CriticalBatchController(base=256, min=32, max=1024, step=1.0, band=1.5, min_estimates=2, window=2,
                                timing_probe=False)
    assert c.ladder == (32, 64, 128, 256, 512, 1024)
    script = [None, 50, 50, 50, 50, 50, 50, 50, 50]  # None: a plain iteration (no estimate)
    sizes = [c.observe(_record(b, num_envs=c.batch_size, rt=0.0, learn=0.0)) for b in script]
    # two estimates, then straight to the rung nearest 50 on a log scale (64: |log 64/50| < |log 32/50|);
    # 64 is within 1.5x of 50 and it holds
    assert sizes == [256, 256, 64, 64, 64, 64, 64, 64, 64]
    assert [m.size for m in c.history] == [64] and all(m.source == "b_crit" for m in c.history)
    for b in (100, 100, 100, 100):  # the estimate rises (window 2): 64 * 1.5 < 100 -> grow to 128, then hold
        c.observe(_record(b, num_envs=c.batch_size, rt=0.0, learn=0.0))
    assert c.batch_size == 128 and [m.size for m in c.history] == [64, 128]
    for b in (1e4,) * 2:  # far above the ladder: one move, to the top
        c.observe(_record(b, num_envs=c.batch_size, rt=0.0, learn=0.0))
    assert c.batch_size == 1024 and [m.size for m in c.history] == [64, 128, 1024]
    for b in (20, 20):  # a large start far above the target comes down in one move, not one rung at a time
        c.observe(_record(b, num_envs=c.batch_size, rt=0.0, learn=0.0))
    assert c.batch_size == 32 and len(c.history) == 4
    for b in (40, 40, 40):  # 32 is within 1.5x of 40 (hysteresis): no move
        c.observe(_record(b, num_envs=c.batch_size, rt=0.0, learn=0.0))
    assert c.batch_size == 32 and len(c.history) == 4
    c.observe(_record(None))
    assert c.batch_size == 32  # no estimate, no move


def test_critical_drbs_asks_for_estimates_until_it_may_decide_at_a_size():
    """The probe: after the start and after every move the controller wants an estimate on every
    iteration until ``min_estimates`` are in at that size; then it leaves the cadence to gdc_every."""
    from tclock.control import CriticalBatchController, DRBSController

    c = CriticalBatchController(base=1024, min=32, max=1024, step=1.0, band=1.5, min_estimates=2, window=1,
                                timing_probe=False)
    wants = [c.wants_estimate]
    for b in (None, 1000, None, 1000, 60, 60, 60):  # hold at 1024 (within 1.5x of 1000), then move
        c.observe(_record(b, num_envs=c.batch_size, rt=0.0, learn=0.0))
        wants.append(c.wants_estimate)
    assert [m.size for m in c.history] == [64]
    # start: wants until 2 estimates are in (a plain iteration changes nothing); after the hold it no
    # longer asks; the move to 64 (at the first 60) makes it ask again until 2 are in at 64
    assert wants == [True, True, True, True, False, True, True, False]
    assert not DRBSController(base=64, min=32, max=128).wants_estimate  # RT/UT reads no estimate


def test_critical_drbs_judges_a_size_only_on_the_estimates_made_at_it():
    """After a move the estimates of the old size no longer count: the run's own windowed
    b_crit_online_envs spans sizes, and the estimate grows with the batch early in a run."""
    from tclock.control import CriticalBatchController

    c = CriticalBatchController(base=1024, min=32, max=1024, step=1.0, band=1.5, min_estimates=2, window=20,
                                    timing_probe=False)
    for b in (300, 300):
        c.observe(_record(b, num_envs=1024, rt=0.0, learn=0.0))
    assert c.batch_size == 256  # nearest 300 below 1024
    for b in (60, 60):  # at 256: (300, 300, 60, 60) would average 180 and hold; its own two say 60
        c.observe(_record(b, num_envs=256, rt=0.0, learn=0.0))
    assert c.batch_size == 64 and [m.size for m in c.history] == [256, 64]
    assert c.target()[0] == pytest.approx(60)
    again = CriticalBatchController(base=1024, min=32, max=1024, step=1.0, band=1.5, min_estimates=2, window=20,
                                    timing_probe=False)
    again.load_state_dict(c.state_dict())
    again.observe(_record(200, num_envs=64, rt=0.0, learn=0.0))
    c.observe(_record(200, num_envs=64, rt=0.0, learn=0.0))
    assert again.target() == c.target() and again.batch_size == c.batch_size


def test_the_noise_scale_the_lr_follows_comes_from_the_current_size_only():
    """``lr_scaling noise`` in a DRBS run reads :attr:`noise_scale`: after the timing probe the
    start size's (larger) estimate must not set the lr at the smallest size, and after any move
    there is none until the new size has its own."""
    from tclock.control import CriticalBatchController
    from tclock.control.drbs import DRBSController

    c = CriticalBatchController(base=1024, min=32, max=1024, step=1.0, band=1.5, min_estimates=2, window=20)
    assert c.noise_scale is None
    c.observe(_record(700, num_envs=1024, rt=0.01, learn=0.5))  # timed -> the probe moves to 32
    assert c.batch_size == 32 and c.noise_scale is None
    c.observe(_record(40, num_envs=32, rt=0.01, learn=0.02))
    assert c.noise_scale == pytest.approx(40)  # not a mix with the 700 read at 1024
    c.observe(_record(60, num_envs=32, rt=0.01, learn=0.02))
    assert c.noise_scale == pytest.approx(50)  # Σ trace / Σ signal over the estimates at 32
    moved = CriticalBatchController(base=64, min=32, max=1024, step=1.0, band=1.5, min_estimates=1,
                                    timing_probe=False)
    moved.observe(_record(500, num_envs=64, rt=0.0, learn=0.0))
    assert moved.batch_size == 512 and moved.noise_scale is None and moved.target()[0] == pytest.approx(500)
    assert DRBSController(base=64, min=32, max=1024).noise_scale is None  # the RT/UT mode reads no estimate


def test_critical_drbs_uses_the_wall_clock_optimum_once_two_sizes_are_timed():
    from tclock.control import CriticalBatchController

    c = CriticalBatchController(base=64, min=32, max=1024, step=1.0, band=1.5, min_estimates=1,
                                timing_probe=False)
    a, k = 0.05, 1e-4  # t(B) = a + k B: B* = sqrt(b a / k) = sqrt(100 * 500) ≈ 224
    c.observe(_record(100, num_envs=64, rt=0.0, learn=a + k * 64))  # 64 < 100/1.5 -> up to 128
    assert c.batch_size == 128 and c.history[-1].source == "b_crit"
    c.observe(_record(100, num_envs=128, rt=0.0, learn=a + k * 128))  # now timed at 2 sizes: target B*
    target, source = c.target()
    assert source == "b_star" and target == pytest.approx((100 * a / k) ** 0.5, rel=1e-6)
    assert c.batch_size == 256 and c.history[-1].source == "b_star"  # 128 * 1.5 < 224: to 256, nearest 224
    c.observe(_record(100, num_envs=256, rt=0.0, learn=a + k * 256))
    assert c.batch_size == 256  # 256 is within 1.5x of 224: hold
    state = c.state_dict()
    again = CriticalBatchController(base=64, min=32, max=1024, step=1.0, band=1.5, min_estimates=1,
                                timing_probe=False)
    again.load_state_dict(state)
    assert again.target() == c.target() and again.batch_size == 256 and again.history == c.history


def test_critical_drbs_times_the_smallest_size_first_from_a_larger_start():
    """The timing probe: after the first timed iteration at a start above the ladder's bottom the
    controller moves there, makes its first estimates there, and then steers to B* from the two
    timings: down where t(B) is mostly per-env cost (a CPU), back up where it is mostly fixed
    cost (an accelerator).  Without the probe the same estimate holds the start size."""
    from tclock.control import CriticalBatchController

    def run(a, k, probe=True, b=1000.0):
        c = CriticalBatchController(base=1024, min=32, max=1024, step=1.0, band=1.5, min_estimates=2,
                                    timing_probe=probe)
        sizes = []
        for _ in range(4):
            n = c.batch_size
            sizes.append(c.observe(_record(b if n == 1024 else 60.0, num_envs=n, rt=0.0, learn=a + k * n)))
        return c, sizes

    cpu, sizes = run(a=0.02, k=1e-3)  # B* = sqrt(60 * 20) ≈ 35: 32 is within 1.5x, it stays
    assert sizes == [32, 32, 32, 32]
    assert cpu.history[0] == (32.0, "timing_probe", 32) and len(cpu.history) == 1
    assert cpu.target()[1] == "b_star" and cpu.target()[0] == pytest.approx((60 * 20) ** 0.5, rel=1e-6)
    accelerator, sizes = run(a=0.02, k=1e-6)  # B* = sqrt(60 * 20000) ≈ 1095: back to 1024
    assert sizes == [32, 32, 1024, 1024] and accelerator.history[-1].source == "b_star"
    _, sizes = run(a=0.02, k=1e-3, probe=False)  # the estimate near the initial policy holds the start
    assert sizes == [1024, 1024, 1024, 1024]
    # an iteration without timings does not trigger it; a start at the bottom has nothing to probe
    c = CriticalBatchController(base=1024, min=32, max=1024, step=1.0, min_estimates=2)
    assert c.observe({"num_envs": 1024}) == 1024 and not c.history
    bottom = CriticalBatchController(base=32, min=32, max=1024, step=1.0, min_estimates=2)
    assert bottom.observe(_record(None, num_envs=32)) == 32 and not bottom.history
    # resume: a pending probe survives the state round trip, a done one does not come back
    again = CriticalBatchController(base=1024, min=32, max=1024, step=1.0, min_estimates=2)
    again.load_state_dict(c.state_dict())
    assert again.observe(_record(1000, num_envs=1024)) == 32
    later = CriticalBatchController(base=1024, min=32, max=1024, step=1.0, min_estimates=2)
    later.load_state_dict(cpu.state_dict())
    assert later.observe(_record(None, num_envs=32)) == 32 and later.history == cpu.history


def test_critical_drbs_times_measured_iterations_and_leaves_out_each_sizes_first():
    """``t(B)`` for B* comes from the iterations that measured an estimate (every size gets them:
    the controller asks for them after each move), not the cheaper plain ones between, and leaves
    out the first at each size (both programs' first call).  With the old rule (median of every
    timed iteration) the same script reads B* ≈ 83 and stops at 64 instead of 32."""
    from tclock.control import CriticalBatchController

    a, k = 0.01, 6e-4  # t(B) = a + k B: B* = sqrt(60 a / k) ≈ 31.6
    c = CriticalBatchController(base=32, min=32, max=1024, step=1.0, band=1.5, min_estimates=2, window=20,
                                timing_probe=False)
    c.observe(_record(200, num_envs=32, rt=0.0, learn=0.1))  # the first call: 0.1 s of warm-up
    c.observe(_record(200, num_envs=32, rt=0.0, learn=a + k * 32))
    assert c.batch_size == 256 and c.history[-1].source == "b_crit"  # one size timed: towards b_crit 200
    assert c.iteration_time(32) == pytest.approx(a + k * 32)  # the warm-up left out
    c.observe(_record(60, num_envs=256, rt=0.0, learn=0.5))  # the first call at 256
    c.observe(_record(None, num_envs=256, rt=0.0, learn=0.001))  # a plain iteration: not timed
    assert c.iteration_time(256) == pytest.approx(0.5)  # only one so far: it is all there is
    c.observe(_record(60, num_envs=256, rt=0.0, learn=a + k * 256))
    assert c.iteration_time(256) == pytest.approx(a + k * 256)
    fit_a, fit_k = c.time_fit()
    assert fit_a == pytest.approx(a) and fit_k == pytest.approx(k)
    assert c.history[-1].source == "b_star" and c.history[-1].target == pytest.approx((60 * a / k) ** 0.5)
    assert c.batch_size == 32
    assert c.iteration_time(64) is None


def test_critical_drbs_steers_to_an_end_of_the_ladder_when_the_time_fit_has_no_optimum():
    """A fit with a <= 0 (time grows faster than B) means B* -> 0: the smallest size, not a fall
    back to the noise scale, which sent a real run up the ladder; k <= 0 weighs no per-env cost
    and steers by the noise scale."""
    from tclock.control import CriticalBatchController

    def controller(times: dict):
        c = CriticalBatchController(base=128, min=32, max=1024, step=1.0, band=1.5, min_estimates=1,
                                    timing_probe=False)
        c.load_state_dict({**c.state_dict(), "times": {str(b): [t] for b, t in times.items()}})
        return c

    superlinear = controller({32: 0.02, 64: 0.05, 128: 0.13})  # intercept < 0
    a, k = superlinear.time_fit()
    assert a < 0 < k
    superlinear.observe(_record(400, num_envs=128, rt=0.0, learn=0.13))  # b = 400 alone would grow B
    assert superlinear.target() == (32.0, "b_star") and superlinear.batch_size == 32
    flat = controller({32: 0.05, 64: 0.05, 128: 0.049})  # k < 0: no per-env cost to weigh
    flat.observe(_record(40, num_envs=128, rt=0.0, learn=0.049))
    assert flat.target() == (pytest.approx(40.0), "b_crit") and flat.batch_size == 32


def test_critical_drbs_validation():
    from tclock.control import CriticalBatchController

    for kw, match in (({"band": 0.9}, "band="), ({"min_estimates": 0}, "min_estimates="), ({"window": 0}, "window="),
                      ({"base": 48, "multiple": 32}, "multiple")):
        with pytest.raises(ValueError, match=match):
            CriticalBatchController(**{"base": 64, "min": 32, "max": 256, **kw})
    c = CriticalBatchController(base=64, min=32, max=256)
    with pytest.raises(ValueError, match="not on this controller's ladder"):
        c.load_state_dict({"batch_size": 99})


def test_lr_multiplier_rules():
    from tclock.control import lr_multiplier

    assert lr_multiplier("none", 64, 256) == 1.0
    assert lr_multiplier("sqrt", 64, 256) == pytest.approx(0.5)
    assert lr_multiplier("linear", 1024, 256) == pytest.approx(4.0)
    # McCandlish's eps_opt(B) = eps_max / (1 + b/B), relative to the base size
    b = 100.0
    assert lr_multiplier("noise", 64, 256, b) == pytest.approx((64 / 164) / (256 / 356))
    assert lr_multiplier("noise", 10**7, 256, b) == pytest.approx(356 / 256, rel=1e-4)  # B >> b: eps_max
    assert lr_multiplier("noise", 64, 256, None) == 1.0  # before the first estimate
    with pytest.raises(ValueError, match="lr_scaling="):
        lr_multiplier("cubic", 64, 256)
