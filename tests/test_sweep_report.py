"""tclock.sweep_report on synthetic sweep directories written with tclock.runlog.RunWriter.

The synthetic sweep: B in {32, ..., 512} envs, T = 8, 3 seeds.  Seed j of batch size B reaches
the target (success_rate 0.5) at iteration S = round((S_MIN + C/B) * (1 + 0.03 * noise)), on a
linear success ramp that crosses 0.5 exactly there, so B_crit = C / S_MIN = 200 envs.  The noise
draws are fixed (seeded by B); over 300 other draws the point estimate stayed within 15% of 200
every time, while a 90% CI misses the truth in about 1 draw in 10 (the fixed draw is not one).
Iteration time is t(B) = A + K*B seconds, so wall seconds to target are S * t(B).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tclock import critical, runlog, sweep_report, thresholds
from tclock.runlog import RunFormatError, RunWriter
from tclock.sweep_analysis import smoothing_window
from tclock.sweep_report import format_summary, summarize_sweep
from tclock.textfmt import fmt

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T = 8
S_MIN, C = 20.0, 4000.0
B_CRIT = C / S_MIN  # 200 envs
BATCHES = (32, 64, 128, 256, 512)
A, K = 0.05, 2e-4  # iteration time t(B) = A + K*B seconds
GDC = {32: 0.92, 64: 0.8, 128: 0.7, 256: 0.55, 512: 0.4}  # cliff (< 0.6) at 256
B_SIMPLE_TR = {32: 800.0, 64: 1200.0, 128: 1600.0, 256: 2000.0, 512: 2400.0}  # transitions
RAMP = 10
NAN = float("nan")

# B_crit recovery tolerance: 3% seed noise and integer S give errors well inside 15%.
B_CRIT_RTOL = 0.15


def seed_steps(B: int, n_seeds: int = 3, rng=None) -> list[int]:
    rng = rng if rng is not None else np.random.default_rng(B)
    return [int(round((S_MIN + C / B) * (1 + 0.03 * rng.normal()))) for _ in range(n_seeds)]


def write_run(root: Path, B: int, steps: list[float], *, state: str = "finished", n_iter: int | None = None,
              target: float = 0.5, diag: bool = True, clocks: bool = True, curve=None, lr: float = 1e-3,
              name: str | None = None, cfg_extra: dict | None = None, extra=None) -> Path:
    """One run directory; ``steps[j]`` = iteration at which seed j's ramp crosses 0.5 (NaN = never);
    ``cfg_extra``: config fields over the defaults, ``extra(i)``: fields added to iteration i's record."""
    n_seeds = len(steps)
    finite = [s for s in steps if math.isfinite(s)]
    n_iter = n_iter or int(max(finite, default=40) + 2 * RAMP)
    cfg = {"env": "reach_sparse", "algo": "ppo", "num_envs": B, "unroll_length": T, "seeds": n_seeds,
           "target_success": target, "gdc_every": 5, "lr": lr, **(cfg_extra or {})}
    name = name or f"B{B:04d}"
    w = RunWriter(root / name, cfg)
    it_s = A + K * B
    for i in range(1, n_iter + 1):
        if curve is not None:
            succ = [float(curve(i))] * n_seeds
        else:
            succ = [float(np.clip(0.5 + (i - s + 0.5) / RAMP, 0, 1)) if math.isfinite(s) else 0.2 for s in steps]
        rec = {"iteration": i, "env_steps": i * B * T, "num_envs": B, "compiles": 2,
               "success_rate": succ, "episode_return": [100.0 * v for v in succ]}
        if clocks:
            rec.update({"wall_s": i * it_s, "rt_s": 0.6 * it_s, "learn_s": 0.4 * it_s,
                        "ut_s": None if i == 1 else it_s, "rt_ut_ratio": None if i == 1 else 0.6})
        if extra is not None:
            rec.update(extra(i))
        if diag and i % 5 == 0:
            rec["gdc"] = [GDC.get(B, 0.5)] * n_seeds
            rec["b_simple"] = [B_SIMPLE_TR.get(B, 1000.0)] * n_seeds
        w.log(rec)
    w.mark(state)
    w.close()
    return root / name


