"""tclock.doctor on synthetic run directories written with tclock.runlog.RunWriter."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tclock import doctor, doctor_checklist, doctor_diagnose, doctor_gradients, doctor_rules, online_critical, plots, runlog
from tclock import thresholds
from tclock.doctor import diagnose, format_table, report_to_dict, run_doctor
from tclock.runlog import RunWriter

BASE_CONFIG = dict(env="reach_sparse", algo="ppo", num_envs=64, unroll_length=32, seeds=3,
                   gdc_every=5, advantage="hae", hae_window=16, drbs={"enabled": True}, lr_clock="hybrid")


def make_run(root: Path, name: str = "run", n: int = 60, seeds: int = 3, ratio=lambda i: 0.5,
             act=lambda i: 0.01 + 0.003 * i, skew=lambda i: 0.5, gdc=lambda i: 0.9, b_simple=lambda i: 640.0,
             ret_step=lambda i, w: 1.0, config: dict | None = None, drop: tuple = (), gdc_every: int = 5,
             noise: float = 0.02, seed: int = 0) -> Path:
    """A run shaped like the loop's output: w50 is the mean of the last <= 50 non-null raw ratios,
    the return grows by ``ret_step(i, w50)`` per iteration."""
    rng = np.random.default_rng(seed)
    cfg = {**BASE_CONFIG, "seeds": seeds, **(config or {})}
    run_dir = root / name
    writer = RunWriter(run_dir, cfg)
    B, T = cfg.get("num_envs", 64), cfg.get("unroll_length", 32)
    ratios: list[float] = []
    ret = np.zeros(seeds)
    for i in range(1, n + 1):
        r = None if i == 1 else max(0.0, ratio(i) + rng.normal(0, noise))
        if r is not None:
            ratios.append(r)
        w = float(np.mean(ratios[-50:])) if ratios else None
        ret = ret + ret_step(i, w if w is not None else 0.0) * (1 + 0.05 * rng.normal(size=seeds))
        rec = {
            "iteration": i, "env_steps": i * B * T, "wall_s": 0.1 * i, "rt_s": 0.05,
            "learn_s": 0.05, "ut_s": None if i == 1 else 0.1, "rt_ut_ratio": r, "rt_ut_ratio_w50": w,
            "num_envs": B, "compiles": 2,
            "episode_return": ret.tolist(),
            "success_rate": np.clip(act(i) * 3 + 0.01 * rng.normal(size=seeds), 0, 1).tolist(),
            "episodes": [4] * seeds,
            "activation_rate": (max(0.0, act(i)) * (1 + 0.05 * rng.normal(size=seeds))).clip(0).tolist(),
            "adv_mean": [0.0] * seeds, "adv_std": [1.0] * seeds,
            "adv_skew": (skew(i) + noise * rng.normal(size=seeds)).tolist(),
            "adv_top1_share": [0.01] * seeds, "kl_behavior": [0.01] * seeds, "clip_frac": [0.1] * seeds,
            "policy_loss": [0.0] * seeds, "value_loss": [1.0] * seeds, "entropy": [1.0] * seeds,
            "lr": [3e-4] * seeds,
        }
        if i % gdc_every == 0:
            g = gdc(i)
            rec.update({"gdc": (g + 0.01 * rng.normal(size=seeds)).tolist(), "gdc_policy": [g] * seeds,
                        "gdc_value": [g - 0.05] * seeds, "b_simple": [b_simple(i)] * seeds,
                        "grad_norm_sq": [1.0] * seeds, "trace_sigma": [1.0] * seeds})
        for k in drop:
            rec.pop(k, None)
        writer.log(rec)
    writer.mark("finished")
    writer.close()
    return run_dir


def verdicts(report) -> dict:
    return {r.signal: r.verdict for r in report.rows}


def writeup(row) -> str:
    """The write-up's classification of a row (kept when tclock reports it as info or caps it)."""
    return row.data.get("writeup_verdict", row.verdict)


ASYNC = {"arp": True}  # RT/UT rows are judged only where they mean staleness: the asynchronous pipeline


