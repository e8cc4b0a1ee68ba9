"""The threshold analysis of experiments/calibration.py (experiments/lr_batch.py's
``flag_agreement`` and ``held_out_thresholds``) on synthetic labelled runs whose answer is worked
out by hand: pure Python, nothing trains."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))
import lr_batch  # noqa: E402  (experiments/lr_batch.py)

EVERY = lr_batch.BATCH_SETS["every lr"]


def _runs(above, below, label="batch above"):
    """Runs at B = 100 whose online estimate puts B / estimate at the given ratios."""
    return ([{"batch_label": "above", "num_envs": 100, "b_crit_online_envs": 100 / r, "label": label} for r in above]
            + [{"batch_label": "below", "num_envs": 100, "b_crit_online_envs": 100 / r, "label": "neither"}
               for r in below])


# Two tasks whose estimate separates the classes at B / estimate = 1, and one whose estimate reads
# about 2x too low (its below runs sit at 1.2x and 2.5x): no single threshold serves all three.
DATA = {"a": {"cells": _runs([1.2, 3.0], [0.4, 0.9])},
        "b": {"cells": _runs([1.3, 4.0], [0.3, 0.8])},
        "c": {"cells": _runs([4.0, 6.0], [1.2, 2.5])},
        "unlabelled": {"cells": [{"batch_label": None, "num_envs": 100, "b_crit_online_envs": 50.0, "label": "neither"}]}}


def test_flag_agreement_counts_each_class_at_a_threshold():
    rows = [r for d in DATA.values() for r in d["cells"]]
    assert lr_batch.flag_agreement(rows, EVERY, 1.0) == {"above": {"n": 6, "agree": 6}, "below": {"n": 6, "agree": 4}}
    assert lr_batch.flag_agreement(rows, EVERY, 3.0) == {"above": {"n": 6, "agree": 3}, "below": {"n": 6, "agree": 6}}
    # ratio exactly at the threshold is not flagged (the doctor's rule is B > t x estimate)
    assert lr_batch.flag_agreement(DATA["a"]["cells"], EVERY, 3.0)["above"]["agree"] == 0


def test_a_run_without_an_online_estimate_is_not_flagged():
    rows = [{"batch_label": "above", "num_envs": 512, "b_crit_online_envs": None, "label": "batch above"},
            {"batch_label": "below", "num_envs": 16, "b_crit_online_envs": None, "label": "neither"}]
    assert lr_batch.flag_agreement(rows, EVERY, 1.0) == {"above": {"n": 1, "agree": 0}, "below": {"n": 1, "agree": 1}}


def test_the_run_set_filter_applies():
    rows = _runs([3.0], [0.5]) + _runs([0.2], [], label="lr too large")
    keep = lr_batch.BATCH_SETS["every lr but 'lr too large'"]
    assert lr_batch.flag_agreement(rows, keep, 1.0) == {"above": {"n": 1, "agree": 1}, "below": {"n": 1, "agree": 1}}


def test_held_out_threshold_is_chosen_on_the_other_tasks_only():
    out = lr_batch.held_out_thresholds(DATA, EVERY)
    # held out c: a and b separate perfectly at 1 only; c's below runs (1.2x, 2.5x) are then flagged
    # held out a: b + c score 3 of 4 on their worse class at 1.5, 2 and 3 (1 gives 2 of 4): the tie goes to 3
    # held out b: a + c score 3 of 4 at 1.5 and 2 (3 gives 2 of 4 above): the tie goes to 2
    assert {t: v["threshold"] for t, v in out["per_task"].items()} == {"a": 3.0, "b": 2.0, "c": 1.0}
    assert out["per_task"]["c"]["below"] == {"n": 2, "agree": 0}
    assert out["per_task"]["a"]["above"] == {"n": 2, "agree": 0}  # 1.2x and 3.0x are not above 3
    assert out["pooled"] == {"above": {"n": 6, "agree": 3}, "below": {"n": 6, "agree": 4}}
    assert "unlabelled" not in out["per_task"]  # no labelled run: nothing to hold out


def test_held_out_agrees_fully_when_every_task_shares_the_threshold():
    data = {t: {"cells": _runs([1.5, 5.0], [0.3, 0.7])} for t in "xyz"}
    out = lr_batch.held_out_thresholds(data, EVERY)
    # 0.75 and 1 both separate these runs (at 1.5 the 1.5x run is not flagged): the tie goes to 1
    assert {v["threshold"] for v in out["per_task"].values()} == {1.0}
    assert out["pooled"] == {"above": {"n": 6, "agree": 6}, "below": {"n": 6, "agree": 6}}