def make_sweep(root: Path, batches=BATCHES, **kw) -> dict[int, list[int]]:
    root.mkdir(parents=True, exist_ok=True)
    (root / "sweep.yaml").write_text("batch_sizes: [32, 64]\n")
    truth = {}
    for B in batches:
        truth[B] = seed_steps(B)
        write_run(root, B, truth[B], **kw)
    return truth


# --------------------------------------------------------------------------- the fit
def test_recovers_b_crit_and_ci(tmp_path):
    truth = make_sweep(tmp_path)
    s = summarize_sweep(tmp_path, smooth_steps=0, write=False)
    assert s["batch_sizes"] == list(BATCHES)
    for row in s["runs"]:
        B = row["num_envs"]
        assert row["smooth_k"] == 1
        assert row["steps_to_target"]["per_seed"] == truth[B]  # exact detection, iterations
        assert row["env_steps_to_target"]["per_seed"] == [S * B * T for S in truth[B]]
        assert row["wall_to_target"]["per_seed"] == pytest.approx([S * (A + K * B) for S in truth[B]])
        assert row["steps_to_target"]["median"] == float(np.median(truth[B]))
        assert row["steps_to_target"]["min"] == min(truth[B]) and row["steps_to_target"]["max"] == max(truth[B])
        assert row["reached_fraction"] == 1.0
    fit = s["fit"]
    assert fit is not None and fit["n_points"] == 5 and fit["n_dropped"] == 0
    assert s["b_crit"] == pytest.approx(B_CRIT, rel=B_CRIT_RTOL)
    assert fit["s_min"] == pytest.approx(S_MIN, rel=B_CRIT_RTOL)
    assert s["b_crit_transitions"] == pytest.approx(s["b_crit"] * T)
    assert fit["e_min"] == pytest.approx(fit["c"] * T)
    lo, hi = s["b_crit_ci"]
    assert lo <= B_CRIT <= hi and lo <= s["b_crit"] <= hi
    assert fit["bootstrap_success_fraction"] > 0.9
    assert s["r2"] > 0.95
    assert f"B_crit ≈ {fmt(s['b_crit'])} envs" in s["headline"]
    assert "90% CI" in s["headline"]


def test_gdc_bsimple_wallclock(tmp_path):
    truth = make_sweep(tmp_path)
    s = summarize_sweep(tmp_path, smooth_steps=0, write=False)
    rows = {r["num_envs"]: r for r in s["runs"]}
    for B in BATCHES:
        r = rows[B]
        assert r["gdc_mean"] == pytest.approx(GDC[B])
        assert r["b_simple_transitions"] == pytest.approx(B_SIMPLE_TR[B])
        assert r["b_simple_envs"] == pytest.approx(B_SIMPLE_TR[B] / T)
        assert r["rt_ut_ratio_mean"] == pytest.approx(0.6)
        assert r["iteration_s_mean"] == pytest.approx(A + K * B)
        assert r["rt_s_mean"] == pytest.approx(0.6 * (A + K * B))
        assert r["final_metric"] == pytest.approx(1.0) and r["final_episode_return"] == pytest.approx(100.0)
    assert s["gdc_cliff"] == 256
    assert s["b_simple_envs"] == pytest.approx(np.median([v / T for v in B_SIMPLE_TR.values()]))
    assert s["time_fit"]["a"] == pytest.approx(A) and s["time_fit"]["k"] == pytest.approx(K)
    assert s["b_star"] == pytest.approx(math.sqrt(s["b_crit"] * A / K))
    walls = {B: np.median([S * (A + K * B) for S in truth[B]]) for B in BATCHES}
    assert s["b_best_measured"] == min(walls, key=walls.get)
    assert "GDC falls below 0.6 at B=256" in s["headline"]
    assert f"measured best: {s['b_best_measured']}" in s["headline"]


