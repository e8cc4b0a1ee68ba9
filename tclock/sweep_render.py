"""Text of a sweep summary (the dict of :func:`tclock.sweep_analysis.summarize`): the per-B
table for the terminal (:func:`format_summary`) and for ``report.md`` (:func:`markdown_report`),
and the one-line :func:`headline`.  Both tables are built from :data:`COLUMNS`, each column
defined once by name; numbers go through :func:`tclock.textfmt.fmt`.  No analysis, no figures.

Units as in :mod:`tclock.sweep_analysis` (docs/design.md §2): B in envs, S in iterations, E in
env steps per seed, wall in seconds; b_simple in envs = transitions / T.  A sweep of SAC's gradient
batch (``sweep_axis`` ``sac_batch_size``) reads B in transitions, S in gradient steps and E in replay
samples (:data:`tclock.sweep_analysis.AXES`).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

from tclock.sweep_analysis import as_float
from tclock.sweep_axes import Axis, axis_of
from tclock.sweep_lr import grid_command, lr_key
from tclock.textfmt import fmt

__all__ = ["Column", "COLUMNS", "table", "format_summary", "markdown_report", "fit_lines", "lr_lines", "headline"]


class Column(NamedTuple):
    """One column of the per-B table: ``header`` in report.md, ``short`` on the terminal (None:
    report.md only); ``{metric}`` in either is the sweep's metric.  ``cell`` renders a run row."""

    name: str
    header: str
    short: str | None
    cell: Callable[[dict], str]


def _range(st: dict) -> str:
    if not math.isfinite(as_float(st["min"])):
        return "—"
    return f"{fmt(st['min'])}–{fmt(st['max'])}"


def _batch(r: dict) -> str:
    return f"{r['batch']}" + ("" if r["complete"] else f" ({r['state']})")


COLUMNS: tuple[Column, ...] = (
    Column("batch", "B ({B})", "B {B}", _batch),
    Column("lr", "lr", "lr", lambda r: lr_key(r["lr"]) if math.isfinite(as_float(r.get("lr"))) else "—"),
    Column("smooth_k", "k (iters)", "k", lambda r: str(r["smooth_k"])),
    Column("reached", "seeds reached", "reached", lambda r: f"{r['n_reached']}/{r['seeds']}"),
    Column("steps", "S median ({S})", "S {s}", lambda r: fmt(r["steps_to_target"]["median"])),
    Column("steps_range", "S min–max ({S})", "S min-max", lambda r: _range(r["steps_to_target"])),
    Column("samples", "E median ({E})", "E {e}", lambda r: fmt(r["samples_to_target"]["median"])),
    Column("wall", "wall median (s)", "wall s", lambda r: fmt(r["wall_to_target"]["median"])),
    Column("final_metric", "final {metric}", "final {metric}", lambda r: fmt(r["final_metric"])),
    Column("final_return", "final return", None, lambda r: fmt(r["final_episode_return"])),
    Column("gdc", "GDC (mean)", "GDC", lambda r: fmt(r["gdc_mean"])),
    Column("b_crit_online_envs", "online B_crit (envs)", "online envs", lambda r: fmt(r["b_crit_online_envs"])),
    Column("b_simple_envs", "b_simple (envs)", "b_simple envs", lambda r: fmt(r["b_simple_envs"])),
    Column("b_simple_transitions", "b_simple (transitions)", None, lambda r: fmt(r["b_simple_transitions"])),
    Column("rt_ut", "RT/UT (mean)", "RT/UT", lambda r: fmt(r["rt_ut_ratio_mean"])),
    Column("iteration_s", "iteration (s)", "iter s", lambda r: fmt(r["iteration_s_mean"])),
    Column("rt_s", "RT (s)", None, lambda r: fmt(r["rt_s_mean"])),
)


