"""Every threshold and window that a verdict, a report or a figure uses, in one place.

The values come from section 3 of the user's write-up (stated in ``docs/design.md``) unless a
comment says otherwise.  The doctor (``tclock.doctor_rules``), the sweep analysis, the plots
and the profile import them from here; no other module spells one of these numbers.

Units: ratios are plain numbers; windows and streaks count **iterations** (one rollout plus
one learning phase); activation rates are shares of transitions.
"""
from __future__ import annotations

# -- the windowed RT/UT ratio ------------------------------------------------------------------
RATIO_WINDOW = 50  # iterations in ``rt_ut_ratio_w50`` (the loop, the doctor and the plots)
RT_LOW, RT_HIGH, RT_STALL = 0.3, 0.7, 1.0  # < LOW cheap rollout, LOW..HIGH healthy, > HIGH risk, > STALL stalled
RT_UT_BANDS = (RT_LOW, RT_HIGH, RT_STALL)
RT_UT_CROSSINGS = (RT_HIGH, RT_STALL)  # levels whose crossing batch size the profile reports
PLATEAU_LEVEL = 0.8  # the write-up's "sustained plateau > 0.8"
SUSTAIN = 20  # consecutive iterations that make a stall or a plateau "sustained"
SLOPE_FALL = 0.5  # the return slope "falls" when it drops below this share of the slope before
PRE_MIN_ITERS = 10  # iterations before a plateau needed to compare slopes
SLOPE_MIN_POINTS = 5  # points with a return needed for a slope

# -- activation rate (share of transitions with reward > 0) -------------------------------------
ACT_ZERO = 1e-6  # below this the reward signal is "dead"
ACT_WARMUP = 3  # first iterations ignored
ACT_DEAD_STREAK = 10  # dead rollouts in a row that make a verdict
RECENT = 20  # the recent window (iterations) of the activation and skew rules
ACT_FLIPS = 4  # dead <-> alive flips in the recent window that count as oscillating
ACT_CV_OSC = 0.5  # coefficient of variation that, with the flips, makes it oscillating
ACT_CV_HIGH = 1.0
ACT_VAR = 0.05  # the write-up's bound on the activation rate's variance
ACT_FALL = 0.5  # last-10 mean below this share of the previous-10 mean is a fall

# -- advantage shape ----------------------------------------------------------------------------
SKEW_LIMIT = 2.0  # |skew| above this is the write-up's warning sign
SKEW_STREAK = 7  # iterations in a row above it make it a strong sign
SKEW_NORMAL = 1.0  # the write-up's normal band is -1..1

# -- gradient direction consistency (GDC) -------------------------------------------------------
GDC_FRESH = 0.85  # above: the data are fresh
GDC_LOW = 0.6  # below: the two clocks have come apart (the sweep's "GDC cliff")
GDC_LINES = (GDC_LOW, GDC_FRESH)
GDC_RECENT = 3  # measurements whose median the doctor judges

# -- solved tasks and the checklist -------------------------------------------------------------
SOLVED_SUCCESS = 0.9  # mean success over the last SOLVED_WINDOW iterations that counts as solved (tclock's rule)
SOLVED_WINDOW = 10
CRIT_FRACTION = 0.7  # the checklist: start at num_envs <= 0.7 x B_crit
HAE_LOW, HAE_HIGH = 0.5, 0.8  # HAE window as a share of the mean distance between reward events

# -- sweeps -------------------------------------------------------------------------------------
FINAL_FRACTION = 0.1  # a run's "final" value: mean over the last 10% of its iterations (tclock's rule)

# -- the calibrated batch verdict (tclock's rules, validated in experiments/doctor_agreement.py) ---
BATCH_ABOVE = 2.0  # B > 2 x the online critical batch: "above the critical batch" (two-clocks)
BATCH_NEAR = 1.0  # B between 1x and 2x of it: watch
LAG_STALE = 2.0  # asynchronous runs: median policy lag (updates) above this over the recent window is stale
KL_STALE = 0.05  # ... or a median behaviour-vs-learner KL above this

# -- when a sweep's B_crit fit is trusted (tclock's rules: a fit that fails them is reported, not used) --
FIT_MIN_R2 = 0.8  # R² of S(B) = S_min + c/B on the per-B medians
FIT_MAX_CI_RATIO = 10.0  # the 90% bootstrap CI may span at most this factor (high / low)
FIT_MIN_BATCHES = 3  # batch sizes whose median seed reached the target
# share of bootstrap resamples whose fit gives a finite B_crit; below it the CI is conditional on
# the resamples that succeeded (those where B_crit fell outside the swept range are dropped)
FIT_MIN_BOOT_SUCCESS = 0.9
STEP_TOO_LARGE = 1 + 0.4 ** 0.5  # r_B above this: lr too large (r(2-r) <= 0.6, tclock.step_size)
STEP_LIMITED_RISE = 1.5  # a fixed-lr sweep's B whose median E is above this x the best larger B's (quartiles apart)