# --------------------------------------------------------------------------- not reached
def test_batch_size_not_reached_is_nan_and_listed(tmp_path):
    truth = make_sweep(tmp_path)
    write_run(tmp_path, 1024, [NAN, NAN, NAN], n_iter=40)
    write_run(tmp_path, 2048, [30, NAN, NAN], n_iter=50)  # 1 of 3 reached: median not finite
    s = summarize_sweep(tmp_path, smooth_steps=0, write=False, n_boot=200, rng=3)
    # the bootstrap sees unreached seeds as infinitely late (inf), not as missing (NaN)
    sp = [truth[B] for B in BATCHES] + [[math.inf] * 3, [30, math.inf, math.inf]]
    boot = critical.bootstrap_b_crit(list(BATCHES) + [1024, 2048], sp, T, n_boot=200, rng=3)
    assert s["b_crit_ci"] == [boot.low, boot.high] and s["b_crit"] == pytest.approx(boot.point)
    rows = {r["num_envs"]: r for r in s["runs"]}
    r = rows[1024]
    assert r["n_reached"] == 0 and r["reached_fraction"] == 0.0
    assert all(math.isnan(v) for v in r["steps_to_target"]["per_seed"])
    assert math.isnan(r["steps_to_target"]["median"]) and math.isnan(r["wall_to_target"]["median"])
    r = rows[2048]
    assert r["n_reached"] == 1 and math.isnan(r["steps_to_target"]["median"])
    assert r["steps_to_target"]["min"] == 30 == r["steps_to_target"]["max"]
    assert s["not_reached"] == [1024, 2048]
    assert s["fit"]["n_points"] == 5 and s["fit"]["n_dropped"] == 2
    assert s["b_crit"] == pytest.approx(B_CRIT, rel=B_CRIT_RTOL)
    summarize_sweep(tmp_path, smooth_steps=0, write=True)
    js = runlog.read_json(tmp_path / "summary.json")
    r = [x for x in js["runs"] if x["num_envs"] == 1024][0]
    assert r["steps_to_target"]["per_seed"] == [None, None, None]
    assert r["steps_to_target"]["median"] is None and r["env_steps_to_target"]["median"] is None
    assert "NaN" not in (tmp_path / "summary.json").read_text()
    assert "not reached" in (tmp_path / "report.md").read_text()


def test_fewer_than_two_reached_gives_null_fit(tmp_path):
    for B in BATCHES[:-1]:
        write_run(tmp_path, B, [NAN, NAN, NAN], n_iter=30)
    write_run(tmp_path, 512, seed_steps(512))
    s = summarize_sweep(tmp_path, smooth_steps=0, write=True)
    assert s["fit"] is None
    assert "fewer than 2 batch sizes reached the target" in s["fit_note"] and "B=512" in s["fit_note"]
    assert s["headline"].startswith("target not reached at enough batch sizes to fit")
    assert math.isnan(s["b_crit"]) and math.isnan(s["b_star"]) and s["b_crit_ci"] is None
    assert s["b_best_measured"] == 512
    js = runlog.read_json(tmp_path / "summary.json")
    assert js["fit"] is None and js["b_crit"] is None and js["fit_note"] == s["fit_note"]
    assert "No fit: fewer than 2" in (tmp_path / "report.md").read_text()
    assert "sweep_steps_to_target.png" in s["figures"]


def test_no_seed_reaches_anywhere(tmp_path):
    for B in BATCHES[:3]:
        write_run(tmp_path, B, [NAN, NAN], n_iter=20)
    s = summarize_sweep(tmp_path, smooth_steps=0, write=True)
    assert s["fit"] is None and s["b_best_measured"] is None and s["not_reached"] == list(BATCHES[:3])
    assert "0 of 3" in s["fit_note"] and "none reached" in s["headline"]
    assert "sweep_steps_to_target.png" not in s["figures"]
    assert not (tmp_path / "sweep_steps_to_target.png").exists()


# --------------------------------------------------------------------------- smoothing
def test_smoothing_window_formula():
    assert smoothing_window(32, 8, 16384) == 64
    assert smoothing_window(512, 8, 16384) == 4
    assert smoothing_window(4096, 8, 16384) == 1
    assert smoothing_window(32, 8, 0) == 1
    assert smoothing_window(100, 8, 801) == 2  # ceil, not round
    with pytest.raises(ValueError):
        smoothing_window(32, 8, -1)


