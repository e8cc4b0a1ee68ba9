"""``tclock doctor``: read one run directory and say whether the two clocks have come apart.

This module renders the report and is the command line; the analysis is elsewhere:
``tclock.doctor_diagnose`` (``diagnose(run_dir) -> Report``, the overall verdict),
``tclock.doctor_rules`` and ``tclock.doctor_gradients`` (the signal rules: the doctor's spec),
``tclock.doctor_checklist`` (the write-up's section-6 checklist).  ``diagnose``, ``Report``,
``Row`` and ``VERDICTS`` are importable from here too.  Nothing here imports JAX, the loop or an
agent.

Exit codes of ``run_doctor`` / ``main``:
    0  no two-clocks row (healthy, or only watch / risk)
    1  at least one signal row says two-clocks
    2  unreadable input: missing directory, malformed ``config.yaml`` / metrics JSON line, a record
       without ``iteration`` or ``rt_ut_ratio``, a non-numeric metric, or no records at all
``--json`` prints ``report_to_dict(report)`` (on exit 2: ``{"verdict": "unreadable", "exit_code":
2, "error": ...}``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from dataclasses import asdict
from typing import Sequence, TextIO

from tclock import runlog
from tclock.doctor_checklist import CHECK_STATES
from tclock.doctor_diagnose import Report, diagnose
from tclock.doctor_rules import VERDICTS, Row
from tclock.runlog import RunFormatError

__all__ = ["CHECK_STATES", "VERDICTS", "Report", "Row", "diagnose", "format_table", "main", "report_to_dict",
           "run_doctor"]

EXIT_UNREADABLE = 2
MARKS = {"healthy": "healthy", "watch": "watch", "risk": "RISK", "two-clocks": "TWO-CLOCKS",
         "not-checkable": "n/a", "info": "info"}  # the verdict column of the text table
HEADER_KEYS = ("env", "algo", "num_envs", "seeds", "iterations", "env_steps", "state")


def report_to_dict(report: Report) -> dict:
    """A JSON-ready dict: run info, verdict, exit code, signals, checklist, notes."""
    def row(r: Row) -> dict:
        d = asdict(r)
        d.pop("kind")
        if r.kind == "checklist":
            d["status"] = d.pop("verdict")
            d["item"] = d.pop("signal")
        return d
    return runlog.to_jsonable({
        "run_dir": report.run_dir,
        "run": report.run,
        "verdict": report.verdict,
        "exit_code": report.exit_code,
        "signals": [row(r) for r in report.signals],
        "checklist": [row(r) for r in report.checklist],
        "notes": report.notes,
        "batch_and_step": report.batch_and_step,
    })


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], widths: Sequence[int]) -> list[str]:
    """Fixed-width columns, each cell wrapped to its column."""
    sep = "  "
    lines = [sep.join(h.ljust(w) for h, w in zip(headers, widths)).rstrip(), sep.join("-" * w for w in widths)]
    for cells in rows:
        wrapped = [textwrap.wrap(str(c), w) or [""] for c, w in zip(cells, widths)]
        for k in range(max(len(x) for x in wrapped)):
            lines.append(sep.join((x[k] if k < len(x) else "").ljust(w) for x, w in zip(wrapped, widths)).rstrip())
    return lines


def format_table(report: Report) -> str:
    """A plain-text report: run header, signal table, checklist table, overall verdict."""
    run = report.run
    info = [f"{k}={run[k]:g}" if isinstance(run.get(k), float) else f"{k}={run.get(k)}"
            for k in HEADER_KEYS if run.get(k) is not None]
    out = [f"tclock doctor: {report.run_dir}", "  " + "  ".join(info), ""]
    out += _table(("signal", "value / evidence", "threshold", "verdict"),
                  [(r.signal, r.value, r.threshold, MARKS.get(r.verdict, r.verdict)) for r in report.signals],
                  (16, 58, 38, 10))
    out.append("")
    out += _table(("checklist (advice)", "evidence", "wants", "status"),
                  [(r.signal, r.value, r.threshold, r.verdict) for r in report.checklist],
                  (24, 58, 32, 13))
    out.append("")
    out += [f"note: {n}" for n in report.notes]
    if report.batch_and_step:
        out.append(f"batch and step size: {report.batch_and_step['outcome']}")
    flagged = [r.signal for r in report.signals if r.verdict == "two-clocks"]
    tail = f": {', '.join(flagged)}" if flagged else ""
    out.append(f"overall: {report.verdict}{tail} (exit {report.exit_code})")
    return "\n".join(out) + "\n"


def run_doctor(run_dir: str | os.PathLike, as_json: bool = False, stream: TextIO | None = None) -> int:
    """Diagnoses ``run_dir``, prints the table (or JSON) to ``stream`` and returns the exit code."""
    stream = sys.stdout if stream is None else stream
    try:
        report = diagnose(run_dir)
    except RunFormatError as e:
        msg = f"tclock doctor: cannot read {run_dir}: {e}"
        if as_json:  # JSON for the consumer on ``stream``, the sentence for a person on stderr
            stream.write(json.dumps({"run_dir": str(run_dir), "verdict": "unreadable", "exit_code": EXIT_UNREADABLE,
                                     "error": str(e)}, indent=1) + "\n")
            print(msg, file=sys.stderr)
        else:
            stream.write(msg + "\n")
        return EXIT_UNREADABLE
    if as_json:
        stream.write(json.dumps(report_to_dict(report), indent=1) + "\n")
    else:
        stream.write(format_table(report))
    return report.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tclock doctor", description="Diagnose the two clocks in a run directory.",
        epilog=f"exit codes: 0 no two-clocks signal, 1 two-clocks detected, {EXIT_UNREADABLE} unreadable input")
    parser.add_argument("run_dir", help="a tclock run directory (holds config.yaml and metrics.jsonl)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    return run_doctor(args.run_dir, as_json=args.json)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