# --------------------------------------------------------------------------- signals
def test_healthy_run_exits_0(tmp_path):
    run = make_run(tmp_path)
    report = diagnose(run)
    v = verdicts(report)
    for sig in ("activation_rate", "adv_skew"):
        assert v[sig] == "healthy", (sig, report.row(sig).value)
    for sig in ("rt_ut_ratio_w50", "rt_ut_plateau", "gdc"):  # synchronous run: reported, not judged
        assert v[sig] == "info" and writeup(report.row(sig)) == "healthy", (sig, report.row(sig).value)
    assert v["b_simple"] == "info" and v["staleness"] == "info"
    assert v["critical_batch"] == "not-checkable"  # this synthetic run logs no per-env noise
    assert report.verdict == "healthy" and report.exit_code == 0
    assert report.row("activation_rate").data["trend"] == "rising"
    out = io.StringIO()
    assert run_doctor(run, stream=out) == 0
    text = out.getvalue()
    assert text == format_table(report)
    assert "overall: healthy" in text and "rt_ut_ratio_w50" in text and "checklist" in text
    assert "env=reach_sparse" in text


def test_stalled_ratio_is_two_clocks(tmp_path):
    run = make_run(tmp_path, n=40, ratio=lambda i: 1.3)
    report = diagnose(run)
    row = report.row("rt_ut_ratio_w50")
    assert row.verdict == "two-clocks", row.value
    assert row.data["stall_streak"] >= thresholds.SUSTAIN
    assert report.row("activation_rate").verdict == "healthy"
    assert report.row("adv_skew").verdict == "healthy"
    assert report.exit_code == 1 and report.verdict == "two-clocks"
    out = io.StringIO()
    assert run_doctor(run, stream=out) == 1
    assert "overall: two-clocks: rt_ut_ratio_w50" in out.getvalue()


def test_stall_without_w50_key_is_recomputed(tmp_path):
    run = make_run(tmp_path, n=40, ratio=lambda i: 1.3, drop=("rt_ut_ratio_w50",))
    row = diagnose(run).row("rt_ut_ratio_w50")
    assert row.verdict == "two-clocks"
    assert "recomputed" in row.data["source"]


def test_short_stall_is_only_risk(tmp_path):
    run = make_run(tmp_path, n=15, ratio=lambda i: 1.3)
    report = diagnose(run)
    assert report.row("rt_ut_ratio_w50").verdict == "risk"
    assert report.exit_code == 0


@pytest.mark.parametrize("level, expected", [(0.15, "watch"), (0.5, "healthy"), (0.76, "risk")])
def test_ratio_levels(tmp_path, level, expected):
    report = diagnose(make_run(tmp_path, n=30, ratio=lambda i: level, noise=0.01, config=ASYNC))
    row = report.row("rt_ut_ratio_w50")
    assert row.verdict == expected, row.value
    sync = diagnose(make_run(tmp_path, name="sync", n=30, ratio=lambda i: level, noise=0.01)).row("rt_ut_ratio_w50")
    assert sync.verdict == "info" and writeup(sync) == expected
    if expected == "watch":
        assert "batch may be small" in row.value
    assert report.exit_code == 0


def _plateau_ratio(i):
    return 0.5 if i <= 50 else 0.95


def test_plateau_with_falling_return_is_two_clocks(tmp_path):
    run = make_run(tmp_path, n=140, ratio=_plateau_ratio, noise=0.01,
                   ret_step=lambda i, w: 0.05 if w > 0.8 else 1.0, config=ASYNC)
    report = diagnose(run)
    row = report.row("rt_ut_plateau")
    assert row.verdict == "two-clocks", row.value
    flagged = [p for p in row.data["plateaus"] if p["falling"]]
    assert flagged and flagged[-1]["length"] >= thresholds.SUSTAIN
    assert flagged[-1]["slope_plateau"] < 0.5 * flagged[-1]["slope_before"]
    # level alone is only a risk: the plateau + slope rule is what flags it
    assert report.row("rt_ut_ratio_w50").verdict == "risk"
    assert report.exit_code == 1


def test_plateau_with_steady_return_is_watch(tmp_path):
    report = diagnose(make_run(tmp_path, n=140, ratio=_plateau_ratio, noise=0.01, ret_step=lambda i, w: 1.0,
                               config=ASYNC))
    assert report.row("rt_ut_plateau").verdict == "watch"
    assert report.row("rt_ut_ratio_w50").verdict == "risk"
    assert report.exit_code == 0 and report.verdict == "risk"


