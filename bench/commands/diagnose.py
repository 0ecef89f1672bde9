"""`regbench diagnose`: from failing cells to known causes, with evidence."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.console import (
    err,
    out,
)
from bench.core.judge import judge
from bench.report.summary import diagnosis_markdown
from bench.runner import confirm
from bench.store.publish import open_results, regenerate


def add_cli_args(sub) -> None:
    diag = sub.add_parser(
        "diagnose", help="from failing cells to known causes, with the evidence for and against each",
        description=("Reasons over a results folder: per failing cell the matrix contrast, facts from its server "
                     "logs, the pre-flight and fingerprints, matched against the signatures of known issues "
                     "(bench/signatures/, plus the config's `signatures` folders). Writes diagnosis.json and "
                     "the Diagnosis sections of summary.md and report.html. Exit 1 when a cell fails."),
    )
    diag.add_argument("dir")
    diag.add_argument("--confirm", action="store_true",
                      help="first run the checks the run did not (inspect, and the audit of each failing cell's "
                           "checkpoint in its environment), then print a minimal reproduction")
    diag.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    path = Path(args.dir)
    results = open_results(path)
    if args.confirm:
        confirm(results, judge(results.data), lambda s: err.print(s, highlight=False))
    report = regenerate(path)
    diagnosis = report.diagnosis
    if not diagnosis.cells:
        out.print("no failing cell: nothing to diagnose", highlight=False, soft_wrap=True)
    for line in diagnosis_markdown(diagnosis):
        out.print(line, highlight=False, markup=False, soft_wrap=True)
    if args.confirm and diagnosis.cells:
        out.print("## Minimal reproduction", highlight=False, markup=False, soft_wrap=True)
        for d in diagnosis.cells:
            audit = next((m.confirm for m in d.matches if m.confirm), None)
            if audit:
                out.print(f"- {d.cell_id}: {audit}", highlight=False, markup=False, soft_wrap=True)
            out.print(f"- {d.cell_id}: regbench run {path / 'config.yaml'} --cell {d.cell_id}",
                      highlight=False, markup=False, soft_wrap=True)
    return report.summary.exit_code
