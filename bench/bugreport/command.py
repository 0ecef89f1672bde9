"""`regbench report-bug`: one failing cell of a results folder as a Markdown issue for upstream."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.bugreport.gather import write_bug_report
from bench.console import err, out
from bench.core.errors import EXIT_PASS


def add_cli_args(sub) -> None:
    bug = sub.add_parser(
        "report-bug", help="write a failing cell's upstream bug report (Markdown) and its one-cell matrix",
        description=("Writes DIR/bug-<cell>.md, an issue in the sections of vLLM's bug-report form (or for "
                     "runai-model-streamer, when the likely cause is one of its issues): the environment from the "
                     "cell's fingerprint and the output of vLLM's collect_env, run in the cell's environment (the "
                     "image's Python with its overlay, or a container of the image the run was pinned to; where it "
                     "cannot run, the report says why and gives its command, and a warning says so on stderr), "
                     "the failure rate with its interval, a minimal reproduction (the audit command, the `vllm "
                     "serve` command line, one request as curl, and DIR/bug-<cell>.yaml, a one-cell matrix for "
                     "`regbench run`), the evidence and the matching known issue. Secrets are redacted. Exit 2 for "
                     "a cell that passed or that the run does not have."),
    )
    bug.add_argument("dir", help="a results folder")
    bug.add_argument("--cell", required=True, metavar="ID", help="the failing or flaky cell's id")
    bug.add_argument("--no-collect-env", dest="collect_env", action="store_false",
                     help="do not run vLLM's collect_env (the report still gives its command)")
    bug.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    written = write_bug_report(Path(args.dir), args.cell, collect_env=args.collect_env)
    for warning in written.warnings:
        err.print(f"regbench: warning: {warning}", highlight=False, markup=False, soft_wrap=True)
    out.print(str(written.report), highlight=False, markup=False, soft_wrap=True)
    return EXIT_PASS
