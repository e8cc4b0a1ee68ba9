"""The doctor against an independent sweep (experiments/calibration.py's ``independent_judgements``,
experiments/lr_batch.py's ``relabelled`` and ``doctor_agreement``) on synthetic grids whose answer
is worked out by hand, written as real results.json files: pure Python, nothing trains."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))
import calibration  # noqa: E402  (experiments/calibration.py)
import lr_batch  # noqa: E402

EVERY = lr_batch.BATCH_SETS["every lr"]


def _cell(b, lr, doctor, label="neither", best=False):
    return {"num_envs": b, "lr": lr, "doctor": doctor, "label": label, "best_lr": best,
            "batch_label": "stale: relabelled replaces it"}


def _grid(b_crit, trusted, cells):
    return {"tuned": {"b_crit": b_crit, "trusted": trusted}, "cells": cells}


def test_batch_label_is_the_issues_two_sided_margin():
    assert [lr_batch.batch_label(b, 100.0) for b in (49, 50, 100, 200, 201)] == ["below", None, None, None, "above"]
    assert lr_batch.batch_label(512, float("nan")) is None and lr_batch.batch_label(512, None) is None


def test_relabelled_takes_the_other_grids_b_crit_and_step_labels():
    judged = [_cell(16, 1e-3, "neither"), _cell(100, 1e-3, "neither"), _cell(256, 1e-3, "batch above"),
              _cell(256, 1e-1, "lr too large")]
    other = _grid(100.0, True, [_cell(256, 1e-1, "x", label="lr too large"), _cell(256, 1e-3, "x", label="batch above")])
    rows = lr_batch.relabelled(judged, other)
    assert [(r["batch_label"], r["label"]) for r in rows] == [
        ("below", "neither"), (None, "neither"), ("above", "batch above"), ("above", "lr too large")]
    assert lr_batch.relabelled(judged, _grid(100.0, False, other["cells"])) == []  # an untrusted fit: no labels


def test_doctor_agreement_counts_only_a_batch_above_outcome_as_a_flag():
    rows = [{"batch_label": "above", "doctor": d, "label": "neither"} for d in ("batch above", "lr too large", "neither")]
    rows += [{"batch_label": "below", "doctor": d, "label": "neither"} for d in ("neither", "lr too large", "batch above")]
    rows += [{"batch_label": None, "doctor": "batch above", "label": "neither"}]  # between the margins: unscored
    assert lr_batch.doctor_agreement(rows, EVERY) == {"above": {"n": 3, "agree": 1}, "below": {"n": 3, "agree": 2}}


def _write(folder: Path, data: dict) -> str:
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"experiment": "lr_batch", "data": data}), encoding="utf-8")
    return str(folder)


def test_independent_judgements_score_each_grid_against_the_other_both_ways(tmp_path):
    # task t: grid a (B_crit 100, trusted) and grid b (B_crit 60, trusted); task u only in a.
    a = _write(tmp_path / "a", {"t": _grid(100.0, True, [_cell(16, 1e-3, "neither"), _cell(150, 1e-3, "batch above"),
                                                        _cell(512, 1e-3, "batch above")]),
                                "u": _grid(50.0, True, [_cell(512, 1e-3, "batch above")])})
    b = _write(tmp_path / "b", {"t": _grid(60.0, True, [_cell(16, 1e-3, "neither"), _cell(150, 1e-3, "batch above"),
                                                        _cell(512, 1e-3, "neither")])})
    out = calibration.independent_judgements([f"{a}:{b}"])
    assert [(j["task"], j["judged"], j["labels"]) for j in out] == [("t", a, b), ("t", b, a)]
    # a's runs by b's B_crit 60: 16 below (not flagged: agrees), 150 and 512 above (both flagged)
    assert lr_batch.doctor_agreement(out[0]["rows"], EVERY) == {"above": {"n": 2, "agree": 2}, "below": {"n": 1, "agree": 1}}
    # b's runs by a's B_crit 100: 150 is between the margins, 512 above but b's doctor did not flag it
    assert lr_batch.doctor_agreement(out[1]["rows"], EVERY) == {"above": {"n": 1, "agree": 0}, "below": {"n": 1, "agree": 1}}
    pooled = calibration.pooled_agreement(out, EVERY)
    assert pooled == {"above": {"n": 3, "agree": 2}, "below": {"n": 2, "agree": 2}}


def test_a_judgement_with_an_untrusted_judging_sweep_can_be_left_out_of_the_pool(tmp_path):
    a = _write(tmp_path / "a", {"t": _grid(100.0, False, [_cell(512, 1e-3, "neither")])})
    b = _write(tmp_path / "b", {"t": _grid(100.0, True, [_cell(512, 1e-3, "batch above")])})
    out = calibration.independent_judgements([f"{a}:{b}"])
    assert [len(j["rows"]) for j in out] == [1, 0]  # a judged by b's labels; b gets none from a's untrusted fit
    assert calibration.pooled_agreement(out, EVERY)["above"] == {"n": 1, "agree": 0}
    assert calibration.pooled_agreement(out, EVERY, judged_trusted_only=True)["above"] == {"n": 0, "agree": 0}


def test_bad_pairs_are_refused_naming_the_flag(tmp_path):
    with pytest.raises(SystemExit, match="--pairs: 'only_one' is not GRID_A:GRID_B"):
        calibration.independent_judgements(["only_one"])
    a = _write(tmp_path / "a", {})
    with pytest.raises(SystemExit, match="--pairs: .*missing/results.json does not exist"):
        calibration.independent_judgements([f"{a}:{tmp_path / 'missing'}"])
