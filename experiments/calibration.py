"""The online critical batch against the sweep's, over every task with a B x lr grid: one
calibration table and figure, and the batch verdict's agreement over all labelled runs.

``lr_batch.py`` trains the grids (one results folder per invocation: the pointmass family, the
reacher on the spring pipeline, the same reacher with reach-and-hold success, the dense-reward
pointmass); this script trains nothing.  It reads
their ``results.json`` files and puts every task side by side:

* per task, the lr-tuned B_crit (90% CI) and each online estimator (median over B of the best-lr
  runs) with its ratio to it: within 2x counts as agreement (tclock's issue 11);
* the batch verdict from the online estimate alone (what ``tclock doctor`` says without a sweep)
  against labels from each task's tuned fit (above: B > 2 B_crit, below: B < B_crit / 2), per class,
  over all tasks together and per task;
* the reproducibility rows of any seed reruns given (``--seeds-from``);
* ``tclock doctor``'s batch verdict against an independent sweep (``--pairs``): where a task has
  grids from two base seeds, each grid's runs, judged by the doctor with their own grid's sweep
  (what it said when the grid was analysed), are labelled by the other grid's tuned B_crit (both
  ways round; an untrusted labelling fit gives no labels).

    python experiments/calibration.py --quick      # the committed lr_batch* results
    python experiments/calibration.py --quick --inputs experiments/results/lr_batch experiments/results/lr_batch_dense
"""
from __future__ import annotations

import json
import math
import common
import lr_batch
from common import fmt, md_table
from tclock import thresholds

NAME = "calibration"
# Where a task has grids from two base seeds, the pooled one (6 seeds per cell) is read: load() takes
# the grid with the most seeds.  reach-and-hold at 1.2M env steps (600k: lr_batch_reacher_hold).
# pointmass_reach's two base seeds (lr_batch, lr_batch_seed1) are not pooled: their runs were not kept.
INPUTS = ("experiments/results/lr_batch", "experiments/results/lr_batch_reacher", "experiments/results/lr_batch_dense",
          "experiments/results/lr_batch_dense_pooled", "experiments/results/lr_batch_reacher_hold_long",
          "experiments/results/lr_batch_reacher_hold_pooled", "experiments/results/lr_batch_reacher_hold_dense_pooled",
          "experiments/results/lr_batch_radii_pooled")
# (base seed 0, base seed 1) grids of the same tasks, sizes and lrs: the seed reruns and the doctor's
# independent labels read them.
SEED_PAIRS = (("experiments/results/lr_batch", "experiments/results/lr_batch_seed1"),
              ("experiments/results/lr_batch", "experiments/results/lr_batch_radii_seed1"),
              ("experiments/results/lr_batch_dense", "experiments/results/lr_batch_dense_seed1"),
              ("experiments/results/lr_batch_reacher_hold_long", "experiments/results/lr_batch_reacher_hold_long_seed1"),
              ("experiments/results/lr_batch_reacher_hold_dense", "experiments/results/lr_batch_reacher_hold_dense_seed1"))
SEED_RERUNS = tuple(rerun for _, rerun in SEED_PAIRS)
# The run sets the threshold analysis reads (lr_batch.BATCH_SETS): every run, and every run but the
# ones a smaller lr beat (the step-size rule's class, judged apart).
THRESHOLD_SETS = ("every lr", "every lr but 'lr too large'")
# What each task varies, for the table: the issue asks for >= 3 tasks, one a second physical system
# and one with a different reward structure.
KIND = {"pointmass_reach": "point mass, sparse reward (the default task)",
        "pointmass_reach_fine": "point mass, sparse, half the radius",
        "pointmass_reach_coarse": "point mass, sparse, twice the radius",
        "pointmass_reach_dense": "point mass, dense -distance reward",
        "reacher_sparse_spring": "two-link reacher (spring pipeline), sparse reward",
        "reacher_hold": "two-link reacher (spring pipeline), sparse reward, success = 2 cm held 10 steps",
        "reacher_hold_dense": "two-link reacher (spring pipeline), Brax's dense reward, success = 5 cm held 10 steps",
        "reacher_sparse": "two-link reacher, sparse reward"}
