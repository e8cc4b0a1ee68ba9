"""The experiment scripts (experiments/*.py) run end to end, and RESULTS.md is reproducible.

Each script runs as a real subprocess with ``--quick --smoke --out <tmp>``: ``--smoke`` shrinks
the quick sizes further (pointmass_reach instead of halfcheetah, 16-64 envs, 16-unit networks,
a few iterations) so the whole file stays in CI time; it checks the plumbing (training, sweeps,
profiling, tables, JSON, PNGs), not the science.  pyproject.toml deselects the marker by
default; run ``python -m pytest tests/test_experiments.py -m experiments`` (measured on the shared
2-core CPU: 203 s with a cold XLA cache, 58 s warm).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = ROOT / "experiments"
SCRIPTS = ("latency_table", "rollout_scaling", "gdc_vs_batch", "critical_point", "online_critical", "noise_vs_batch", "lr_batch",
           "calibration", "drbs_critical", "mitigations")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.experiments
sys.path.insert(0, str(EXPERIMENTS))
import common  # noqa: E402  (experiments/common.py)
import make_results  # noqa: E402


def _run(args, timeout=900):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_runs_and_writes_table_json_and_pngs(name, tmp_path):
    out = tmp_path / name
    proc = _run([EXPERIMENTS / f"{name}.py", "--quick", "--smoke", "--out", out])
    assert proc.returncode == 0, proc.stderr[-4000:]

    table = (out / "table.md").read_text(encoding="utf-8")
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["experiment"] == name and results["mode"] == "smoke"
    assert results["command"] == f"python experiments/{name}.py --quick --smoke --out {out}"
    assert results["hardware"]["jax_backend"] and results["hardware"]["versions"]["jax"]
    assert results["claims"], "every experiment compares at least one write-up claim"
    for c in results["claims"]:
        assert c["verdict"] in common.VERDICTS and c["writeup"] and c["tclock"] and c["reading"]
        assert c["claim"] in table
    assert "## Write-up vs tclock" in table and "smoke mode" in table
    assert table.strip() in proc.stdout  # the table is printed too

    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs and pngs == sorted(results["figures"])
    for p in pngs:
        assert (out / p).read_bytes()[:8] == PNG_MAGIC and (out / p).stat().st_size > 5000
    assert not list(out.rglob("checkpoints")), "results keep metrics, not model checkpoints"


def test_lr_batch_pools_grids_of_two_base_seeds(tmp_path):
    outs = [tmp_path / "s0", tmp_path / "s1"]
    for seed, out in enumerate(outs):
        proc = _run([EXPERIMENTS / "lr_batch.py", "--quick", "--smoke", "--seed", seed, "--out", out])
        assert proc.returncode == 0, proc.stderr[-4000:]
    pooled = tmp_path / "pooled"
    proc = _run([EXPERIMENTS / "lr_batch.py", "--quick", "--smoke", "--pool", *outs, "--out", pooled])
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((pooled / "results.json").read_text(encoding="utf-8"))
    assert results["settings"]["seeds"] == 4 and results["settings"]["pooled_from"] == [str(o) for o in outs]
    summary = json.loads((pooled / "runs" / "pointmass_reach" / "summary.json").read_text(encoding="utf-8"))
    parts = [json.loads((o / "runs" / "pointmass_reach" / "summary.json").read_text(encoding="utf-8")) for o in outs]
    for row, a, b in zip(summary["runs"], parts[0]["runs"], parts[1]["runs"]):
        assert row["final_metric_per_seed"] == a["final_metric_per_seed"] + b["final_metric_per_seed"]
    refused = _run([EXPERIMENTS / "lr_batch.py", "--quick", "--smoke", "--pool", outs[0], "--out", tmp_path / "x"])
    assert refused.returncode != 0 and "--pool" in refused.stderr


def test_lr_batch_extends_a_grid_with_a_new_batch_size_and_keeps_the_trained_runs(tmp_path):
    out = tmp_path / "grid"
    proc = _run([EXPERIMENTS / "lr_batch.py", "--quick", "--smoke", "--out", out])
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = out / "runs" / "pointmass_reach"
    before = {d.name: (d / "metrics.jsonl").read_bytes() for d in runs.glob("B*")}
    assert sorted(before) == ["B0016_lr1e-03", "B0016_lr3e-04", "B0032_lr1e-03", "B0032_lr3e-04"]
    proc = _run([EXPERIMENTS / "lr_batch.py", "--quick", "--smoke", "--batch-sizes", "8", "16", "32", "--resume",
                 "--out", out])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "skipped finished runs" in proc.stdout + proc.stderr
    for name, metrics in before.items():  # reused, not retrained
        assert (runs / name / "metrics.jsonl").read_bytes() == metrics, name
    summary = json.loads((runs / "summary.json").read_text(encoding="utf-8"))
    assert sorted(set(summary["batch_sizes"])) == [8, 16, 32] and (runs / "B0008_lr1e-03" / "metrics.jsonl").exists()
    refused = _run([EXPERIMENTS / "lr_batch.py", "--quick", "--smoke", "--batch-sizes", "16", "16", "--out", out])
    assert refused.returncode != 0 and "--batch-sizes" in refused.stderr


def test_make_results_regenerates_committed_results_md(tmp_path):
    first, second = tmp_path / "a.md", tmp_path / "b.md"
    for target in (first, second):
        proc = _run([EXPERIMENTS / "make_results.py", "--out", target], timeout=120)
        assert proc.returncode == 0, proc.stderr
    assert first.read_bytes() == second.read_bytes(), "make_results.py is not deterministic"
    committed = ROOT / "RESULTS.md"
    assert committed.exists(), "RESULTS.md is missing; run python experiments/make_results.py"
    assert first.read_text(encoding="utf-8") == committed.read_text(encoding="utf-8"), (
        "RESULTS.md differs from what experiments/make_results.py generates from experiments/results; "
        "regenerate it")
    proc = _run([EXPERIMENTS / "make_results.py", "--check"], timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_make_results_lists_failures_and_flags_smoke_runs(tmp_path):
    folder = tmp_path / "results" / "latency_table"
    folder.mkdir(parents=True)
    claims = [common.claim("a", "Claim A", "1.0", "2.0", "not reproduced", "measured twice the claim"),
              common.claim("b", "Claim B", "3", "3.1", "reproduced", "within tolerance")]
    record = {"experiment": "latency_table", "title": "T", "mode": "smoke", "command": "python x --smoke",
              "runtime_s": 1.0, "claims": claims, "notes": ["n1"], "figures": ["f.png"],
              "hardware": {"jax_backend": "cpu", "devices": ["cpu:cpu"], "cpu": "c", "cpu_count": 2,
                           "load_average_at_start": [1.0, 1.0, 1.0], "python": "3",
                           "versions": {"jax": "0", "brax": "0", "flax": "0"}}}
    (folder / "results.json").write_text(json.dumps(record))
    text = make_results.render(make_results.load(tmp_path / "results"), tmp_path / "results", tmp_path)
    assert "**Warning:**" in text and "2 claims checked: 1 reproduced, 1 not reproduced." in text
    did_not = text.split("**Did not reproduce:**")[1].split("**Reproduced")[0]
    assert "Claim A" in did_not and "Claim B" not in did_not
    assert "Not run yet: `python experiments/mitigations.py --quick`" in text
    assert text == make_results.render(make_results.load(tmp_path / "results"), tmp_path / "results", tmp_path)


def test_loglog_fit_recovers_exponent():
    fit = common.loglog_fit([128, 256, 512, 1024], [3 * b ** 1.5 for b in (128, 256, 512, 1024)])
    assert fit["p"] == pytest.approx(1.5) and fit["c"] == pytest.approx(3) and fit["r2"] == pytest.approx(1)
