"""Pool sweeps that differ only in their base seed into one sweep with all their seeds.

A B_crit fit from 3 seeds per size can miss its trust bar on seed noise alone (one size's median
above its smaller neighbour's).  Training more seeds into the same directory would repeat the
seeds already trained; a second sweep with another ``--seed`` trains new ones, and
:func:`pool_sweeps` puts the two (or more) side by side: for every run directory (``B*``) found
in every source it writes one run directory whose per-seed metrics are the sources' seed columns
one after another, so :func:`tclock.sweep_report.summarize_sweep` reads a sweep of
``sum(seeds)`` seeds and every statistic (medians over seeds, the bootstrap over seeds, the online
estimates' median over seeds) is computed over all of them.

Rules (checked before anything is written; a violation raises :class:`PoolError` naming the run,
the field and the fix):

* every source is a sweep directory with the same run directories, each ``finished``;
* the runs' configs agree in every field but ``seed`` and ``seeds`` (and the fields a sweep may change:
  ``out``, ``progress``, ...), and no two sources share a base seed (their seeds would repeat);
* a run's sources log the same iterations, row for row.

Per record: ``iteration``, ``env_steps`` and ``num_envs`` must agree and stay scalars; a per-seed
list is concatenated; a scalar (``wall_s``, ``rt_s``: one value for all seeds of a run) becomes
that value repeated for each of the run's seeds, so every seed keeps its own run's clock; a key a
source lacks gives nulls for its seeds.  The pooled ``config.yaml`` has ``seeds`` = the total and
``pooled_from`` (the sources with their base seeds).  Plain Python; no JAX.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from tclock import runlog
from tclock.config import SWEEP_MAY_CHANGE, TrainConfig
from tclock.sweep_analysis import discover_runs

__all__ = ["PoolError", "pool_sweeps", "pool_records"]

SHARED_KEYS = ("iteration", "env_steps", "num_envs")  # the same for every seed of a row
MAY_DIFFER = SWEEP_MAY_CHANGE | {"seed", "seeds"}  # seed i of a run is fold_in(seed, i)


class PoolError(ValueError):
    """Sources that cannot be pooled; the message names the run, the field and the fix."""


def _seed_values(value, n: int) -> list:
    if isinstance(value, (list, tuple)):
        return list(value) + [None] * (n - len(value)) if len(value) <= n else list(value[:n])
    return [value] * n


def pool_records(sources: list[list[dict]], seeds: list[int], where: str = "run") -> list[dict]:
    """Row-by-row merge of one run's records from several sources (``seeds[i]``: source i's seed
    count); see the module docstring."""
    lengths = {len(r) for r in sources}
    if len(lengths) != 1:
        raise PoolError(f"{where}: the sources log {sorted(len(r) for r in sources)} iterations; pool only "
                        "sweeps trained with the same total_steps (rerun the shorter one with --resume)")
    out = []
    for rows in zip(*sources):
        merged: dict = {}
        for key in SHARED_KEYS:
            values = {json.dumps(r.get(key)) for r in rows}
            if len(values) != 1:
                raise PoolError(f"{where}: {key!r} differs between the sources at row {len(out) + 1} "
                                f"({sorted(values)}); their runs are not the same schedule")
            if key in rows[0]:
                merged[key] = rows[0][key]
        keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in SHARED_KEYS]
        for key in keys:
            merged[key] = [v for r, n in zip(rows, seeds) for v in _seed_values(r.get(key), n)]
        out.append(merged)
    return out


def _differences(a: dict, b: dict) -> list[str]:
    plain = TrainConfig().to_dict()
    keys = [k for k in dict.fromkeys([*a, *b]) if k not in MAY_DIFFER]
    return [f"{k}: {a.get(k, plain.get(k))!r} vs {b.get(k, plain.get(k))!r}" for k in keys
            if a.get(k, plain.get(k)) != b.get(k, plain.get(k))]


def _check(dirs: list[Path]) -> dict[str, tuple[list[Path], list[dict]]]:
    """Every run name with its source directories and their configs, once the rules hold."""
    names = [sorted(p.name for p in discover_runs(d)) for d in dirs]
    if any(n != names[0] for n in names):
        raise PoolError("the sources hold different runs (" + "; ".join(f"{d}: {n}" for d, n in zip(dirs, names))
                        + "); pool sweeps of the same batch sizes and lrs")
    runs = {}
    for name in names[0]:
        paths = [d / name for d in dirs]
        for p in paths:
            state = runlog.read_status(p).get("state")
            if state != "finished":
                raise PoolError(f"{p}: status is {state!r}, not 'finished'; finish it (rerun its sweep) first")
        configs = [runlog.read_config(p) for p in paths]
        for p, c in zip(paths[1:], configs[1:]):
            diff = _differences(configs[0], c)
            if diff:
                raise PoolError(f"{p} and {paths[0]} differ in {'; '.join(diff[:5])}: only the base seed may differ")
        base_seeds = [c.get("seed", 0) for c in configs]
        if len(set(base_seeds)) != len(base_seeds):
            raise PoolError(f"{name}: the sources share a base seed ({base_seeds}), so their seeds repeat; "
                            "pool sweeps trained with different --seed")
        runs[name] = (paths, configs)
    return runs


def pool_sweeps(sources: list[str | os.PathLike], out: str | os.PathLike) -> Path:
    """Writes the pooled sweep into ``out`` (a new or empty directory) and returns its path."""
    dirs = [Path(s) for s in sources]
    if len(dirs) < 2:
        raise PoolError(f"pool needs at least two sweep directories, got {len(dirs)}")
    if len({d.resolve() for d in dirs}) != len(dirs):
        raise PoolError(f"the same sweep directory is given twice ({[str(d) for d in dirs]}); its seeds would repeat")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise PoolError(f"out: {out} is not empty; pool into a new directory")
    runs = _check(dirs)
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for name, (paths, configs) in runs.items():
        seeds = [int(c.get("seeds") or 1) for c in configs]
        total = sum(seeds)
        records = pool_records([runlog.read_metrics(p) for p in paths], seeds, where=name)
        run = out / name
        run.mkdir()
        config = {**configs[0], "seeds": sum(seeds), "out": str(run),
                  "pooled_from": [{"dir": str(p), "seed": c.get("seed", 0), "seeds": n}
                                  for p, c, n in zip(paths, configs, seeds)]}
        runlog.write_text(run / runlog.CONFIG_FILE, yaml.safe_dump(runlog.to_jsonable(config), sort_keys=False))
        runlog.write_text(run / runlog.METRICS_FILE, "".join(json.dumps(r) + "\n" for r in records))
        status = {**runlog.read_status(paths[0]), "pooled_from": [str(p) for p in paths]}
        runlog.write_text(run / runlog.STATUS_FILE, json.dumps(status, indent=1))
    spec_file = dirs[0] / "sweep.yaml"
    if spec_file.exists():
        record = yaml.safe_load(spec_file.read_text(encoding="utf-8")) or {}
        record.setdefault("base", {})["seeds"] = total
        record["pooled_from"] = [str(d) for d in dirs]
        runlog.write_text(out / "sweep.yaml", yaml.safe_dump(record, sort_keys=False))
    return out