def test_activation_dead_is_two_clocks(tmp_path):
    run = make_run(tmp_path, n=40, act=lambda i: 0.05 + 0.002 * i if i <= 25 else 0.0)
    report = diagnose(run)
    row = report.row("activation_rate")
    assert writeup(row) == "two-clocks" and row.verdict == "risk", row.value  # capped: not a validated verdict
    assert row.data["dead_streak"] == 15
    assert writeup(report.row("rt_ut_ratio_w50")) == "healthy"
    assert report.exit_code == 0


def test_activation_dead_then_recovered_is_watch(tmp_path):
    report = diagnose(make_run(tmp_path, n=60, act=lambda i: 0.0 if 6 <= i <= 20 else 0.05 + 0.001 * i))
    row = report.row("activation_rate")
    assert row.verdict == "watch" and "recovered" in row.value
    assert report.exit_code == 0


def test_activation_dead_only_in_warmup_is_ignored(tmp_path):
    report = diagnose(make_run(tmp_path, n=40,
                               act=lambda i: 0.0 if i <= thresholds.ACT_WARMUP else 0.05 + 0.001 * i))
    assert report.row("activation_rate").verdict == "healthy"


def test_activation_oscillating_is_risk(tmp_path):
    report = diagnose(make_run(tmp_path, n=40, act=lambda i: 0.3 if i % 2 else 0.0))
    row = report.row("activation_rate")
    assert row.verdict == "risk" and "oscillating" in row.value
    assert row.data["flips"] >= thresholds.ACT_FLIPS


def test_skew_streak_is_two_clocks(tmp_path):
    run = make_run(tmp_path, n=40, skew=lambda i: 3.0 if i > 32 else 0.5)
    report = diagnose(run)
    row = report.row("adv_skew")
    assert writeup(row) == "two-clocks" and row.verdict == "watch", row.value  # capped at watch
    assert row.data["longest_recent_run"] == 8
    assert report.exit_code == 0


def test_negative_skew_short_run_is_risk(tmp_path):
    report = diagnose(make_run(tmp_path, n=40, skew=lambda i: -3.0 if 30 < i <= 35 else 0.5))
    assert writeup(report.row("adv_skew")) == "risk" and report.row("adv_skew").verdict == "watch"
    assert report.exit_code == 0


@pytest.mark.parametrize("g, expected", [(0.92, "healthy"), (0.7, "watch"), (0.45, "two-clocks")])
def test_gdc_levels(tmp_path, g, expected):
    report = diagnose(make_run(tmp_path, n=30, gdc=lambda i: g))
    assert writeup(report.row("gdc")) == expected and report.row("gdc").verdict == "info"
    assert report.exit_code == 0  # GDC is reported; the batch verdict rests on critical_batch


def test_gdc_absent_is_not_checkable(tmp_path):
    report = diagnose(make_run(tmp_path, n=30, drop=("gdc", "gdc_policy", "gdc_value", "b_simple")))
    assert report.row("gdc").verdict == "not-checkable"
    assert report.row("b_simple").verdict == "not-checkable"
    diag = report.row("diagnostics logged")
    assert diag.verdict == "missing" and diag.data["absent"] == ["gdc"]
    assert report.exit_code == 0


def test_b_simple_converted_to_envs(tmp_path):
    row = diagnose(make_run(tmp_path, n=30, b_simple=lambda i: 640.0)).row("b_simple")
    assert row.data["median_transitions"] == pytest.approx(640.0)
    assert row.data["median_envs"] == pytest.approx(640.0 / 32)
    assert row.data["num_envs_over_b_simple"] == pytest.approx(64 / 20)


# --------------------------------------------------------------------------- unreadable input
def _write_lines(run: Path, lines: list[str]) -> None:
    runlog.write_text(run / runlog.METRICS_FILE, "".join(l + "\n" for l in lines))