EXTRA_FLAGS = (
    (("--inputs",), {"nargs": "+", "default": list(INPUTS),
                     "help": "lr_batch results folders (each with results.json); where several hold a task, the "
                             "one with the most seeds wins, the later one on a tie"}),
    (("--seeds-from",), {"nargs": "*", "default": list(SEED_RERUNS),
                         "help": "lr_batch results folders of seed reruns (their reproducibility rows are listed)"}),
    (("--pairs",), {"nargs": "*", "default": [f"{a}:{b}" for a, b in SEED_PAIRS], "metavar": "GRID_A:GRID_B",
                    "help": "two lr_batch results folders of the same tasks from different base seeds; each one's "
                            "doctor verdicts are scored against the other's tuned B_crit"}),
)


def read_results(folder: str, flag: str) -> dict | None:
    """An lr_batch folder's ``results.json`` (None when absent); ``flag`` names the option in errors."""
    path = common.repo_path(folder) / "results.json"
    if not path.exists():
        return None
    results = json.loads(path.read_text(encoding="utf-8"))
    if results.get("experiment") != "lr_batch":
        raise SystemExit(f"{flag}: {path} is from {results.get('experiment')!r}, not lr_batch")
    return results


def load(folders) -> tuple[dict, dict]:
    """Every task's lr_batch ``data`` entry, and the folder it came from: where several folders
    hold a task, the grid with the most seeds per cell (a pooled one, ``lr_batch.py --pool``), the
    later folder on a tie."""
    data, source, seeds = {}, {}, {}
    for folder in folders:
        results = read_results(folder, "--inputs")
        if results is None:
            raise SystemExit(f"--inputs: {common.repo_path(folder) / 'results.json'} does not exist; run "
                             "experiments/lr_batch.py for it first (its docstring has the commands)")
        n = int((results.get("settings") or {}).get("seeds") or 0)
        for task, d in results["data"].items():
            if n >= seeds.get(task, 0):
                data[task], source[task], seeds[task] = d, str(folder), n
    return data, source


def seed_rows(folders) -> list[list]:
    rows = []
    for folder in folders:
        results = read_results(folder, "--seeds-from")
        if results is None:
            continue
        for c in results.get("claims", []):
            if c["id"] == "tuned_b_crit_reproducible":
                rows.append([str(folder), c["tclock"], c["verdict"]])
    return rows


def independent_judgements(pairs) -> list[dict]:
    """For every task both grids of a pair hold, both ways round: the judged grid's runs (their
    ``doctor`` class: tclock doctor with that grid's own sweep) labelled by the other grid's tuned
    B_crit (:func:`lr_batch.relabelled`; none when that fit is not trusted)."""
    out = []
    for pair in pairs:
        folders = pair.split(":")
        if len(folders) != 2 or not all(folders):
            raise SystemExit(f"--pairs: {pair!r} is not GRID_A:GRID_B (two lr_batch results folders)")
        results = [read_results(f, "--pairs") for f in folders]
        for f, r in zip(folders, results):
            if r is None:
                raise SystemExit(f"--pairs: {common.repo_path(f) / 'results.json'} does not exist; run "
                                 "experiments/lr_batch.py for it first (its docstring has the commands)")
        for task in sorted(results[0]["data"].keys() & results[1]["data"].keys()):
            grids = [(f, r["data"][task]) for f, r in zip(folders, results)]
            for (judged, j), (labels, lab) in (grids, grids[::-1]):
                out.append({"task": task, "judged": judged, "labels": labels, "judged_trusted": j["tuned"]["trusted"],
                            "labels_trusted": lab["tuned"]["trusted"], "rows": lr_batch.relabelled(j["cells"], lab)})
    return out


def pooled_agreement(judgements: list[dict], keep, judged_trusted_only: bool = False) -> dict:
    """:func:`lr_batch.doctor_agreement` over the runs of every judgement (only those whose judging
    sweep is trusted with ``judged_trusted_only``: the others get no batch verdict at all)."""
    rows = [r for j in judgements if j["judged_trusted"] or not judged_trusted_only for r in j["rows"]]
    return lr_batch.doctor_agreement(rows, keep)


