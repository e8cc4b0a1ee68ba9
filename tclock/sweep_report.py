"""Summarise a batch-size sweep: steps to target per B, the critical batch size, the wall-clock
optimum, and the diagnostics beside them.  Reads run directories only (through
:mod:`tclock.runlog`); never imports JAX, the loop or an agent.

The parts: :mod:`tclock.sweep_analysis` (the numbers, and the definitions of steps to target,
its bias and the fit), :mod:`tclock.sweep_render` (tables, headline, report.md text),
:mod:`tclock.sweep_figures` (the PNGs).  Units: docs/design.md §2.

Outputs (``write=True``, into the sweep directory)
--------------------------------------------------
``summary.json`` (layout: :func:`tclock.sweep_analysis.summarize`, plus ``headline`` and
``figures``), ``report.md`` and the PNGs in :data:`tclock.sweep_figures.FIGURES`; a figure whose
data are absent is skipped (not written, not listed).

    python -m tclock.sweep_report SWEEP_DIR [--target X] [--metric KEY] [--smooth-steps N]
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from tclock import runlog, sweep_analysis
from tclock.runlog import RunFormatError
from tclock.sweep_figures import FIGURES, write_figures
from tclock.sweep_render import format_summary, headline, markdown_report

__all__ = ["SUMMARY_FILE", "REPORT_FILE", "FIGURES", "summarize_sweep", "write_report", "format_summary", "main"]

SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"


def summarize_sweep(sweep_dir: str | os.PathLike, target: float | None = None, metric: str = "success_rate",
                    smooth_steps: float = 16384, write: bool = True, include_incomplete: bool = False,
                    n_boot: int = 1000, ci: float = 0.9, rng: Any = 0) -> dict:
    """Summarise the sweep in ``sweep_dir``; with ``write`` also write summary.json, report.md, PNGs.

    Args:
      target: value of ``metric`` that counts as reached; default: each run's ``target_success``.
      metric: per-iteration key of the learning curve (``docs/metrics.md``), e.g. ``success_rate``
        or ``episode_return``.
      smooth_steps: env steps (per seed) of the trailing-mean window; see :mod:`tclock.sweep_analysis`.
      include_incomplete: also use what unfinished runs logged (they are listed either way).
      n_boot, ci, rng: passed to :func:`tclock.critical.bootstrap_b_crit`.

    Returns the dict of :func:`tclock.sweep_analysis.summarize` (the content of summary.json)
    with ``headline`` (:func:`tclock.sweep_render.headline`) and ``figures`` (file names written;
    empty without ``write``).
    """
    summary = sweep_analysis.summarize(sweep_dir, target=target, metric=metric, smooth_steps=smooth_steps,
                                       include_incomplete=include_incomplete, n_boot=n_boot, ci=ci, rng=rng)
    summary["headline"] = headline(summary)
    summary["figures"] = []
    if write:
        write_report(summary, sweep_dir)
    return summary


def write_report(summary: dict, out_dir: str | os.PathLike) -> list[Path]:
    """Writes the PNGs, summary.json and report.md into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    figures = write_figures(summary, out)
    summary["figures"] = [p.name for p in figures]
    runlog.write_json(out / SUMMARY_FILE, summary)
    runlog.write_text(out / REPORT_FILE, markdown_report(summary))
    return [out / SUMMARY_FILE, out / REPORT_FILE, *figures]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tclock.sweep_report SWEEP_DIR [--target X] [--metric KEY] ...``"""
    import argparse

    p = argparse.ArgumentParser(prog="python -m tclock.sweep_report", description=__doc__.splitlines()[0])
    p.add_argument("sweep_dir")
    p.add_argument("--target", type=float, default=None)
    p.add_argument("--metric", default="success_rate")
    p.add_argument("--smooth-steps", type=float, default=16384)
    p.add_argument("--include-incomplete", action="store_true")
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args(argv)
    try:
        s = summarize_sweep(a.sweep_dir, target=a.target, metric=a.metric, smooth_steps=a.smooth_steps,
                            write=not a.no_write, include_incomplete=a.include_incomplete)
    except (RunFormatError, ValueError) as e:
        print(f"error: {e}")
        return 2
    print(format_summary(s))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