def test_smoothed_steps_to_target(tmp_path):
    # A step from 0 to 1 at iteration 10; target 0.5; B*T = 256 env steps per iteration.
    write_run(tmp_path, 32, [NAN], n_iter=60, curve=lambda i: 1.0 if i >= 10 else 0.0)
    expect = {0: (1, 10), 1024: (4, 11), 1025: (5, 12), 1280: (5, 12), 1281: (6, 12), 16384: (64, NAN)}
    for smooth, (k, S) in expect.items():
        row = summarize_sweep(tmp_path, smooth_steps=smooth, write=False)["runs"][0]
        assert row["smooth_k"] == k == math.ceil(smooth / (32 * T)) or (smooth == 0 and row["smooth_k"] == 1)
        got = row["steps_to_target"]["per_seed"][0]
        assert (math.isnan(got) and math.isnan(S)) or got == S, (smooth, got, S)
    # The window must be full: a curve at 1 from the start is reached at iteration k, not 1.
    sub = tmp_path / "flat"
    write_run(sub, 32, [NAN], n_iter=20, curve=lambda i: 1.0)
    assert summarize_sweep(sub, smooth_steps=4 * 256, write=False)["runs"][0]["steps_to_target"]["median"] == 4
    # Smoothing ignores a one-iteration spike that the raw first crossing takes.
    spike = tmp_path / "spike"
    write_run(spike, 32, [NAN], n_iter=60, curve=lambda i: 1.0 if i == 3 or i >= 30 else 0.0)
    assert summarize_sweep(spike, smooth_steps=0, write=False)["runs"][0]["steps_to_target"]["median"] == 3
    assert summarize_sweep(spike, smooth_steps=4 * 256, write=False)["runs"][0]["steps_to_target"]["median"] == 31


def test_default_smoothing_k_per_batch_size(tmp_path):
    make_sweep(tmp_path, diag=False, n_iter=250)  # long enough for a 64-iteration window at B=32
    s = summarize_sweep(tmp_path, write=False)
    assert [r["smooth_k"] for r in s["runs"]] == [math.ceil(16384 / (B * T)) for B in BATCHES] == [64, 32, 16, 8, 4]
    # on a ramp the smoothed crossing is late, never early, by at most k-1 iterations
    raw = summarize_sweep(tmp_path, smooth_steps=0, write=False)
    for r, r0 in zip(s["runs"], raw["runs"]):
        for S, S0 in zip(r["steps_to_target"]["per_seed"], r0["steps_to_target"]["per_seed"]):
            assert S0 <= S <= S0 + r["smooth_k"] - 1
        assert r["steps_to_target"]["median"] > r0["steps_to_target"]["median"]  # k > 1 lags on a ramp
    assert any("k-1 iterations late" in n for n in s["notes"])


# --------------------------------------------------------------------------- files
def test_every_file_written(tmp_path):
    make_sweep(tmp_path)
    s = summarize_sweep(tmp_path, smooth_steps=0)
    one_lr = [f for f in sweep_report.FIGURES if f != "sweep_lr_heatmap.png"]  # the heat map needs a grid
    assert s["figures"] == one_lr
    for name in one_lr:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000, name
    assert not list(tmp_path.glob(".*.tmp"))
    js = runlog.read_json(tmp_path / "summary.json")
    assert set(js) == {
        "algo", "sweep_axis", "replay_ratio", "sweep_dir", "metric", "target", "smooth_steps", "smoothing", "unroll_length", "units",
        "include_incomplete", "batch_sizes", "incomplete", "runs", "not_reached", "fit", "fit_note", "b_crit",
        "b_crit_transitions", "b_crit_ci", "r2", "gdc_threshold", "gdc_cliff", "b_simple_envs",
        "b_simple_transitions", "b_crit_online_envs", "b_crit_trusted", "b_crit_distrust", "step_size_limited", "lr_grid", "time_fit", "b_star", "b_best_measured", "best_wall_s", "notes", "headline",
        "figures"}
    assert js["b_crit"] == pytest.approx(s["b_crit"]) and js["headline"] == s["headline"]
    assert js["figures"] == one_lr
    md = (tmp_path / "report.md").read_text()
    assert s["headline"] in md
    for header in ("B (envs)", "S median (iterations)", "E median (env steps per seed)", "wall median (s)",
                   "b_simple (envs)"):
        assert header in md
    for name in one_lr:
        assert f"]({name})" in md
    assert "B_crit = " in md and "envs" in md