def test_broken_json_line_exits_2(tmp_path):
    run = make_run(tmp_path, n=5)
    good = [json.dumps(r) for r in runlog.read_metrics(run)]
    _write_lines(run, good[:2] + ['{"iteration": 3, "rt_ut_ratio": 0.5'] + good[3:])
    out = io.StringIO()
    assert run_doctor(run, stream=out) == 2
    msg = out.getvalue()
    assert "metrics.jsonl:3" in msg and "not valid JSON" in msg


def test_missing_directory_exits_2(tmp_path):
    out = io.StringIO()
    assert run_doctor(tmp_path / "nope", stream=out) == 2
    assert "nope" in out.getvalue() and "does not exist" in out.getvalue()


def test_empty_metrics_exits_2(tmp_path):
    run = make_run(tmp_path, n=3)
    _write_lines(run, [])
    out = io.StringIO()
    assert run_doctor(run, stream=out) == 2
    assert "metrics.jsonl" in out.getvalue() and "no records" in out.getvalue()


def test_missing_required_key_exits_2(tmp_path):
    run = make_run(tmp_path, n=5, drop=("rt_ut_ratio",))
    out = io.StringIO()
    assert run_doctor(run, stream=out) == 2
    assert "'rt_ut_ratio'" in out.getvalue() and "iteration 1" in out.getvalue()


def test_non_numeric_metric_exits_2(tmp_path):
    run = make_run(tmp_path, n=3)
    recs = runlog.read_metrics(run)
    recs[1]["adv_skew"] = ["high", 1.0, 1.0]
    _write_lines(run, [json.dumps(r) for r in recs])
    out = io.StringIO()
    assert run_doctor(run, stream=out) == 2
    assert "adv_skew" in out.getvalue()


def test_json_error_output(tmp_path, capsys):
    out = io.StringIO()
    assert run_doctor(tmp_path / "nope", as_json=True, stream=out) == 2
    d = json.loads(out.getvalue())
    assert d["verdict"] == "unreadable" and d["exit_code"] == 2 and "nope" in d["error"]
    assert "cannot read" in capsys.readouterr().err


# --------------------------------------------------------------------------- json
@pytest.mark.parametrize("shape, code", [("healthy", 0), ("stalled", 1)])
def test_json_output_matches_report(tmp_path, shape, code):
    run = make_run(tmp_path, n=40, ratio=(lambda i: 1.3) if shape == "stalled" else (lambda i: 0.5), config=ASYNC)
    report = diagnose(run)
    out = io.StringIO()
    assert run_doctor(run, as_json=True, stream=out) == code
    d = json.loads(out.getvalue())
    assert d == report_to_dict(report)
    assert d["exit_code"] == code == report.exit_code
    assert d["verdict"] == report.verdict == ("two-clocks" if code else "healthy")
    sig = {s["signal"]: s["verdict"] for s in d["signals"]}
    assert sig["rt_ut_ratio_w50"] == ("two-clocks" if code else "healthy")
    items = {c["item"]: c["status"] for c in d["checklist"]}
    assert items["GPU memory < 85%"] == "not-checkable"
    assert d["run"]["env"] == "reach_sparse" and d["run"]["iterations"] == 40


