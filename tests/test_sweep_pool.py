"""tclock.sweep_pool: sweeps from different base seeds pooled into one, against a sweep written
with all the seeds directly (the known answer), and its refusals."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tclock import runlog
from tclock.sweep_pool import PoolError, pool_records, pool_sweeps
from tclock.sweep_report import summarize_sweep
from test_sweep_report import BATCHES, seed_steps, write_run

N_ITER = 400  # every run the same length, as two sweeps of one total_steps are


def sweep(root, steps_by_b, seed, **cfg):
    root.mkdir(parents=True)
    (root / "sweep.yaml").write_text("spec: {batch_sizes: [32, 64]}\nbase: {seeds: 3}\n")
    for B, steps in steps_by_b.items():
        write_run(root, B, steps, n_iter=N_ITER, cfg_extra={"seed": seed, **cfg})
    return root


@pytest.fixture(scope="module")
def steps():
    rng = np.random.default_rng(7)
    a = {B: seed_steps(B, 3, rng) for B in BATCHES}
    b = {B: seed_steps(B, 2, rng) for B in BATCHES}
    return a, b


def test_pooled_sweep_equals_a_sweep_of_all_the_seeds(tmp_path, steps):
    a, b = steps
    pooled = pool_sweeps([sweep(tmp_path / "s0", a, 0), sweep(tmp_path / "s1", b, 1)], tmp_path / "pool")
    direct = sweep(tmp_path / "direct", {B: a[B] + b[B] for B in BATCHES}, 0)
    got, want = summarize_sweep(pooled, write=False), summarize_sweep(direct, write=False)
    for g, w in zip(got["runs"], want["runs"]):
        assert g["seeds"] == 5
        assert g["steps_to_target"]["per_seed"] == w["steps_to_target"]["per_seed"]
        assert g["wall_to_target"]["per_seed"] == pytest.approx(w["wall_to_target"]["per_seed"])
    assert got["b_crit"] == pytest.approx(want["b_crit"])
    assert got["b_crit_ci"] == pytest.approx(want["b_crit_ci"])
    config = runlog.read_config(pooled / "B0032")
    assert config["seeds"] == 5 and [p["seed"] for p in config["pooled_from"]] == [0, 1]


def test_records_concatenate_seeds_repeat_scalars_and_fill_missing_keys():
    a = [{"iteration": 1, "env_steps": 8, "wall_s": 1.0, "success_rate": [0.1, 0.2], "only_a": 3.0}]
    b = [{"iteration": 1, "env_steps": 8, "wall_s": 2.5, "success_rate": [0.3]}]
    (row,) = pool_records([a, b], [2, 1])
    assert row == {"iteration": 1, "env_steps": 8, "wall_s": [1.0, 1.0, 2.5], "success_rate": [0.1, 0.2, 0.3],
                   "only_a": [3.0, 3.0, None]}


def test_rows_that_do_not_line_up_are_refused():
    a = [{"iteration": 1}, {"iteration": 2}]
    with pytest.raises(PoolError, match="iterations"):
        pool_records([a, a[:1]], [1, 1])
    with pytest.raises(PoolError, match="'iteration' differs"):
        pool_records([a, [{"iteration": 1}, {"iteration": 3}]], [1, 1])


def test_refusals_name_the_problem(tmp_path, steps):
    a, b = steps
    s0 = sweep(tmp_path / "s0", a, 0)
    with pytest.raises(PoolError, match="share a base seed"):
        pool_sweeps([s0, sweep(tmp_path / "same_seed", b, 0)], tmp_path / "p1")
    with pytest.raises(PoolError, match="lr: 0.001 vs 0.003"):
        pool_sweeps([s0, sweep(tmp_path / "other_lr", b, 1, lr=3e-3)], tmp_path / "p2")
    with pytest.raises(PoolError, match="different runs"):
        pool_sweeps([s0, sweep(tmp_path / "fewer", {32: b[32]}, 1)], tmp_path / "p3")
    with pytest.raises(PoolError, match="given twice"):
        pool_sweeps([s0, tmp_path / "s0"], tmp_path / "p4")
    unfinished = sweep(tmp_path / "unfinished", b, 2)
    runlog.write_text(unfinished / "B0064" / runlog.STATUS_FILE, json.dumps({"state": "running"}))
    with pytest.raises(PoolError, match="not 'finished'"):
        pool_sweeps([s0, unfinished], tmp_path / "p5")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(PoolError, match="not empty"):
        pool_sweeps([s0, sweep(tmp_path / "s1", b, 1)], tmp_path / "busy")
    assert not any((tmp_path / p).exists() for p in ("p1", "p2", "p3", "p4", "p5"))


def test_cli_pools_and_summarises(tmp_path, steps, capsys):
    from tclock.cli import main

    a, b = steps
    rc = main(["pool", str(sweep(tmp_path / "s0", a, 0)), str(sweep(tmp_path / "s1", b, 1)),
               "--out", str(tmp_path / "pool")])
    assert rc == 0
    summary = json.loads((tmp_path / "pool" / "summary.json").read_text())
    assert summary["runs"][0]["seeds"] == 5 and math.isfinite(summary["b_crit"])
    assert "B_crit" in capsys.readouterr().out
    assert main(["pool", str(tmp_path / "s0"), "--out", str(tmp_path / "again")]) == 2