def test_figures_skipped_without_data(tmp_path):
    make_sweep(tmp_path, diag=False, clocks=False)
    s = summarize_sweep(tmp_path, smooth_steps=0)
    assert "sweep_gdc_bsimple.png" not in s["figures"] and not (tmp_path / "sweep_gdc_bsimple.png").exists()
    assert "sweep_rt_ut.png" not in s["figures"] and not (tmp_path / "sweep_rt_ut.png").exists()
    assert "sweep_return_vs_wall.png" in s["figures"]  # return panel notes "not logged" but exists
    assert "sweep_return_vs_steps.png" in s["figures"] and "sweep_steps_to_target.png" in s["figures"]
    assert s["time_fit"] is None and s["gdc_cliff"] is None and math.isnan(s["b_star"])
    assert math.isnan(s["runs"][0]["wall_to_target"]["median"])
    assert "B* n/a" in s["headline"]


# --------------------------------------------------------------------------- run states
def test_incomplete_runs_listed(tmp_path):
    make_sweep(tmp_path)
    write_run(tmp_path, 1024, seed_steps(1024), state="running")
    bad = write_run(tmp_path, 2048, seed_steps(2048))
    with open(bad / runlog.METRICS_FILE, "a") as f:
        f.write('{"iteration": 99, "success_r\n')
    (tmp_path / "notes").mkdir()  # not a run directory: ignored
    s = summarize_sweep(tmp_path, smooth_steps=0, write=False)
    assert s["batch_sizes"] == list(BATCHES)
    inc = {r["run"]: r for r in s["incomplete"]}
    assert inc["B1024"]["state"] == "running" and inc["B1024"]["used"] is False
    assert "metrics unreadable" in inc["B2048"]["reason"] and inc["B2048"]["used"] is False
    s2 = summarize_sweep(tmp_path, smooth_steps=0, write=False, include_incomplete=True)
    assert s2["batch_sizes"] == list(BATCHES) + [1024]
    row = s2["runs"][-1]
    assert row["complete"] is False and row["state"] == "running" and row["n_reached"] == 3
    assert {r["run"]: r for r in s2["incomplete"]}["B1024"]["used"] is True
    assert "B1024" in format_summary(s)


def test_all_runs_unfinished(tmp_path):
    write_run(tmp_path, 64, seed_steps(64), state="running")
    s = summarize_sweep(tmp_path, smooth_steps=0, write=True)
    assert s["runs"] == [] and s["fit"] is None and s["incomplete"][0]["run"] == "B0064"
    assert s["headline"].startswith("no finished runs")
    assert (tmp_path / "report.md").exists() and s["figures"] == []


def test_not_a_sweep_dir(tmp_path):
    with pytest.raises(RunFormatError, match="no run directories"):
        summarize_sweep(tmp_path, write=False)
    with pytest.raises(RunFormatError, match="not a directory"):
        summarize_sweep(tmp_path / "missing", write=False)


def test_explicit_target_and_metric(tmp_path):
    truth = make_sweep(tmp_path, target=0.99)
    s = summarize_sweep(tmp_path, smooth_steps=0, write=False)  # config target 0.99: ramp reaches it later
    assert s["target"] == 0.99
    later = s["runs"][0]["steps_to_target"]["per_seed"]
    assert all(S > S0 for S, S0 in zip(later, truth[32]))
    s = summarize_sweep(tmp_path, target=50.0, metric="episode_return", smooth_steps=0, write=False)
    assert s["target"] == 50.0 and s["runs"][0]["steps_to_target"]["per_seed"] == truth[32]


# --------------------------------------------------------------------------- terminal
def test_format_summary(tmp_path):
    make_sweep(tmp_path)
    s = summarize_sweep(tmp_path, smooth_steps=0, write=False)
    text = format_summary(s)
    assert text.rstrip().endswith(s["headline"])
    assert "B_crit = " in text and "S iters" in text
    lines = text.splitlines()
    for B in BATCHES:
        assert any(line.strip().startswith(str(B) + " ") for line in lines), B
    json.dumps(runlog.to_jsonable(s))  # the dict itself is JSON-friendly after to_jsonable


