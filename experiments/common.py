"""Shared plumbing of the experiment scripts (one place; the scripts hold only their science).

* :func:`parse_args`: ``--quick`` (2-core CPU, minutes), ``--smoke`` (tiny, for tests),
  default full mode (sized for one GPU); ``--out`` (default ``experiments/results/<name>``);
  ``--resume`` (reuse finished training runs under ``<out>/runs``).
* :func:`hardware`: what ran it (CPU model, cores, load average, JAX backend/devices, versions).
* :func:`write_outputs`: ``table.md`` (printed too), ``results.json`` and the PNGs, plus the
  claim-by-claim comparison that ``make_results.py`` turns into ``RESULTS.md``.
* :data:`CLAIMS`: the numbers of the user's write-up (in Chinese; not distributed with tclock, its
  claims are restated in English in docs/design.md §6), by section.

Verdicts used in every ``results.json`` (``claims[*].verdict``): ``reproduced``, ``partly``,
``not reproduced``, ``inconclusive`` (the measurement could not decide), ``not tested`` (no
implementation, e.g. SAC), ``pending`` (the implementation failed or is unfinished).
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import shlex
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

warnings.filterwarnings("ignore", message=".*not actively being maintained.*")
warnings.filterwarnings("ignore", category=DeprecationWarning)

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "experiments" / "results"
MODES = ("smoke", "quick", "full")
VERDICTS = ("reproduced", "partly", "not reproduced", "inconclusive", "not tested", "pending")

# --------------------------------------------------------------------------- tasks of the calibration experiments
# name -> TrainConfig fields: the built-in pointmass_reach and variants that change its reward structure.
TASKS: dict[str, dict] = {
    "pointmass_reach": {"env": "pointmass_reach"},
    "pointmass_reach_terminal": {"env": "pointmass_reach", "env_kwargs": {"terminate_on_success": True}},
    "pointmass_reach_fine": {"env": "pointmass_reach", "env_kwargs": {"radius": 0.05}},  # half the radius: sparser
    "pointmass_reach_coarse": {"env": "pointmass_reach", "env_kwargs": {"radius": 0.2}},  # twice the radius: denser
    # The same task and success target trained on the dense -distance reward: a different reward structure.
    "pointmass_reach_dense": {"env": "pointmass_reach", "env_kwargs": {"shaped_reward": True}},
    "reacher_sparse": {"env": "reacher_sparse"},
    # A second physical system fast enough for quick grids on a CPU: Brax reacher on the spring
    # pipeline (~114k env steps/s at 128 envs here, vs ~22k on the default generalized one), with
    # a 2 cm target (1 cm plateaus near 0.3 success in 600k steps, 5 cm is solved almost at once)
    # and a success target below its ~0.6 plateau so E measures speed, not the plateau.
    "reacher_sparse_spring": {"env": "reacher_sparse", "backend": "spring", "env_kwargs": {"threshold": 0.02},
                              "target_success": 0.4},
    # The same reacher where success means reaching the 2 cm target *and staying* 10 steps in a row
    # (the reward is unchanged: 1.0 on every step inside).  A random policy almost never holds it, so
    # success starts near 0 and grows for the whole budget (a pilot at B=128, lr 3e-3: 0.36 at
    # 262k env steps, 0.45 at 600k): E to 0.3 measures learning, not the first few updates.
    "reacher_hold": {"env": "reacher_sparse", "backend": "spring", "env_kwargs": {"threshold": 0.02, "hold_steps": 10},
                     "target_success": 0.3},
    # The reach-and-hold reacher trained on Brax's own dense reward (-distance - control cost): a
    # different reward structure on a second physical system.  On the dense reward the 2 cm hold
    # stays near 0.15 in 600k steps (a pilot at B=128, lr 3e-3), so success is a 5 cm hold of 10
    # steps; pilots at B=128 (lr 3e-3 / 1e-2): ~0.2 at 45k env steps, 0.4-0.5 from ~250k, so the
    # target 0.4 measures learning past the first quick rise.  Fixed before the grid was trained.
    "reacher_hold_dense": {"env": "reacher_sparse", "backend": "spring",
                           "env_kwargs": {"threshold": 0.05, "hold_steps": 10, "shaped_reward": True},
                           "target_success": 0.4},
}

# --------------------------------------------------------------------------- the write-up's claims
WRITEUP = "the user's write-up (not distributed; claims restated in docs/design.md §6)"  # a description, not a path
CLAIMS: dict[str, Any] = {
    # 5.5 (Q5): 100-step micro rollout, "update every 1000 env steps".
    "latency_table": {
        "section": "5.5 (Q5)",
        "rollout_steps": 100,
        "update_every": 1000,
        "rows": [  # batch, rollout_time s, env_step_per_sec, RT_UT_ratio_est
            (64, 0.82, 73.2, 0.27),
            (128, 1.55, 82.6, 0.51),
            (256, 3.01, 84.9, 0.99),
            (512, 6.25, 81.9, 2.07),
        ],
        "critical": "between 128 and 256 (ratio 0.51 -> 0.99)",
    },
    # 2.1: MuJoCo HalfCheetah, rollout length 2048.
    "rollout_scaling": {
        "section": "2.1",
        "env": "HalfCheetah (MuJoCo, write-up); tclock: Brax halfcheetah",
        "unroll_length": 2048,
        "times": {128: 3.2, 1024: 28.5},
        "shape": "near-quadratic",
        "ratio_text": "1024 trajectories take 6-8x (section 1) / ~9x (section 2.1) the time of 128",
    },
    # 3.3: GDC over K=5 minibatches of 64, 10 pairs.
    "gdc": {
        "section": "3.3",
        "k": 5,
        "minibatch": 64,
        "values": {128: (0.91, 0.03), 512: (0.52, 0.11), 1024: (0.33, 0.08)},
        "fresh": 0.85,
        "cliff": 0.6,
        "shape": "a cliff (not a gradual decline) at the critical batch size",
    },
    # 1: critical rollout batch sizes per algorithm.
    "critical": {"section": "1", "values": {"ppo": 256, "sac": 128, "impala": 512}},
    # 3.1: healthy RT/UT band.
    "rt_ut_band": (0.3, 0.7),
    # 4.x: mitigations, each measured by the author on a different task.
    "mitigations": {
        "drbs": {"section": "4.1", "text": "plateau gone; reward 1.8 -> 2.3; total training time -18%",
                 "task": "image-generation RL fine-tuning", "base_batch": 512, "reward": (1.8, 2.3),
                 "time_change": -0.18, "stable_step": 0.25},
        "hae": {"section": "4.3", "text": "adv_skew 4.2 -> 0.7; reward variance -65%; no batch reduction needed",
                "task": "financial trading, batch 512", "skew": (4.2, 0.7), "reward_var_change": -0.65},
        "purm": {"section": "4.4", "text": "batch 1024 with PURM ends 12% above the batch-128 baseline, no plateau",
                 "task": "autonomous-driving simulation", "gain": 0.12, "t_base": 3.0, "alpha": 0.2,
                 "t_cycle": 60.0},
    },
}


# --------------------------------------------------------------------------- arguments
def parse_args(name: str, description: str, argv: Sequence[str] | None = None,
               extra: Iterable[tuple[tuple, dict]] = ()) -> argparse.Namespace:
    """``--quick`` / ``--smoke`` / full (default), ``--out``, ``--resume`` and script-specific flags.

    Sets ``args.mode`` (``smoke`` | ``quick`` | ``full``), ``args.out`` (a Path),
    ``args.name`` and ``args.command`` (the exact command line, for RESULTS.md)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog=f"experiments/{name}.py", description=description)
    p.add_argument("--quick", action="store_true", help="small sizes for a 2-core CPU (a few minutes)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes that only check the plumbing (used by tests/test_experiments.py); "
                        "the numbers mean nothing")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / name,
                   help=f"results folder (default experiments/results/{name})")
    p.add_argument("--resume", action="store_true",
                   help="reuse finished training runs under OUT/runs instead of starting them again")
    for flags, kwargs in extra:
        p.add_argument(*flags, **kwargs)
    args = p.parse_args(argv)
    args.mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    args.name = name
    args.command = " ".join(["python", f"experiments/{name}.py"] + [shlex.quote(a) for a in argv])
    args.started = time.perf_counter()
    return args