def table(summary: dict, terminal: bool = False) -> tuple[list[str], list[list[str]]]:
    """``(headers, rows)`` of the per-B table: every column, or with ``terminal`` those with a
    short header."""
    cols = [c for c in COLUMNS if c.short is not None] if terminal else list(COLUMNS)
    ax = axis_of(summary)
    short = ("iters", "env steps") if ax.field == "num_envs" else ("grad steps", "samples")
    names = {"{metric}": summary["metric"], "{B}": ax.unit, "{S}": ax.steps, "{E}": ax.samples, "{s}": short[0],
             "{e}": short[1]}
    title = []
    for c in cols:
        text = c.short if terminal else c.header
        for k, v in names.items():
            text = text.replace(k, v)
        title.append(text)
    return title, [[c.cell(r) for c in cols] for r in summary["runs"]]


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _fit_description(fit: dict, T, ax: Axis) -> list[str]:
    if ax.field == "num_envs":
        c_text = (f"c = E_min/T = {fmt(fit['c'])} iterations·envs; E_min = {fmt(fit['e_min'])} env steps per seed "
                  f"(T = {T})")
        b_text = f"**B_crit = {fmt(fit['b_crit'])} envs** = {fmt(fit['b_crit_transitions'])} transitions per rollout"
    else:
        c_text = f"c = E_min = {fmt(fit['c'])} {ax.samples}"
        b_text = f"**B_crit = {fmt(fit['b_crit'])} {ax.unit}** per gradient step ({ax.field})"
    lines = [f"S(B) = S_min + c/B fitted to the per-B median S over B = {fit['batch_sizes_used']} "
             f"(weighting: {fit['weighting']}; {fit['n_dropped']} B dropped as not reached):", "",
             f"- S_min = {fmt(fit['s_min'])} {ax.steps}; {c_text}",
             f"- {b_text}; {fit['ci_level']:.0%} bootstrap CI {fmt(fit['ci_low'])}–{fmt(fit['ci_high'])} "
             f"{ax.unit} ({fit['n_boot']} resamples of seeds per B, "
             f"{fit['bootstrap_success_fraction']:.0%} gave a finite B_crit); R² = {fmt(fit['r2'])}"]
    if fit["note"]:
        lines.append(f"- {fit['note']}")
    return lines


def fit_lines(summary: dict) -> list[str]:
    """The "Critical batch size" section (markdown bullets): the fit, GDC cliff, b_simple, B*."""
    fit = summary["fit"]
    ax = axis_of(summary)
    lines = [f"No fit: {summary['fit_note']}."] if fit is None else _fit_description(fit, summary["unroll_length"], ax)
    lines.append(f"- GDC cliff (first B with mean GDC < {summary['gdc_threshold']}): "
                 f"{summary['gdc_cliff'] if summary['gdc_cliff'] is not None else 'none in the sweep'}")
    if ax.field == "num_envs":
        lines.append(f"- online critical batch (b_crit_online_envs: the learning phase's noise per env, median over "
                     f"B): {fmt(summary.get('b_crit_online_envs'))} envs — 0.39-1.13x of the lr-tuned B_crit at the best "
                     f"lr on six tasks with a trusted grid (RESULTS.md)")
        lines.append(f"- online b_simple from i.i.d. transitions (median over B): {fmt(summary['b_simple_envs'])} envs = "
                     f"{fmt(summary['b_simple_transitions'])} transitions")
    else:
        lines.append(f"- online b_simple from replay minibatches (median over B): "
                     f"{fmt(summary['b_simple_transitions'])} transitions, B's own unit (McCandlish's B_simple; not "
                     f"validated against a SAC sweep)")
    tf = summary["time_fit"]
    if tf is None:
        lines.append("- iteration time: fewer than 2 batch sizes timed, no t(B) fit")
    else:
        lines.append(f"- iteration time t(B) = a + k·B: a = {fmt(tf['a'])} s, k = {tf['k']:.3g} s per "
                     f"{ax.unit[:-1]}, R² = {fmt(tf['r2'])}; wall-clock optimum B* = sqrt(B_crit·a/k) = "
                     f"{fmt(summary['b_star'])} {ax.unit}")
    best = summary["b_best_measured"]
    lines.append(f"- measured best B (lowest median wall seconds to target): "
                 f"{best if best is not None else 'none reached'}"
                 + (f" ({fmt(summary['best_wall_s'])} s)" if best is not None else ""))
    return lines