def test_a_clean_synthetic_sweep_is_trusted_and_a_poor_fit_is_not(tmp_path):
    from tclock.sweep_analysis import fit_trust

    make_sweep(tmp_path)
    s = summarize_sweep(tmp_path, smooth_steps=0, write=False)
    assert s["b_crit_trusted"] is True and s["b_crit_distrust"] == []
    good = {"b_crit": 300.0, "r2": 0.95, "ci_low": 150.0, "ci_high": 450.0}
    rows = [{"steps_to_target": {"median": m}, "smooth_k": 4, "batch": b}
            for m, b in zip((90.0, 50.0, 20.0, float("nan")), (32, 64, 128, 256))]
    assert fit_trust(good, rows) == (True, [])
    ok, why = fit_trust({**good, "r2": 0.34, "ci_high": 3500.0}, rows)
    assert not ok and any("R² 0.34" in w for w in why) and any("spans 23x" in w for w in why)
    ok, why = fit_trust(good, rows[2:])
    assert not ok and "only 1 batch sizes reached" in why[0]
    assert fit_trust(None, rows) == (False, ["no finite B_crit"])
    # a CI from only the resamples that gave a finite B_crit is narrower than the data allow
    assert fit_trust({**good, "bootstrap_success_fraction": 0.9}, rows) == (True, [])
    ok, why = fit_trust({**good, "bootstrap_success_fraction": 0.62}, rows)
    assert not ok and why == [why[0]] and "only 62% of bootstrap resamples" in why[0]
    assert not fit_trust({**good, "bootstrap_success_fraction": float("nan")}, rows)[0]
    # a median reached at the first iteration the trailing window allows is censored, not measured
    censored = [*rows[:2], {**rows[2], "steps_to_target": {"median": 4.0}}]
    ok, why = fit_trust(good, censored)
    assert not ok and "smoothing window filled at B=[128]" in why[0]


# --------------------------------------------------------------------------- the learning rate
LRS = (1e-4, 3e-4, 1e-3, 3e-3)
BEST_LR_INDEX = {32: 1, 64: 1, 128: 2, 256: 2, 512: 2}  # interior optima: the tuned fit can be trusted


def make_grid(root: Path, best=BEST_LR_INDEX, lrs=LRS) -> None:
    """A B x lr grid whose best lr at each B follows the known S*(B) = S_MIN + C/B (B_crit 200) and
    every other lr is (1 + d^2) times slower, d = grid steps from the best."""
    root.mkdir(parents=True, exist_ok=True)
    for B in BATCHES:
        for i, lr in enumerate(lrs):
            factor = 1 + (i - best[B]) ** 2
            steps = [s * factor for s in seed_steps(B)]
            write_run(root, B, steps, lr=lr, name=f"B{B:04d}_lr{lr:.0e}")


def test_tuned_medians_match_a_loop_reference():
    rng = np.random.default_rng(3)
    for trial in range(40):
        sp = rng.uniform(5, 100, size=(3, 4, 5))
        sp[rng.random(sp.shape) < 0.25] = np.inf  # not reached
        sp[rng.random(sp.shape) < 0.1] = np.nan  # no such seed
        if trial == 0:
            sp[:, 1, :] = np.inf  # no lr reached at this B
            sp[:, 2, :] = np.nan  # no lr was run at this B
        med, best = critical.tuned_medians(sp)
        for j in range(sp.shape[1]):
            per_lr = []
            for i in range(sp.shape[0]):
                seeds = sorted(v for v in sp[i, j] if not math.isnan(v))
                per_lr.append(float(np.median(seeds)) if seeds else math.nan)
            ran = [(v, i) for i, v in enumerate(per_lr) if not math.isnan(v)]
            if not ran:
                assert math.isnan(med[j]) and best[j] == -1
                continue
            v, i = min(ran)
            assert med[j] == v
            assert best[j] == (i if math.isfinite(v) else -1)


