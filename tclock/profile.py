"""Rollout-latency pre-flight (write-up section 5.5, Q5): time a short rollout at several batch sizes.

``profile(cfg, batch_sizes=(64, 128, 256, 512), rollout_steps=100, update_every=1000)`` builds
the agent of ``cfg`` once per batch size ``B`` (``num_envs = B``, ``unroll_length =
rollout_steps``, one seed), compiles the rollout ahead of time (``compile_s``, never part of the
clocks), then times ``repeats`` rollouts with ``jax.block_until_ready`` and keeps the median
(``rollout_s``; ``env_steps_per_s = B * rollout_steps / rollout_s``).  With ``with_update`` it
also compiles and times the learning phase on the trajectory the rollout produced (``update_s``).

Two ratios are reported side by side for every ``B``:

* ``RT_UT_ratio_est`` -- the write-up's estimate, exactly as it defines it:
  ``rollout_time / (update_every / env_steps_per_s)``, where ``update_every`` is the planned
  update interval in env steps.  Caveat: because ``env_steps_per_s`` is itself
  ``B * rollout_steps / rollout_time``, the estimate is algebraically
  ``B * rollout_steps / update_every`` -- the number of update intervals one rollout spans.  It
  grows linearly with ``B`` by construction, on any hardware, whatever the timings are; it
  carries no information about the machine.  (The write-up's own table does not satisfy its
  formula: 0.82 s * 73.2 steps/s / 1000 = 0.06, not 0.27.)
* ``rt_ut_measured`` -- ``rollout_s / (rollout_s + update_s)``: the rollout's share of one
  synchronous iteration, measured.  This is the ``rt_ut_ratio`` the training loop logs
  (``rt_s / ut_s``), so it is the one to compare with ``tclock doctor``'s thresholds.

The rollout seconds are fitted to ``t(B) = a + k*B`` (``critical.fit_linear_time``), and for both
ratios the first batch size reaching 0.7 and 1.0 is named (``critical.rt_ut_crossings``).

The result is a plain dict (JSON-ready); with ``out_dir`` it is written as ``profile.json``
and ``profile.md`` through ``tclock.runlog``.  ``format_profile(result)`` renders it for a
terminal.
"""
from __future__ import annotations

import math
import numbers
import statistics
import time
from pathlib import Path
from typing import Callable, Iterable

import jax
import jax.numpy as jnp

from tclock import critical, runlog
from tclock.config import ConfigError, TrainConfig, validate
from tclock.runtime import build_agent, compile_agent
from tclock.textfmt import fmt
from tclock.thresholds import RT_UT_CROSSINGS

LEVELS = RT_UT_CROSSINGS  # the RT/UT levels whose first crossing batch size is reported
ESTIMATE_NOTE = ("RT_UT_ratio_est = rollout_s / (update_every / env_steps_per_s), the write-up's estimate; "
                 "it equals B*rollout_steps/update_every by construction (the number of planned update "
                 "intervals one rollout spans), so it grows linearly with B whatever the hardware does. "
                 "rt_ut_measured = rollout_s / (rollout_s + update_s) is the synchronous ratio tclock logs "
                 "in training (rt_ut_ratio).")


# ----------------------------------------------------------------------------- inputs
def _positive_int(value, name: str, fix: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name}: must be a positive integer, got {value!r}; {fix}")
    if value <= 0:
        raise ConfigError(f"{name}: must be a positive integer, got {value}; {fix}")
    return int(value)


def _check_inputs(batch_sizes, rollout_steps, update_every, repeats) -> tuple[list[int], int, int, int]:
    if isinstance(batch_sizes, (int, float, str)) or batch_sizes is None:
        raise ConfigError(f"batch_sizes: give a list of positive integers such as (64, 128, 256, 512), "
                          f"got {batch_sizes!r}")
    sizes = list(batch_sizes)
    if not sizes:
        raise ConfigError("batch_sizes: is empty; give at least one batch size, e.g. (64, 128, 256, 512)")
    sizes = [_positive_int(b, "batch_sizes", "drop it or use a positive number of envs like 64") for b in sizes]
    dupes = sorted({b for b in sizes if sizes.count(b) > 1})
    if dupes:
        raise ConfigError(f"batch_sizes: {dupes} given more than once; list each batch size once")
    rollout_steps = _positive_int(rollout_steps, "rollout_steps", "use e.g. 100 (steps each env takes per rollout)")
    update_every = _positive_int(update_every, "update_every",
                                 "give the planned update interval in env steps, e.g. 1000")
    repeats = _positive_int(repeats, "repeats", "use e.g. 3 timed repetitions (the median is kept)")
    return sorted(sizes), rollout_steps, update_every, repeats