def _b_crit_phrase(s: dict) -> str:
    rows, fit = s["runs"], s["fit"]
    if fit is None:
        n_reached = len(rows) - len(s["not_reached"])
        return (f"target not reached at enough batch sizes to fit (median seed reached "
                f"{s['metric']} target at {n_reached} of {len(rows)} batch sizes)")
    if not math.isfinite(as_float(fit["b_crit"])):
        if not fit["s_min"] > 0:
            return (f"B_crit undefined: steps to target still fall like 1/B up to B={rows[-1]['batch']} "
                    f"(B_crit above the sweep)")
        return (f"B_crit undefined: larger batches did not reduce steps to target "
                f"(B_crit at or below B={rows[0]['batch']})")
    lo, hi = fit["ci_low"], fit["ci_high"]
    ci_txt = f"{fit['ci_level']:.0%} CI {fmt(lo)}–{fmt(hi)}" if math.isfinite(as_float(lo)) else "CI n/a"
    ax = axis_of(s)
    what = "batch size" if ax.field == "num_envs" else ax.label
    phrase = f"critical {what} B_crit ≈ {fmt(fit['b_crit'])} {ax.unit} ({ci_txt}), R² {fit['r2']:.2f}"
    if s.get("b_crit_trusted") is False:
        fix = (f"measure it with the lr tuned per B: {regrid_command(s)}" if s.get("step_size_limited")
               else "rerun with more seeds, a longer --total-steps or more batch sizes before acting on it")
        phrase += f" — NOT trustworthy ({'; '.join(s.get('b_crit_distrust') or [])}): {fix}"
    return phrase


def regrid_command(s: dict, widen: bool = False) -> str:
    """The grid command that resolves a step-size-limited fixed-lr sweep (``widen``: a grid on
    both sides of its lr)."""
    lr = next((as_float(r["lr"]) for r in s["runs"] if math.isfinite(as_float(r.get("lr")))), 1e-3)
    command = grid_command(lr, s["batch_sizes"], f"{s['sweep_dir'].rstrip('/')}-lr", widen=widen)
    axis = axis_of(s).field
    return command if axis == "num_envs" else f"{command} --algo sac --sweep-axis {axis}"


def _cell_text(c: dict) -> str:
    e = fmt(c["samples_median"]) if math.isfinite(as_float(c["samples_median"])) else "not reached"
    return f"{e} ({c['n_reached']}/{c['seeds']})"


