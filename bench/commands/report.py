"""`regbench report`: a results folder judged again, every report file rewritten."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.console import (
    compare_flags,
    comparison,
    out,
)
from bench.report.summary import table
from bench.store.publish import regenerate


def add_cli_args(sub) -> None:
    report = sub.add_parser(
        "report", help="regenerate summary.json, summary.md, junit.xml and report.html from a results folder")
    report.add_argument("dir")
    compare_flags(report, "judge outputs by this rule instead of the run's config's `comparison`")
    report.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    summary = regenerate(Path(args.dir), comparison(args, Path(args.dir))).summary
    out.print(table(summary))
    return summary.exit_code