def _nearest_divisor(n: int, wanted: int) -> int:
    """The divisor of ``n`` closest to ``wanted`` (the smaller one on a tie)."""
    divisors = {d for i in range(1, math.isqrt(n) + 1) if n % i == 0 for d in (i, n // i)}
    return min(divisors, key=lambda d: (abs(d - wanted), d))


def profile_config(cfg: TrainConfig, batch_size: int, rollout_steps: int) -> tuple[TrainConfig, list[str]]:
    """The validated config profiled at ``batch_size``, and the notes on what had to change."""
    n = batch_size * rollout_steps
    changes: dict = {"num_envs": batch_size, "unroll_length": rollout_steps, "seeds": 1,
                     "total_steps": max(cfg.total_steps, n), "progress": False}
    notes = []
    if cfg.num_minibatches > 0 and n % cfg.num_minibatches:
        m = _nearest_divisor(n, cfg.num_minibatches)
        changes["num_minibatches"] = m
        notes.append(f"num_minibatches {cfg.num_minibatches} does not divide B*rollout_steps = "
                     f"{batch_size}*{rollout_steps} = {n}; using the nearest divisor {m}")
    if cfg.gdc_every and cfg.gdc_minibatch > n:
        changes["gdc_minibatch"] = n
        notes.append(f"gdc_minibatch {cfg.gdc_minibatch} exceeds the rollout's {n} transitions; using {n}")
    new = cfg.replace(**changes)
    try:
        validate(new)
    except ConfigError as e:
        raise ConfigError(f"{e} (while profiling batch size {batch_size}, rollout_steps {rollout_steps})") from None
    return new, notes


# ----------------------------------------------------------------------------- timing
def _median_time(fn: Callable[[], object], repeats: int, clock=time.perf_counter) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = clock()
        out = fn()
        jax.block_until_ready(out)
        times.append(clock() - t0)
    return float(statistics.median(times)), out


def _device_kind() -> str:
    try:
        return str(jax.devices()[0].device_kind)
    except Exception:  # pragma: no cover - backends without a kind
        return "unknown"


def _profile_one(cfg: TrainConfig, repeats: int, with_update: bool, update_every: int,
                 say: Callable[[str], None]) -> dict:
    B, T = cfg.num_envs, cfg.unroll_length
    agent = build_agent(cfg, B)
    state = agent.init(cfg.seed, 1)
    with_gdc = cfg.gdc_every == 1  # what most training iterations run
    variants = (("gdc" if with_gdc else "plain"),) if with_update else ()
    programs = compile_agent(agent, state, B, variants, say)  # the programs training runs, compiled the same way

    say(f"timing {repeats} rollout(s)")
    state, traj, _ = programs.rollout(state)  # warm-up: first call of the executable, untimed
    jax.block_until_ready(traj)
    holder = {"state": state}

    def one_rollout():
        holder["state"], tr, _m = programs.rollout(holder["state"])
        holder["traj"] = tr
        return tr

    rollout_s, traj = _median_time(one_rollout, repeats)
    env_steps_per_s = B * T / rollout_s
    row = {
        "batch_size": B,
        "transitions": B * T,
        "rollout_s": rollout_s,
        "env_steps_per_s": env_steps_per_s,
        "RT_UT_ratio_est": rollout_s / (update_every / env_steps_per_s),
        "compile_s": programs.compile_times["rollout"],
        "update_s": None,
        "update_compile_s": None,
        "rt_ut_measured": None,
        "num_minibatches": cfg.num_minibatches,
        "update_variant": None,
    }
    if with_update:
        update = programs.update_gdc if with_gdc else programs.update_plain
        row["update_compile_s"] = programs.compile_times[f"update_{variants[0]}"]
        lr = jnp.float32(cfg.scaled_lr())
        state = holder["state"]
        say(f"timing {repeats} update(s)")
        jax.block_until_ready(update(state, traj, lr))  # warm-up
        update_s, _ = _median_time(lambda: update(state, traj, lr), repeats)
        row.update(update_s=update_s, rt_ut_measured=rollout_s / (rollout_s + update_s), update_variant=variants[0])
    return row


# ----------------------------------------------------------------------------- entry point
def profile(cfg: TrainConfig, batch_sizes: Iterable[int] = (64, 128, 256, 512), rollout_steps: int = 100,
            update_every: int = 1000, repeats: int = 3, with_update: bool = True, out_dir=None,
            announce: Callable[[str], None] | None = print) -> dict:
    """Times a ``rollout_steps``-step rollout of ``cfg``'s env and agent at each batch size.

    Returns a JSON-ready dict: ``env``, ``backend``, ``device``, ``rollout_steps``,
    ``update_every``, ``repeats``, ``with_update``, ``rows`` (one per batch size, ascending:
    ``batch_size``, ``rollout_s``, ``env_steps_per_s``, ``RT_UT_ratio_est``, ``update_s``,
    ``rt_ut_measured``, ``compile_s``, ``update_compile_s``, ``num_minibatches``, ...),
    ``fit`` (``t(B) = a + k*B`` on the rollout seconds; None with one batch size),
    ``crossings`` (``{"estimate": {"0.7": B or None, "1.0": ...}, "measured": {...}}``),
    ``notes`` (config adjustments), ``note`` (what the two ratios mean), ``total_s``.

    ``RT_UT_ratio_est = rollout_s / (update_every / env_steps_per_s)`` is the write-up's estimate
    with ``update_every`` the planned update interval in env steps.  Caveat: it reduces to
    ``B*rollout_steps/update_every``, so it rises linearly with ``B`` by construction; the
    measured synchronous ratio ``rt_ut_measured = rollout_s/(rollout_s+update_s)`` is the one
    ``tclock train`` logs.  Compile time is measured apart (``compile_s``) and never enters them.

    Raises ``ConfigError`` (naming the field and the fix) before compiling anything when an input
    or a derived per-batch-size config is invalid.  ``announce`` receives one progress line per
    phase (None: silent).  With ``out_dir`` writes ``profile.json`` and ``profile.md`` there.
    """
    sizes, rollout_steps, update_every, repeats = _check_inputs(batch_sizes, rollout_steps, update_every, repeats)
    say_all = announce or (lambda s: None)
    configs = [profile_config(cfg, b, rollout_steps) for b in sizes]  # all fail before any compile
    notes = []
    for (c, ns) in configs:
        for note in ns:
            notes.append(f"B={c.num_envs}: {note}")
            say_all(f"note: B={c.num_envs}: {note}")

    start = time.perf_counter()
    rows = []
    for i, (c, _) in enumerate(configs, 1):
        prefix = f"profile [{i}/{len(configs)}] {c.env} B={c.num_envs} T={rollout_steps}: "
        rows.append(_profile_one(c, repeats, with_update, update_every, lambda s, p=prefix: say_all(p + s)))
        r = rows[-1]
        say_all(prefix + f"rollout {r['rollout_s']:.4f}s, {r['env_steps_per_s']:,.0f} env steps/s"
                + (f", update {r['update_s']:.4f}s" if r["update_s"] is not None else ""))

    b = [r["batch_size"] for r in rows]
    fit = None
    if len(rows) >= 2:
        f = critical.fit_linear_time(b, [r["rollout_s"] for r in rows])
        fit = {"a": f.a, "k": f.k, "r2": f.r2, "n_points": f.n_points, "of": "rollout_s",
               "units": "a in seconds, k in seconds per env"}
    est = critical.rt_ut_crossings(b, [r["RT_UT_ratio_est"] for r in rows], LEVELS)
    meas = critical.rt_ut_crossings(b, [r["rt_ut_measured"] if r["rt_ut_measured"] is not None else float("nan")
                                        for r in rows], LEVELS)
    result = {
        "env": cfg.env,
        "algo": cfg.algo,
        "backend": jax.default_backend(),
        "device": _device_kind(),
        "rollout_steps": rollout_steps,
        "update_every": update_every,
        "repeats": repeats,
        "with_update": bool(with_update),
        "update_variant": rows[0]["update_variant"],  # "plain" | "gdc" (gdc when cfg.gdc_every == 1) | None
        "rows": rows,
        "fit": fit,
        "crossings": {"estimate": {str(k): v for k, v in est.items()},
                      "measured": {str(k): v for k, v in meas.items()} if with_update else None},
        "notes": notes,
        "note": ESTIMATE_NOTE,
        "total_s": time.perf_counter() - start,
    }
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        runlog.write_json(out / "profile.json", result)
        runlog.write_text(out / "profile.md", format_markdown(result))
        result["files"] = [str(out / "profile.json"), str(out / "profile.md")]
    return result


# ----------------------------------------------------------------------------- rendering
def _crossing_text(cross: dict | None) -> str:
    if cross is None:
        return "not measured (with_update=False)"
    low, high = LEVELS
    b_low, b_high = cross.get(str(low)), cross.get(str(high))
    if b_low is None and b_high is None:
        return "never crosses in the profiled range"
    return f"crosses {low} at B={b_low}, {high} at B={b_high if b_high is not None else 'never in the profiled range'}"


def verdict(result: dict) -> str:
    """One line per ratio: where it first reaches each of ``LEVELS`` (0.7 and 1.0)."""
    est = result["crossings"]["estimate"]
    meas = result["crossings"]["measured"]
    return f"estimate {_crossing_text(est)}; measured {_crossing_text(meas)}"


def _variant_text(result: dict) -> str:
    return {"gdc": "with gradient diagnostics (gdc_every=1, as in training)",
            "plain": "plain (no gradient diagnostics)"}.get(result.get("update_variant"), "no (with_update=False)")


def _fit_line(result: dict) -> str:
    fit = result.get("fit")
    if not fit:
        return "fit t(B) = a + k*B: needs >= 2 batch sizes"
    return f"fit rollout_s(B) = a + k*B: a = {fit['a']:.4g} s, k = {fit['k']:.4g} s/env, r2 = {fit['r2']:.3f}"


_MD_COLUMNS = [("batch_size", 3), ("rollout_s", 4), ("update_s", 4), ("env_steps_per_s", 3),
               ("RT_UT_ratio_est", 3), ("rt_ut_measured", 3), ("compile_s", 3)]  # (key, significant digits)


def format_markdown(result: dict) -> str:
    """``profile.md``: header, one table row per batch size, fit and verdict."""
    lines = [
        f"# Rollout latency profile: {result['env']} ({result['algo']})",
        "",
        f"backend {result['backend']} ({result['device']}); rollout_steps = {result['rollout_steps']}; "
        f"update_every = {result['update_every']} env steps; median of {result['repeats']} timed run(s); "
        f"times in seconds, compile time measured apart; update timed: {_variant_text(result)}.",
        "",
        f"> {result['note']}",
        "",
        "| " + " | ".join(name for name, _ in _MD_COLUMNS) + " |",
        "|" + "|".join("---:" for _ in _MD_COLUMNS) + "|",
    ]
    for row in result["rows"]:
        lines.append("| " + " | ".join(fmt(row.get(name), digits) for name, digits in _MD_COLUMNS) + " |")
    lines += ["", _fit_line(result), "", "Verdict: " + verdict(result)]
    if result.get("notes"):
        lines += ["", "Config adjustments:"] + [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def format_profile(result: dict) -> str:
    """A terminal table: timings, both ratios, compile time in its own column, fit and verdict."""
    head = (f"{'B':>6} {'rollout_s':>10} {'update_s':>9} {'env_steps/s':>12} {'RT_UT_est':>10} "
            f"{'rt_ut_meas':>10} | {'compile_s':>9} {'upd_comp_s':>10}")
    lines = [
        f"rollout latency profile: {result['env']} ({result['algo']}) on {result['backend']} ({result['device']}), "
        f"rollout_steps={result['rollout_steps']}, update_every={result['update_every']} env steps, "
        f"median of {result['repeats']}, update timed: {_variant_text(result)}",
        "RT_UT_est = rollout_s/(update_every/env_steps_per_s) (write-up; = B*rollout_steps/update_every by "
        "construction); rt_ut_meas = rollout_s/(rollout_s+update_s) (what training logs)",
        head,
        "-" * len(head),
    ]
    for r in result["rows"]:
        lines.append(f"{r['batch_size']:>6d} {fmt(r['rollout_s'], 4):>10} {fmt(r['update_s'], 4):>9} "
                     f"{fmt(r['env_steps_per_s']):>12} {fmt(r['RT_UT_ratio_est']):>10} "
                     f"{fmt(r['rt_ut_measured']):>10} | {fmt(r['compile_s']):>9} "
                     f"{fmt(r['update_compile_s']):>10}")
    lines.append(_fit_line(result))
    lines.append("verdict: " + verdict(result))
    for n in result.get("notes") or []:
        lines.append("note: " + n)
    lines.append(f"total {result['total_s']:.1f}s")
    return "\n".join(lines)
