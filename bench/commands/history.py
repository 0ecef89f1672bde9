"""`regbench history`: every cell across the runs in the history database, and where it broke;
`regbench history ingest DIR...`: results folders into it (bench/store/history.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.commands.console import err, out
from bench.core.config import ConfigError
from bench.core.errors import EXIT_PASS, EXIT_USAGE, RegbenchError
from bench.report.history import history_table, regression_lines
from bench.store.history import DEFAULT_NAME, default_url, ingest, open_history

_URL_HELP = (f"the history database as an SQLAlchemy URL (default: {DEFAULT_NAME} in the results root), e.g. "
             "postgresql+psycopg://regbench@db.example/regbench for one shared by several runners")


def add_cli_args(sub) -> None:
    h = sub.add_parser(
        "history", help="every cell across the runs in the history database, and the run where it broke",
        description="Per cell, the runs in the history in the order they started: image, vLLM and streamer "
                    "versions, verdict, failures/runs with the Wilson 95 % interval; then the first run "
                    "where a passing cell turned failing or flaky, and the last run before it that passed. "
                    "`regbench history ingest DIR...` adds results folders.")
    h.add_argument("--history", metavar="URL", help=_URL_HELP)
    h.add_argument("--results", default="results", metavar="DIR",
                   help=f"the results root whose {DEFAULT_NAME} is the default database (default: results)")
    h.add_argument("--cell", metavar="ID", help="only this cell (model__load-format__platform__image)")
    h.add_argument("--json", action="store_true", help="print the history as JSON")
    h.set_defaults(func=main)
    actions = h.add_subparsers(dest="action", metavar="ingest")
    ing = actions.add_parser(
        "ingest", help="add results folders to the history (a run already there is left as it is)",
        description="Reads and judges each results folder as `regbench report` does and stores its cells, "
                    "fingerprints and performance medians. Idempotent by run id. Merged slices: ingest the "
                    "merged folder, not a slice (a slice carries the run's id and would stand for it).")
    ing.add_argument("dirs", nargs="+", metavar="DIR")
    # SUPPRESS: not given after `ingest`, the value given before it stands.
    ing.add_argument("--history", metavar="URL", default=argparse.SUPPRESS,
                     help=f"{_URL_HELP.replace('the results root', 'the folders’ parent folder')}")
    ing.set_defaults(func=ingest_main)


def ingest_main(args: argparse.Namespace) -> int:
    dirs = [Path(d) for d in args.dirs]
    url = args.history
    if url is None:
        parents = {d.resolve().parent for d in dirs}
        if len(parents) > 1:
            raise ConfigError("history ingest: the folders are in different parent folders "
                              f"({', '.join(sorted(map(str, parents)))}): name one database with --history URL")
        url = default_url(parents.pop())
    history = open_history(url)
    failed = 0
    try:
        for d in dirs:
            try:
                run_id, stored = ingest(history, d)
            except RegbenchError as exc:
                # One unreadable folder (`ingest results/*` meets a stray one) does not stop the rest.
                err.print(f"{d}: not ingested: {exc}", highlight=False, markup=False)
                failed += 1
                continue
            out.print(f"{d}: {'ingested' if stored else 'already there'} (run {run_id})", highlight=False, markup=False)
    finally:
        history.close()
    return EXIT_USAGE if failed else EXIT_PASS


def main(args: argparse.Namespace) -> int:
    history = open_history(args.history or default_url(Path(args.results)), create=False)
    try:
        if args.cell is not None and args.cell not in (known := history.cell_ids()):
            raise ConfigError(f"--cell {args.cell}: no such cell in the history {history.shown}"
                              + (f"; cells: {', '.join(known)}" if known else " (it holds no run)"))
        cells = history.histories(args.cell)
        version = history.schema_version()
    finally:
        history.close()
    if args.json:
        print(json.dumps({"database": history.shown, "schema_version": version,
                          "cells": [h.model_dump(mode="json") for h in cells]}, indent=2))
        return EXIT_PASS
    if not cells:
        out.print(f"no run in the history {history.shown}: regbench history ingest DIR... adds some",
                  highlight=False, markup=False)
    for h in cells:
        out.print(history_table(h))
        for line in regression_lines(h):
            out.print(line, highlight=False, markup=False)
    return EXIT_PASS
