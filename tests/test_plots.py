"""tclock.plots on synthetic run directories written with tclock.runlog.RunWriter."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from tclock import figures, plots, runlog
from tclock.plots import plot_run
from tclock.runlog import seed_matrix
from tclock.runlog import RunFormatError, RunWriter

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DIAG_KEYS = ("gdc", "gdc_policy", "gdc_value", "b_simple", "grad_norm_sq", "trace_sigma")


def make_run(root: Path, name: str = "run", n: int = 30, seeds: int = 2, drop: tuple = (), drbs: bool = False,
             null_early_return: bool = False) -> Path:
    rng = np.random.default_rng(1)
    cfg = {"env": "reach_sparse", "algo": "ppo", "num_envs": 64, "unroll_length": 32, "seeds": seeds}
    w = RunWriter(root / name, cfg)
    ratios = []
    for i in range(1, n + 1):
        r = None if i == 1 else float(0.5 + 0.05 * rng.normal())
        if r is not None:
            ratios.append(r)
        ret = [None if (null_early_return and i <= 5) else float(i + rng.normal()) for _ in range(seeds)]
        rec = {
            "iteration": i, "env_steps": i * 64 * 32, "wall_s": 0.2 * i, "rt_s": 0.1, "learn_s": 0.1,
            "ut_s": None if i == 1 else 0.2, "rt_ut_ratio": r,
            "rt_ut_ratio_w50": float(np.mean(ratios[-50:])) if ratios else None,
            "num_envs": (64 if i < n // 2 else 128) if drbs else 64, "compiles": 2,
            "episode_return": ret,
            "success_rate": rng.uniform(0, 1, seeds).tolist(),
            "activation_rate": rng.uniform(0, 0.1, seeds).tolist(),
            "adv_skew": rng.normal(0.5, 0.5, seeds).tolist(),
        }
        if i % 5 == 0:
            rec.update({"gdc": rng.uniform(0.8, 0.95, seeds).tolist(), "gdc_policy": [0.9] * seeds,
                        "gdc_value": [0.7] * seeds,
                        "b_simple": [None if i == 10 else 500.0 * i, -1.0 if i == 15 else 400.0][:seeds] +
                                    [300.0] * (seeds - 2),
                        "grad_norm_sq": [1.0] * seeds, "trace_sigma": [1.0] * seeds})
        for k in drop:
            rec.pop(k, None)
        w.log(rec)
    w.close()
    return root / name


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_all_figures_written(tmp_path):
    run = make_run(tmp_path)
    paths = plot_run(run)
    assert [p.name for p in paths] == list(plots.FIGURES)
    for p in paths:
        assert p.parent == run and p.stat().st_size > 5000
        png_size(p)
    assert png_size(run / "return.png") == (12 * figures.DPI, int(7.5 * figures.DPI))
    assert png_size(run / "rt_ut.png") == (11 * figures.DPI, 5 * figures.DPI)
    assert not list(run.glob(".*.tmp"))


def test_out_dir(tmp_path):
    run = make_run(tmp_path)
    out = tmp_path / "figs"
    paths = plot_run(run, out_dir=out)
    assert {p.name for p in paths} == set(plots.FIGURES)
    assert all(p.parent == out for p in paths)
    assert not list(run.glob("*.png"))


def test_figures_skipped_when_keys_absent(tmp_path):
    run = make_run(tmp_path, drop=DIAG_KEYS + ("adv_skew",))
    names = [p.name for p in plot_run(run)]
    assert names == ["return.png", "rt_ut.png", "activation.png"]
    assert not (run / "gdc.png").exists() and not (run / "adv_skew.png").exists()


def test_minimal_records_only_rt_ut(tmp_path):
    w = RunWriter(tmp_path / "m", {"env": "x"})
    for i in range(1, 6):
        w.log({"iteration": i, "rt_ut_ratio": None if i == 1 else 0.4})
    w.close()
    assert [p.name for p in plot_run(tmp_path / "m")] == ["rt_ut.png"]


def test_nulls_and_drbs_do_not_crash(tmp_path):
    run = make_run(tmp_path, seeds=3, drbs=True, null_early_return=True, drop=("gdc", "gdc_policy", "gdc_value"))
    names = [p.name for p in plot_run(run)]
    assert "gdc.png" in names  # b_simple alone still gives the figure
    assert "return.png" in names and "rt_ut.png" in names


def test_single_iteration_run(tmp_path):
    run = make_run(tmp_path, n=1)
    names = [p.name for p in plot_run(run)]
    assert "rt_ut.png" not in names  # the first ratio is null: nothing to plot
    assert "return.png" in names


def test_unreadable_runs_raise(tmp_path):
    with pytest.raises(RunFormatError, match="not a directory"):
        plot_run(tmp_path / "missing")
    w = RunWriter(tmp_path / "empty", {"env": "x"})
    w.close()
    with pytest.raises(RunFormatError, match="no records"):
        plot_run(tmp_path / "empty")


def test_seed_matrix():
    recs = [
        {"iteration": 1, "a": [1.0, None], "s": 0.5},
        {"iteration": 2, "s": None},
        {"iteration": 3, "a": [2.0, 3.0, 4.0], "s": 2},
    ]
    its, m = seed_matrix(recs, "a")
    assert its.tolist() == [1, 3]
    assert m.shape == (2, 3)
    np.testing.assert_array_equal(m, [[1.0, np.nan, np.nan], [2.0, 3.0, 4.0]])
    its, m = seed_matrix(recs, "a", keep_missing=True)
    assert its.tolist() == [1, 2, 3] and m.shape == (3, 3) and np.isnan(m[1]).all()
    its, m = seed_matrix(recs, "s")
    assert m.shape == (3, 1)
    np.testing.assert_array_equal(m[:, 0], [0.5, np.nan, 2.0])
    its, m = seed_matrix(recs, "absent")
    assert its.shape == (0,) and m.shape == (0, 0)
    np.testing.assert_allclose(runlog.nanmean_rows(np.array([[1.0, np.nan], [np.nan, np.nan]])), [1.0, np.nan])
    with pytest.raises(RunFormatError, match="iteration 2.*'a'"):
        seed_matrix([{"iteration": 2, "a": ["x"]}], "a")


def test_trailing_mean():
    v = np.array([np.nan, 1.0, 3.0, np.nan, 5.0])
    np.testing.assert_allclose(runlog.trailing_mean(v, 2), [np.nan, 1.0, 2.0, 2.0, 4.0])