def lr_lines(s: dict) -> list[str]:
    """The "Learning rate" section (markdown): a fixed-lr sweep's step-size warning with the
    command that resolves it, or a grid's heat-map table, best lr per B and fixed-lr fits."""
    grid = s.get("lr_grid")
    if grid is None:
        limited = s.get("step_size_limited")
        if not limited:
            return [f"One learning rate for every B: this B_crit is the fixed-lr reading. McCandlish's B_crit tunes "
                    f"the lr at each B, and a lr too small (or too large) for the small batches inflates it "
                    f"(PPO on pointmass_reach: 1e-3 gives about 300 envs, the lr-tuned grid 84-108 on two base seeds: RESULTS.md). E does not "
                    f"rise as B falls here; to measure the tuned B_crit: `{regrid_command(s, widen=True)}`."]
        return [f"**Warning: E rises as B falls** below B={limited['best_batch']} (B={limited['batch']} needs "
                f"{fmt(limited['rise'])}x the E of B={limited['best_batch']}; flagged: B={limited['limited']}). "
                f"S(B) = S_min + c/B cannot produce that: at one lr for every B the small-B points look "
                f"step-size-limited, and the fit mixes the step size with the batch. Resolve it with "
                f"`{regrid_command(s)}`."]
    lrs = grid["lrs"]
    ax = axis_of(s)
    cells = {(c["batch"], c["lr"]): c for c in grid["cells"]}
    head = [f"B ({ax.unit})"] + [f"lr {lr_key(lr)}" for lr in lrs] + ["best lr", "best-lr range (≥5% of resamples)"]
    rows = []
    for b in grid["best_lr"]:
        rows.append([str(b["batch"])]
                    + [_cell_text(cells[(b["batch"], lr)]) if (b["batch"], lr) in cells else "—" for lr in lrs]
                    + [lr_key(b["lr"]) if b["lr"] else "none reached",
                       f"{lr_key(b['lr_low'])}–{lr_key(b['lr_high'])}" if b["lr_low"] else "—"])
    lines = [f"B x lr grid: median E ({ax.samples}) to target (seeds reached). The critical batch size above is "
             "fitted on the best lr at each B (McCandlish's definition; the choice is redone in every bootstrap "
             "resample, so its optimism is inside the CI).", ""] + _md_table(head, rows) + ["", "Fixed-lr fits beside it:", ""]
    for key, f in grid["fixed"].items():
        ci = f["b_crit_ci"]
        trust = "trusted" if f["trusted"] else "not trusted: " + "; ".join(f["distrust"])
        lines.append(f"- lr {key}: B_crit {fmt(f['b_crit'])} {ax.unit}"
                     + (f" (CI {fmt(ci[0])}–{fmt(ci[1])})" if ci else "") + f", R² {fmt(f['r2'])}; {trust}")
    for e in grid["edge"]:
        lines.append(f"- at B={e['batch']} the best lr is the grid's {e['side']} ({lr_key(e['lr'])}): widen --lrs")
    return lines


def headline(s: dict) -> str:
    """One line: B_crit with its CI, b_simple, the GDC cliff and B* next to the measured best B."""
    rows = s["runs"]
    if not rows:
        return (f"no finished runs to summarise yet ({len(s['incomplete'])} incomplete); "
                f"rerun with include_incomplete=True to use what they logged")
    parts = [_b_crit_phrase(s)]
    ax = axis_of(s)
    if ax.field != "num_envs":  # the noise scale in B's unit; the per-env estimates do not apply
        if math.isfinite(as_float(s["b_simple_transitions"])):
            parts.append(f"online b_simple ≈ {fmt(s['b_simple_transitions'])} transitions")
    else:
        if math.isfinite(as_float(s.get("b_crit_online_envs"))):
            parts.append(f"online B_crit ≈ {fmt(s['b_crit_online_envs'])} envs")
        if math.isfinite(as_float(s["b_simple_envs"])):
            parts.append(f"online b_simple ≈ {fmt(s['b_simple_envs'])} envs")
    gdc_known = [r for r in rows if math.isfinite(as_float(r["gdc_mean"]))]
    if s["gdc_cliff"] is not None:
        parts.append(f"GDC falls below {s['gdc_threshold']} at B={s['gdc_cliff']}")
    elif gdc_known:
        parts.append(f"GDC stays ≥ {s['gdc_threshold']} up to B={gdc_known[-1]['batch']}")
    best = s["b_best_measured"]
    best_txt = f"measured best: {best}" if best is not None else "measured best: none reached"
    if math.isfinite(as_float(s["b_star"])):
        parts.append(f"wall-clock optimum B* ≈ {fmt(s['b_star'])} {ax.unit} ({best_txt})")
    else:
        parts.append(f"wall-clock optimum B* n/a ({best_txt})")
    return "; ".join(parts)


