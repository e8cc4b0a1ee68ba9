"""Stored short fixed-seed runs: the metrics of each must stay identical through refactors.

``python tests/golden_runs.py --write`` trains every run in :data:`RUNS` and stores its
metrics (timing keys removed) in ``tests/data/golden_<name>.json``; ``test_golden.py`` trains
them again and compares key by key.  Regenerate only when a change of behaviour is intended,
and say so in the commit message.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
# Keys that measure time (or follow from it) differ between any two runs.
TIMING_KEYS = {"wall_s", "rt_s", "learn_s", "ut_s", "rt_ut_ratio", "rt_ut_ratio_w50", "compile_s"}
# Keys added after a run was stored are ignored by the comparison (a new metric is not a change).
COMMON = dict(env="pointmass_reach", num_envs=32, unroll_length=32, seeds=2, seed=3, progress=False,
              checkpoint_every=1000)
RUNS = {
    "ppo": dict(COMMON, total_steps=32 * 32 * 5, gdc_every=2),
    "ppo_hae": dict(COMMON, total_steps=32 * 32 * 4, gdc_every=0, advantage="hae", hae_window=8),
    "impala": dict(COMMON, algo="impala", lr=3e-4, total_steps=32 * 32 * 4, gdc_every=1),
}


def deterministic(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def train_run(name: str, out: Path) -> list[dict]:
    from tclock import runlog
    from tclock.config import TrainConfig
    from tclock.loop import train

    cfg = TrainConfig(**RUNS[name], out=str(out))
    train(cfg)
    return deterministic(runlog.read_metrics(out))


def stored(name: str) -> list[dict]:
    return json.loads((DATA / f"golden_{name}.json").read_text(encoding="utf-8"))


if __name__ == "__main__":
    if "--write" not in sys.argv:
        sys.exit("usage: python tests/golden_runs.py --write   (regenerates tests/data/golden_*.json)")
    DATA.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in RUNS:
            records = train_run(name, Path(tmp) / name)
            (DATA / f"golden_{name}.json").write_text(json.dumps(records, indent=0) + "\n", encoding="utf-8")
            print(name, len(records), "records")