TASKS_FLAG = (("--tasks",), {"nargs": "+", "default": None,
                              "help": f"tasks to train (default: the mode's; known: {', '.join(TASKS)})"})


def chosen_tasks(requested: Sequence[str] | None, default: Sequence[str]) -> tuple:
    """``--tasks`` checked against :data:`TASKS` (exits naming the unknown ones), else ``default``."""
    if not requested:
        return tuple(default)
    unknown = [t for t in requested if t not in TASKS]
    if unknown:
        raise SystemExit(f"--tasks: unknown {unknown}; known: {', '.join(TASKS)}")
    return tuple(requested)


def pick(args: argparse.Namespace, smoke: Any, quick: Any, full: Any) -> Any:
    """The value for this run's mode."""
    return {"smoke": smoke, "quick": quick, "full": full}[args.mode]


def say(msg: str) -> None:
    """Progress on stderr (stdout carries the table)."""
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- hardware
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(pkg: str) -> str:
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:  # noqa: BLE001 - not installed
        return "not installed"


def hardware() -> dict:
    """What this run ran on: CPU, cores, load, JAX backend and devices, package versions."""
    import jax

    devices = jax.devices()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": load,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "jax_backend": jax.default_backend(),
        "devices": [f"{d.platform}:{getattr(d, 'device_kind', '?')}" for d in devices],
        "versions": {p: _version(p) for p in ("jax", "jaxlib", "brax", "flax", "optax", "numpy")},
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def hardware_line(hw: dict) -> str:
    dev = ", ".join(sorted(set(hw["devices"])))
    load = hw.get("load_average_at_start")
    return (f"{hw['jax_backend']} backend ({dev}); CPU {hw['cpu']} x{hw['cpu_count']} logical cores"
            + (f" (load average {load[0]} at start: the machine is shared)" if load else "")
            + f"; jax {hw['versions']['jax']}, brax {hw['versions']['brax']}, flax {hw['versions']['flax']}, "
              f"python {hw['python']}")