def test_grid_fits_the_best_lr_per_batch_size(tmp_path):
    make_grid(tmp_path)
    s = summarize_sweep(tmp_path, smooth_steps=0, write=True)
    grid = s["lr_grid"]
    assert grid["lrs"] == list(LRS) and len(grid["cells"]) == len(BATCHES) * len(LRS)
    assert {b["batch"]: b["lr"] for b in grid["best_lr"]} == {B: LRS[i] for B, i in BEST_LR_INDEX.items()}
    assert all(b["frequency"][f"{b['lr']:.0e}"] > 0.9 for b in grid["best_lr"])  # 2x gaps: never a close call
    assert [r["lr"] for r in s["runs"]] == [LRS[BEST_LR_INDEX[B]] for B in BATCHES]
    assert s["b_crit"] == pytest.approx(B_CRIT, rel=B_CRIT_RTOL)
    lo, hi = s["b_crit_ci"]
    assert lo < B_CRIT < hi and s["b_crit_trusted"], s["b_crit_distrust"]
    # The fixed lr 1e-3 is 2x slow at B <= 64: E rises as B falls, so its own fit is flagged.
    fixed = grid["fixed"]["1e-03"]
    assert not fixed["trusted"] and fixed["step_size_limited"]["batch"] == 64
    assert fixed["step_size_limited"]["best_batch"] == 128
    assert grid["edge"] == []
    report = (tmp_path / "report.md").read_text()
    assert "## Learning rate" in report and "lr 3e-03" in report and "sweep_lr_heatmap.png" in s["figures"]
    assert (tmp_path / "sweep_lr_heatmap.png").read_bytes()[:8] == PNG_MAGIC


def test_grid_with_the_best_lr_at_an_edge_is_not_trusted(tmp_path):
    make_grid(tmp_path, best={**BEST_LR_INDEX, 512: 3})
    s = summarize_sweep(tmp_path, smooth_steps=0, write=False)
    assert s["lr_grid"]["edge"] == [{"batch": 512, "lr": 3e-3, "side": "largest"}]
    assert not s["b_crit_trusted"] and any("edge of the grid" in w for w in s["b_crit_distrust"])


