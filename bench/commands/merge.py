"""`regbench merge`: the slices of one run put back into one folder, reports regenerated."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.console import (
    out,
)
from bench.core.config import ConfigError
from bench.report.summary import table
from bench.store.merge import merge
from bench.store.publish import regenerate
from bench.store.results import ResultsError


def add_cli_args(sub) -> None:
    merge_p = sub.add_parser("merge", help="merge the results folders of the slices of one run, reports regenerated")
    merge_p.add_argument("dirs", nargs="+", metavar="DIR")
    merge_p.add_argument("-o", "--out", required=True, help="parent folder of the merged run")
    merge_p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        merged = merge([Path(d) for d in args.dirs], Path(args.out))
    except (ResultsError, OSError) as exc:
        raise ConfigError(f"merge: {exc}") from None
    summary = regenerate(merged.path).summary
    out.print(table(summary))
    out.print(f"merged: {merged.path}", highlight=False)
    return summary.exit_code