# --------------------------------------------------------------------------- formatting
def fmt(v: Any, spec: str = ".3g") -> str:
    """A number for a table; None/NaN/inf as an em dash."""
    if v is None:
        return "—"
    try:
        x = float(v)
    except (TypeError, ValueError):
        return str(v)
    if not math.isfinite(x):
        return "—"
    return format(x, spec)


def pm(mean: Any, std: Any, spec: str = ".2f") -> str:
    return f"{fmt(mean, spec)} ± {fmt(std, spec)}" if fmt(mean) != "—" else "—"


def md_cell(value: Any) -> str:
    """A table cell: pipes escaped, newlines flattened."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def finite(values: Iterable[Any]) -> np.ndarray:
    a = np.asarray([np.nan if v is None else v for v in values], dtype=float).reshape(-1)
    return a[np.isfinite(a)]


def mean_std(values: Iterable[Any]) -> tuple[float, float, int]:
    """Mean and (population) std of the finite values, and how many there were (NaN, NaN, 0 if none)."""
    a = finite(values)
    if a.size == 0:
        return math.nan, math.nan, 0
    return float(a.mean()), float(a.std()), int(a.size)


def loglog_fit(x: Sequence[float], y: Sequence[float]) -> dict:
    """``y = c * x**p`` by least squares on ``log y = log c + p log x``: ``{p, c, r2, n}``."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    keep = np.isfinite(lx) & np.isfinite(ly)
    lx, ly = lx[keep], ly[keep]
    if np.unique(lx).size < 2:
        return {"p": math.nan, "c": math.nan, "r2": math.nan, "n": int(lx.size)}
    p, logc = np.polyfit(lx, ly, 1)
    pred = logc + p * lx
    ss_res, ss_tot = float(((ly - pred) ** 2).sum()), float(((ly - ly.mean()) ** 2).sum())
    return {"p": float(p), "c": float(math.exp(logc)), "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan,
            "n": int(lx.size)}