def swept_line(summary: dict) -> str:
    """Which learner and which axis the sweep varied (and what it held fixed for SAC)."""
    algo = summary.get("algo", "ppo")
    ax = axis_of(summary)
    text = f"Learner: `{algo if isinstance(algo, str) else ', '.join(algo)}`; swept: `{ax.field}` (B, the {ax.label})"
    if ax.field == "sac_batch_size":
        runs = summary["runs"]
        envs = sorted({r["num_envs"] for r in runs})
        text += (f" at num_envs = {', '.join(map(str, envs)) or '?'} and a fixed replay ratio of "
                 f"{fmt(summary['replay_ratio'])} gradient steps per env step, so every B runs the same gradient "
                 f"steps per iteration; S counts gradient steps and E = S·B the replay samples drawn")
    elif summary.get("replay_ratio") is not None:
        text += (f" at a fixed replay ratio of {fmt(summary['replay_ratio'])} gradient steps per env step (the "
                 "gradient steps per iteration grow with B; the gradient batch `sac_batch_size` is fixed)")
    return text + "."


def _units_text(summary: dict) -> str:
    ax = axis_of(summary)
    return (f"B in {ax.unit}, S in {ax.steps}, E in {ax.samples}, wall in seconds; b_simple in envs = "
            f"transitions / T (T = {summary['unroll_length']})")


def markdown_report(summary: dict) -> str:
    """The text of ``report.md`` (figures: the names in ``summary["figures"]``)."""
    target = summary["target"]
    lines = [f"# Batch-size sweep: {Path(summary['sweep_dir']).name}", "", f"**{summary['headline']}**", "",
             f"Target: `{summary['metric']}` ≥ {fmt(target) if target is not None else 'per run (see summary.json)'}; "
             f"steps to target = first iteration where the trailing mean over k = max(1, ceil({summary['smooth_steps']:g} / "
             f"(B·T))) iterations reaches it. This smooths over about the same env steps at every B; it is late by "
             f"up to k−1 iterations (never early for curves that stay above the target), more at small B. "
             f"Medians count a seed that never reached as infinitely late (finite only if more than half reached). "
             f"Units: {_units_text(summary)}.", "", swept_line(summary), ""]
    lines += ["## Per batch size", ""] + _md_table(*table(summary)) + [""]
    if summary["not_reached"]:
        lines += [f"Target not reached (median over seeds) at B = {summary['not_reached']}.", ""]
    lines += ["## Critical batch size", ""] + fit_lines(summary) + [""]
    lines += ["## Learning rate", ""] + lr_lines(summary) + [""]
    if summary["incomplete"]:
        lines += ["## Incomplete runs", ""]
        for r in summary["incomplete"]:
            lines.append(f"- {r['run']} (B={r['batch']}): {r['reason']}"
                         + (" — included" if r["used"] else " — not used"))
        lines.append("")
    if summary["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in summary["notes"]] + [""]
    if summary["figures"]:
        lines += ["## Figures", ""]
        for name in summary["figures"]:
            lines += [f"![{name[:-4]}]({name})", ""]
    return "\n".join(lines)


def format_summary(summary: dict) -> str:
    """A plain-text table of the sweep and the headline, for the terminal."""
    headers, rows = table(summary, terminal=True)
    grid = [headers] + rows
    widths = [max(len(str(t[c])) for t in grid) for c in range(len(headers))]
    target = summary["target"]
    lines = [f"sweep {summary['sweep_dir']}  (metric {summary['metric']}, target "
             f"{fmt(target) if target is not None else 'per run'}, T={summary['unroll_length']})"]
    for i, t in enumerate(grid):
        lines.append("  ".join(str(c).rjust(w) for c, w in zip(t, widths)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    lines += [ln.replace("**", "") for ln in fit_lines(summary)]
    if summary["runs"]:
        lines += [""] + [ln.replace("**", "").replace("`", "") for ln in lr_lines(summary)]
    for r in summary["incomplete"]:
        lines.append(f"incomplete: {r['run']} (B={r['batch']}): {r['reason']}"
                     + (" [included]" if r["used"] else " [not used]"))
    lines.append("")
    lines.append(summary["headline"])
    return "\n".join(lines)