def test_a_fixed_lr_sweep_whose_small_batches_are_slower_is_flagged(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    slow = {32: 2.4, 64: 1.0, 128: 1.0, 256: 1.0, 512: 1.0}  # the issue's U shape: B=32 needs 2.4x B=64's E
    for B in BATCHES:
        write_run(tmp_path, B, [s * slow[B] * (C / B + S_MIN) / (C / B + S_MIN) for s in seed_steps(B)])
    s = summarize_sweep(tmp_path, smooth_steps=0, write=True)
    lim = s["step_size_limited"]
    assert lim["batch"] == 32 and lim["limited"] == [32] and lim["rise"] > thresholds.STEP_LIMITED_RISE
    assert s["lr_grid"] is None and not s["b_crit_trusted"]
    report = (tmp_path / "report.md").read_text()
    assert "E rises as B falls" in report and "tclock sweep --lrs 1e-04 3e-04 1e-03 --batch-sizes 32 64" in report
    assert "tclock sweep --lrs" in s["headline"]
    # the clean sweep of the same shape without the slow end is not flagged
    clean = tmp_path / "clean"
    make_sweep(clean)
    assert summarize_sweep(clean, smooth_steps=0, write=False)["step_size_limited"] is None


def test_two_runs_with_the_same_batch_and_lr_are_refused(tmp_path):
    write_run(tmp_path, 32, seed_steps(32), lr=1e-3, name="B0032")
    write_run(tmp_path, 32, seed_steps(32), lr=1e-3, name="B0032_lr1e-03")
    with pytest.raises(RunFormatError, match="lr=0.001"):
        summarize_sweep(tmp_path, write=False)


# --------------------------------------------------------------------------- SAC's gradient batch
SAC_WARM, SAC_G = 3, 2  # warm-up iterations (no gradient steps), then G gradient steps per iteration


def make_gradient_batch_sweep(root: Path) -> dict[int, list[int]]:
    """A ``--sweep-axis sac_batch_size`` sweep: B = sac_batch_size at num_envs 16; seed j crosses at
    iteration i, after ``(i - SAC_WARM) * SAC_G`` gradient steps (the truth, in gradient steps)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "sweep.yaml").write_text("spec:\n  axis: sac_batch_size\n  batch_sizes: [32, 512]\n")
    truth = {}
    for B in BATCHES:
        iters = seed_steps(B)
        truth[B] = [(i - SAC_WARM) * SAC_G for i in iters]
        write_run(root, B, iters, cfg_extra={"algo": "sac", "num_envs": 16, "sac_batch_size": B,
                                             "sac_replay_ratio": 0.0625},
                  extra=lambda i: {"grad_steps": [0.0 if i <= SAC_WARM else float(SAC_G)] * 3})
    return truth


def test_a_gradient_batch_sweep_counts_gradient_steps_and_fits_in_transitions(tmp_path):
    truth = make_gradient_batch_sweep(tmp_path)
    s = summarize_sweep(tmp_path, smooth_steps=0)
    assert s["sweep_axis"] == "sac_batch_size" and s["batch_sizes"] == list(BATCHES)
    assert s["units"]["B"] == "transitions (sac_batch_size)" and s["units"]["S"] == "gradient steps to target"
    for row in s["runs"]:
        B = row["batch"]
        assert row["num_envs"] == 16 and row["transitions_per_b"] == 1
        assert row["steps_to_target"]["per_seed"] == truth[B]  # gradient steps, warm-up excluded
        assert row["samples_to_target"]["per_seed"] == [S * B for S in truth[B]]  # replay samples drawn
        iters = [S / SAC_G + SAC_WARM for S in truth[B]]
        assert row["iterations_to_target"]["per_seed"] == iters
        assert row["env_steps_to_target"]["per_seed"] == [i * 16 * T for i in iters]
    # S(B) = G*(S_MIN - WARM) + G*C/B in gradient steps: B_crit = C / (S_MIN - WARM) transitions
    expected = C / (S_MIN - SAC_WARM)
    assert s["b_crit"] == pytest.approx(expected, rel=B_CRIT_RTOL)
    assert s["b_crit_transitions"] == pytest.approx(s["b_crit"])  # B is already in transitions
    assert f"critical gradient batch size B_crit ≈ {fmt(s['b_crit'])} transitions" in s["headline"]
    report = (tmp_path / "report.md").read_text()
    assert "swept: `sac_batch_size` (B, the gradient batch size) at num_envs = 16" in report
    assert "| B (transitions) |" in report and "S median (gradient steps)" in report
    assert "E median (replay samples per seed)" in report and "gradient steps" in report
    assert "sweep_steps_to_target.png" in s["figures"]


def test_the_doctor_does_not_read_a_gradient_batch_b_crit_as_envs(tmp_path):
    from tclock.doctor import diagnose

    make_gradient_batch_sweep(tmp_path)
    summarize_sweep(tmp_path, smooth_steps=0, write=True)
    report = diagnose(tmp_path / "B0512")
    assert report.row("critical_batch").data["b_crit_sweep_envs"] is None  # transitions per step, not envs
    assert report.row("critical_batch").verdict != "two-clocks"


@pytest.mark.parametrize("changes, field", [
    ({"axis": "batch"}, "axis"),
    ({"axis": "sac_batch_size", "budget": "iterations"}, "axis"),
    ({"axis": "sac_batch_size", "minibatch": "size", "minibatch_size": 64}, "axis"),
])
def test_bad_sweep_axis_is_refused_naming_the_field(changes, field):
    from tclock.config import ConfigError
    from tclock.sweep import SweepSpec

    with pytest.raises(ConfigError, match=rf"^{field}: "):
        SweepSpec(batch_sizes=(32, 64), **changes).validate()


def test_a_gradient_batch_sweep_needs_sac(tmp_path):
    from tclock.config import ConfigError, TrainConfig
    from tclock.sweep import SweepSpec, sweep_configs

    with pytest.raises(ConfigError, match=r"^axis: .*--algo sac"):
        sweep_configs(TrainConfig(), SweepSpec(batch_sizes=(32, 64), axis="sac_batch_size"), tmp_path)