def per_class_verdict(agreement: dict) -> str:
    """Issue 11's bar for a batch verdict: every class with runs agrees on >= 90% of them."""
    if all(x["n"] and x["agree"] / x["n"] >= 0.9 for x in agreement.values()):
        return "reproduced"
    return "partly" if any(x["agree"] for x in agreement.values()) else "not reproduced"


def main(argv=None) -> dict:
    args = common.parse_args(NAME, __doc__.splitlines()[0], argv, extra=EXTRA_FLAGS)
    data, source = load(args.inputs)
    if not data:
        raise SystemExit("--inputs: no tasks found in the given results")
    cal_rows, within = lr_batch.calibration(data)
    rows = [r for d in data.values() for r in d["cells"]]
    sets = {name: lr_batch.batch_agreement(rows, keep) for name, keep in lr_batch.BATCH_SETS.items()}
    per_task = {task: lr_batch.batch_agreement(d["cells"], lr_batch.BATCH_SETS["every lr"]) for task, d in data.items()}
    per_lr = {lr: lr_batch.batch_agreement([r for r in rows if r["lr"] == lr], lr_batch.BATCH_SETS["every lr"])
              for lr in sorted({r["lr"] for r in rows})}
    sizes = sorted({int(b) for d in data.values() for b in (d["online"].get("tuned_by_b") or {})})
    by_t = {name: {t: lr_batch.flag_agreement(rows, lr_batch.BATCH_SETS[name], t) for t in lr_batch.THRESHOLD_GRID}
            for name in THRESHOLD_SETS}
    held = {name: lr_batch.held_out_thresholds(data, lr_batch.BATCH_SETS[name]) for name in THRESHOLD_SETS}
    figures = [lr_batch.calibration_figure(args, data)]

    def frac(v):
        return f"{v['agree']} of {v['n']}" if v["n"] else "—"

    body = ["## Tasks", "",
            md_table(["task", "what it is", "grid from", "tuned fit"],
                     [[t, KIND.get(t, "—"), source[t], lr_batch._trust(data[t]["tuned"])] for t in data]), "",
            "A task whose tuned fit is not trusted gives no ground truth: its ratios below are shown, not counted "
            "as agreement, and its runs get no labels.", "",
            "## The online critical batch against the lr-tuned B_crit", "",
            "Online estimates in envs, median over B of the best-lr runs (ratio to the tuned B_crit in brackets). "
            "`update_run` is what `b_crit_online_envs` logs with the two-halves split on; `gradient_run` and "
            "`b_simple` (the old i.i.d.-transition estimate / T) are kept beside it.", "",
            md_table(["task", "tuned B_crit (90% CI)", "fixed lr 1e-3 B_crit (90% CI)"] + list(lr_batch.ESTIMATORS),
                     cal_rows), "",
            "`update_run` of the best-lr run at each B, and the slope of log(estimate) against log(B):", "",
            md_table(["task"] + [f"B={b}" for b in sizes] + ["slope"], lr_batch.by_b_rows(data, sizes)), "",
            "## The batch verdict from the online estimate alone, every task", "",
            "Labels from each task's tuned fit (above: B > 2 B_crit, below: B < B_crit / 2). An 'above' run agrees "
            "when the online class is above; a 'below' run agrees when it is not.", "",
            md_table(["runs", "label above: online above", "label below: online not above"],
                     [[name, frac(v["above"]), frac(v["below"])] for name, v in sets.items()]), "",
            "Per task, every lr:", "",
            md_table(["task", "above", "below"], [[t, frac(v["above"]), frac(v["below"])] for t, v in per_task.items()]),
            "", "Per lr, every task (where along the lr grid the online class misses):", "",
            md_table(["lr", "above", "below"], [[f"{lr:g}", frac(v["above"]), frac(v["below"])]
                                                for lr, v in per_lr.items()]),
            "",
            "## Would another threshold make it a verdict?", "",
            "The flag above at B > t x the run's online estimate, for each t of a grid fixed in advance (the "
            f"doctor's two-clocks is t = {thresholds.BATCH_ABOVE:g}, its watch t = {thresholds.BATCH_NEAR:g}); "
            "every task's labelled runs together:", "",
            md_table(["t", *[f"{name}: {cls}" for name in THRESHOLD_SETS for cls in ("above", "below")]],
                     [[f"{t:g}", *[frac(by_t[name][t][cls]) for name in THRESHOLD_SETS for cls in ("above", "below")]]
                      for t in lr_batch.THRESHOLD_GRID]), "",
            "Choosing t on the same runs flatters it, so each task is held out in turn: t is the grid value whose "
            "worse class agrees best over the other tasks (a tie goes to the larger t), scored on the held-out "
            "task only.", "",
            md_table(["task", *[f"{name}: t, above, below" for name in THRESHOLD_SETS]],
                     [[task, *[(f"{held[name]['per_task'][task]['threshold']:g}, "
                                f"{frac(held[name]['per_task'][task]['above'])}, "
                                f"{frac(held[name]['per_task'][task]['below'])}")
                               if task in held[name]["per_task"] else "—" for name in THRESHOLD_SETS]]
                      for task in data] +
                     [["**held out, pooled**", *[f"above {frac(held[name]['pooled']['above'])}, below "
                                                 f"{frac(held[name]['pooled']['below'])}" for name in THRESHOLD_SETS]]]),
            ""]
    seeds = seed_rows(args.seeds_from)
    if seeds:
        body += ["## Reproducibility (seed reruns)", "", md_table(["rerun", "tuned B_crit", "verdict"], seeds), ""]
    judgements = independent_judgements(args.pairs)
    doctor_sets = {name: {"every judging sweep": pooled_agreement(judgements, keep),
                          "trusted judging sweep": pooled_agreement(judgements, keep, judged_trusted_only=True)}
                   for name, keep in lr_batch.BATCH_SETS.items()}
    if judgements:
        def cell(j, keep):
            if not j["rows"]:
                return "— (labelling fit not trusted)"
            v = lr_batch.doctor_agreement(j["rows"], keep)
            return f"{frac(v['above'])}, {frac(v['below'])}"

        body += ["## The doctor against an independent sweep", "",
                 "Each grid's runs as `tclock doctor` judged them with their own grid's sweep (the lr-tuned B_crit, "
                 "used only when trusted; an untrusted one gets no batch verdict), labelled by the other base seed's "
                 "grid (above: B > 2 B_crit, below: B < B_crit / 2; 'lr too large' from the other grid's run at the "
                 "same B and lr). An 'above' run agrees when the doctor's outcome is 'batch above', a 'below' run "
                 "when it is anything else. Cells: above, below.", "",
                 md_table(["task", "judged (its fit)", "labels from (its fit)", *lr_batch.BATCH_SETS],
                          [[j["task"], f"{j['judged']} ({'trusted' if j['judged_trusted'] else 'not trusted'})",
                            f"{j['labels']} ({'trusted' if j['labels_trusted'] else 'not trusted'})",
                            *[cell(j, keep) for keep in lr_batch.BATCH_SETS.values()]] for j in judgements]), "",
                 "Pooled over every judgement with trusted labels:", "",
                 md_table(["runs", *[f"{w}: above, below" for w in ("every judging sweep", "trusted judging sweep")]],
                          [[name, *[f"{frac(v[w]['above'])}, {frac(v[w]['below'])}"
                                    for w in ("every judging sweep", "trusted judging sweep")]]
                           for name, v in doctor_sets.items()]), ""]

    claims = []
    for k in lr_batch.ESTIMATORS:
        got = within[k]
        claims.append(common.claim(f"online_{k}_vs_tuned_all", f"online `{k}` within 2x of the lr-tuned B_crit, "
                                   "every task", "— (tclock's issue 11: within 2x on >= 3 tasks)",
                                   f"{sum(got)} of {len(got)} tasks ("
                                   + ", ".join(f"{t}: {'yes' if w else 'no'}"
                                               + ("" if data[t]["tuned"].get("trusted") else " (fit not trusted)")
                                               for t, w in zip(data, got)) + ")",
                                   "reproduced" if got and all(got) and len(got) >= 3 else
                                   "partly" if any(got) else "not reproduced",
                                   "ratios in the calibration table; a task whose tuned fit is not finite or "
                                   "not trusted counts as no"))
    for name in ("best lr at each B", "every lr"):
        v = sets[name]
        claims.append(common.claim(f"online_batch_verdict_all_{name.replace(' ', '_')}",
                                   f"the online critical batch alone classes runs above / below ({name}, every task)",
                                   "— (tclock's issue 11: >= 90% per class, >= 2 tasks)",
                                   f"above {frac(v['above'])}, below {frac(v['below'])}",
                                   per_class_verdict(v), "labels from each task's tuned fit"))
    if judgements:
        given, every = doctor_sets["every lr"]["trusted judging sweep"], doctor_sets["every lr"]["every judging sweep"]
        tasks = sorted({j["task"] for j in judgements if j["rows"] and j["judged_trusted"]})
        claims.append(common.claim("doctor_batch_verdict_independent_sweep",
                                   "tclock doctor's batch verdict (with the run's own sweep) agrees with an "
                                   "independent sweep's labels (every lr)",
                                   "— (tclock's issue 11: >= 90% per class, >= 2 tasks)",
                                   f"where it gives a verdict: above {frac(given['above'])}, below "
                                   f"{frac(given['below'])} on {len(tasks)} tasks ({', '.join(tasks)}); no verdict "
                                   f"(its sweep not trusted) on {every['above']['n'] - given['above']['n']} of "
                                   f"{every['above']['n']} runs labelled above and "
                                   f"{every['below']['n'] - given['below']['n']} of {every['below']['n']} below",
                                   per_class_verdict(given) if len(tasks) >= 2 else "inconclusive",
                                   "labels from the other base seed's trusted lr-tuned B_crit; the doctor judges a "
                                   "batch only against a trusted sweep, so its agreement is over the runs it judged, "
                                   "and how many it left unjudged is said beside it"))
    v = held["every lr"]["pooled"]
    claims.append(common.claim("online_batch_verdict_held_out_threshold",
                               "the online critical batch alone classes every run above / below with its threshold "
                               "chosen on the other tasks (every lr, every task)",
                               "— (tclock's issue 11: >= 90% per class, >= 2 tasks)",
                               f"above {frac(v['above'])}, below {frac(v['below'])} (held-out thresholds: "
                               + ", ".join(f"{t}: {x['threshold']:g}" for t, x in held["every lr"]["per_task"].items())
                               + ")",
                               per_class_verdict(v),
                               "leave one task out: t from the grid " + ", ".join(f"{t:g}" for t in lr_batch.THRESHOLD_GRID)
                               + " maximising the worse class over the other tasks; labels from each task's tuned fit"))
    return common.write_outputs(args, "Calibration: the online critical batch against the sweeps", "\n".join(body),
                                {"tasks": list(data), "sources": source, "within_2x": within, "batch_sets": sets,
                                 "per_task": per_task, "per_lr": {f"{lr:g}": v for lr, v in per_lr.items()},
                                 "by_threshold": {name: {f"{t:g}": a for t, a in v.items()} for name, v in by_t.items()},
                                 "held_out_threshold": held,
                                 "doctor_independent": {"judgements": [{k: v for k, v in j.items() if k != "rows"}
                                                                        | {name: lr_batch.doctor_agreement(j["rows"], keep)
                                                                           for name, keep in lr_batch.BATCH_SETS.items()}
                                                                        for j in judgements],
                                                        "pooled": doctor_sets}},
                                claims, figures,
                                settings={"inputs": list(args.inputs), "seeds_from": list(args.seeds_from),
                                          "pairs": list(args.pairs)})


if __name__ == "__main__":
    main()
