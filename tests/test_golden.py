"""Fixed-seed runs reproduce the stored metrics exactly (see tests/golden_runs.py)."""
import math

import pytest

from golden_runs import RUNS, stored, train_run


def _same(a, b) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    return a == b


@pytest.mark.parametrize("name", sorted(RUNS))
def test_fixed_seed_run_matches_stored_metrics(name, tmp_path):
    want = stored(name)
    got = train_run(name, tmp_path / name)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for key, value in w.items():  # keys added since the run was stored are new metrics, not changes
            assert key in g, f"{name}: iteration {w['iteration']} lost the key {key}"
            assert _same(g[key], value), f"{name}: iteration {w['iteration']}: {key} = {g[key]} (stored {value})"
