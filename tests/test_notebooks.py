"""The walkthrough notebooks: committed stripped, and they run end to end at the quick sizes.

The ``notebooks``-marked tests (deselected by default, ``python -m pytest -m notebooks``; about
3-5 minutes each on a 2-core CPU) execute each notebook with ``nbclient`` in a fresh ``python3`` kernel, with
``TCLOCK_NOTEBOOK_QUICK=1`` and the notebook's outputs (``TCLOCK_NOTEBOOK_OUT``) in a temporary
directory, then check what the notebook printed and wrote against the run directories
(read back through ``tclock.runlog`` / ``tclock.doctor``, which import no JAX).

The kernel inherits this process's environment, so the XLA compilation cache set up in
``conftest.py`` applies to the notebooks too.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tclock import runlog
from tclock.doctor import diagnose

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NAMES = ("01_two_clocks.ipynb", "02_custom_brax_task.ipynb")
QUICK_LINE = 'QUICK = os.environ.get("TCLOCK_NOTEBOOK_QUICK", "1") == "1"'
CELL_TIMEOUT_S = 900  # one cell; the quick notebooks take a few minutes in all on a 2-core CPU
VERDICT = re.compile(r"^overall: (healthy|watch|risk|two-clocks)\b.*\(exit ([01])\)$", re.M)


# --------------------------------------------------------------------------- committed files
@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_is_valid_and_stripped(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code), \
        f"{name}: strip outputs before committing (outputs and execution counts must be empty)"
    first = code[0]
    assert QUICK_LINE in first.source, f"{name}: the first code cell must read the QUICK parameter"
    assert "parameters" in first.metadata.get("tags", [])
    assert sum(c.cell_type == "markdown" for c in nb.cells) >= 6, f"{name}: explain each step in markdown"


# --------------------------------------------------------------------------- execution
def _python3_kernel_available() -> bool:
    """True when jupyter_client finds a ``python3`` kernel that starts this interpreter."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        return False
    exe = spec.argv[0] if spec.argv else ""
    major, minor = sys.version_info[:2]
    if exe in ("python", f"python{major}", f"python{major}.{minor}"):
        return True  # jupyter_client launches these names with sys.executable
    resolved = shutil.which(exe) or exe
    return os.path.realpath(resolved) == os.path.realpath(sys.executable)


@pytest.fixture
def quick_env(tmp_path, monkeypatch) -> Path:
    """A python3 kernel for this interpreter (installed into tmp if missing), quick sizes, tmp outputs."""
    if not _python3_kernel_available():
        from ipykernel.kernelspec import install

        prefix = tmp_path / "jupyter-prefix"
        install(prefix=str(prefix), kernel_name="python3")
        data = prefix / "share" / "jupyter"
        monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(p for p in (str(data), os.environ.get("JUPYTER_PATH")) if p))
        assert _python3_kernel_available()
    out = tmp_path / "runs"
    monkeypatch.setenv("TCLOCK_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("TCLOCK_NOTEBOOK_OUT", str(out))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    return out


def execute(name: str, workdir: Path) -> tuple[str, int]:
    """Runs the notebook in ``workdir``; returns its stdout text and the number of PNGs it displayed."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": str(workdir)}})
    client.execute()  # raises CellExecutionError (with the cell's traceback) on any error
    text, images = [], 0
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            assert o.output_type != "error", o
            if o.output_type == "stream" and o.name == "stdout":
                text.append(o.text)
            elif o.output_type in ("display_data", "execute_result"):
                images += "image/png" in o.get("data", {})
    return "".join(text), images


@pytest.mark.notebooks
def test_two_clocks_notebook_runs(quick_env, tmp_path):
    text, images = execute("01_two_clocks.ipynb", tmp_path)
    sweep = quick_env / "01_two_clocks" / "quick" / "sweep"

    # the profile ran and was written where the doctor looks for it
    assert "rollout latency profile: pointmass_reach" in text
    assert (sweep / "profile.json").exists()

    # both training runs finished, and the doctor's verdicts printed for them match a fresh diagnosis
    runs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.startswith("B"))
    assert len(runs) == 3, runs
    for run in runs:
        assert runlog.read_status(run)["state"] == "finished", run
    printed = VERDICT.findall(text)
    assert len(printed) >= 2, text[-3000:]
    trained = [m.group(1) for m in re.finditer(r"tclock doctor: (\S+)", text)]
    assert len(trained) == 2
    for run_dir, (verdict, code) in zip(trained, printed):
        report = diagnose(run_dir)
        assert (report.verdict, report.exit_code) == (verdict, int(code))

    # plots: 5 per training run + the sweep's figures, displayed inline
    for run_dir in trained:
        assert all((Path(run_dir) / f).exists() for f in ("return.png", "rt_ut.png", "gdc.png"))
    summary = json.loads((sweep / "summary.json").read_text())
    assert images >= 2 * 3 + len(summary["figures"]) and "sweep_steps_to_target.png" in summary["figures"]

    # the sweep reused the two finished runs and printed its summary and the critical point
    assert re.search(r"skipped finished runs: B=\[\d+, \d+\]", text)
    assert f"sweep {sweep}" in text and "S(B) = S_min + c/B" in text
    assert summary["batch_sizes"] == [16, 64, 256]
    assert "B_crit = E_min/(T*S_min)" in text and "headline:" in text
    # with summary.json beside the runs the doctor's "num_envs <= 0.7 x b_crit" advice becomes checkable
    assert len(re.findall(r"^(?:small|large): (?:ok|missing)\s+num_envs \d+", text, re.M)) == 2, text[-2000:]


@pytest.mark.notebooks
def test_custom_task_notebook_runs(quick_env, tmp_path):
    text, images = execute("02_custom_brax_task.ipynb", tmp_path)
    run = quick_env / "02_custom_brax_task" / "quick" / "dial_hold"

    assert "reward == success flag == independent predicate on every step" in text
    assert "on target: reward 1 (expected 1)" in text and "opposite : reward 0 (expected 0)" in text
    assert "at the time limit (step 100): truncation [1. 1. 1. 1. 1. 1. 1. 1.]" in text
    assert runlog.read_status(run)["state"] == "finished"
    assert runlog.read_config(run)["env"] == "dial_hold"
    records = runlog.read_metrics(run)
    assert records and len(records[-1]["activation_rate"]) == 2
    verdicts = VERDICT.findall(text)
    assert len(verdicts) == 1 and verdicts[0] == (diagnose(run).verdict, str(diagnose(run).exit_code))
    assert images >= 4 and (run / "activation.png").exists()
