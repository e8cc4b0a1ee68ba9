"""tclock.profile: the rollout-latency pre-flight (write-up 5.5), on a real small pointmass_reach."""
from __future__ import annotations

import json
import math

import pytest

from tclock import runlog
from tclock.config import ConfigError, TrainConfig
from tclock.profile import format_profile, profile, profile_config

SMALL = TrainConfig(env="pointmass_reach", policy_hidden=(16,), value_hidden=(16,), gdc_every=0,
                    num_minibatches=4, num_epochs=1)
SIZES, T, EVERY = (16, 32), 20, 1000


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile")
    lines: list[str] = []
    result = profile(SMALL, batch_sizes=SIZES, rollout_steps=T, update_every=EVERY, repeats=2,
                     with_update=True, out_dir=out, announce=lines.append)
    return result, out, lines


def test_files_exist_and_parse(profiled):
    result, out, _ = profiled
    saved = runlog.read_json(out / "profile.json")
    assert saved["env"] == "pointmass_reach"
    assert saved["rollout_steps"] == T and saved["update_every"] == EVERY
    assert [r["batch_size"] for r in saved["rows"]] == list(SIZES)
    assert json.loads((out / "profile.json").read_text())["backend"] == result["backend"]
    md = (out / "profile.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| batch_size"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    for name in ("batch_size", "rollout_s", "env_steps_per_s", "RT_UT_ratio_est", "rt_ut_measured", "compile_s"):
        assert name in cols
    body = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| batch_size")]
    assert len(body) == len(SIZES)
    for line, b in zip(body, SIZES):
        cells = dict(zip(cols, (c.strip() for c in line.strip("|").split("|"))))
        assert int(cells["batch_size"]) == b
        assert float(cells["rollout_s"]) >= 0 and float(cells["rt_ut_measured"]) > 0
    assert "B*rollout_steps/update_every" in md  # the estimate's caveat travels with the table


def test_rows_times_and_ratios(profiled):
    result, _, _ = profiled
    assert result["backend"] and result["device"]
    for row in result["rows"]:
        b = row["batch_size"]
        for key in ("rollout_s", "update_s", "compile_s", "update_compile_s", "env_steps_per_s"):
            assert row[key] > 0 and math.isfinite(row[key]), key
        assert row["env_steps_per_s"] == pytest.approx(b * T / row["rollout_s"], rel=1e-9)
        # the write-up's estimate, recomputed from this row's own numbers
        assert row["RT_UT_ratio_est"] == pytest.approx(row["rollout_s"] / (EVERY / row["env_steps_per_s"]), rel=1e-9)
        assert row["RT_UT_ratio_est"] == pytest.approx(b * T / EVERY, rel=1e-9)  # the identity it reduces to
        assert 0.0 < row["rt_ut_measured"] < 1.0
        assert row["rt_ut_measured"] == pytest.approx(row["rollout_s"] / (row["rollout_s"] + row["update_s"]))
    fit = result["fit"]
    assert fit["n_points"] == 2 and math.isfinite(fit["a"]) and math.isfinite(fit["k"])
    # estimate = B*T/1000 = 0.32, 0.64: below 0.7 everywhere
    assert result["crossings"]["estimate"] == {"0.7": None, "1.0": None}
    assert set(result["crossings"]["measured"]) == {"0.7", "1.0"}
    assert result["total_s"] > 0


def test_format_and_progress(profiled):
    result, _, lines = profiled
    text = format_profile(result)
    assert "compile_s" in text and "estimate never crosses in the profiled range" in text
    assert any("B=16" in s and "compiling rollout" in s for s in lines)
    assert any("B=32" in s and "timing" in s for s in lines)


def test_verdict_names_crossings():
    fake = {"env": "x", "algo": "ppo", "backend": "cpu", "device": "cpu", "rollout_steps": 100,
            "update_every": 1000, "repeats": 1, "total_s": 1.0, "notes": [], "fit": None,
            "rows": [{"batch_size": b, "rollout_s": 0.1, "update_s": None, "env_steps_per_s": 1.0,
                      "RT_UT_ratio_est": b * 100 / 1000, "rt_ut_measured": None, "compile_s": 1.0,
                      "update_compile_s": None} for b in (4, 8, 16)],
            "crossings": {"estimate": {"0.7": 8, "1.0": 16}, "measured": None}}
    assert "estimate crosses 0.7 at B=8, 1.0 at B=16" in format_profile(fake)


@pytest.mark.parametrize("kwargs, field", [
    ({"batch_sizes": (16, 0)}, "batch_sizes"),
    ({"batch_sizes": (-8,)}, "batch_sizes"),
    ({"batch_sizes": (16, 16)}, "batch_sizes"),
    ({"batch_sizes": ()}, "batch_sizes"),
    ({"batch_sizes": 64}, "batch_sizes"),
    ({"rollout_steps": 0}, "rollout_steps"),
    ({"rollout_steps": -5}, "rollout_steps"),
    ({"update_every": 0}, "update_every"),
    ({"update_every": 2.5}, "update_every"),
    ({"repeats": 0}, "repeats"),
])
def test_bad_inputs_raise_before_compiling(kwargs, field):
    args = {"batch_sizes": (16, 32), "rollout_steps": 20, "update_every": 1000, "announce": None, **kwargs}
    with pytest.raises(ConfigError, match=rf"^{field}:"):
        profile(SMALL, **args)


def test_bad_config_fails_before_compiling():
    with pytest.raises(ConfigError, match="^lr:"):
        profile(SMALL.replace(lr=-1.0), batch_sizes=(16,), rollout_steps=20, announce=None)


def test_num_minibatches_adjusted_to_nearest_divisor():
    cfg, notes = profile_config(SMALL.replace(num_minibatches=7), 16, 20)  # 320 transitions
    assert 320 % cfg.num_minibatches == 0 and cfg.num_minibatches == 8
    assert notes and "num_minibatches" in notes[0] and "8" in notes[0]
    cfg, notes = profile_config(SMALL, 16, 20)
    assert cfg.num_minibatches == 4 and notes == []
    assert (cfg.num_envs, cfg.unroll_length, cfg.seeds) == (16, 20, 1)
    cfg, _ = profile_config(SMALL.replace(num_minibatches=6), 16, 20)  # divisors of 320 near 6: 5 (off by 1), 8 (off by 2)
    assert cfg.num_minibatches == 5