def test_main_json_flag(tmp_path, capsys):
    run = make_run(tmp_path, n=40, ratio=lambda i: 1.3)
    assert doctor.main([str(run), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["verdict"] == "two-clocks"


# --------------------------------------------------------------------------- checklist
def _items(report) -> dict:
    return {r.signal: r.verdict for r in report.checklist}


def test_checklist_follows_files_and_config(tmp_path):
    sweep = tmp_path / "sweep"
    run = make_run(sweep, n=25, act=lambda i: 0.04)  # reward gap ~25 steps -> window 12.5-20; 16 fits
    items = _items(diagnose(run))
    assert items["diagnostics logged"] == "ok"
    assert items["latency baseline"] == "missing"
    assert items["batch <= 0.7 x critical"] == "not-checkable"
    assert items["DRBS on"] == "ok"
    assert items["HAE window calibrated"] == "ok"
    assert items["LR schedule on wall time"] == "ok"
    assert items["reward-event unit test"] == "not-checkable"
    assert items["GPU memory < 85%"] == "not-checkable"

    runlog.write_json(sweep / "profile.json", {"rows": []})
    runlog.write_json(sweep / "summary.json", {"b_crit": 1000.0})
    report = diagnose(run)
    items = _items(report)
    assert items["latency baseline"] == "ok"
    assert items["batch <= 0.7 x critical"] == "ok"
    assert report.row("batch <= 0.7 x critical").data["limit"] == pytest.approx(700.0)

    runlog.write_json(sweep / "summary.json", {"b_crit": 80})  # 64 > 0.7 * 80 = 56
    assert _items(diagnose(run))["batch <= 0.7 x critical"] == "missing"
    runlog.write_json(sweep / "summary.json", {"b_crit": None})
    assert _items(diagnose(run))["batch <= 0.7 x critical"] == "not-checkable"


@pytest.mark.parametrize("window, act, expected", [
    (16, 0.04, "ok"),        # gap 25 -> 12.5..20
    (16, 0.2, "missing"),    # gap 5 -> 2.5..4
    (4, 0.04, "missing"),
    (32, 0.001, "ok"),       # gap 1000 -> capped at unroll_length 32
    (16, 0.0, "ok"),         # no reward event to calibrate against: config alone
])
def test_hae_window_calibration(tmp_path, window, act, expected):
    run = make_run(tmp_path, n=25, act=lambda i: act, config={"hae_window": window}, noise=0.0)
    row = diagnose(run).row("HAE window calibrated")
    assert row.verdict == expected, row.value


def test_profile_in_run_dir_counts(tmp_path):
    run = make_run(tmp_path, n=10)
    runlog.write_json(run / "profile.json", {"rows": []})
    assert _items(diagnose(run))["latency baseline"] == "ok"


def test_checklist_config_fields(tmp_path):
    run = make_run(tmp_path, "a", n=10, config={"drbs": {"enabled": False}, "advantage": "gae", "lr_clock": "steps"})
    items = _items(diagnose(run))
    assert items["DRBS on"] == items["HAE window calibrated"] == items["LR schedule on wall time"] == "missing"
    run = make_run(tmp_path, "b", n=10, config={"advantage": "hae", "hae_window": None, "lr_clock": "wall"})
    items = _items(diagnose(run))
    assert items["HAE window calibrated"] == "missing" and items["LR schedule on wall time"] == "ok"
    cfg = {k: v for k, v in BASE_CONFIG.items() if k not in ("drbs", "advantage", "hae_window", "lr_clock")}
    writer = RunWriter(tmp_path / "c", cfg)
    for rec in runlog.read_metrics(run):
        writer.log(rec)
    writer.close()
    items = _items(diagnose(tmp_path / "c"))
    for item in ("DRBS on", "HAE window calibrated", "LR schedule on wall time"):
        assert items[item] == "not-checkable"
    # checklist advice never changes the exit code
    assert diagnose(tmp_path / "c").exit_code == diagnose(run).exit_code == 0


def test_missing_config_is_tolerated(tmp_path):
    run = make_run(tmp_path, n=25)
    (run / runlog.CONFIG_FILE).unlink()
    report = diagnose(run)
    assert report.exit_code == 0
    assert any("config.yaml" in n for n in report.notes)
    assert _items(report)["DRBS on"] == "not-checkable"
    assert "unroll_length unknown" in report.row("b_simple").value


# --------------------------------------------------------------------------- helpers and hygiene
def test_helpers():
    assert doctor_rules.streaks([False, True, True, False, True]) == [(1, 2), (4, 4)]
    assert doctor_rules.trailing_streak([True, False, True, True]) == 2
    assert doctor_rules.trailing_streak([]) == 0
    assert doctor_rules.flips([True, False, False, True, False]) == 3
    x = np.arange(10.0)
    assert doctor_rules.slope(x, 3 * x + 1) == pytest.approx(3.0)
    assert doctor_rules.slope(np.ones(4), x[:4]) is None


def test_no_jax_and_no_direct_file_reads():
    code = ("import sys, tclock.doctor, tclock.plots; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'brax', 'optax') "
            "or m.startswith(('tclock.loop', 'tclock.agents'))]; print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    for mod in (doctor, doctor_rules, doctor_gradients, doctor_checklist, doctor_diagnose, plots):
        src = Path(mod.__file__).read_text()
        for forbidden in ("open(", "read_text(", "json.load(", "json.loads(", "yaml."):
            assert forbidden not in src, (mod.__name__, forbidden)


def test_low_gdc_and_skew_on_a_solved_task_are_watch_not_two_clocks(tmp_path):
    # success = clip(3 * act): act 0.4 -> success ~1.0 throughout the last 10 iterations.
    solved = diagnose(make_run(tmp_path, name="solved", n=40, act=lambda i: 0.4, gdc=lambda i: 0.1,
                               skew=lambda i: 3.0))
    assert writeup(solved.row("gdc")) == "watch" and "task is solved" in solved.row("gdc").value
    assert solved.row("adv_skew").verdict == "watch"
    assert solved.exit_code == 0
    # The same gradients while still learning (success ~0.3): the write-up's two-clocks sign, reported only.
    learning = diagnose(make_run(tmp_path, name="learning", n=40, act=lambda i: 0.1, gdc=lambda i: 0.1,
                                 skew=lambda i: 3.0))
    assert writeup(learning.row("gdc")) == "two-clocks" and learning.exit_code == 0


# --------------------------------------------------------------------------- the calibrated batch verdict
def noisy_run(root, name, num_envs, b_crit, n=40, seed=0, improving=True, source="gradient"):
    """A run that logs per-env noise estimates of ``source`` (tclock.online_critical.SOURCES:
    ``gradient`` or ``update``) whose windowed ratio is ``b_crit`` envs (each estimate of the
    signal noisy, some negative), and a return that rises when ``improving``."""
    rng = np.random.default_rng(seed)
    extra = {}
    trace_key, signal_key = online_critical.SOURCES[source]

    def make(i):
        g2 = 1.0 + 1.0 * rng.normal(size=3)
        return {signal_key: g2.tolist(), trace_key: (b_crit * (1.0 + 0.2 * rng.normal(size=3))).tolist()}

    run = make_run(root, name=name, n=n, config={"num_envs": num_envs, "noise_window": 20},
                   ret_step=lambda i, w: 1.0 if improving else 0.0, gdc=lambda i: 0.2, gdc_every=1, seed=seed)
    records = runlog.read_metrics(run)
    for r in records:
        r.update(make(r["iteration"]))
        extra[r["iteration"]] = r
    writer = RunWriter(run, runlog.read_config(run))
    for r in records:
        writer.log(r)
    writer.mark("finished")
    writer.close()
    return run


def in_sweep(root, b_crit, ci=None, time_fit=None):
    """A sweep directory whose summary.json holds a measured B_crit (what the verdict rests on)."""
    root.mkdir(parents=True, exist_ok=True)
    runlog.write_json(root / "summary.json", {"b_crit": b_crit, "b_crit_ci": ci or [0.5 * b_crit, 1.5 * b_crit],
                                              "time_fit": time_fit})
    return root


@pytest.mark.parametrize("seed", range(3))
def test_batch_well_above_the_measured_critical_batch_is_flagged_with_its_cost(tmp_path, seed):
    report = diagnose(noisy_run(in_sweep(tmp_path, 100.0), "B1024", num_envs=1024, b_crit=30.0, seed=seed))
    row = report.row("critical_batch")
    assert row.verdict == "two-clocks" and report.exit_code == 1 and row.data["class"] == "above", row.value
    assert row.data["env_steps_vs_min"] == pytest.approx(1 + 1024 / 100.0)
    assert 15 < row.data["b_crit_online_envs"] < 60  # reported beside it
    assert "the minimum" in row.value and "try B ≈ 100" in row.value
    assert "another base seed's sweep" in row.value  # what the verdict's validation is


@pytest.mark.parametrize("num_envs, expected", [(32, "healthy"), (64, "healthy"), (150, "watch"), (201, "two-clocks")])
def test_batch_classes_follow_the_measured_critical_batch(tmp_path, num_envs, expected):
    report = diagnose(noisy_run(in_sweep(tmp_path, 100.0), f"B{num_envs}", num_envs=num_envs, b_crit=30.0))
    assert report.row("critical_batch").verdict == expected
    assert report.exit_code == (1 if expected == "two-clocks" else 0)


@pytest.mark.parametrize("seed", range(3))
def test_online_estimate_alone_is_reported_not_judged(tmp_path, seed):
    """Without a sweep the doctor reports the online estimate with its arithmetic, as info: it is
    not validated as a verdict yet, so a normal run is never flagged on it."""
    report = diagnose(noisy_run(tmp_path, "alone", num_envs=1024, b_crit=100.0, seed=seed))
    row = report.row("critical_batch")
    assert row.verdict == "info" and row.data["class"] == "above" and "not validated" in row.value
    assert "try B" not in row.value and "suggested_num_envs" not in row.data  # no advice the validation lacks
    assert 55 < row.data["b_crit_online_envs"] < 200  # the windowed ratio, not one noisy estimate
    assert report.exit_code == 0


@pytest.mark.parametrize("num_envs, expected", [(32, "healthy"), (150, "watch"), (1024, "two-clocks")])
def test_a_validated_online_source_gives_the_batch_verdict(tmp_path, monkeypatch, num_envs, expected):
    """The gate: a source in doctor_batch.ONLINE_VALIDATED judges the batch without a sweep, with
    the cost and the advice; the same run is info while the source is not validated (as shipped:
    the learning phase's noise missed the >= 90% target on the B x lr grids, RESULTS.md)."""
    from tclock import doctor_batch

    run = noisy_run(tmp_path, f"B{num_envs}", num_envs=num_envs, b_crit=100.0, source="update")
    shipped = diagnose(run)
    assert shipped.row("critical_batch").verdict == "info" and shipped.exit_code == 0
    monkeypatch.setattr(doctor_batch, "ONLINE_VALIDATED", ("update",))
    report = diagnose(run)
    row = report.row("critical_batch")
    assert row.verdict == expected and row.data["online_source"] == "update", row.value
    assert ("try B ≈" in row.value) == (expected == "two-clocks")
    assert report.exit_code == (1 if expected == "two-clocks" else 0)


@pytest.mark.parametrize("seed", range(3))
def test_batch_below_the_critical_batch_and_improving_is_not_flagged(tmp_path, seed):
    report = diagnose(noisy_run(in_sweep(tmp_path, 300.0), "B32", num_envs=32, b_crit=300.0, seed=seed))
    assert report.row("critical_batch").verdict == "healthy"
    assert report.row("gdc").verdict == "info"  # low GDC (0.2) is reported, not a verdict
    assert report.exit_code == 0 and report.verdict != "two-clocks"


def test_batch_advice_uses_the_wall_clock_optimum_when_the_sweep_timed_it(tmp_path):
    sweep = in_sweep(tmp_path, 100.0, time_fit={"a": 0.04, "k": 0.0004})
    row = diagnose(noisy_run(sweep, "B1024", num_envs=1024, b_crit=30.0)).row("critical_batch")
    b_star = (100.0 * 0.04 / 0.0004) ** 0.5
    assert row.data["suggested_num_envs"] == pytest.approx(b_star) and "B* ≈ 100" in row.value


def test_staleness_is_judged_only_in_the_asynchronous_pipeline(tmp_path):
    sync = diagnose(make_run(tmp_path, name="sync", n=30))
    assert sync.row("staleness").verdict == "info"
    run = make_run(tmp_path, name="async", n=30, config=ASYNC)
    records = runlog.read_metrics(run)
    writer = RunWriter(run, runlog.read_config(run))
    for r in records:
        r.update(policy_lag=4, kl_behavior=[0.2, 0.2, 0.2])
        writer.log(r)
    writer.close()
    row = diagnose(run).row("staleness")
    assert row.verdict == "two-clocks" and row.data["policy_lag"] == 4


def test_an_untrustworthy_sweep_fit_is_not_used_as_a_measurement(tmp_path):
    root = in_sweep(tmp_path, 100.0)
    summary = runlog.read_json(root / "summary.json")
    runlog.write_json(root / "summary.json", {**summary, "b_crit_trusted": False, "b_crit_distrust": ["R² 0.3 < 0.8"]})
    report = diagnose(noisy_run(root, "B1024", num_envs=1024, b_crit=30.0))
    row = report.row("critical_batch")
    assert row.verdict == "info" and row.data["b_crit_sweep_envs"] is None and report.exit_code == 0


# --------------------------------------------------------------------------- the step size
def with_step_ratio(run: Path, ratio, every: int = 4, seed: int = 0) -> Path:
    """Adds ``step_ratio_online`` (per seed, log-normal noise around ``ratio(i)``) every ``every``
    iterations, as a run with the half learning phase logs it."""
    rng = np.random.default_rng(seed)
    records = runlog.read_metrics(run)
    writer = RunWriter(run, runlog.read_config(run))
    for r in records:
        if r["iteration"] % every == 0:
            r["step_ratio_online"] = (ratio(r["iteration"]) * np.exp(0.15 * rng.normal(size=3))).tolist()
        writer.log(r)
    writer.mark("finished")
    writer.close()
    return run


@pytest.fixture
def step_verdicts(monkeypatch):
    """The step-size rule as a verdict (as shipped: validated on B x lr grids)."""
    from tclock import doctor_batch

    monkeypatch.setattr(doctor_batch, "STEP_VERDICT_VALIDATED", True)


def test_the_step_rule_without_its_validation_is_reported_without_advice(tmp_path, monkeypatch):
    from tclock import doctor_batch

    monkeypatch.setattr(doctor_batch, "STEP_VERDICT_VALIDATED", False)
    report = diagnose(with_step_ratio(make_run(tmp_path, config={"lr": 3e-3}), lambda i: 2.6))
    row = report.row("step_size")
    assert row.verdict == "info" and row.data["class"] == "lr too large" and "not validated" in row.value
    assert "lower the lr" not in row.value and "no lr advice" in row.value
    assert report.batch_and_step["outcome"] == "neither" and report.exit_code == 0


@pytest.mark.parametrize("seed", range(3))
def test_lr_too_large_is_flagged_with_how_much_to_lower_it(tmp_path, seed, step_verdicts):
    run = with_step_ratio(make_run(tmp_path, config={"lr": 3e-3}, seed=seed), lambda i: 2.6, seed=seed)
    report = diagnose(run)
    row = report.row("step_size")
    assert row.verdict == "risk" and row.data["class"] == "lr too large", row.value
    assert 2.0 < row.data["lower_lr_by"] < 3.4 and "lower the lr by about" in row.value
    assert report.batch_and_step["outcome"] == "lr too large" and report.exit_code == 0


@pytest.mark.parametrize("seed", range(3))
def test_a_step_within_its_best_range_is_not_flagged(tmp_path, seed, step_verdicts):
    report = diagnose(with_step_ratio(make_run(tmp_path, seed=seed), lambda i: 0.9, seed=seed))
    assert report.row("step_size").verdict == "healthy"
    assert report.batch_and_step["outcome"] == "neither"


def test_the_step_is_judged_before_the_target_was_reached(tmp_path, step_verdicts):
    """success = 0.03 + 0.009 i crosses 0.5 near iteration 52: what happens after it does not count."""
    late = with_step_ratio(make_run(tmp_path, name="late", config={"target_success": 0.5}),
                           lambda i: 0.9 if i < 52 else 3.0)
    row = diagnose(late).row("step_size")
    assert row.verdict == "healthy" and 48 <= row.data["phase_end"] <= 56, row.value
    early = with_step_ratio(make_run(tmp_path, name="early", config={"target_success": 0.5}),
                            lambda i: 3.0 if i < 52 else 0.9)
    assert diagnose(early).row("step_size").verdict == "risk"


def test_step_size_not_measured_without_the_half_phase(tmp_path):
    row = diagnose(make_run(tmp_path)).row("step_size")
    assert row.verdict == "not-checkable" and "--noise-split" in row.value


def test_batch_above_is_the_outcome_when_the_step_is_fine(tmp_path):
    run = with_step_ratio(noisy_run(in_sweep(tmp_path, 100.0), "B1024", num_envs=1024, b_crit=30.0), lambda i: 0.9)
    report = diagnose(run)
    assert report.batch_and_step["outcome"] == "batch above" and report.exit_code == 1
    text = format_table(report)
    assert "batch and step size: batch above" in text