# --------------------------------------------------------------------------- figures
def figure(nrows: int = 1, ncols: int = 1, figsize: tuple[float, float] = (6.4, 4.2)):
    """A matplotlib Figure on the Agg canvas (no pyplot, no global state), and its axes grid."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def save_figure(fig, out: Path, name: str) -> str:
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / name, dpi=110, format="png")
    return name


# --------------------------------------------------------------------------- training runs
def train_run(cfg, resume: bool = False) -> list[dict]:
    """Trains ``cfg`` (or, with ``resume``, reuses a finished run in ``cfg.out``) and returns
    its metric records.  Checkpoints are deleted afterwards: the results keep config.yaml,
    metrics.jsonl and status.json (the raw data), not the model state."""
    from tclock import runlog
    from tclock.loop import train

    if not (resume and runlog.read_status(cfg.out).get("state") == "finished"):
        train(cfg, overwrite=True)
    drop_checkpoints(cfg.out)
    return runlog.read_metrics(cfg.out)


def drop_checkpoints(path: str | Path) -> None:
    """Removes every ``checkpoints/`` folder under ``path`` (run or sweep directory)."""
    p = Path(path)
    for ck in ([p / "checkpoints"] if (p / "checkpoints").is_dir() else []) + list(p.glob("*/checkpoints")):
        shutil.rmtree(ck, ignore_errors=True)


def repo_path(path: str | Path) -> Path:
    """``path`` as given when absolute, else relative to the repository root."""
    p = Path(path)
    return p if p.is_absolute() else ROOT / p


def fresh_runs_dir(args: argparse.Namespace) -> Path:
    """``<out>/runs``: emptied unless ``--resume``."""
    runs = Path(args.out) / "runs"
    if runs.exists() and not args.resume:
        shutil.rmtree(runs)
    runs.mkdir(parents=True, exist_ok=True)
    return runs


def series(records: Sequence[dict], key: str) -> np.ndarray:
    """``[n_iter, n_seeds]`` float array of a metric (NaN where null/absent); rows line up with records."""
    from tclock.runlog import seed_matrix

    _, m = seed_matrix(records, key, keep_missing=True)
    return m


# --------------------------------------------------------------------------- outputs
def claim(claim_id: str, text: str, writeup: str, tclock: str, verdict: str, reading: str) -> dict:
    """One row of the write-up vs tclock comparison (verdict from :data:`VERDICTS`)."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict {verdict!r} is not one of {VERDICTS}")
    return {"id": claim_id, "claim": text, "writeup": writeup, "tclock": tclock, "verdict": verdict,
            "reading": reading}


def claims_table(claims: Sequence[dict]) -> str:
    return md_table(["claim", "write-up", "tclock (measured)", "verdict"],
                    [[c["claim"], c["writeup"], c["tclock"], f"**{c['verdict']}**"] for c in claims])


def write_outputs(args: argparse.Namespace, title: str, body_md: str, data: dict, claims: Sequence[dict],
                  figures: Sequence[str], notes: Sequence[str] = (), settings: dict | None = None) -> dict:
    """Writes ``table.md`` (and prints it), ``results.json``; returns the results dict.

    ``body_md``: the experiment's own markdown tables; ``data``: its raw numbers;
    ``claims``: :func:`claim` rows; ``figures``: PNG names already saved in ``args.out``;
    ``notes``: caveats (sizes reduced in quick mode, what differs from the write-up);
    ``settings``: the sizes actually used."""
    from tclock import runlog

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hw = hardware()
    runtime = time.perf_counter() - args.started
    head = [f"# {title}", "",
            f"Mode: **{args.mode}**. Command: `{args.command}`. Runtime {runtime:.0f} s"
            + (" (this invocation: runs finished before were reused, not retrained)." if getattr(args, "resume", False)
               else "."), "",
            f"Hardware: {hardware_line(hw)}.", ""]
    if args.mode == "smoke":
        head += ["> smoke mode: tiny sizes that only check the plumbing; the numbers below mean nothing.", ""]
    parts = head + [body_md.rstrip(), "", "## Write-up vs tclock", "", claims_table(claims), ""]
    parts += ["Readings:", ""] + [f"- **{c['claim']}** — {c['reading']}" for c in claims] + [""]
    if notes:
        parts += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    if figures:
        parts += ["## Figures", ""] + [f"![{f[:-4]}]({f})" for f in figures] + [""]
    table_md = "\n".join(parts)
    results = {
        "experiment": args.name,
        "title": title,
        "mode": args.mode,
        "command": args.command,
        "runtime_s": runtime,
        "hardware": hw,
        "settings": settings or {},
        "claims": list(claims),
        "notes": list(notes),
        "figures": list(figures),
        "data": data,
    }
    runlog.write_text(out / "table.md", table_md)
    runlog.write_json(out / "results.json", results)
    print(table_md)
    say(f"wrote {out / 'table.md'}, {out / 'results.json'} and {len(figures)} figure(s) in {runtime:.0f} s")
    return results
